"""The dense-layer and MLP kernels against a float64 reference, on every kernel set this CPU
runs: every activation, layer widths across the row-group splits, both row orders bit for
bit, the non-finite flag of every block, refusals of overflowing layers, the head. Dense
layers reorder float32 sums, so they are held to a bound relative to the sum of |terms|;
tanh/sigmoid (the AVX2 polynomial) at atol 1e-6."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fastpath import _kernels as K
from helpers.builders import ACTS, ISAS
from helpers.reference import act_ref


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
