"""The cache's float32 first look (fp_cache.h, difference form) held to its contract at its edges.

Contract: whenever the float32 look decides (hit, cosine miss, norm miss) its decision is the
double path's (fp_cache_decide_f64). The double path errs by up to eps2 = (n + 8) 2^-52 in
cosine, so a decision the look makes is only safe where the exact cosine (or norm ratio) lies
more than eps2 beyond the threshold. These tests walk each pair to the very edge of what the
look decides (bisection on the angle or the norm ratio) and check the exact value there,
computed in integers, on every kernel set, at feature counts from 1 to 300, thresholds from
1e-300 to past 1, magnitudes from the 2^-64 floor of |f|^2 to near float32's overflow, with
subnormal components, opposite directions and zero vectors. The double path's decision is
rebuilt in Python from the kernel's own double sums (kernel_dot_norms_f64) with the same
double operations as fp_cache_decide_f64, so it is the reference and not the lookup itself
(kernel_cache_decide runs the float32 look first: comparing the look with it compares the
look with itself wherever the look decides).
"""
import math
from decimal import Decimal, localcontext

import numpy as np
import pytest

from fastpath import _kernels as K
from helpers.mxcsr import flush_to_zero
from helpers.reference import double_decision


f64_decision = double_decision


def exact(f, c):
    """(cos(f, c), |f| / |c|) of two float32 vectors, exact to ~60 digits."""
    ia = [int(v) for v in np.ldexp(f.astype(np.float64), 149)]
    ib = [int(v) for v in np.ldexp(c.astype(np.float64), 149)]
    p = sum(x * y for x, y in zip(ia, ib))
    sa, sb = sum(x * x for x in ia), sum(y * y for y in ib)
    with localcontext() as ctx:
        ctx.prec = 60
        return (Decimal(p) / (Decimal(sa) * Decimal(sb)).sqrt(),
                (Decimal(sa) / Decimal(sb)).sqrt())


def eps2(n):
    return Decimal((n + 8) * 2.0 ** -52)


def rotated(c, u, ang, rho):
    """float32 rho |c| (cos(ang) c / |c| + sin(ang) u), u a unit vector orthogonal to c."""
    c64 = c.astype(np.float64)
    nc = np.linalg.norm(c64)
    with np.errstate(over="ignore", under="ignore"):
        return (rho * (math.cos(ang) * c64 + math.sin(ang) * nc * u)).astype(np.float32)


def key_and_dir(rng, n, scale, sparse):
    for _ in range(50):
        c = (rng.standard_normal(n) * scale / math.sqrt(n)).astype(np.float32)
        if sparse:
            # most components ~2^-30 smaller: their products and squares go subnormal
            c[rng.random(n) < 0.7] *= np.float32(2.0 ** -30)
        c64 = c.astype(np.float64)
        if not np.isfinite(c).all() or not (c64 @ c64) > 0:
            continue
        u = rng.standard_normal(n)
        u -= (u @ c64) / (c64 @ c64) * c64
        nu = np.linalg.norm(u)
        if n == 1 or nu == 0:
            u = np.zeros(n)
        else:
            u /= nu
        return c, u
    raise AssertionError("no key")


CASES = [  # (n, threshold, tolerance, scale of |c|, sparse)
    (1, 0.999999, 0.5, 1.0, False),
    (2, 1 - 1e-13, 0.01, 10.0, False),
    (3, 1 - 1e-11, 0.01, 2.0 ** -31.5, False),    # |c|^2 just above the 2^-64 floor
    (5, 0.9999999, 1e-6, 2.0 ** 60, False),        # |c|^2 near 2^120
    (17, 0.999999, 0.5, 1.0, True),
    (17, 0.3, 3.0, 1e-3, True),
    (33, 1e-300, 0.999, 1e5, False),
    (128, 0.999999, 0.05, 1.0, False),
    (128, 1 - 1e-9, 0.5, 2.0 ** -30, True),
    (128, 0.99, 1.0, 1e12, False),
    (129, 1.0, 0.5, 1.0, False),
    (300, 0.999, 0.002, 3.0, True),
]


def _under(ftz, fn, *args):
    """fn(*args), with MXCSR's FTZ and DAZ on for the call when ftz (the vectors are built and
    checked outside it, so numpy's own arithmetic is not flushed)."""
    if not ftz:
        return fn(*args)
    with flush_to_zero():
        return fn(*args)


@pytest.mark.parametrize("ftz", [False, True], ids=["ieee", "ftz"])
@pytest.mark.parametrize("case", CASES)
def test_float_look_edges_are_safe(isa, case, ftz):
    """At the angle where the look stops deciding a hit (and where it starts deciding a cosine
    miss), the exact cosine is more than eps2 on the decided side of the threshold, and the
    decision is the double path's; with gradual underflow and with flush-to-zero (below)."""
    n, t, tol, scale, sparse = case
    rng = np.random.default_rng(n * 1000 + int(scale > 1))
    checked = 0
    for trial in range(4):
        c, u = key_and_dir(rng, n, scale, sparse)
        rho = 1.0 + (0.0, 1e-9, -1e-7, 1e-4)[trial] * (tol < 1)
        tau = 1.0 - t
        ang0 = math.acos(min(1.0, max(-1.0, t))) if tau > 1e-15 else 1e-7
        look = lambda a: _under(ftz, K.kernel_cache_look_f32, isa, rotated(c, u, a, rho), c, t, tol)
        for target, lo, hi in (("hit", 0.0, ang0), ("cosine", ang0, min(math.pi, 2.0 * ang0 + 1e-6))):
            decided = (lambda r: r in ("hit", "norm")) if target == "hit" else (lambda r: r == "cosine")
            if not decided(look(lo if target == "hit" else hi)):
                continue
            for _ in range(60):
                mid = 0.5 * (lo + hi)
                if decided(look(mid)) == (target == "hit"):
                    lo = mid
                else:
                    hi = mid
            f = rotated(c, u, lo if target == "hit" else hi, rho)
            r = look(lo if target == "hit" else hi)
            assert decided(r)
            assert r == _under(ftz, f64_decision, isa, f, c, t, tol), (target, r)
            cos, _ = exact(f, c)
            margin = cos - Decimal(t) if target == "hit" else Decimal(t) - cos
            assert margin > eps2(n), (target, float(margin), float(eps2(n)))
            checked += 1
    if t < 1.0:
        assert checked > 0


@pytest.mark.parametrize("n,t,tol,scale", [(3, 0.99, 0.01, 1.0), (17, 0.5, 0.3, 1e-8),
                                           (128, 0.999999, 1e-4, 1.0), (128, 0.3, 0.999, 1e15),
                                           (300, 0.9, 0.5, 2.0 ** -31.5)])
def test_float_look_norm_edges_are_safe(isa, n, t, tol, scale):
    """The same at the norm ratio where the look stops deciding a hit and where it starts
    deciding a norm miss, on both sides of 1."""
    rng = np.random.default_rng(n)
    c, u = key_and_dir(rng, n, scale, False)
    ang = 0.0 if n == 1 else 0.3 * math.acos(t)
    checked = 0
    for side in (1.0, -1.0):
        edge = 1.0 + side * tol
        far = 1.0 + side * 2.0 * tol if side > 0 else max(1.0 - 2.0 * tol, 0.5 * edge)
        look = lambda rho: K.kernel_cache_look_f32(isa, rotated(c, u, ang, rho), c, t, tol)
        for target, lo, hi in (("hit", 1.0, edge), ("norm", edge, far)):
            if look(lo if target == "hit" else hi) != target:
                continue
            for _ in range(70):
                mid = 0.5 * (lo + hi)
                if (look(mid) == target) == (target == "hit"):
                    lo = mid
                else:
                    hi = mid
            rho = lo if target == "hit" else hi
            f = rotated(c, u, ang, rho)
            assert look(rho) == target == f64_decision(isa, f, c, t, tol)
            _, ratio = exact(f, c)
            dev = abs(ratio - 1)
            margin = Decimal(tol) - dev if target == "hit" else dev - Decimal(tol)
            assert margin > eps2(n), (target, side, float(margin))
            checked += 1
    assert checked >= 2


def test_float_look_special_inputs(isa):
    """Zero, NaN, Inf and out-of-range sums, thresholds at and past 1 or <= 0, negative
    tolerances: the look decides only what the double path decides the same way."""
    rng = np.random.default_rng(3)
    c = rng.standard_normal(40).astype(np.float32)
    zero = np.zeros(40, np.float32)
    tiny = (c * np.float32(1e-30)).astype(np.float32)
    big = (c * np.float32(1e19)).astype(np.float32)
    nan, inf = c.copy(), c.copy()
    nan[7], inf[39] = np.nan, np.inf
    vecs = [c, -c, zero, tiny, big, nan, inf, (c * np.float32(1.0001)).astype(np.float32)]
    for t in (-1.0, 0.0, 5e-324, 0.5, 1.0 - 2.0 ** -53, 1.0, 1.0 + 2.0 ** -52, 1.0 + 1e-12,
              2.0, math.inf, math.nan):
        for tol in (-1.0, 0.0, 1e-9, 0.5, 1.0, 3.0, math.inf, math.nan):
            for f in vecs:
                for k in vecs:
                    r = K.kernel_cache_look_f32(isa, f, k, t, tol)
                    if r != "undecided":
                        with np.errstate(all="ignore"):
                            want = f64_decision(isa, f, k, t, tol)
                        assert r == want, (t, tol, r, want)


# ---- flush-to-zero ---------------------------------------------------------------------------
# torch.set_flush_denormal(True), or loading any shared library built with -ffast-math, sets
# MXCSR's FTZ and DAZ bits for the thread: an underflowing float32 product is then 0, not
# within 2^-150 of its value. The look's bound must hold there too (the double path's sums
# of float products never underflow).

def ftz_pair(seed, n=128):
    """(f, c): |c|^2 ~ 2^-88, f - c of +-2^-66 in every component: each square of a
    difference (2^-132) underflows, so under FTZ the float32 |f - c|^2 is 0, while the pair's
    true 1 - cos is ~1e-11."""
    rng = np.random.default_rng(seed)
    c = (rng.standard_normal(n) * 2.0 ** -44 / math.sqrt(n)).astype(np.float32)
    f = (c + rng.choice([-1.0, 1.0], n) * 2.0 ** -66).astype(np.float32)
    return f, c


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_float_look_under_flush_to_zero(isa, seed):
    f, c = ftz_pair(seed)
    t = 1.0 - 1e-12
    cos, _ = exact(f, c)
    assert cos < Decimal(t) - Decimal(1e-12)        # a clear miss
    with flush_to_zero():
        look = K.kernel_cache_look_f32(isa, f, c, t, 0.5)
        want = double_decision(isa, f, c, t, 0.5)
        full = K.kernel_cache_decide(isa, f, c, t, 0.5)
    assert want == "cosine"
    assert look in ("cosine", "undecided")
    assert full == "cosine"


def test_engine_under_flush_to_zero(isa):
    """End to end: the key stored, then a tick 1e-11 off in cosine at threshold 1 - 1e-12
    must not be answered from the cache."""
    from fastpath import Engine
    from fastpath.model import CachePolicy, Layer, Model
    from helpers.builders import engine_cfg
    f, c = ftz_pair(7)
    pol = CachePolicy(enabled=True, cos_threshold=1.0 - 1e-12, norm_tol=0.5,
                      max_age_ns=10**15, max_run=10**6)
    w = np.random.default_rng(0).standard_normal((2, len(c))).astype(np.float32)
    eng = Engine(Model((Layer(w, np.zeros(2, np.float32), "identity"),), None, pol),
                 config=engine_cfg(isa))
    with flush_to_zero():
        assert not eng.step(c, 0, ts_ns=10).cached
        assert not eng.step(f, 0, ts_ns=11).cached
