"""Each C kernel against a numpy reference, for every kernel set this CPU runs.

Tolerances: z-score kernels are exact in float32 (same two operations, same order);
dense layers reorder float32 sums, compared at rtol 1e-4 relative to the sum of |terms|;
dot/norm sums in double (exact float products), so it is held to 1e-13 of the sum of
|terms|; tanh/sigmoid (AVX2 polynomial) at atol 1e-6.
"""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from fastpath import _engine as E
from fastpath import _kernels as K
from helpers.builders import ACTS, ISAS
from helpers.reference import act_ref  # noqa: F401

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
def test_dot_norm2_matches_float64(isa, n):
    rng = np.random.default_rng(n + 2)
    a, b = rng.standard_normal((2, n)).astype(np.float32)
    d, s = K.kernel_dot_norm2(isa, a, b)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    assert abs(d - a64 @ b64) <= 1e-13 * np.abs(a64 * b64).sum() + 1e-300
    assert abs(s - a64 @ a64) <= 1e-13 * (a64 @ a64) + 1e-300


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


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("n_in,n_out", [(1, 1), (7, 3), (37, 9), (129, 64), (300, 37), (16, 33),
                                        (33, 40), (300, 600)])
def test_dense_layer_matches_float64_for_every_activation(isa, act, n_in, n_out):
    rng = np.random.default_rng(n_in * 1000 + n_out)
    w = rng.standard_normal((n_out, n_in)).astype(np.float32)
    b = rng.standard_normal(n_out).astype(np.float32)
    x = rng.standard_normal(n_in).astype(np.float32) * 2
    got = K.PackedMLP([w], [b], [act], isa).forward(x)
    pre = w.astype(np.float64) @ x + b
    bound = np.abs(w.astype(np.float64)) @ np.abs(x) + np.abs(b)
    want = act_ref(pre, act)
    # the activation's slope is <= 1 everywhere, so the pre-activation error bounds it
    np.testing.assert_array_less(np.abs(got - want), 1e-5 * bound + 1e-6)


def test_activation_edges(isa):
    """Saturation, zero and tiny inputs through a 1x1 identity-weight layer."""
    xs = np.array([-100, -20, -9, -1e-3, -1e-7, 0, 1e-7, 1e-3, 0.05, 0.07, 9, 20, 100], np.float32)
    for act in ("tanh", "sigmoid"):
        P = K.PackedMLP([np.ones((1, 1), np.float32)], [np.zeros(1, np.float32)], [act], isa)
        got = np.array([P.forward(np.array([v], np.float32))[0] for v in xs])
        np.testing.assert_allclose(got, act_ref(xs, act), rtol=2e-6, atol=1e-6)


def test_unknown_isa_is_clear_error():
    with pytest.raises(ValueError, match="unknown kernel set"):
        K.kernel_zscore("sse9", np.ones(3, np.float32), np.ones(3, np.float32), np.ones(3, np.float32))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 400), seed=st.integers(0, 2**32 - 1),
       scale=st.sampled_from([1e-3, 1.0, 1e3]))
def test_dot_norm2_property(n, seed, scale):
    rng = np.random.default_rng(seed)
    a, b = (rng.standard_normal((2, n)) * scale).astype(np.float32)
    for isa in ISAS:
        d, s = K.kernel_dot_norm2(isa, a, b)
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        assert abs(d - a64 @ b64) <= 1e-13 * np.abs(a64 * b64).sum() + 1e-300
        assert abs(s - a64 @ a64) <= 1e-13 * (a64 @ a64) + 1e-300


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


@settings(max_examples=30, deadline=None)
@given(dims=st.lists(st.integers(1, 70), min_size=2, max_size=5),
       acts=st.lists(st.sampled_from(ACTS), min_size=4, max_size=4),
       seed=st.integers(0, 2**32 - 1))
def test_mlp_property(dims, acts, seed):
    rng = np.random.default_rng(seed)
    ws = [(rng.standard_normal((dims[i + 1], dims[i])) / np.sqrt(dims[i])).astype(np.float32)
          for i in range(len(dims) - 1)]
    bs = [rng.standard_normal(dims[i + 1]).astype(np.float32) for i in range(len(dims) - 1)]
    acts = acts[:len(ws)]
    x = rng.standard_normal(dims[0]).astype(np.float32)
    ref = x.astype(np.float64)
    for w, b, a in zip(ws, bs, acts):
        ref = act_ref(w.astype(np.float64) @ ref + b, a)
    for isa in ISAS:
        got = K.PackedMLP(ws, bs, acts, isa).forward(x)
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_dispatch_reports_cpu():
    """best_isa() is the widest set cpuid + XCR0 allow, and it is one supported_isas() lists."""
    f = E.cpu_features()
    avx2 = f["avx2"] and f["fma"]
    want = "avx512" if avx2 and f["avx512"] else "avx2" if avx2 else "scalar"
    assert E.best_isa() == want
    assert E.supported_isas()[0] == "scalar"
    assert E.best_isa() in E.supported_isas()
    assert E.supported_isas() == [s for s in E.all_isas() if s in E.supported_isas()]
    assert set(E.all_isas()) == {"scalar", "avx2", "avx512"}
    assert ("avx512" in E.supported_isas()) == bool(f["avx512"] and avx2)


@pytest.mark.parametrize("n_in", [1, 2, 3, 15, 16, 17, 31, 33])
def test_dense_nonfinite_row_does_not_leak(isa, n_in):
    """An Inf weight in one 8-row block must not touch the rows of another: the AVX-512 set
    reads a block two inputs at a time, and a tail that read the next block's first weights
    (0 * Inf = NaN) would poison finite rows. The flag says non-finite; the finite rows stay
    exact."""
    rng = np.random.default_rng(n_in)
    w = rng.standard_normal((24, n_in)).astype(np.float32)
    b = rng.standard_normal(24).astype(np.float32)
    x = rng.standard_normal(n_in).astype(np.float32)
    w[8:16, 0] = np.inf            # block 1's first weights: what block 0's tail would reach
    for reverse in (False, True):
        got, ok = K.kernel_dense(isa, w, b, "identity", x, reverse)
        assert not ok
        fin = np.r_[0:8, 16:24]
        want = w[fin].astype(np.float64) @ x + b[fin]
        bound = np.abs(w[fin].astype(np.float64)) @ np.abs(x) + np.abs(b[fin])
        np.testing.assert_array_less(np.abs(got[fin] - want), 1e-5 * bound + 1e-6)


@pytest.mark.parametrize("n_in,n_out", [(16, 64), (1024, 136), (256, 520)])
def test_dense_sets_agree_on_wide_layers(n_in, n_out):
    """Every set against scalar on layers wide enough to take the vector sets' main loops and
    (1024x136: 557 KB of weights) the AVX-512 set's streaming path with prefetch."""
    rng = np.random.default_rng(n_in + n_out)
    w = (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)
    b = rng.standard_normal(n_out).astype(np.float32)
    x = rng.standard_normal(n_in).astype(np.float32)
    ref, _ = K.kernel_dense("scalar", w, b, "relu", x)
    bound = np.abs(w.astype(np.float64)) @ np.abs(x) + np.abs(b)
    for isa in ISAS:
        for reverse in (False, True):
            got, ok = K.kernel_dense(isa, w, b, "relu", x, reverse)
            assert ok
            np.testing.assert_array_less(np.abs(got - ref), 2e-6 * bound + 1e-7)


def test_engines_agree_on_every_set():
    """The whole fused step (features, cache, MLP, head) gives the same signals and the same
    cache decisions on every set this CPU runs."""
    from fastpath import Engine
    from helpers.builders import engine_cfg, windowed_model
    rng = np.random.default_rng(12)
    m = windowed_model(rng, raw_len=70, n_z=37, hidden=(64, 33))
    raws = rng.standard_normal((300, m.raw_len)).astype(np.float32)
    raws[100:140] = raws[99]           # repeated ticks so the cache decides hits as well
    syms = rng.integers(0, 4, 300)
    ts = np.arange(300) * 1000
    ref = Engine(m, config=engine_cfg("scalar")).step_batch(raws, syms, ts)
    assert ref.cached.any() and not ref.cached.all()
    for isa in ISAS:
        got = Engine(m, config=engine_cfg(isa)).step_batch(raws, syms, ts)
        np.testing.assert_allclose(got.signal, ref.signal, atol=1e-5)
        np.testing.assert_allclose(got.confidence, ref.confidence, atol=1e-5)
        np.testing.assert_array_equal(got.cached, ref.cached)


def test_fastpath_simd_env(monkeypatch):
    """FASTPATH_SIMD names any set of the build; one this CPU cannot run is a ConfigError
    that names the variable and what the CPU has, never a silent fallback."""
    from fastpath import ConfigError
    from fastpath._build import resolve_simd
    for name in E.supported_isas():
        monkeypatch.setenv("FASTPATH_SIMD", name)
        assert resolve_simd("auto") == name
    monkeypatch.setenv("FASTPATH_SIMD", "avx512")
    monkeypatch.setattr(E, "supported_isas", lambda: ["scalar", "avx2"])
    with pytest.raises(ConfigError, match="FASTPATH_SIMD=avx512.*cannot run"):
        resolve_simd("auto")
    monkeypatch.delenv("FASTPATH_SIMD")
    with pytest.raises(ConfigError, match="engine.simd = 'avx512'.*cannot run"):
        resolve_simd("avx512")


def test_bound_probes():
    """The bench's bounds: FMA rate of each vector set (0 for scalar, none to measure) and the
    streaming-read bandwidth; checked for sign and arguments, never for speed."""
    for isa in E.all_isas():
        r = K.fma_macs_per_ns(isa)
        assert (r > 0) == (isa in ISAS and isa != "scalar")
    assert K.read_gbps(1 << 16, 2) > 0
    with pytest.raises(ValueError, match="nbytes"):
        K.read_gbps(10)
    with pytest.raises(ValueError, match="unknown kernel set"):
        K.fma_macs_per_ns("sse9")


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


@pytest.mark.parametrize("n_out", [1, 8, 9, 17, 24, 33, 40, 57, 72])
def test_dense_both_row_orders_bit_identical(isa, n_out):
    """Callers alternate the row-group order per call (their own parity, passed in); the
    answer must not depend on it, through the kernel directly or through PackedMLP."""
    rng = np.random.default_rng(n_out)
    w = rng.standard_normal((n_out, 29)).astype(np.float32)
    b = rng.standard_normal(n_out).astype(np.float32)
    x = rng.standard_normal(29).astype(np.float32)
    fwd, ok_f = K.kernel_dense(isa, w, b, "tanh", x, False)
    rev, ok_r = K.kernel_dense(isa, w, b, "tanh", x, True)
    assert ok_f and ok_r
    np.testing.assert_array_equal(fwd, rev)
    P = K.PackedMLP([w], [b], ["tanh"], isa)
    first, second, third = P.forward(x), P.forward(x), P.forward(x)
    np.testing.assert_array_equal(first, fwd)
    np.testing.assert_array_equal(first, second)
    np.testing.assert_array_equal(first, third)


def test_packed_mlp_refuses_overflow(isa):
    """PackedMLP, like the engine, never returns an output computed through a NaN/Inf layer."""
    P = K.PackedMLP([np.full((4, 2), 1e30, np.float32), np.ones((2, 4), np.float32)],
                    [np.zeros(4, np.float32), np.zeros(2, np.float32)], ["relu", "identity"], isa)
    with pytest.raises(ValueError, match="NaN/Inf"):
        P.forward(np.array([1e10, 0], np.float32))
    assert np.all(np.isfinite(P.forward(np.array([1e-10, 0], np.float32))))


@settings(max_examples=200, deadline=None)
@given(o0=st.floats(-100, 100, width=32), o1=st.floats(-100, 100, width=32))
def test_head_property(o0, o1):
    """signal = tanh(out0), confidence = sigmoid(out1), every kernel set, |err| <= 1e-6."""
    for isa in ISAS:
        s, c = K.kernel_head(isa, o0, o1)
        assert abs(s - np.tanh(np.float64(o0))) <= 1e-6
        assert abs(c - 1 / (1 + np.exp(-np.float64(o1)))) <= 1e-6
        assert -1 <= s <= 1 and 0 <= c <= 1


# -------------------------------------------- the cache's float32 first look, fused passes
@pytest.mark.parametrize("n", [1, 7, 15, 16, 17, 31, 32, 33, 63, 64, 100, 128, 257])
def test_dot_norms_f32_within_its_rounding_bound(isa, n):
    # the float32 sums must stay inside the error bound fp_cache.h assumes
    # (FP_DOTF_ROUNDINGS(n) = ceil(n/16) + 7 roundings per term, relative to sum |terms|)
    rng = np.random.default_rng(n)
    for scale in (1e-3, 1.0, 1e6):
        a = (rng.standard_normal(n) * scale).astype(np.float32)
        b = (rng.standard_normal(n) * scale).astype(np.float32)
        d, sa, sb = K.kernel_dot_norms_f32(isa, a, b)
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        m = -(-n // 16) + 7
        gam = m * 2.0**-24 / (1 - m * 2.0**-24)
        for got, terms in ((d, a64 * b64), (sa, a64 * a64), (sb, b64 * b64)):
            assert abs(got - terms.sum()) <= gam * np.abs(terms).sum() * 1.0001 + 1e-30


@pytest.mark.parametrize("n", [1, 8, 15, 16, 17, 100, 128, 257])
def test_dot_norms_f64_equals_dot_norm2_bit_for_bit(isa, n):
    # the cache keeps |b|^2 from one kernel and compares with the other: they must agree exactly
    rng = np.random.default_rng(100 + n)
    a = rng.standard_normal(n).astype(np.float32) * 3
    b = rng.standard_normal(n).astype(np.float32) * 0.5
    d, sa, sb = K.kernel_dot_norms_f64(isa, a, b)
    assert (d, sa) == K.kernel_dot_norm2(isa, a, b)
    assert sb == K.kernel_dot_norm2(isa, b, b)[1]
    np.testing.assert_allclose([d, sa, sb], [a.astype(np.float64) @ b, a.astype(np.float64) @ a,
                                            b.astype(np.float64) @ b], rtol=1e-12)


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


# Widths at every boundary of the vector sets' dense loops: 16 inputs per AVX-512 step (8 pairs),
# an odd last input, and output counts that take each group the sets split a layer into
# (AVX-512: 8 blocks of 8 rows in cache, then 4, 2, 1; AVX2: 4, 2, 1), with a short last block.
GROUP_INS = [1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 64, 65, 256]
GROUP_OUTS = [1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 64, 65, 120, 127, 256]


def _dense_both_orders(isa, w, b, x):
    """One identity layer in both row orders: each within the float64 reference's rounding
    bound, the same bits either way round; returns the forward result."""
    want = w.astype(np.float64) @ x + b
    bound = np.abs(w.astype(np.float64)) @ np.abs(x) + np.abs(b)
    fwd, ok_f = K.kernel_dense(isa, w, b, "identity", x, False)
    rev, ok_r = K.kernel_dense(isa, w, b, "identity", x, True)
    assert ok_f and ok_r, w.shape
    assert fwd.shape == (w.shape[0],)
    np.testing.assert_array_less(np.abs(fwd - want), 1e-5 * bound + 1e-6)
    np.testing.assert_array_equal(fwd, rev)
    return fwd


@pytest.mark.parametrize("n_in", GROUP_INS)
def test_dense_every_group_split_matches_reference(isa, n_in):
    """Every split of a layer into row groups, both row orders: the float64 reference within
    the sum's rounding bound, and the same bits either way round."""
    for n_out in GROUP_OUTS:
        rng = np.random.default_rng(n_in * 1000 + n_out)
        w = rng.standard_normal((n_out, n_in)).astype(np.float32)
        b = rng.standard_normal(n_out).astype(np.float32)
        x = rng.standard_normal(n_in).astype(np.float32)
        _dense_both_orders(isa, w, b, x)


@pytest.mark.parametrize("n_in", [1, 9, 33, 64])
@pytest.mark.parametrize("n_out", [65, 120, 127, 136])
def test_dense_nonfinite_in_every_block_is_flagged(isa, n_in, n_out):
    """A NaN/Inf pre-activation in any block of any group (first, middle or last row of it)
    is flagged in both row orders, and stays in its own row: every other row is exact. ReLU
    would map the NaN to 0, so the flag is the only trace of it."""
    rng = np.random.default_rng(n_in + n_out)
    w0 = rng.standard_normal((n_out, n_in)).astype(np.float32)
    b = rng.standard_normal(n_out).astype(np.float32)
    x = rng.standard_normal(n_in).astype(np.float32)
    nb = (n_out + 7) // 8
    for blk in range(nb):
        for row in {blk * 8, min(blk * 8 + 3, n_out - 1), min(blk * 8 + 7, n_out - 1)}:
            for bad in (np.inf, np.nan):
                w = w0.copy()
                w[row, (blk * 5) % n_in] = bad
                keep = np.r_[0:row, row + 1:n_out]
                want = np.maximum(w[keep].astype(np.float64) @ x + b[keep], 0)
                bound = np.abs(w[keep].astype(np.float64)) @ np.abs(x) + np.abs(b[keep])
                for reverse in (False, True):
                    got, ok = K.kernel_dense(isa, w, b, "relu", x, reverse)
                    assert not ok, (blk, row, bad, reverse)
                    np.testing.assert_array_less(np.abs(got[keep] - want), 1e-5 * bound + 1e-6)


def _at_page_end(values):
    """values copied to the very end of a readable page followed by an unreadable one: a kernel
    that reads one float past the array faults (SIGSEGV) instead of passing by luck."""
    import ctypes
    import mmap
    page = mmap.PAGESIZE
    nbytes = values.nbytes
    size = (nbytes + page - 1) // page * page + page
    m = mmap.mmap(-1, size, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(m))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    assert libc.mprotect(ctypes.c_void_p(base + size - page), page, 0) == 0
    arr = np.frombuffer(m, np.float32, count=len(values), offset=size - page - nbytes)
    arr[:] = values
    return arr, m


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
    raw, keep = _at_page_end(vals)
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


@pytest.mark.parametrize("n_in,n_out", [(5, 8), (33, 16), (64, 32), (17, 29), (128, 64),
                                        (40, 57), (2100, 64), (4100, 32), (127, 2), (128, 2),
                                        (301, 7), (1024, 2)])
def test_dense_one_group_layers_flag_every_block(isa, n_in, n_out):
    """Layers of 1, 2, 4 or 8 blocks run as one group straight from the dispatcher (no row
    order to walk; on AVX-512 a lone block of 128 inputs or more takes 8 chains, 4 below:
    127/128 are either side, 301 ends in a masked odd tail); 2100x64 and 4100x32 are the
    same block counts with their weights past the streaming threshold (>512 KB), which must
    still take the prefetching path. Each: the float64 reference, the same bits in both row
    orders, and a NaN/Inf in any block flagged without touching the other rows."""
    rng = np.random.default_rng(n_in * 7 + n_out)
    w0 = (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)
    b = rng.standard_normal(n_out).astype(np.float32)
    x = rng.standard_normal(n_in).astype(np.float32)
    fwd = _dense_both_orders(isa, w0, b, x)
    for blk in range((n_out + 7) // 8):
        row = min(blk * 8 + blk % 8, n_out - 1)
        for bad in (np.inf, np.nan):
            w = w0.copy()
            w[row, (blk * 13) % n_in] = bad
            keep = np.r_[0:row, row + 1:n_out]
            for reverse in (False, True):
                got, ok = K.kernel_dense(isa, w, b, "identity", x, reverse)
                assert not ok, (blk, row, bad, reverse)
                np.testing.assert_array_equal(got[keep], fwd[keep])


# ------------------------------------------ the cache's float32 first look, difference form
def _diff_norms_check(isa, a, b):
    """diff_norms_f32's four sums against float64 within the bound fp_cache.h assumes: every
    term meets at most FP_DOTF_ROUNDINGS(n) + 2 = ceil(n/16) + 9 roundings, so each sum is
    off by at most g * sum |terms| (float64 holds a - b, a + b and their products exactly
    for floats of similar exponents; for the rest its own error is ~1e-16 relative)."""
    n = len(a)
    dd, de, sa, sb = K.kernel_diff_norms_f32(isa, a, b)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    m = -(-n // 16) + 9
    gam = m * 2.0**-24 / (1 - m * 2.0**-24)
    for got, terms in (((dd, (a64 - b64) ** 2)), (de, (a64 - b64) * (a64 + b64)),
                       (sa, a64 * a64), (sb, b64 * b64)):
        assert abs(got - terms.sum()) <= gam * np.abs(terms).sum() * 1.0001 + 1e-38, (n, got)


@pytest.mark.parametrize("n", [1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 63, 64, 100, 128, 257])
def test_diff_norms_f32_within_its_rounding_bound(isa, n):
    rng = np.random.default_rng(1000 + n)
    for scale in (1e-3, 1.0, 1e6):
        a = (rng.standard_normal(n) * scale).astype(np.float32)
        _diff_norms_check(isa, a, (rng.standard_normal(n) * scale).astype(np.float32))
        # nearly equal vectors, as at a cache hit: |a - b|^2 ~ 1e-12 |a|^2, and its error must
        # stay relative to that, not to |a|^2
        near = (a.astype(np.float64) * (1 + 1e-6 * rng.standard_normal(n))).astype(np.float32)
        _diff_norms_check(isa, a, near)
        _diff_norms_check(isa, a, a.copy())
        dd, de, _, _ = K.kernel_diff_norms_f32(isa, a, a.copy())
        assert dd == 0.0 and de == 0.0


@pytest.mark.parametrize("n", [1, 5, 16, 17, 31, 33, 100])
def test_diff_norms_f32_reads_nothing_past_n(isa, n):
    """a and b end where an unreadable page begins: a lane loaded past n faults."""
    rng = np.random.default_rng(n)
    a, keep_a = _at_page_end(rng.standard_normal(n).astype(np.float32))
    b, keep_b = _at_page_end(rng.standard_normal(n).astype(np.float32))
    _diff_norms_check(isa, a, b)
    del keep_a, keep_b


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


def test_op_latency_probe():
    """The op-latency probe (bench/scaling.py's latency bound) names what it measures: an
    unknown op is refused; on a CPU with AVX2+FMA every op takes a positive time, and without
    them the probe answers -1 (no figure rather than a wrong one)."""
    with pytest.raises(ValueError, match="op must be one of"):
        K.op_latency_ns("div")
    lat = {op: K.op_latency_ns(op, 20_000) for op in ("fma", "add", "mul", "max")}
    if "avx2" in E.supported_isas():
        assert all(v > 0 for v in lat.values()), lat
    else:
        assert all(v == -1.0 for v in lat.values()), lat
