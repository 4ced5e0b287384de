"""Rolling windows on every kernel set against scalar, bit for bit, where q/n - mean^2 cancels
(prices near 1e5 with a small spread): window stats, the engine's window features, healing
once an outlier has left, the sums renewed at each wrap, and refused ticks."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import fastpath._kernels as K
from fastpath import Engine, InputError
from fastpath.model import CachePolicy, FeatureSpec, Layer, Model
from helpers.builders import ISAS
from helpers.refusing_models import F32, refusing_model


def _window_args(rng, n_w, W, base, step):
    """A ring of W ticks per field (a random walk of `step` around `base`, as float32 prices)
    with its running sums as the commit kernel keeps them (float64, tick by tick)."""
    walk = base + np.cumsum(rng.integers(-1, 2, (W + 1, n_w)) * step, axis=0)
    hist = walk.astype(F32)
    raw = np.zeros(64, F32)
    w_idx = rng.choice(64, n_w, replace=False).astype(np.int32)
    raw[w_idx] = hist[-1]
    ring = hist[:W].astype(np.float64)
    s, q = np.zeros(n_w), np.zeros(n_w)
    for row in ring:
        s, q = s + row, q + row * row
    return raw, w_idx, s, q, hist[0]


# ------------------------------------------------------------------ rolling std, cancelling
@pytest.mark.parametrize("n_w", [1, 3, 4, 5, 7, 8, 9, 16, 17])
@pytest.mark.parametrize("full", [False, True])
def test_window_stats_same_bits_as_scalar_where_the_variance_cancels(isa, n_w, full):
    """Defect guarded: the vector sets fused mean*mean into the variance's subtraction (one
    rounding fewer than scalar) and gave a rolling std ~1% off scalar's where q/n and mean^2
    cancel (~1e10 each, difference ~1e-4)."""
    rng = np.random.default_rng(n_w * 2 + full)
    W = 100
    for base, step in ((1e5, 2.0 ** -7), (6.4e4, 2.0 ** -8), (3e3, 2.0 ** -13)):
        raw, w_idx, s, q, old = _window_args(rng, n_w, W, base, step)
        o = old if full else None
        inv_n = 1.0 / (W if full else W + 1)
        got = K.kernel_window_stats(isa, raw, w_idx, s, q, o, inv_n)
        want = K.kernel_window_stats("scalar", raw, w_idx, s, q, o, inv_n)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
        mean = np.zeros(2 * n_w, F32)
        inv = np.ones(2 * n_w, F32)
        np.testing.assert_array_equal(
            K.kernel_window_zscore(isa, raw, w_idx, s, q, o, inv_n, mean, inv),
            K.kernel_window_zscore("scalar", raw, w_idx, s, q, o, inv_n, mean, inv))


@settings(max_examples=60, deadline=None)
@given(n_w=st.integers(1, 20), base=st.floats(1.0, 1e6), log_step=st.integers(-20, -4),
       W=st.integers(2, 300), seed=st.integers(0, 2 ** 31))
def test_window_stats_every_set_same_bits_property(n_w, base, log_step, W, seed):
    rng = np.random.default_rng(seed)
    raw, w_idx, s, q, old = _window_args(rng, n_w, W, base, 2.0 ** log_step)
    want = K.kernel_window_stats("scalar", raw, w_idx, s, q, old, 1.0 / W)
    for isa in ISAS:
        got = K.kernel_window_stats(isa, raw, w_idx, s, q, old, 1.0 / W)
        np.testing.assert_array_equal(got[0], want[0], err_msg=isa)
        np.testing.assert_array_equal(got[1], want[1], err_msg=isa)


def test_engine_window_features_same_bits_on_every_set():
    # the same through the engine: four price fields at ~1e5 over a long run, the window
    # features of the next tick on each set against scalar's
    rng = np.random.default_rng(7)
    n_w, W, N = 4, 100, 5000
    fs = FeatureSpec(n_w, np.array([0]), np.arange(n_w), W, np.zeros(1 + 2 * n_w, F32),
                     np.ones(1 + 2 * n_w, F32))
    m = Model((Layer(rng.standard_normal((2, 1 + 2 * n_w)).astype(F32) * 1e-3,
                     np.zeros(2, F32), "identity"),), fs, CachePolicy(enabled=False))
    raws = (1e5 + np.cumsum(rng.integers(-1, 2, (N, n_w)), axis=0) * 2.0 ** -7).astype(F32)
    feats = {}
    for isa in ISAS:
        e = Engine(m, config={"engine": {"simd": isa, "n_symbols": 1}})
        e.step_batch(raws[:-1], np.zeros(N - 1, np.int32))
        feats[isa] = e.features(raws[-1])
    for isa in ISAS:
        np.testing.assert_array_equal(feats[isa], feats["scalar"], err_msg=isa)


# ------------------------------------------------------------------ window sums renewed
def _window_model(W, n_w=1, seed=0):
    rng = np.random.default_rng(seed)
    fs = FeatureSpec(n_w, np.array([0]), np.arange(n_w), W, np.zeros(1 + 2 * n_w, F32),
                     np.ones(1 + 2 * n_w, F32))
    return Model((Layer(rng.standard_normal((2, 1 + 2 * n_w)).astype(F32) * 1e-20,
                        np.zeros(2, F32), "identity"),), fs, CachePolicy(enabled=False))


def _fresh_features(m, isa, ticks, nxt):
    """The features of tick `nxt` on an engine that saw only `ticks` (no subtraction yet)."""
    e = Engine(m, config={"engine": {"simd": isa, "n_symbols": 1}})
    e.step_batch(np.ascontiguousarray(ticks), np.zeros(len(ticks), np.int32))
    return e.features(nxt)


@pytest.mark.parametrize("W", [2, 5, 20, 64])
@pytest.mark.parametrize("by", ["step", "step_batch"])
def test_window_heals_once_a_finite_outlier_has_left(isa, W, by):
    # a bad print of 1e18 among prices ~100 is finite and accepted; entering, its square
    # absorbed the other ticks' share of the running sums, and leaving, it took that share
    # with it: the mean stayed 2.5 off and the std 0 on every later tick of the symbol
    rng = np.random.default_rng(W)
    m = _window_model(W, n_w=3)
    n = 6 * W + 3
    p = (100 + rng.standard_normal((n, 3))).astype(F32)
    p[W // 2 + 1, 1] = 1e18
    k = W // 2 + 2 + W                    # ticks seen by the time the outlier has just left
    while k < n:
        e = Engine(m, config={"engine": {"simd": isa, "n_symbols": 1}})
        if by == "step":
            for i in range(k):
                e.step(p[i])
        else:
            e.step_batch(p[:k], np.zeros(k, np.int32))
        got = e.features(p[k])
        want = _fresh_features(m, isa, p[k - W + 1:k], p[k])
        window = p[k - W + 1:k + 1].astype(np.float64)
        np.testing.assert_allclose(got[1:4], window.mean(0), rtol=1e-6)
        np.testing.assert_allclose(got[4:], want[4:], rtol=1e-3, atol=1e-4)
        np.testing.assert_allclose(got[4:], window.std(0), rtol=1e-3, atol=1e-4)
        k += W // 2 + 1


@pytest.mark.parametrize("W", [3, 100])
def test_window_sums_renewed_at_every_wrap(isa, W):
    """At 1e5 the squares sum past 2^53 of their granularity, so each add-new/subtract-old loses
    bits and the residue random-walks; at each wrap the sums are those of the window's ticks
    added afresh: the same bits as an engine that saw only those ticks."""
    rng = np.random.default_rng(W)
    m = _window_model(W, n_w=4)
    N = 60 * W
    p = (1e5 + rng.standard_normal((N + 1, 4)) * 4).astype(F32)
    e = Engine(m, config={"engine": {"simd": isa, "n_symbols": 1}})
    e.step_batch(p[:N], np.zeros(N, np.int32))
    got = e.features(p[N])
    # the fresh engine: the last W ticks, so its ring has wrapped once too
    want = _fresh_features(m, isa, p[N - W:N], p[N])
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("W", [3, 7])
@pytest.mark.parametrize("by", ["step", "step_batch"])
def test_refused_ticks_leave_the_fresh_sums_as_they_were(isa, W, by):
    # ticks the model refuses (a z-scored field of 1e10 times a weight of 1e30 overflows)
    # between good ones: fp_step commits the window first and restores it from the undo
    # record, the fresh sums included, so at every wrap the window is bit for bit that of an
    # engine that never saw them
    rng = np.random.default_rng(W)
    n_w = 3
    m = refusing_model(rng, n_w, W, 1e-6)
    good = np.zeros((8 * W + 1, n_w + 1), F32)
    good[:, :n_w] = 1e5 + rng.standard_normal((8 * W + 1, n_w)) * 3
    bad = good[0].copy()
    bad[:n_w] = 7e4
    bad[n_w] = 1e10
    e = Engine(m, config={"engine": {"simd": isa, "n_symbols": 1}})
    clean = Engine(m, config={"engine": {"simd": isa, "n_symbols": 1}})
    for i in range(8 * W):
        if i % 3 == 1:
            with pytest.raises(InputError):
                if by == "step":
                    e.step(bad)
                else:
                    e.step_batch(bad[None, :].copy(), np.zeros(1, np.int32))
        e.step(good[i])
        clean.step(good[i])
        np.testing.assert_array_equal(e.features(good[i + 1]), clean.features(good[i + 1]))
