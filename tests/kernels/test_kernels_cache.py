"""The cache's similarity kernels against float64, on every kernel set this CPU runs: the dot
product and squared norms summed in double (exact float products, held to 1e-13 of the sum
of |terms|), the float32 first look's fused dot/norms and difference norms within their
stated rounding bounds, and reads that never go past the array's end."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fastpath import _kernels as K
from helpers.builders import ISAS
from helpers.reference import at_page_end


WIDTHS = (1, 7, 8, 9, 16, 37, 129, 300)


@pytest.mark.parametrize("n", WIDTHS)
def test_dot_norm2_matches_float64(isa, n):
    rng = np.random.default_rng(n + 2)
    a, b = rng.standard_normal((2, n)).astype(np.float32)
    d, s = K.kernel_dot_norm2(isa, a, b)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    assert abs(d - a64 @ b64) <= 1e-13 * np.abs(a64 * b64).sum() + 1e-300
    assert abs(s - a64 @ a64) <= 1e-13 * (a64 @ a64) + 1e-300


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
    a, keep_a = at_page_end(rng.standard_normal(n).astype(np.float32))
    b, keep_b = at_page_end(rng.standard_normal(n).astype(np.float32))
    _diff_norms_check(isa, a, b)
    del keep_a, keep_b
