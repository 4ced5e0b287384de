"""Reduced-precision layers at the edges of float32 (denormal inputs and weights, inputs too
small to quantize, a zero input, layers outside the model limits), on every variant the CPU
runs, against a numpy reference or the fp32 model."""

import numpy as np
import pytest

from fastpath import CachePolicy, Engine, InputError, Model
from fastpath._kernels import kernel_lowp_dense, lowp_variants
from fastpath.model import Layer

from helpers.reference import ref_bf16

F32 = np.float32
ALL_BF16, HAVE_BF16 = lowp_variants("bf16")
ALL_INT8, HAVE_INT8 = lowp_variants("int8")


def need(variant, have, kind):
    if variant not in have:
        pytest.skip(f"this CPU cannot run the {variant} {kind} kernel")


# ------------------------------------------------------------------ bf16 and denormals
# vdpbf16ps (the avx512_bf16 variant) reads denormal bf16 operands as 0 whatever MXCSR says:
# an input below 2^-126, or a weight that is a denormal bf16, dropped out of its row there and
# nowhere else (weights ~3e38 under inputs ~1e-38: a pre-activation of 3 answered as 0).
BF16_EDGES = {
    # (weights, input)
    "input denormal, weights large": (np.full((5, 7), 3e38, F32), np.full(7, 1e-38, F32)),
    "input just above the min normal": (np.full((5, 7), 1e37, F32),
                                         np.linspace(1.2e-38, 4e-38, 7).astype(F32)),
    "inputs of mixed size": (np.full((17, 33), 2e37, F32),
                             np.where(np.arange(33) % 3 == 0, 1.0, 3e-39).astype(F32)),
    "weights denormal, input large": (np.full((5, 7), 1e-39, F32), np.full(7, 3e38, F32)),
}


@pytest.mark.parametrize("variant", ALL_BF16)
@pytest.mark.parametrize("case", sorted(BF16_EDGES))
def test_bf16_denormal_operands_count_on_every_variant(variant, case):
    need(variant, HAVE_BF16, "bf16")
    w, x = BF16_EDGES[case]
    b = np.zeros(w.shape[0], F32)
    y, ok = kernel_lowp_dense("bf16", variant, w, b, "identity", x)
    ref, mag = ref_bf16(w, b, x, "identity")
    assert ok
    assert np.all(np.abs(y - ref) <= 3e-5 * mag + 1e-30), (variant, y, ref)
    assert np.all(np.abs(ref) > 1e-3)          # the case is one where the rows matter


def _bf16_edge_model():
    # hidden = 3e38 * x (x = 1e-38: 3.0), out0 = 0.1 hidden, out1 = x
    return Model((Layer(np.array([[3e38], [1.0]], F32), np.zeros(2, F32)),
                  Layer(np.array([[0.1, 0.0], [0.0, 1.0]], F32), np.zeros(2, F32))),
                 None, CachePolicy(enabled=False))


@pytest.mark.parametrize("weights", ["bf16", "int8"])
def test_engine_reduced_weights_keep_tiny_inputs(isa, weights):
    """int8 quantized inputs under 1e-30 to zeros on every set (the same wrong answer
    everywhere); bf16 lost them on the avx512 set only."""
    m = _bf16_edge_model()
    x = np.array([1e-38], F32)
    want = Engine(m, "cpu", {"engine": {"simd": isa, "n_symbols": 1}}).step(x).signal
    e = Engine(m.with_weights(weights), "cpu", {"engine": {"simd": isa, "n_symbols": 1}})
    r = e.step(x)
    assert abs(want - np.tanh(0.3)) < 1e-6
    assert abs(r.signal - want) < 2e-3, (weights, isa, r.signal, want)
    np.testing.assert_allclose(e.predict(x)[0], 0.3, rtol=2e-3)


# ------------------------------------------------------------------ int8 and tiny inputs
def _exact(w, b, x):
    return (w.astype(np.float64) @ x.astype(np.float64) + b).astype(F32)


@pytest.mark.parametrize("variant", ALL_INT8)
@pytest.mark.parametrize("n_in", [1, 7, 64, 65])
@pytest.mark.parametrize("xmax", [1e-38, 1e-35, 9e-31])
def test_int8_input_below_the_quantizer_range_is_not_zeroed(variant, n_in, xmax):
    need(variant, HAVE_INT8, "int8")
    rng = np.random.default_rng(n_in)
    # weights ~1 / xmax: each product of order 1 (up to 3e38 for the smallest inputs)
    w = (np.clip(rng.standard_normal((19, n_in)), -3, 3) / xmax).astype(F32)
    b = (rng.standard_normal(19) * 1e-3).astype(F32)
    x = (rng.uniform(-1, 1, n_in) * xmax).astype(F32)
    x[0] = F32(xmax)
    y, ok = kernel_lowp_dense("int8", variant, w, b, "identity", x)
    ys, _ = kernel_lowp_dense("int8", "scalar", w, b, "identity", x)
    assert ok
    np.testing.assert_array_equal(y, ys)            # the same answer on every set
    exact = _exact(w, b, x)
    mag = np.abs(w).astype(np.float64) @ np.abs(x).astype(np.float64)
    # int8 weights: each within half a step (max|row| / 254) of the fp32 one
    step = np.abs(w).max(axis=1).astype(np.float64) / 254 * np.abs(x).sum()
    assert np.all(np.abs(y - exact) <= step * 1.01 + 1e-6 * mag + 1e-6), (y, exact)
    assert np.abs(exact - b).max() > 1e-3           # the input matters here
    for act in ("relu", "tanh", "sigmoid"):
        ya, _ = kernel_lowp_dense("int8", variant, w, b, act, x)
        yr, _ = kernel_lowp_dense("int8", "scalar", w, b, act, x)
        np.testing.assert_array_equal(ya, yr)


@pytest.mark.parametrize("variant", ALL_INT8)
def test_int8_zero_input_is_the_bias_and_nonfinite_still_refused(variant):
    need(variant, HAVE_INT8, "int8")
    w = np.full((9, 5), 1e30, F32)
    b = np.arange(9, dtype=F32)
    y, ok = kernel_lowp_dense("int8", variant, w, b, "identity", np.zeros(5, F32))
    assert ok
    np.testing.assert_array_equal(y, b)
    for bad in (np.nan, np.inf):
        x = np.full(5, 1e-38, F32)
        x[3] = bad
        _, ok = kernel_lowp_dense("int8", variant, w, b, "identity", x)
        assert not ok


# ------------------------------------------------------------------ kernel shims at their limits
@pytest.mark.parametrize("weights", ["int8", "bf16"])
def test_lowp_shim_refuses_layers_outside_the_model_limits(weights):
    """kernel_lowp_dense took 140000 inputs, past the int32 dot of an int8 row (140000 ones
    under weights of 1 answered -126288.5), and a layer of no inputs (kernel_dense refuses
    both)."""
    n = 140000
    with pytest.raises(InputError, match="65536"):
        kernel_lowp_dense(weights, "scalar", np.ones((1, n), F32), np.zeros(1, F32), "identity",
                          np.ones(n, F32))
    with pytest.raises(InputError, match="at least one input"):
        kernel_lowp_dense(weights, "scalar", np.ones((3, 0), F32), np.zeros(3, F32), "identity",
                          np.zeros(0, F32))
    # the widest layer a model may have is taken, and exact for ones (int8: 65536 * 127 * 127
    # fits int32)
    n = 65536
    y, ok = kernel_lowp_dense(weights, "scalar", np.ones((1, n), F32), np.zeros(1, F32),
                              "identity", np.ones(n, F32))
    assert ok and y[0] == n


