"""Rolling windows about a reference tick: the ticks on which a window heals, refusals, paths.

The window's sums are of x - ref (fp_features.h), and a commit recomputes them from the ring
("heals") when an outlier leaves or the mean has moved far from ref. The features of a tick
are computed before its commit, so the tick that heals needs them from the ring as well:
these tests check every tick's window features against a two-pass float64 reference, the
heal ticks included, and that the three ways in (step, step_batch, begin/finish) and every
kernel set (the `isa` fixture) agree bit for bit. A refused tick leaves the window as it was.
"""
import numpy as np
import pytest

from fastpath import Engine, InputError
from fastpath.model import CachePolicy, FeatureSpec, Layer, Model, window_pre_features

F32 = np.float32


def _model(n_w, W, inv_std=None, refuse=False, seed=0):
    """raw = [window fields (n_w), one z field]; features = [z, means, stds], unscaled unless
    inv_std is given. refuse: a z field of 1e10 overflows the one layer (the tick is refused)."""
    rng = np.random.default_rng(seed)
    inv = np.ones(1 + 2 * n_w, F32) if inv_std is None else np.asarray(inv_std, F32)
    fs = FeatureSpec(n_w + 1, np.array([n_w]), np.arange(n_w), W, np.zeros(1 + 2 * n_w, F32),
                     inv)
    w = rng.standard_normal((2, 1 + 2 * n_w)).astype(F32) * 1e-20
    if refuse:
        w[:, 0] = 1e30
    return Model((Layer(w, np.zeros(2, F32), "identity"),), fs, CachePolicy(enabled=False))


def _engine(m, isa, n_symbols=1):
    return Engine(m, config={"engine": {"simd": isa, "n_symbols": n_symbols}})


def _two_pass(win):
    w = np.asarray(win, np.float64)
    mu = w.mean(0)
    return mu, np.sqrt(((w - mu) ** 2).mean(0))


def _prices(rng, n, n_w, level=100.0, spread=0.01):
    p = np.zeros((n, n_w + 1), F32)
    p[:, :n_w] = level + rng.standard_normal((n, n_w)) * spread
    return p


def _check_every_tick(e, p, n_w, W, skip=(), scale=1.0):
    """features of every tick (before it is stepped) against the two-pass window (features
    over inv_std = scale: the window's own mean and std)"""
    for i in range(len(p)):
        if i not in skip:
            got = e.features(p[i]).astype(np.float64) / scale
            mu, sd = _two_pass(p[max(0, i - W + 1):i + 1, :n_w])
            np.testing.assert_allclose(got[1:1 + n_w], mu, rtol=1e-6, err_msg=f"mean, tick {i}")
            np.testing.assert_allclose(got[1 + n_w:], sd, rtol=1e-3, atol=1e-6,
                                       err_msg=f"std, tick {i}")
        e.step(p[i])


# ------------------------------------------------------------------ the healing tick itself
@pytest.mark.parametrize("W", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("phase", [0, 1, -1])
def test_the_tick_an_outlier_leaves_on_gets_its_windows_features(isa, W, phase):
    # a finite bad print (1e18 among prices ~100, spread 0.01) is accepted; on the tick whose
    # window it has just left, the commit heals, but the features came from the sums before
    # it: the mean 128 (a double's step at 1e18 is 128) and the std 0 or 1e10, and at W = 1
    # every tick after the outlier's was measured from it. Every tick whose window does not
    # hold the outlier is checked, the heal tick included
    rng = np.random.default_rng(W)
    n_w = 3
    n = 5 * W + 6
    p = _prices(rng, n, n_w)
    o = W + 1 + phase % W
    p[o, 1] = 1e18
    e = _engine(_model(n_w, W), isa)
    _check_every_tick(e, p, n_w, W, skip=range(o, o + W))


@pytest.mark.parametrize("W", [32, 64, 100])
def test_a_move_far_from_ref_heals_on_that_tick(isa, W):
    """Defect guarded: an integer field near 1 that jumps by 2^24 leaves running sums of (x -
    ref)^2 ~ 2^48 W that lose the std to cancellation (0.3% off at W = 32, 4% at W = 100) on the
    tick the window is all at the new level; the commit heals on that tick and its features come
    from the ring."""
    rng = np.random.default_rng(W)
    n_w = 2
    n = 4 * W + 3
    p = np.zeros((n, n_w + 1), F32)
    jump = 2 * W + 1
    p[:, :n_w] = (1.0 + np.cumsum(rng.integers(-1, 2, (n, n_w)), axis=0)
                  + np.where(np.arange(n) >= jump, 2.0 ** 24, 0.0)[:, None])
    e = _engine(_model(n_w, W), isa)
    _check_every_tick(e, p, n_w, W)


@pytest.mark.parametrize("W", [1, 3, 8])
def test_heal_tick_features_same_on_every_path(isa, W):
    # step, step_batch and the begin/finish path (an external backend's) all take the
    # features from fp_features_compute: the same bits on the heal ticks as elsewhere, and a
    # window afterwards that gives the same next features
    rng = np.random.default_rng(W + 10)
    n_w = 5
    n = 6 * W + 5
    p = _prices(rng, n, n_w)
    p[W + 1, 2] = 1e18
    p[2 * W + 2, 4] = -3e17
    m = _model(n_w, W)
    a, b, c = _engine(m, isa), _engine(m, isa), _engine(m, isa)
    for i in range(n):
        fa, fb, fc = a.features(p[i]), b.features(p[i]), c.features(p[i])
        np.testing.assert_array_equal(fa, fb, err_msg=f"tick {i}")
        np.testing.assert_array_equal(fa, fc, err_msg=f"tick {i}")
        a.step(p[i])
        b.step_batch(p[i:i + 1].copy(), np.zeros(1, np.int32))
        c._step_external(p[i], 0, np.zeros(2, F32), 0)


def test_heal_tick_features_same_bits_on_every_set():
    # the exact path (window_sums and window_stats of each set) against the scalar twin's
    from fastpath._engine import supported_isas
    rng = np.random.default_rng(7)
    n_w, W = 11, 6
    n = 8 * W
    p = _prices(rng, n, n_w, level=1e5, spread=2.0 ** -7)
    for j in range(n_w):
        p[W + j % W, j] = 1e18 if j % 2 else -1e17
    got = {}
    for isa in supported_isas():
        e = _engine(_model(n_w, W), isa)
        rows = []
        for i in range(n):
            rows.append(e.features(p[i]))
            e.step(p[i])
        got[isa] = np.array(rows)
    for isa, f in got.items():
        np.testing.assert_array_equal(f, got["scalar"], err_msg=isa)


# ------------------------------------------------------------------ refusals
@pytest.mark.parametrize("W", [1, 2, 3, 4, 9])
@pytest.mark.parametrize("n_w", [1, 3, 9, 17])
def test_refusals_everywhere_leave_every_symbol_as_a_clean_engine(isa, W, n_w):
    # three symbols interleaved, outliers that heal on leaving, and a refused tick after
    # every good one (at row 0, at the wrap, on healing ticks): each symbol's next features
    # bit for bit those of an engine that never saw a refused tick
    rng = np.random.default_rng(W * 31 + n_w)
    n = 3 * (4 * W + 6)
    p = _prices(rng, n, n_w, level=1e4, spread=0.5)
    p[rng.integers(0, n, 4), rng.integers(0, n_w, 4)] = F32(1e18)
    sym = np.arange(n) % 3
    m = _model(n_w, W, refuse=True)
    e, clean = _engine(m, isa, 3), _engine(m, isa, 3)
    for i in range(n):
        bad = p[i].copy()
        bad[n_w] = 1e10
        with pytest.raises(InputError):
            e.step(bad, int(sym[i]))
        for s in range(3):
            np.testing.assert_array_equal(e.features(p[i], s), clean.features(p[i], s),
                                          err_msg=f"tick {i} symbol {s}")
        e.step(p[i], int(sym[i]))
        clean.step(p[i], int(sym[i]))


# ------------------------------------------------------------------ reset, reference
def test_reset_of_one_symbol_starts_it_as_a_fresh_engine(isa):
    # Engine.reset(symbol) zeroes the symbol's window block: count, pos, sums and refs; the
    # next ticks are those of an engine that never saw the symbol, the others untouched
    rng = np.random.default_rng(3)
    n_w, W = 4, 5
    p = _prices(rng, 40, n_w, level=1e5, spread=2.0 ** -7)
    m = _model(n_w, W)
    e, fresh, other = _engine(m, isa, 2), _engine(m, isa, 2), _engine(m, isa, 2)
    for i in range(23):
        e.step(p[i], 0)
        e.step(p[i], 1)
        other.step(p[i], 1)
    e.reset(0)
    for i in range(23, 40):
        np.testing.assert_array_equal(e.features(p[i], 0), fresh.features(p[i], 0))
        np.testing.assert_array_equal(e.features(p[i], 1), other.features(p[i], 1))
        e.step(p[i], 0)
        fresh.step(p[i], 0)
        e.step(p[i], 1)
        other.step(p[i], 1)


@pytest.mark.parametrize("n", [1, 2, 5])
def test_numpy_reference_short_multi_symbol_streams_match_the_engine(isa, n):
    # fewer ticks than the window, symbols interleaved: the reference's warm-up windows
    rng = np.random.default_rng(n)
    n_w, W = 3, 8
    p = _prices(rng, 3 * n, n_w, level=1e5, spread=2.0 ** -7)
    sym = np.repeat(np.arange(3), n)
    rng.shuffle(sym)
    want = window_pre_features(p, sym, np.array([n_w]), np.arange(n_w), W)
    e = _engine(_model(n_w, W), isa, 3)
    for i in range(len(p)):
        got = e.features(p[i], int(sym[i]))
        np.testing.assert_allclose(got[1:1 + n_w], want[i, 1:1 + n_w], rtol=1e-7)
        np.testing.assert_allclose(got[1 + n_w:], want[i, 1 + n_w:], rtol=1e-4, atol=1e-6)
        e.step(p[i], int(sym[i]))


# ------------------------------------------------------------------ tiny and huge values
@pytest.mark.parametrize("scale", [1e-30, 1e-22, 1e-20, 1e-40])
def test_std_of_a_field_in_a_tiny_unit_is_not_flushed_to_zero(isa, scale):
    # values ~scale with a spread of scale/10: the std (1e-31 at 1e-30) is a float, its
    # variance (1e-62) is below the smallest one, and the std came out 0 (a subnormal
    # variance kept a few bits of it); the root is now taken of the variance scaled by 2^200 where it is below 2^-100, on every set
    rng = np.random.default_rng(int(-np.log10(scale)))
    n_w, W = 3, 6
    n = 4 * W
    p = np.zeros((n, n_w + 1), F32)
    p[:, :n_w] = (scale * (1 + 0.1 * rng.standard_normal((n, n_w)))).astype(F32)
    e = _engine(_model(n_w, W), isa)
    for i in range(n):
        got = e.features(p[i])
        mu, sd = _two_pass(p[max(0, i - W + 1):i + 1, :n_w])
        # the values themselves are floats near the subnormal range at 1e-40: a few ulps
        np.testing.assert_allclose(got[1 + n_w:], sd, rtol=1e-4 if scale > 1e-38 else 1e-2,
                                   atol=0, err_msg=f"tick {i}")
        e.step(p[i])


@pytest.mark.parametrize("n_w", [1, 4, 8, 11])
def test_kernel_std_root_keeps_tiny_stds_and_inf_past_float(isa, n_w):
    # window_stats on every set against the scalar twin: variances from 1e-90 to 1e77 about
    # the float range's ends, the std from a float root of the variance (scaled by 2^200 below 2^-100), Inf where the variance is past
    # what a float holds (the overflowed-feature refusal stays)
    import fastpath._kernels as K
    vals = np.array([1e-45, 1e-30, 1e-22, 3e-20, 1.0, 1e19, 1.8446743e19, 1.9e19, 1e20, 3e30,
                     3.4e38], np.float64)[:n_w]
    v32 = vals.astype(F32)
    sums, sq = -v32.astype(np.float64), v32.astype(np.float64) ** 2
    pm, ps = K.kernel_window_stats(isa, v32, np.arange(n_w), sums, sq, None, 0.5)
    sd = np.abs(v32.astype(np.float64))
    with np.errstate(over="ignore"):
        var_as_float = (sd * sd).astype(F32)
    want = np.where(np.isinf(var_as_float), np.inf, sd).astype(F32)
    np.testing.assert_allclose(ps, want, rtol=1e-6)
    np.testing.assert_array_equal(ps, K.kernel_window_stats("scalar", v32, np.arange(n_w), sums,
                                                            sq, None, 0.5)[1])
