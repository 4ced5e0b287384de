"""Kernel sets against the scalar one at the numeric edges: the rolling std where q/n - mean^2
cancels (prices ~1e5 with a small spread), bf16 inputs and weights near FLT_MAX. Every test
runs on every kernel set the CPU has (the `isa` fixture) or every variant it runs."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import fastpath._kernels as K
from fastpath import Engine, InputError
from fastpath._kernels import LowpMLP, kernel_lowp_dense, lowp_variants
from fastpath.model import CachePolicy, FeatureSpec, Layer, Model

from helpers.builders import ISAS
from helpers.models import F32, refusing_model  # noqa: F401

FLT_MAX = float(np.finfo(F32).max)
_, HAVE_BF16 = lowp_variants("bf16")


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
    # q/n and mean^2 are ~1e10 and their difference ~1e-4: the vector sets used to fuse
    # mean*mean into the subtraction (GCC contracts the intrinsics), one rounding fewer than
    # scalar, and gave a std ~1% away from it (AVX2 from 4 fields, AVX-512 from 1)
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


# ------------------------------------------------------------------ bf16 near FLT_MAX
@pytest.mark.parametrize("variant", ["scalar", "avx2", "avx512", "avx512_bf16"])
def test_bf16_inputs_near_flt_max_are_accepted_as_scalar_does(variant):
    # the native AVX-512 BF16 form rounded x's high half to nearest-even bf16: every finite
    # |x| above ~3.3961e38 became Inf, and the layer was refused where the other forms (and
    # the fp32 model) return finite outputs
    if variant not in HAVE_BF16:
        pytest.skip(f"this CPU does not run the {variant} bf16 kernel")
    w = np.full((9, 3), 0.25, F32)
    b = np.zeros(9, F32)
    for v in (3.3961e38, 3.3999e38, FLT_MAX, -FLT_MAX, 1.7e38):
        x = np.array([v, 1.0, -2.0], F32)
        y, ok = kernel_lowp_dense("bf16", variant, w, b, "identity", x)
        ys, oks = kernel_lowp_dense("bf16", "scalar", w, b, "identity", x)
        assert oks and ok, (variant, v)
        np.testing.assert_allclose(y, ys, rtol=3e-5)


@pytest.mark.parametrize("weight", [3.3961e38, 3.4e38, FLT_MAX, -FLT_MAX])
def test_bf16_weight_near_flt_max_keeps_the_largest_finite_bf16(isa, weight):
    # a finite fp32 weight that nearest-even bf16 takes to Inf made every tick non-finite
    # (Inf * 0 is NaN): the packed weight is now bf16's largest finite, one bf16 step away
    rng = np.random.default_rng(3)
    w1 = rng.standard_normal((9, 5)).astype(F32) * 0.1
    w1[2, 0] = weight
    w2 = rng.standard_normal((2, 9)).astype(F32) * 0.1
    b1, b2 = np.zeros(9, F32), np.zeros(2, F32)
    x = rng.standard_normal(5).astype(F32)
    x[0] = 0.0                                           # the huge weight meets a zero input
    ref = LowpMLP([w1, w2], [b1, b2], ["tanh", "identity"], weight_type="fp32", isa=isa)
    m = LowpMLP([w1, w2], [b1, b2], ["tanh", "identity"], weight_type="bf16", isa=isa)
    np.testing.assert_allclose(m.forward(x), ref.forward(x), rtol=1e-2, atol=1e-3)
    x[0] = 1e-30                                          # and a tiny one: 3.4e8, tanh -> 1
    np.testing.assert_allclose(m.forward(x), ref.forward(x), rtol=1e-2, atol=1e-3)


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
    # at 1e5 the squares sum past 2^53 of their granularity, so every add-new/subtract-old
    # rounds and the residue random-walks; at each wrap the sums are now those of the window's
    # ticks added afresh: the same bits as an engine that saw only those ticks
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


# ------------------------------------------------------------------ overflow in one order only
def _overflow_case(rng, n, o):
    """A layer whose float32 sums overflow in some summation orders and not in others: terms
    of +-0.2..0.6 FLT_MAX, so a partial sum leaves the range or not by the order it is
    summed in, while the exact pre-activation is mostly finite."""
    w = (rng.choice([-1, 1], (o, n)) * rng.uniform(0.2, 0.6, (o, n)) * FLT_MAX).astype(F32)
    return w, np.ones(n, F32)


@pytest.mark.parametrize("weights", ["fp32", "bf16"])
def test_a_layer_is_refused_by_its_exact_sum_not_by_the_order_of_a_set(weights):
    # every set summed the row in its own order (scalar input by input, AVX2 in 4 chains,
    # AVX-512 in even/odd halves and chains) and refused where its own partial sums overflowed:
    # one tick in ten of these was refused by one set and answered by another. A layer whose
    # float32 sums overflow is now summed again in double, and refused only when its exact
    # pre-activation does not fit a float32, the same decision on every set
    rng = np.random.default_rng(5)
    fs = None
    decisions = []
    for t in range(300):
        n = int(rng.choice([3, 4, 5, 8, 9, 16, 17, 31, 33, 64, 65]))
        o = int(rng.choice([1, 2, 7, 9, 17]))
        w, x = _overflow_case(rng, n, o)
        w2 = np.full((2, o), 1e-38, F32)
        m = Model((Layer(w, np.zeros(o, F32), "identity"), Layer(w2, np.zeros(2, F32), "identity")),
                  fs, CachePolicy(enabled=False))
        m = m.with_weights(weights)
        wq = w.astype(np.float64)
        if weights == "bf16":
            u = w.view(np.uint32).astype(np.uint64)
            wq = ((((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32)
                  .view(F32).astype(np.float64))
        exact = wq @ x.astype(np.float64)
        if np.any(np.abs(np.abs(exact) / FLT_MAX - 1) < 1e-4):
            continue                                  # rounding decides there: not this test
        want_ok = bool(np.all(np.abs(exact) < FLT_MAX))
        row = []
        for isa in ISAS:
            e = Engine(m, config={"engine": {"simd": isa, "n_symbols": 1}})
            try:
                e.predict(x)
                row.append(True)
            except InputError:
                row.append(False)
        decisions.append((row, want_ok))
        assert row == [want_ok] * len(ISAS), (t, n, o, dict(zip(ISAS, row)), want_ok)
    assert sum(ok for _, ok in decisions) > 20 and sum(not ok for _, ok in decisions) > 20


def test_int8_row_with_one_huge_weight_is_not_refused_for_its_scale(isa):
    # the int8 kernels scale a row's dot by s1 * s_w (x's step, max|x| / 127, times the row's,
    # max|w| / 127): a weight near FLT_MAX under an input of 20000 made that product Inf, and
    # the row's dot of 0 (its huge weight meets a small input) then NaN: refused, where the
    # pre-activation (FLT_MAX * 0.5) is inside the range
    w1 = np.zeros((3, 2), F32)
    w1[0, 0] = FLT_MAX
    w1[1, 1] = 1e-3
    w1[2] = [0.0, -1e-4]
    w2 = np.array([[1e-3, 2e-3, 3e-3], [1e-3, -1e-3, 1e-3]], F32)
    m = Model((Layer(w1, np.zeros(3, F32), "tanh"), Layer(w2, np.zeros(2, F32), "identity")),
              None, CachePolicy(enabled=False))
    x = np.array([0.5, 20000.0], F32)
    ref = Engine(m, config={"engine": {"simd": isa, "n_symbols": 1}}).predict(x)
    cfg = {"engine": {"simd": isa, "n_symbols": 1}}
    got = Engine(m.with_weights("int8"), config=cfg).predict(x)
    np.testing.assert_allclose(got, ref, rtol=1e-2, atol=1e-4)
