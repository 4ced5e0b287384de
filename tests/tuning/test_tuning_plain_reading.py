"""The fits against a plain reading: calibrate and fit_head_scale match a numpy reading of their
docstrings, fit_cache_policy's report and weights_error match their own replays, a numpy tick
spacing is taken, and a fit that no guard lets hit names the guard."""
import re

import numpy as np
import pytest

from fastpath import Engine, InputError
from fastpath.model import CachePolicy, FeatureSpec
from fastpath.tuning import calibrate, fit_cache_policy, fit_head_scale
from helpers.builders import random_model


F32 = np.float32


def test_calibrate_and_fit_head_scale_match_their_docstrings():
    rng = np.random.default_rng(9)
    raws = rng.standard_normal((80, 4)).astype(F32)
    sy = rng.integers(0, 3, 80)
    m = random_model(rng, [4, 5, 1])                 # one output: a regression head
    out = calibrate(m, raws, [0, 1], [2], window=4, symbols=sy)
    assert out.feature_spec == FeatureSpec.fit(raws, [0, 1], [2], 4, sy)
    assert not out.cache_policy.enabled and out.cache_policy.fitted_max_error is None
    pred = out.forward(out.feature_spec.apply(raws, sy))[:, 0].astype(np.float64)
    assert out.head_spec.scale == pytest.approx(np.quantile(np.abs(pred), 0.95) / 2.0, rel=1e-12)
    one = fit_head_scale(out, raws[:1], sy[:1])      # one tick is enough for a scale
    p1 = float(out.forward(out.feature_spec.apply(raws[:1], sy[:1]))[0, 0])
    assert one.head_spec.scale == pytest.approx(abs(p1) / 2.0, rel=1e-6)
    with pytest.raises(InputError, match="symbols"):
        fit_head_scale(out, raws, sy[:10])


def test_fit_cache_policy_takes_a_numpy_tick_spacing():
    # tick_ns=np.int64(5) was refused as "must be a positive int, got np.int64(5)"
    rng = np.random.default_rng(10)
    m = random_model(rng, [3, 4, 2])
    raws = (rng.standard_normal((60, 3)) * 0.01).cumsum(0).astype(F32)
    a = fit_cache_policy(m, raws, tick_ns=np.int64(5), simd="scalar")
    b = fit_cache_policy(m, raws, tick_ns=5, simd="scalar")
    assert a[0] == b[0] and a[1].rows == b[1].rows


@pytest.mark.parametrize("policy,match", [
    (CachePolicy(max_run=0), "max_run 0, which allows no hit"),
    (CachePolicy(max_age_ns=10), r"max_age_ns 10, less than the 1000000 ns"),
])
def test_a_fit_that_no_guard_lets_hit_names_the_guard(policy, match):
    # the note said "fit on a longer recording" when the age or run guard kept from the
    # model's policy allowed no hit on any recording
    rng = np.random.default_rng(13)
    m = random_model(rng, [3, 4, 2]).with_cache_policy(policy)
    raws = (rng.standard_normal((120, 3)) * 0.001).cumsum(0).astype(F32)
    pol, rep = fit_cache_policy(m, raws, simd="scalar")
    assert not pol.enabled and not any(r["hits"] for r in rep.rows)
    assert re.search(match, rep.note) and "longer recording" not in rep.note
    # a stream too short to hit keeps its advice
    pol, rep = fit_cache_policy(random_model(rng, [3, 4, 2]), raws[:1], simd="scalar")
    assert "longer recording" in rep.note


def test_fit_cache_policy_report_matches_its_own_replays():
    # each row recomputed from a cache-less and a cached engine over the same ticks, and the
    # choice from the rows: the highest hit rate within the budget, ties in grid order
    rng = np.random.default_rng(18)
    m = random_model(rng, [3, 8, 2], scale=3.0)
    n = 400
    raws = (rng.standard_normal((n, 3)) * 0.02).cumsum(0).astype(F32)
    sy = rng.choice([5, 9], n)
    dense = (sy == 9).astype(np.int32)
    cos_grid, norm_grid = (0.99, 0.999, 0.9999), (0.05, 0.01)
    pol, rep = fit_cache_policy(m, raws, sy, max_error=0.02, cos_grid=cos_grid,
                                norm_grid=norm_grid, simd="scalar")
    cfg = {"engine": {"n_symbols": 2, "simd": "scalar"},
           "memory": {"huge_pages": "none", "mlock": False}}
    ts = np.arange(n, dtype=np.int64) * 1_000_000
    off = m.with_cache_policy(CachePolicy())
    fresh = Engine(off, config=cfg).step_batch(raws, dense, ts).signal
    rows = iter(rep.rows)
    best = None
    for c in cos_grid:
        for t in norm_grid:
            cand = CachePolicy(True, c, t, m.cache_policy.max_age_ns, m.cache_policy.max_run)
            res = Engine(m.with_cache_policy(cand), config=cfg).step_batch(raws, dense, ts)
            h = res.cached
            err = np.abs(res.signal[h].astype(np.float64) - fresh[h])
            row = next(rows)
            assert (row["cos_threshold"], row["norm_tol"]) == (c, t)
            assert row["hits"] == h.sum() and row["hit_rate"] == pytest.approx(h.mean())
            assert row["max_error"] == pytest.approx(err.max() if len(err) else 0.0)
            ok = h.sum() > 0 and (err.max() if len(err) else 0.0) <= 0.02
            assert row["within_budget"] == (len(err) == 0 or err.max() <= 0.02)
            if ok and (best is None or h.mean() > best[0]):
                best = (h.mean(), c, t)
    if best is None:
        assert not pol.enabled and rep.chosen is None
    else:
        assert pol.enabled and (pol.cos_threshold, pol.norm_tol) == best[1:]
        assert pol.fitted_max_error == 0.02


def test_weights_error_matches_its_own_replays():
    from fastpath.tuning import weights_error
    rng = np.random.default_rng(19)
    m = random_model(rng, [6, 16, 2], scale=2.0)
    raws = rng.standard_normal((300, 6)).astype(F32)
    sy = rng.choice([2, 70], 300)
    cfg = {"engine": {"n_symbols": 2, "simd": "scalar"},
           "memory": {"huge_pages": "none", "mlock": False}}
    dense = (sy == 70).astype(np.int32)
    ts = np.arange(300, dtype=np.int64) * 1_000_000
    off = m.with_cache_policy(CachePolicy())
    ref = Engine(off, config=cfg).step_batch(raws, dense, ts).signal.astype(np.float64)
    for wt in ("bf16", "int8"):
        got = Engine(off.with_weights(wt), config=cfg).step_batch(raws, dense, ts).signal
        d = np.abs(got - ref)
        r = weights_error(m, raws, wt, sy, simd="scalar")
        assert r["n"] == 300 and r["max_abs"] == pytest.approx(d.max())
        assert r["mean_abs"] == pytest.approx(d.mean()) and r["worst_tick"] == int(np.argmax(d))
        assert r["sign_flips"] == int(np.sum(np.sign(got) * np.sign(ref) < 0))
