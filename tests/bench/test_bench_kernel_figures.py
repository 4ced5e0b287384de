"""The kernel figures: the MLP kernel's GFLOP/s is printed where the CPU has no FMA rate to compare
with, its figure says it is the best run, and bench/weights.py counts changes of sign only.
"""

import json
import os
import sys

import numpy as np
import pytest

from helpers.bench_scripts import BENCH


def test_mlp_gflops_is_printed_where_the_cpu_has_no_fma_rate(bench, monkeypatch, bench_harness):
    """Without an FMA probe result (a CPU without AVX2+FMA: rate 0) the kernel's GFLOP/s was
    left out of the JSON and the throughput table printed "0.0 GFLOP/s" for a kernel that ran;
    GFLOP/s is the kernel's multiply-adds over its own time and needs no bound."""
    import fastpath
    run, report = bench
    monkeypatch.setattr(bench_harness, "fma_macs_per_ns", lambda isa: 0.0)
    model = fastpath.Model.load(run.DEMO_MODEL)
    k = bench_harness.mlp_kernel(model)
    assert "fma_bound_ns" not in k and "ratio_to_bound" not in k
    assert k["gflops"] == pytest.approx(2 * k["macs"] / k["ns_per_forward"])
    with open(os.path.join(BENCH, "results", "latest-generated.json")) as f:
        res = json.load(f)
    res["mlp_kernel"] = k
    (_, _, rows), = [t for t in report.tables(res) if t[0] == "Throughput"]
    (cell,) = [r[2] for r in rows if r[0].startswith("MLP kernel alone")]
    assert cell == f"{k['gflops']:.1f} GFLOP/s"
    sys.path.insert(0, BENCH)
    try:
        import readme_figures
    finally:
        sys.path.remove(BENCH)
    assert f"({k['gflops']:.0f} GFLOP/s)" in readme_figures.summary(res)


def test_mlp_kernel_figure_says_it_is_the_best_run(bench, bench_harness):
    """The throughput table's "MLP kernel alone: 106 ns" (and the README sentence) was the
    best of five runs' means with nothing saying so, beside step_batch rows that say "best of
    5; median ..."; the JSON and both labels now name it."""
    import fastpath
    run, report = bench
    k = bench_harness.mlp_kernel(fastpath.Model.load(run.DEMO_MODEL))
    assert k["runs"] == bench_harness.MLP_RUNS and k["passes_per_run"] == bench_harness.MLP_PASSES
    assert k["ns_per_forward"] <= k["ns_median_of_runs"]
    with open(os.path.join(BENCH, "results", "latest-generated.json")) as f:
        res = json.load(f)
    res["mlp_kernel"] = k
    (_, _, rows), = [t for t in report.tables(res) if t[0] == "Throughput"]
    want = (f"best of {bench_harness.MLP_RUNS} runs, "
            f"each the mean of {bench_harness.MLP_PASSES:,} passes")
    assert any(r[0].startswith("MLP kernel alone") and want in r[0] for r in rows)
    sys.path.insert(0, BENCH)
    try:
        import readme_figures
    finally:
        sys.path.remove(BENCH)
    assert want in readme_figures.summary(res)


def test_weights_sign_flips_count_changes_of_sign_only():
    """bench/weights.py counted np.sign(sig) != np.sign(ref): a signal at exactly 0 against a
    small one of either sign was a "sign flip", where bench/run.py (and the docstring: "ticks
    whose signal changes sign") count + to - and - to + only."""
    sys.path.insert(0, BENCH)
    try:
        import weights
    finally:
        sys.path.remove(BENCH)
    ref = np.array([0.0, 0.3, -0.2, 0.4, 0.0], np.float32)
    sig = np.array([0.01, -0.1, 0.0, 0.41, 0.0], np.float32)
    e = weights.signal_errors(sig, ref)
    assert e["sign_flips"] == 1
    assert e["n"] == 5 and e["max_abs"] == pytest.approx(0.4)
