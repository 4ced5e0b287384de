"""The batch log1p kernel of every kernel set against the C library's log1p (math.log1p calls
it), bit for bit: the kernels are glibc's FMA build of fdlibm's log1p, on every path of it
(x below 2^-54 and 2^-29, k = 0 below 0.41422, the reduction 1 + x = 2^k (1 + f), |f| below
2^-20, x past 2^53, subnormals, inf, NaN) and on the values the live book feeds it: sizes,
cumulative depths and whole-number counts."""
import math

import numpy as np
import pytest

from fastpath import _kernels as K
from helpers.book import libm_log1p

pytestmark = pytest.mark.skipif(
    not K.log1p_libm_fused(),
    reason="this host's C library log1p is not glibc's FMA build, the one the kernels "
           "reproduce (the live book keeps libm's log1p here)")


def _check(isa, x, want=None):
    x = np.asarray(x, np.float64)
    got = K.kernel_log1p(isa, x)
    want = libm_log1p(x) if want is None else want
    bad = np.flatnonzero(got.view(np.uint64) != want.view(np.uint64))
    assert bad.size == 0, (f"{isa}: {bad.size} of {x.size} differ from libm, first at "
                           f"x={x[bad[0]].hex()}: {got[bad[0]].hex()} vs {want[bad[0]].hex()}")


def _ulps_around(v, k=40):
    """v and the k doubles on each side of it (k ulps down and up)"""
    out = [v]
    lo = hi = v
    for _ in range(k):
        lo, hi = math.nextafter(lo, -math.inf), math.nextafter(hi, math.inf)
        out += [lo, hi]
    return out


@pytest.fixture(scope="module")
def wide():
    """Two million inputs over the book's range and every path, and libm's answers."""
    rng = np.random.default_rng(36)
    bits = rng.integers(0, 0x7FF0000000000000, 400_000, dtype=np.uint64)
    x = np.concatenate([
        rng.random(400_000) * 1e12,                                    # depths, notional
        np.floor(rng.random(400_000) * 1e6),                           # whole sizes
        rng.random(200_000) * 0.5,                                     # k = 0
        rng.random(200_000) * 4.0,                                     # around 1 + x = 2
        np.ldexp(1.0 + rng.random(200_000), rng.integers(-60, 60, 200_000)),
        bits.view(np.float64),                                         # every finite x >= 0
        -rng.random(100_000),                                          # (-1, 0): libm's lanes
    ])
    return x, libm_log1p(x)


def test_log1p_equals_libm_on_two_million_values(isa, wide):
    _check(isa, *wide)


def test_log1p_equals_libm_at_every_path_boundary(isa):
    edges = [2.0 ** -54, 2.0 ** -29, 2.0 ** -20, math.sqrt(2) - 1, 0.41422, 0.5, 1.0, 2.0,
             2.0 ** 52, 2.0 ** 53, 2.0 ** 54, 1e4, 1e12, 2.0 ** 1023, 1.7976931348623157e308,
             5e-324, 2.2250738585072014e-308]
    # 0x3FDA827A: the high word where k = 0 ends; 0x6a09e: where u is halved instead
    edges += [np.array([0x3FDA827A00000000], np.uint64).view(np.float64)[0],
              np.array([0x3FF6A09E00000000], np.uint64).view(np.float64)[0] - 1.0]
    x = [v for e in edges for v in _ulps_around(e)]
    x += [0.0, -0.0, math.inf, math.nan, -math.nan, -2.0 ** -30, -2.0 ** -29, -0.5, -0.999]
    x += [float(v) for v in range(0, 70_000)]                         # counts, whole sizes
    _check(isa, x)


def test_log1p_subnormals_and_specials_keep_their_bits(isa):
    sub = np.arange(1, 20_000, dtype=np.uint64) * np.uint64(0x10000001)
    x = np.concatenate([sub.view(np.float64), [np.inf, np.nan, 0.0, -0.0]])
    _check(isa, x)
    got = K.kernel_log1p(isa, x)
    assert np.isnan(got[-3]) and got[-4] == np.inf
    assert np.signbit(got[-1]) and not np.signbit(got[-2])


@pytest.mark.parametrize("n", range(0, 19))
def test_log1p_every_length_and_tail(isa, n):
    """Every tail length of a 4- and 8-lane set, and nothing written past n."""
    x = np.linspace(0.0, 3e5, n) + 0.37
    _check(isa, x)
