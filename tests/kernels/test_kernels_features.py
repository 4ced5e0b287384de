"""The feature kernels against numpy, on every kernel set this CPU runs: z-scores (direct,
gathered, by runs of indices, permuted), rolling-window stats and z-scores, and the window
commit against float64 bit for bit. The z-score kernels are exact in float32 (the same two
operations in the same order), so they are compared for equality."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from fastpath import _kernels as K
from helpers.builders import ISAS
from helpers.reference import at_page_end

WIDTHS = (1, 7, 8, 9, 16, 37, 129, 300)


@pytest.mark.parametrize("n", WIDTHS)
def test_zscore_gather_equals_numpy(isa, n):
    rng = np.random.default_rng(n)
    raw = rng.standard_normal(512).astype(np.float32) * 100
    idx = rng.integers(0, 512, n).astype(np.int32)
    mean = rng.standard_normal(n).astype(np.float32)
    inv = rng.random(n).astype(np.float32) + 0.1
    got = K.kernel_zscore_gather(isa, raw, idx, mean, inv)
    np.testing.assert_array_equal(got, (raw[idx] - mean) * inv)


@pytest.mark.parametrize("n", WIDTHS)
def test_zscore_equals_numpy(isa, n):
    rng = np.random.default_rng(n + 1)
    x, mean = rng.standard_normal((2, n)).astype(np.float32)
    inv = rng.random(n).astype(np.float32)
    np.testing.assert_array_equal(K.kernel_zscore(isa, x, mean, inv), (x - mean) * inv)


@pytest.mark.parametrize("n", WIDTHS)
def test_allfinite_finds_nan_and_inf_anywhere(isa, n):
    x = np.ones(n, np.float32)
    assert K.kernel_allfinite(isa, x)
    for bad in (np.nan, np.inf, -np.inf):
        for pos in {0, n // 2, n - 1}:
            y = x.copy()
            y[pos] = bad
            assert not K.kernel_allfinite(isa, y), (bad, pos)
    big = np.full(n, np.finfo(np.float32).max, np.float32)
    assert K.kernel_allfinite(isa, big)


@settings(max_examples=40, deadline=None)
@given(x=hnp.arrays(np.float32, st.integers(1, 200),
                    elements=st.floats(-1e6, 1e6, width=32, allow_subnormal=False)),
       seed=st.integers(0, 2**32 - 1))
def test_zscore_property(x, seed):
    rng = np.random.default_rng(seed)
    mean = rng.standard_normal(len(x)).astype(np.float32)
    inv = rng.random(len(x)).astype(np.float32)
    idx = rng.permutation(len(x)).astype(np.int32)
    for isa in ISAS:
        np.testing.assert_array_equal(K.kernel_zscore(isa, x, mean, inv), (x - mean) * inv)
        np.testing.assert_array_equal(K.kernel_zscore_gather(isa, x, idx, mean, inv),
                                      (x[idx] - mean) * inv)


@pytest.mark.parametrize("n", WIDTHS)
def test_zscore_runs_equals_numpy(isa, n):
    rng = np.random.default_rng(n + 3)
    raw = rng.standard_normal(512).astype(np.float32)
    # runs of random lengths 1..20, ending exactly at the end of raw in one case
    idx = []
    pos = int(rng.integers(0, 40))
    while len(idx) < n:
        L = int(rng.integers(1, 21))
        idx += list(range(pos, min(pos + L, 512)))
        pos = min(pos + L + int(rng.integers(1, 9)), 511)
    idx = np.array(idx[:n], np.int32)
    if n > 8:
        idx[-8:] = np.arange(504, 512)
    mean = rng.standard_normal(n).astype(np.float32)
    inv = rng.random(n).astype(np.float32)
    np.testing.assert_array_equal(K.kernel_zscore_runs(isa, raw, idx, mean, inv), (raw[idx] - mean) * inv)


@pytest.mark.parametrize("n", (1, 3, 4, 7, 8, 9, 37))
@pytest.mark.parametrize("full", [False, True])
def test_window_stats_matches_float64(isa, n, full):
    rng = np.random.default_rng(n * 2 + full)
    W = 6
    hist = rng.standard_normal((W, n)).astype(np.float32) * 3 + 50     # the ring
    raw = rng.standard_normal(64).astype(np.float32) * 3 + 50
    idx = rng.integers(0, 64, n).astype(np.int32)
    x = raw[idx].astype(np.float64)
    kept = hist[1:] if full else hist                       # `old` = hist[0] leaves when full
    s, q = hist.astype(np.float64).sum(0), (hist.astype(np.float64) ** 2).sum(0)
    pm, ps = K.kernel_window_stats(isa, raw, idx, s, q, hist[0] if full else None,
                                   1.0 / (W if full else W + 1))
    window = np.vstack([kept, x[None]]).astype(np.float64)
    np.testing.assert_allclose(pm, window.mean(0), rtol=1e-6)
    np.testing.assert_allclose(ps, window.std(0), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("n_w", [1, 3, 4, 7, 8, 9, 17, 40])
@pytest.mark.parametrize("with_old", [False, True])
def test_window_zscore_equals_stats_then_zscore(isa, n_w, with_old):
    rng = np.random.default_rng(n_w)
    raw = rng.standard_normal(64).astype(np.float32)
    w_idx = rng.integers(0, 64, n_w).astype(np.int32)
    s = rng.standard_normal(n_w) * 20
    q = np.abs(rng.standard_normal(n_w)) * 400 + s * s / 20
    old = rng.standard_normal(n_w).astype(np.float32) if with_old else None
    mean = rng.standard_normal(2 * n_w).astype(np.float32)
    inv_std = (rng.random(2 * n_w) + 0.5).astype(np.float32)
    pm, ps = K.kernel_window_stats(isa, raw, w_idx, s, q, old, 1 / 20)
    ref = K.kernel_zscore(isa, np.concatenate([pm, ps]), mean, inv_std)
    got = K.kernel_window_zscore(isa, raw, w_idx, s, q, old, 1 / 20, mean, inv_std)
    np.testing.assert_array_equal(got, ref)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw_len=st.integers(1, 700), n=st.integers(1, 200), seed=st.integers(0, 2**31))
def test_zscore_perm(isa, raw_len, n, seed):
    """The permute plan (the AVX-512 engine's z-score path) against numpy: any raw length
    (windows cut by raw's end), indices in any order with repeats, any group tail; nothing
    read past raw (it ends at an unreadable page) or written past the outputs. Its flag is
    the engine's non-finite input check: True for a finite raw (huge values included), False
    for a NaN or +-Inf anywhere in raw, read by an index or not (the plan loads every
    window, those no index reads in check-only steps)."""
    rng = np.random.default_rng(seed)
    vals = (rng.standard_normal(raw_len) * 100).astype(np.float32)
    vals[rng.random(raw_len) < 0.05] = np.float32(3e38)      # huge values stay exact
    raw, keep = at_page_end(vals)
    kind = seed % 3
    if kind == 0:
        idx = rng.integers(0, raw_len, n)
    elif kind == 1:      # sorted, clustered like an order-book spec
        idx = np.sort(rng.integers(max(0, raw_len - 40), raw_len, n))
    else:
        idx = rng.permutation(np.arange(raw_len))[:n] if raw_len >= n else rng.integers(0, raw_len, n)
    idx = idx.astype(np.int32)
    mean = rng.standard_normal(len(idx)).astype(np.float32)
    inv = (rng.random(len(idx)) + 0.1).astype(np.float32)
    got, steps, finite = K.kernel_zscore_perm(isa, raw, idx, mean, inv, steps=True, finite=True)
    with np.errstate(over="ignore"):
        want = (vals[idx] - mean) * inv
    np.testing.assert_array_equal(got, want)
    assert np.array_equal(K.kernel_zscore_gather(isa, vals, idx, mean, inv), got)
    assert finite is True
    groups = (len(idx) + 15) // 16
    assert groups <= steps <= groups * ((raw_len + 31) // 32)
    pos = int(rng.integers(0, raw_len))
    raw[pos] = (np.nan, np.inf, -np.inf)[seed % 3]
    with np.errstate(invalid="ignore", over="ignore"):
        got2, finite2 = K.kernel_zscore_perm(isa, raw, idx, mean, inv, finite=True)
    assert finite2 is False, f"non-finite at {pos} of {raw_len} not flagged"
    unread = ~np.isin(idx, pos)
    np.testing.assert_array_equal(got2[unread], want[unread])
    del raw
    keep.close()


def test_zscore_perm_demo_spec(isa):
    """The embedded demo spec: 112 fields of a 256-float tick in 13 plan steps (7 groups),
    and one check-only step for raw[96:128], which no field reads; a NaN there is flagged."""
    from fastpath.model import Model
    from fastpath._build import DEMO_MODEL
    fs = Model.load(DEMO_MODEL).feature_spec
    n_z = len(fs.z_idx)
    raw = (np.random.default_rng(0).standard_normal(fs.raw_len) * 10).astype(np.float32)
    got, steps = K.kernel_zscore_perm(isa, raw, fs.z_idx, fs.mean[:n_z], fs.inv_std[:n_z], steps=True)
    np.testing.assert_array_equal(got, (raw[fs.z_idx] - fs.mean[:n_z]) * fs.inv_std[:n_z])
    assert steps == 14
    assert not np.isin(np.arange(96, 128), fs.z_idx).any()
    raw[100] = np.nan
    assert K.kernel_zscore_perm(isa, raw, fs.z_idx, fs.mean[:n_z], fs.inv_std[:n_z],
                                finite=True)[1] is False


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n_w=st.integers(1, 40), full=st.booleans(), seed=st.integers(0, 2**31),
       outlier=st.integers(-1, 39), level=st.sampled_from([0.0, 1e5, -3e7]),
       flat=st.integers(-1, 39))
def test_window_commit_matches_float64_bit_for_bit(isa, n_w, full, seed, outlier, level, flat):
    """A tick into a window (the engine's commit) on every kernel set equals the float64
    reference bit for bit: with x = raw - ref and o = old - ref, (sum - o) + x and
    (sumsq - o^2) + x^2 in that order, the sums since the last wrap (fresh) + y and + y^2
    with y = raw - fref, the heal flag when full (a departing square over 2^16 times the new
    sumsq, an outlier planted in old makes it fire; or sum^2 over both its field's bound
    thr[j] and thr[n_w] sumsq, a mean far from ref where q/n - m^2 cancels, which a flat field
    away from its ref makes fire), tails of 8 lanes masked, huge and tiny values included,
    at price-like levels too; nothing written past n_w."""
    rng = np.random.default_rng(seed)
    raw = (level + rng.standard_normal(300) * 10.0 ** rng.integers(-30, 30, 300)).astype(np.float32)
    w_idx = rng.integers(0, 300, n_w).astype(np.int32)
    old = (level + rng.standard_normal(n_w) * 1e3).astype(np.float32)
    if 0 <= outlier < n_w:
        old[outlier] = np.float32(1e18)
    ref = (level + rng.standard_normal(n_w) * 1e2).astype(np.float32).astype(np.float64)
    fref = (level + rng.standard_normal(n_w) * 1e2).astype(np.float32).astype(np.float64)
    s0 = rng.standard_normal(n_w) * 1e6
    q0 = np.abs(rng.standard_normal(n_w)) * 1e12 + s0 * s0
    # bounds on sum^2 about the sums' own size, so some fields pass theirs and some do not
    W = float(rng.integers(1, 200))
    thr = np.append(s0 * s0 * 10.0 ** rng.uniform(-2, 2, n_w), W * (1 - 2.0 ** -30))
    if 0 <= flat < n_w and abs(ref[flat]) < 1e7:
        # a flat window 0.25 above its ref: sum = W d, sumsq = W d^2 after this tick, so
        # sum^2 = W sumsq passes the cancellation bound, and its own bound is low
        d = 0.25
        raw[w_idx[flat]] = np.float32(ref[flat] + d)
        x_f = float(np.float64(raw[w_idx[flat]]) - ref[flat])
        o_f = float(np.float64(old[flat]) - ref[flat]) if full else 0.0
        s0[flat] = W * x_f + o_f - x_f
        q0[flat] = W * x_f * x_f + o_f * o_f - x_f * x_f
        # below sum^2 = (W d)^2 >= 1/16 (at 1.0, W = 4 made sum^2 exactly 1.0: not over it)
        thr[flat] = 0.01
    f0 = np.concatenate([rng.standard_normal(n_w) * 1e6, np.abs(rng.standard_normal(n_w)) * 1e12])
    kw = dict(fresh=f0, ref=ref, fref=fref, thr=thr)
    s, q, row, fr, heal = K.kernel_window_commit(isa, raw, w_idx, s0, q0, old, full, **kw)
    xr = raw[w_idx].astype(np.float64)
    x = xr - ref
    y = xr - fref
    o = old.astype(np.float64) - ref
    want_s = (s0 - o) + x if full else s0 + x
    want_q = (q0 - o * o) + x * x if full else q0 + x * x
    assert s.tobytes() == want_s.tobytes()
    assert q.tobytes() == want_q.tobytes()
    assert row.tobytes() == raw[w_idx].tobytes()
    assert fr.tobytes() == np.concatenate([f0[:n_w] + y, f0[n_w:] + y * y]).tobytes()
    ss = want_s * want_s
    want_heal = bool(full and (np.any(o * o > 2.0 ** 16 * want_q) or
                               np.any((ss > thr[:n_w]) & (ss > thr[n_w] * want_q))))
    assert heal == want_heal
    if full and 0 <= outlier < n_w and abs(x[outlier]) < 1e17:
        assert heal
    if full and 0 <= flat < n_w and abs(ref[flat]) < 1e7:
        assert heal                      # the flat field off its ref
    assert all(a.tobytes() == b.tobytes() for a, b in zip(
        (s, q, row, fr), K.kernel_window_commit("scalar", raw, w_idx, s0, q0, old, full, **kw)))
    # the undo record (what fp_step restores when the model refuses the tick): the old sums
    # and the old row exactly, whether or not the window was full, and the same commit
    s2, q2, row2, fr2, heal2, us, uq, uf, urow = K.kernel_window_commit(
        isa, raw, w_idx, s0, q0, old, full, undo=True, **kw)
    assert (s2.tobytes(), q2.tobytes(), row2.tobytes(), fr2.tobytes(), heal2) == (
        s.tobytes(), q.tobytes(), row.tobytes(), fr.tobytes(), heal)
    assert (us.tobytes(), uq.tobytes(), uf.tobytes(), urow.tobytes()) == (
        s0.tobytes(), q0.tobytes(), f0.tobytes(), old.tobytes())


