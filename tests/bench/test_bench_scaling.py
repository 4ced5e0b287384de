"""bench/scaling.py's rows: the reduced-weight (bf16, int8) rows read the bytes the engine packs
and claim no fp32 compute bound (their kernels' dot-product rates are not measured), and the
numpy "all cores" row runs on the cores it may use.
"""

import json
import math
import os
import subprocess
import sys

import pytest

import fastpath

from helpers.bench_scripts import BENCH


def test_scaling_reduced_weight_rows_read_the_bytes_the_engine_packs(tmp_path):
    """bench/scaling.py's read bound for a bf16 / int8 row took padded MACs x the type's bytes,
    though the engine keeps the output layer fp32 and pads its blocks as the reduced kernels
    need: int8 32x16x2 was bounded on 640 bytes where the kernel streams 1280. The row also
    says the peers ran fp32 weights, as they do on every row."""
    from fastpath._kernels import LowpMLP, lowp_kernels
    sys.path.insert(0, BENCH)
    try:
        import scaling
    finally:
        sys.path.remove(BENCH)
    out = subprocess.run([sys.executable, os.path.join(BENCH, "scaling.py"), "--models",
                          "32x16x2", "--weights", "fp32,int8,bf16", "--calls", "100", "--no-peers",
                          "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads((tmp_path / "scaling-partial.json").read_text())
    model = scaling.build_model((32, 16, 2))
    isa = [i for i in res["kernel_sets"] if lowp_kernels(i) is not None][-1]
    rows = {r["weights"]: r for r in res["rows"]}
    assert rows["fp32"]["weight_bytes"] == scaling.padded_macs((32, 16, 2)) * 4
    for wt in ("int8", "bf16"):
        packed = LowpMLP([L.weight for L in model.layers], [L.bias for L in model.layers],
                         [L.activation for L in model.layers], wt, isa)
        r = rows[wt]
        assert r["weight_bytes"] == packed.arena_bytes
        assert r["read_bound_ns"] == pytest.approx(r["weight_bytes"] / r["read_gbps"])
        assert r["peer_weights"] == "fp32"


def test_scaling_numpy_all_cores_is_the_cores_it_may_run_on(tmp_path):
    """bench/scaling.py labelled its numpy row "numpy {os.cpu_count()}t" and asked the BLAS
    pool for that many threads; under an affinity of one core (taskset, a container's cpuset)
    OpenBLAS held one, so "numpy 2t" timed one thread. The row is named after the allowed
    cores, and the child reports the pool's threads. With one core the all-cores row and the
    one-thread row shared a JSON key and the run died (TypeError), on any one-core host too."""
    if not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs a process allowed on two or more cores")
    core = min(os.sched_getaffinity(0))
    out = subprocess.run([sys.executable, os.path.join(BENCH, "scaling.py"), "--models", "8x2",
                          "--calls", "100", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=300, cwd=str(tmp_path),
                         preexec_fn=lambda: os.sched_setaffinity(0, {core}))
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads((tmp_path / "scaling-partial.json").read_text())
    assert res["machine"]["cores"] == 1
    (row,) = res["rows"]
    assert "numpy_1t" in row and not any(k.startswith("numpy_") and k != "numpy_1t"
                                         for k in row)
    try:
        import threadpoolctl  # noqa: F401
    except ImportError:
        return
    assert row["numpy_1t"]["blas_threads"] and set(row["numpy_1t"]["blas_threads"]) == {1}


def _nan(v):
    return v is None or (isinstance(v, float) and math.isnan(v))


def test_scaling_reduced_weight_rows_claim_no_fp32_compute_bounds(tmp_path):
    import scaling
    assert scaling.main(["--models", "256x256x2", "--weights", "fp32,bf16,int8", "--calls",
                         "100", "--no-peers", "--sets", fastpath.simd(),
                         "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "scaling-partial.json").read_text())
    rows = {r["weights"]: r for r in res["rows"]}
    fp32 = rows["fp32"]
    if res["machine"]["fma_macs_per_ns"]:
        # fp32 keeps its FMA bound: padded MACs at the core's FMA rate
        rate = max(res["machine"]["fma_macs_per_ns"].values())
        assert fp32["fma_bound_ns"] == pytest.approx(fp32["padded_macs"] / rate)
        assert "bounds_note" not in fp32
    for wt in ("bf16", "int8"):
        r = rows[wt]
        assert _nan(r["fma_bound_ns"]) and _nan(r["latency_bound_ns"]), r
        assert r["bound"] == "read" and r["bound_ns"] == r["read_bound_ns"]
        assert r["max_bound"] is None and r["issue_bound"] in (None, "read")
        assert "vpdpbusd" in r["bounds_note"]
