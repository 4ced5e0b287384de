"""Reduced-precision kernels near FLT_MAX against the scalar variant: bf16 inputs and weights
near the largest float, a layer refused by its exact sum whatever the summation order of a
set, an int8 row whose one huge weight sets its scale."""
import numpy as np
import pytest

from fastpath import Engine, InputError
from fastpath._kernels import LowpMLP, kernel_lowp_dense, lowp_variants
from fastpath.model import CachePolicy, Layer, Model

from helpers.builders import ISAS

F32 = np.float32
FLT_MAX = float(np.finfo(F32).max)
_, HAVE_BF16 = lowp_variants("bf16")


# ------------------------------------------------------------------ bf16 near FLT_MAX
@pytest.mark.parametrize("variant", ["scalar", "avx2", "avx512", "avx512_bf16"])
def test_bf16_inputs_near_flt_max_are_accepted_as_scalar_does(variant):
    """Defect guarded: the native AVX-512 BF16 form rounded inputs above ~3.3961e38 to Inf and
    refused the layer, where the other forms and the fp32 model return finite outputs."""
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


# ------------------------------------------------------------------ overflow in one order only
def _overflow_case(rng, n, o):
    """A layer whose float32 sums overflow in some summation orders and not in others: terms
    of +-0.2..0.6 FLT_MAX, so a partial sum leaves the range or not by the order it is
    summed in, while the exact pre-activation is mostly finite."""
    w = (rng.choice([-1, 1], (o, n)) * rng.uniform(0.2, 0.6, (o, n)) * FLT_MAX).astype(F32)
    return w, np.ones(n, F32)


@pytest.mark.parametrize("weights", ["fp32", "bf16"])
def test_a_layer_is_refused_by_its_exact_sum_not_by_the_order_of_a_set(weights):
    """Defect guarded: each kernel set refused a layer where its own partial sums overflowed, so
    one tick in ten here was refused by one set and answered by another; a layer is refused only
    when its exact pre-activation does not fit a float32."""
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
