"""Rolling window features at price levels: the std where q/n - mean^2 cancels.

Sums of raw prices at 1e5 with a spread of 0.01 kept a few bits of the variance (the std a
few % off; at 1e7 with a spread of 1, ~1%). The window's sums are now of x - ref, ref a tick
of the window's own (fp_features.h), and a window whose ref has stopped being one like its
ticks (an outlier that has left, a move into a flat run) is recomputed about its newest
tick. Every test runs on every kernel set the CPU has (the `isa` fixture)."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import fastpath._kernels as K
from fastpath import Engine, InputError
from fastpath.model import CachePolicy, FeatureSpec, Layer, Model, window_pre_features

from helpers.refusing_models import refusing_model

F32 = np.float32


def _identity_window_model(n_w, W, seed=0):
    """Features = [raw[n_w] (z-scored as is), rolling means, rolling stds] unscaled, so
    Engine.features() shows the window's own mean and std."""
    rng = np.random.default_rng(seed)
    fs = FeatureSpec(n_w + 1, np.array([n_w]), np.arange(n_w), W, np.zeros(1 + 2 * n_w, F32),
                     np.ones(1 + 2 * n_w, F32))
    return Model((Layer(rng.standard_normal((2, 1 + 2 * n_w)).astype(F32) * 1e-20,
                        np.zeros(2, F32), "identity"),), fs, CachePolicy(enabled=False))


def _two_pass(window):
    w = np.asarray(window, np.float64)
    mu = w.mean(0)
    return mu, np.sqrt(((w - mu) ** 2).mean(0))


def _walk(rng, n, n_w, level, step):
    """float32 prices: a random walk of +-step (or 0) around level, one column per field"""
    p = np.zeros((n, n_w + 1), F32)
    p[:, :n_w] = level + np.cumsum(rng.integers(-1, 2, (n, n_w)), axis=0) * step
    p[:, n_w] = rng.standard_normal(n)
    return p


# ------------------------------------------------------------------ the reference itself
def test_numpy_reference_is_two_pass_at_price_levels():
    """Defect guarded: window_pre_features (used by FeatureSpec.apply and .fit) summed over the
    whole stream, losing the window's variance at price levels; each tick's window is computed
    in two passes, checked against a plain loop."""
    rng = np.random.default_rng(3)
    n, W = 3000, 40
    p = _walk(rng, n, 2, 1e5, 2.0 ** -7)
    p[:, 0] += 4e4 * np.sin(np.arange(n) / 500)      # a level that moves (float32 again)
    p = p.astype(F32)
    sym = rng.integers(0, 3, n)
    pre = window_pre_features(p, sym, np.array([2]), np.arange(2), W)
    for s in range(3):
        rows = np.flatnonzero(sym == s)
        for j, r in enumerate(rows):
            win = p[rows[max(0, j - W + 1):j + 1], :2]
            mu, sd = _two_pass(win)
            np.testing.assert_allclose(pre[r, 1:3], mu, rtol=1e-7)
            np.testing.assert_allclose(pre[r, 3:5], sd, rtol=2e-6, atol=1e-9)


# ------------------------------------------------------------------ kernels
@pytest.mark.parametrize("full", [False, True])
def test_kernel_std_about_a_ref_keeps_what_raw_sums_lose(isa, full):
    # the same window through window_stats twice: sums of raw values (ref 0) and sums about
    # the window's first tick. About the tick, the std is the two-pass one to float32
    # precision; the raw sums (what the engine kept before) miss it by a few %
    rng = np.random.default_rng(11 + full)
    n_w, W = 8, 100
    hist = (1e5 + np.cumsum(rng.integers(-1, 2, (W + 1, n_w)), axis=0) * 2.0 ** -7).astype(F32)
    raw = np.zeros(16, F32)
    w_idx = np.arange(3, 3 + n_w, dtype=np.int32)
    raw[w_idx] = hist[-1]
    kept = hist[1:] if full else hist
    mu, sd = _two_pass(kept)
    inv_n = 1.0 / len(kept)
    old = hist[0] if full else None
    ring = hist[:W].astype(np.float64)
    ref = ring[0].copy()
    pm, ps = K.kernel_window_stats(isa, raw, w_idx, (ring - ref).sum(0), ((ring - ref) ** 2).sum(0),
                                   old, inv_n, ref=ref)
    np.testing.assert_allclose(ps, sd, rtol=1e-6)
    np.testing.assert_allclose(pm, mu, rtol=1e-7)
    pm0, ps0 = K.kernel_window_stats(isa, raw, w_idx, ring.sum(0), (ring ** 2).sum(0), old, inv_n)
    assert np.max(np.abs(ps0 / sd - 1)) > 1e-3     # what raw sums gave: the cancellation
    # every set the same bits as scalar, about the ref
    want = K.kernel_window_stats("scalar", raw, w_idx, (ring - ref).sum(0),
                                 ((ring - ref) ** 2).sum(0), old, inv_n, ref=ref)
    np.testing.assert_array_equal(pm, want[0])
    np.testing.assert_array_equal(ps, want[1])
    mean = rng.standard_normal(2 * n_w).astype(F32)
    inv = (rng.random(2 * n_w) + 0.5).astype(F32)
    np.testing.assert_array_equal(
        K.kernel_window_zscore(isa, raw, w_idx, (ring - ref).sum(0), ((ring - ref) ** 2).sum(0),
                               old, inv_n, mean, inv, ref=ref),
        (np.concatenate([pm, ps]) - mean) * inv)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.integers(0, 130), n=st.integers(1, 40), level=st.sampled_from([0.0, 1e5, -3e7]),
       seed=st.integers(0, 2 ** 31))
def test_window_sums_kernel_matches_a_row_by_row_float64_sum(isa, rows, n, level, seed):
    """The heal's kernel: every field's sums about its ref, rows in order, in float64 (each
    square rounded on its own), bit for bit on every set, tails of 4 and 8 lanes included;
    huge and tiny values too"""
    rng = np.random.default_rng(seed)
    ring = (level + rng.standard_normal((rows, n)) * 10.0 ** rng.integers(-20, 20, (rows, n)))
    ring = ring.astype(F32)
    ref = (level + rng.standard_normal(n)).astype(F32)
    s, q = K.kernel_window_sums(isa, ring, ref)
    ws, wq = np.zeros(n), np.zeros(n)
    for r in range(rows):
        v = ring[r].astype(np.float64) - ref.astype(np.float64)
        ws = ws + v
        wq = wq + v * v
    assert s.tobytes() == ws.tobytes() and q.tobytes() == wq.tobytes()


def test_kernel_refs_must_have_one_value_per_field():
    raw = np.ones(8, F32)
    w_idx = np.arange(3, dtype=np.int32)
    with pytest.raises(InputError, match="ref must have one value per window field"):
        K.kernel_window_stats("scalar", raw, w_idx, np.zeros(3), np.zeros(3), None, 1.0,
                              ref=np.zeros(2))
    with pytest.raises(InputError, match="fref must have one value per window field"):
        K.kernel_window_commit("scalar", raw, w_idx, np.zeros(3), np.zeros(3), np.zeros(3, F32),
                               False, fref=np.zeros(4))
    with pytest.raises(InputError, match="thr must have one value per window field and one more"):
        K.kernel_window_commit("scalar", raw, w_idx, np.zeros(3), np.zeros(3), np.zeros(3, F32),
                               True, thr=np.zeros(3))


# ------------------------------------------------------------------ engine
@pytest.mark.parametrize("level,step", [(1e5, 2.0 ** -7), (6.4e4, 2.0 ** -8), (1e7, 1.0),
                                        (3e3, 2.0 ** -13)])
@pytest.mark.parametrize("W", [5, 32, 100])
@pytest.mark.parametrize("by", ["step", "step_batch"])
def test_engine_window_std_at_price_levels(isa, level, step, W, by):
    # prices moving by one float32 step at a time: the window's std is a few steps, 1e-7 of
    # the level. Every tick's window features against the numpy reference (two-pass)
    rng = np.random.default_rng(W)
    n_w = 4
    m = _identity_window_model(n_w, W)
    n = 12 * W + 5
    p = _walk(rng, n, n_w, level, step)
    want = window_pre_features(p, np.zeros(n, np.int64), np.array([n_w]), np.arange(n_w), W)
    e = Engine(m, config={"engine": {"simd": isa, "n_symbols": 1}})
    got = np.empty((n, 1 + 2 * n_w), F32)
    if by == "step":
        for i in range(n):
            got[i] = e.features(p[i])
            e.step(p[i])
    else:
        for a in range(0, n, 7):        # batches of 7: the features of each batch's next tick
            got[a] = e.features(p[a])
            e.step_batch(p[a:a + 7], np.zeros(len(p[a:a + 7]), np.int32))
        keep = np.arange(0, n, 7)
        got, want = got[keep], want[keep]
    np.testing.assert_allclose(got[:, 1:1 + n_w], want[:, 1:1 + n_w], rtol=1e-7)
    # sqrt of a float32 variance: ~1e-7 relative, and one float32 step of the std's inputs
    np.testing.assert_allclose(got[:, 1 + n_w:], want[:, 1 + n_w:], rtol=1e-5,
                               atol=step * 1e-6)


@pytest.mark.parametrize("W", [2, 5, 16])
@pytest.mark.parametrize("at", ["first", "second", "last"])
def test_an_outlier_that_was_a_windows_ref_leaves_no_trace(isa, W, at):
    # a finite bad print (1e18 among prices ~100) at the first tick of a period becomes the
    # reference of the fresh sums, and at the wrap the running sums' ref: every later tick
    # was measured from 1e18, where a double's step is 128, and the mean came out 256 off.
    # A window whose mean is 2^15 stds from its ref is now recomputed about its newest tick
    rng = np.random.default_rng(W)
    n_w = 3
    m = _identity_window_model(n_w, W)
    n = 8 * W + 3
    p = _walk(rng, n, n_w, 100.0, 2.0 ** -10)
    k = 2 * W + {"first": 0, "second": 1 % W, "last": W - 1}[at]
    p[k, 1] = 1e18
    e = Engine(m, config={"engine": {"simd": isa, "n_symbols": 1}})
    for i in range(n):
        if i > k + W:                    # the outlier has left this tick's window
            got = e.features(p[i])
            mu, sd = _two_pass(p[i - W + 1:i + 1, :n_w])
            np.testing.assert_allclose(got[1:1 + n_w], mu, rtol=1e-7, err_msg=f"tick {i}")
            np.testing.assert_allclose(got[1 + n_w:], sd, rtol=1e-4, atol=1e-6,
                                       err_msg=f"tick {i}")
        e.step(p[i])


@pytest.mark.parametrize("W", [3, 8])
@pytest.mark.parametrize("by", ["step", "step_batch"])
def test_a_refused_tick_whose_commit_healed_restores_the_refs(isa, W, by):
    # the tick on which an outlier leaves heals the window (recomputes it about that tick,
    # a new ref), and a tick at the wrap takes the period's ref; when the model then refuses
    # that tick, fp_step puts the window back from its undo record, refs included: the next
    # tick's features, and every later one, bit for bit an engine's that never saw it
    rng = np.random.default_rng(W)
    n_w = 3
    mdl = refusing_model(rng, n_w, W, 1e-30)    # a z field of 1e10: the tick is refused
    n = 6 * W
    good = _walk(rng, n, n_w, 1e5, 2.0 ** -7)
    good[:, n_w] = 0.0
    out = W + 1                          # an accepted outlier, leaving W ticks later
    good[out, 0] = 1e18
    e = Engine(mdl, config={"engine": {"simd": isa, "n_symbols": 1}})
    clean = Engine(mdl, config={"engine": {"simd": isa, "n_symbols": 1}})
    for i in range(n):
        if out + W <= i <= out + W + 2 * W:     # the leaving tick and later ones, refused
            bad = good[i].copy()
            bad[n_w] = 1e10
            with pytest.raises(InputError):
                if by == "step":
                    e.step(bad)
                else:
                    e.step_batch(bad[None, :].copy(), np.zeros(1, np.int32))
            # the next tick's features come from the restored window (refs included)
            np.testing.assert_array_equal(e.features(good[i]), clean.features(good[i]),
                                          err_msg=f"after the refused tick before {i}")
        e.step(good[i])
        clean.step(good[i])
        if i + 1 < n:
            np.testing.assert_array_equal(e.features(good[i + 1]), clean.features(good[i + 1]),
                                          err_msg=f"after tick {i}")


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n_w=st.integers(1, 20), seed=st.integers(0, 2 ** 31), outlier=st.integers(-1, 19),
       far=st.integers(-1, 19))
def test_window_zscore_flags_exactly_the_commits_that_heal(isa, n_w, seed, outlier, far):
    """The feature kernel's heal flag (the tick's features then come from the ring) is the
    commit kernel's own, on every set: the same sums in the same order and the same criteria,
    for outliers leaving, refs far from the window, and ordinary ticks"""
    rng = np.random.default_rng(seed)
    raw = (100 + rng.standard_normal(40)).astype(F32)
    w_idx = rng.integers(0, 40, n_w).astype(np.int32)
    old = (100 + rng.standard_normal(n_w)).astype(F32)
    ref = (100 + rng.standard_normal(n_w)).astype(F32)
    W = 32
    ring = (100 + rng.standard_normal((W, n_w))).astype(np.float64)
    s0 = (ring - ref).sum(0)
    q0 = ((ring - ref) ** 2).sum(0)
    if 0 <= outlier < n_w:                  # 1e9 leaving: its square dwarfs the rest
        old[outlier] = np.float32(1e9)
        s0[outlier] += 1e9
        q0[outlier] += 1e18
    if 0 <= far < n_w:                      # a ref far below a window at 100
        ref[far] = np.float32(-1e6)
        s0[far] = (ring[:, far] - np.float64(ref[far])).sum()
        q0[far] = ((ring[:, far] - np.float64(ref[far])) ** 2).sum()
    inv = (rng.random(2 * n_w) + 0.5).astype(F32)
    thr = np.append(W * 2.0 ** 16 / np.maximum(inv[:n_w], inv[n_w:]).astype(np.float64) ** 2,
                    W * (1 - 2.0 ** -30))
    mean = np.zeros(2 * n_w, F32)
    feat, flag = K.kernel_window_zscore(isa, raw, w_idx, s0, q0, old, 1.0 / W, mean, inv,
                                        ref=ref, thr=thr)
    *_, heal = K.kernel_window_commit(isa, raw, w_idx, s0, q0, old, True, ref=ref, thr=thr)
    assert flag == heal
    if 0 <= outlier < n_w or 0 <= far < n_w:
        assert flag
    want, wflag = K.kernel_window_zscore("scalar", raw, w_idx, s0, q0, old, 1.0 / W, mean, inv,
                                         ref=ref, thr=thr)
    assert feat.tobytes() == want.tobytes() and wflag == flag
    # without thr (a window still filling, or no check wanted): the same features, no flag
    assert K.kernel_window_zscore(isa, raw, w_idx, s0, q0, old, 1.0 / W, mean, inv,
                                  ref=ref).tobytes() == feat.tobytes()
