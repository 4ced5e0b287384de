"""How the benches read their samples: one rank rule for percentiles in every bench (a sample some
call took, as HdrHistogram picks it, with or without hdrhistogram installed), max and mean the
samples' own, zero readings kept, and the timeline's percentiles taken over the calls in C.
"""

import os
import sys
import types

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from helpers.bench_scripts import BENCH, bench_on_path


bench_on_path()
import _report  # noqa: E402  (bench/ is on sys.path from here)


def test_percentiles_pick_a_sample_by_the_rank_rule():
    assert _report.percentiles([4, 1, 3, 2], (50, 99)) == [2.0, 4.0]     # np.percentile: 2.5
    assert _report.percentiles([], (50,)) == [0.0]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 10**9), min_size=1, max_size=300),
       st.lists(st.floats(0, 100), min_size=1, max_size=5))
def test_percentiles_match_the_dist_rule(values, levels):
    got = _report.percentiles(values, levels)
    s = np.sort(np.asarray(values, np.float64))
    for p, g in zip(levels, got):
        assert g in values
        rank = min(max(int(np.floor(p * len(s) / 100 + 0.5)), 1), len(s))
        assert g == s[rank - 1]


def test_the_benches_use_it():
    import scaling
    import serve
    assert scaling.pct(np.array([10, 40, 20, 30]))["p50"] == 20.0
    assert serve.pct([10, 40, 20, 30])["p50"] == 20.0
    for name in ("scaling.py", "serve.py", "weights.py", "gpu_check.py"):
        with open(os.path.join(BENCH, name)) as f:
            src = f.read()
        assert "np.percentile(" not in src, name


def _without_hdrh(monkeypatch):
    # a None entry in sys.modules makes `import hdrh.histogram` raise ImportError, as on a
    # host where the package is not installed
    monkeypatch.setitem(sys.modules, "hdrh", None)
    monkeypatch.setitem(sys.modules, "hdrh.histogram", None)


@pytest.mark.parametrize("n", [2, 3, 44, 1218, 3000])
def test_percentiles_without_hdrhistogram_are_the_histograms(bench, monkeypatch, n):
    """Below 2048 ns a 3-digit HdrHistogram is exact, so the figures computed from the sorted
    samples must be the histogram's to the ns: np.percentile interpolated (a p50 of two calls
    that no call took) and the plotted series rounded ranks up where the histogram rounds half
    up."""
    pytest.importorskip("hdrh.histogram")
    _, report = bench
    v = np.random.default_rng(n).integers(1, 2000, n)
    with_hdr = report.Dist.of(v)
    assert with_hdr._h is not None
    _without_hdrh(monkeypatch)
    without = report.Dist.of(v)
    assert without._h is None
    assert without.summary() == {**with_hdr.summary(), "mean": without.summary()["mean"]}
    assert without.series() == with_hdr.series()
    # every percentile is a time some call took
    assert set(without.q.values()) <= set(float(x) for x in v)


def test_max_and_mean_are_the_samples_own(bench):
    """With hdrhistogram the max column (and the last point of each plotted line, "its slowest
    sample") was the top of the slowest sample's bucket, 4,032,511 ns for a call of
    4,031,234 ns, and the mean was of bucket values: both are taken from the samples."""
    pytest.importorskip("hdrh.histogram")
    _, report = bench
    v = np.array([100] * 10 + [4_031_234, 2049, 3001])
    d = report.Dist.of(v)
    assert d._h is not None
    assert d.max == 4_031_234 == d.summary()["max"] == d.series()["ns"][-1]
    assert d.mean == pytest.approx(float(v.mean()), rel=0, abs=1e-9)


def test_zero_readings_stay_zero(bench, monkeypatch):
    """A stage shorter than one step of a coarse clock (10 ns here) reads 0; the histogram was
    fed max(v, 1), so a stage that read 0 on most calls printed a p50 of "1 ns", which no call
    took and which the run without hdrhistogram did not print."""
    pytest.importorskip("hdrh.histogram")
    _, report = bench
    v = np.array([0] * 60 + [10] * 40)
    d = report.Dist.of(v)
    assert d._h is not None
    assert d.p50 == 0.0 and d.q[90] == 10.0 and d.series()["ns"][0] == 0.0
    _without_hdrh(monkeypatch)
    plain = report.Dist.of(v)
    assert plain.summary() == d.summary() and plain.series() == d.series()


def test_timeline_percentiles_are_calls_in_c(bench_replays):
    """The timeline's p50_ns / p99_ns were interpolated (no call's time) and not said to be in-C
    totals."""
    n = 200
    rec = np.zeros((n, 4), np.uint32)
    rec[:, 3] = 10 * (np.arange(n) % 100) + 100          # each bin of 100: 100, 110, .., 1090
    on = {"cached": np.zeros(n, bool), "reason": np.full(n, 3, np.int8),
          "py": np.full(n, 500, np.int64), "rec": rec, "signal": np.zeros(n),
          "stats": {}}
    bs = types.SimpleNamespace(regime_names=["calm"], regime=np.zeros(n, np.int64))
    tl = bench_replays.replay_summary(on, np.zeros(n), bs, n)["timeline"]
    assert len(tl["p50_ns"]) == 2
    took = set(rec[:, 3].tolist())
    assert all(v in took for v in tl["p50_ns"] + tl["p99_ns"]), tl
    assert "in C" in tl["what"] and "not from Python" in tl["what"]


def test_schema_describes_the_timeline():
    import json
    with open(os.path.join(BENCH, "schema.json")) as f:
        s = json.load(f)
    tl = s["properties"]["replay"]["properties"]["timeline"]
    assert "in C" in tl["properties"]["what"]["description"]
