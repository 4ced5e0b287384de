"""Session 28: scaling.py, serve.py, weights.py and gpu_check.py read their percentiles with
np.percentile's interpolation (a p50 of two calls that no call took), while run.py and the
README's other figures use HdrHistogram's rank rule. Now every bench reads them one way."""
import os
import sys

import numpy as np
from hypothesis import given, settings, strategies as st

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
sys.path.insert(0, BENCH)

import _report  # noqa: E402


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
