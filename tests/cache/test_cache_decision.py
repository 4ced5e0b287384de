"""Cache hit/miss decisions at tight thresholds match a float64 reference on every kernel set.

The direction guard is cos(f, cached) >= cos_threshold. With thresholds like 0.999999, 1 -
threshold is the size of float32 rounding in a 128-term dot product, so a float32 decision is
noise and differs between kernel sets. Pairs are built with a chosen float64 cosine just
above or below each threshold (offsets 1e-8 .. 3e-6); every pair farther than 1e-8 from the
threshold must be decided as float64 decides it, by the kernel's lookup and by an Engine,
and the scalar and vector sets must agree. The magnitude guard is checked the same way.
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fastpath import Engine
from fastpath import _kernels as K
from fastpath.model import CachePolicy, Layer, Model
from helpers.builders import ISAS, engine_cfg
from helpers.reference import double_decision

N = 128
THRESHOLDS = (0.999, 0.9999, 0.99999, 0.999999)
MARGIN = 1e-8


def cos64(a, b):
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(a @ b / np.sqrt((a @ a) * (b @ b)))


def pair(rng, target, scale=1.0, norm_ratio=1.0):
    """float32 (a, b) whose cosine is close to `target` (its float64 value is recomputed
    after rounding to float32), |b| = norm_ratio * |a|. Components are heavy-tailed so the
    sums mix magnitudes, as real features do."""
    a = (rng.standard_t(3, N) * scale).astype(np.float32)
    a64 = a.astype(np.float64)
    u = rng.standard_normal(N)
    u -= (u @ a64) / (a64 @ a64) * a64
    u /= np.linalg.norm(u)
    na = np.linalg.norm(a64)
    s = np.sqrt(max(0.0, 1.0 - target * target))
    b = ((target * a64 / na + s * u) * na * norm_ratio).astype(np.float32)
    return a, b


def offsets(rng, n):
    mag = 10.0 ** rng.uniform(-8, np.log10(3e-6), n)
    return mag * rng.choice([-1.0, 1.0], n)


def make_pairs(seed, n_per_threshold=300):
    rng = np.random.default_rng(seed)
    out = []
    for thr in THRESHOLDS:
        for off, scale in zip(offsets(rng, n_per_threshold),
                              rng.choice([1e-3, 1.0, 30.0, 1e3], n_per_threshold)):
            target = thr + off
            if target >= 1.0:
                continue
            a, b = pair(rng, target, scale)
            out.append((thr, a, b, cos64(a, b)))
    return out


PAIRS = make_pairs(12345)


def test_pairs_straddle_the_thresholds():
    """The generator does what the tests rely on: most pairs land within 3e-6 of a threshold,
    on both sides, and far enough from it to be checked."""
    d = np.array([c - thr for thr, _, _, c in PAIRS])
    checked = np.abs(d) > MARGIN
    assert checked.mean() > 0.8
    assert (d[checked] > 0).sum() > 300 and (d[checked] < 0).sum() > 300
    assert np.abs(d).max() < 5e-6


def test_kernel_sets_decide_alike():
    if len(ISAS) < 2:
        pytest.skip("one kernel set on this CPU")
    for thr, a, b, c in PAIRS:
        if abs(c - thr) > MARGIN:
            got = {isa: K.kernel_cache_decide(isa, b, a, thr, 0.5) for isa in ISAS}
            assert len(set(got.values())) == 1, (c - thr, got)


@pytest.mark.parametrize("tol", [0.002, 0.02])
def test_norm_guard_matches_float64(isa, tol):
    """Same direction, |b| / |a| - 1 just inside or outside norm_tol."""
    rng = np.random.default_rng(99)
    wrong = 0
    checked = 0
    for off in np.concatenate([offsets(rng, 200), [0.0]]):
        ratio = 1.0 + tol + off if rng.random() < 0.5 else 1.0 - tol - off
        a = (rng.standard_t(3, N) * rng.choice([1e-2, 1.0, 1e2])).astype(np.float32)
        b = (a.astype(np.float64) * ratio).astype(np.float32)
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        rel = abs(np.sqrt((b64 @ b64) / (a64 @ a64)) - 1.0)
        if abs(rel - tol) <= MARGIN:
            continue
        checked += 1
        want = "hit" if rel <= tol else "norm"
        wrong += K.kernel_cache_decide(isa, b, a, 0.99, tol) != want
    assert checked > 150 and wrong == 0


def _identity_model(policy):
    # 128 -> 2 with the default (identity) feature spec: the cached key is the raw tick
    w = np.random.default_rng(0).standard_normal((2, N)).astype(np.float32) * 0.01
    return Model((Layer(w, np.zeros(2, np.float32), "identity"),), None, policy)


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), thr=st.sampled_from(THRESHOLDS),
       log_off=st.floats(-8, -5.5), sign=st.sampled_from([-1.0, 1.0]),
       scale=st.sampled_from([1e-4, 1.0, 1e4]))
def test_decision_property(seed, thr, log_off, sign, scale):
    a, b = pair(np.random.default_rng(seed), thr + sign * 10.0 ** log_off, scale)
    c = cos64(a, b)
    if abs(c - thr) <= MARGIN or c >= 1.0:
        return
    want = "hit" if c >= thr else "cosine"
    for isa in ISAS:
        assert K.kernel_cache_decide(isa, b, a, thr, 0.5) == want, (isa, c - thr)


# ---- the float32 first look and its fallback band ------------------------------------------
# The lookup compares the vectors with float32 sums first and decides there only when a
# rigorous bound on their error keeps the threshold out of reach; otherwise it sums again in
# double. BAND is that bound for a cosine from float32 sums of a.b, |a|^2, |b|^2, in cosine
# units for N features (about 2 g, g = m 2^-24, m = FP_DOTF_ROUNDINGS(N) = ceil(N / 16) + 7):
# the look's first form, inside which a float32 cosine decides wrongly. Pairs are placed
# inside it, at its edges and just outside it; the difference form (fp_cache.h) decides most
# of them itself (its band is ~1e-11, see the tight-threshold tests below), the double path
# the rest, all as float64 does.
BAND = 2.0 * ((N + 15) // 16 + 7) * 2.0 ** -24
BAND_STEPS = (0.01, 0.02, 0.05, 0.2, 0.5, 0.8, 0.95, 1.0, 1.05, 1.3, 2.0, 4.0, 30.0, 300.0)


def band_pairs(seed, scales=(1e-3, 1.0, 30.0, 1e3)):
    rng = np.random.default_rng(seed)
    out = []
    for thr in THRESHOLDS:
        for k in BAND_STEPS:
            for sign in (-1.0, 1.0, -1.0, 1.0):
                target = thr + sign * k * BAND
                if target >= 1.0:
                    continue
                a, b = pair(rng, target, float(rng.choice(scales)))
                out.append((thr, a, b, cos64(a, b)))
    return out


BAND_PAIRS = band_pairs(2024) + band_pairs(7, scales=(1e-12, 1e12))


def cos32(a, b):
    """The cosine from float32 sums in 16 chains, as the float32 first look sums it."""
    def s(x, y):
        return np.float32((x * y).reshape(-1, 16).sum(0, dtype=np.float32).sum(dtype=np.float32))
    return float(s(a, b)) / np.sqrt(float(s(a, a)) * float(s(b, b)))


def test_band_pairs_need_the_fallback():
    """The band is real: inside it a float32 decision gets some pairs wrong (so a lookup that
    trusted its float sums there would differ from float64), and the pairs cover both sides
    of every threshold inside and outside the band."""
    inside = [(t, a, b, c) for t, a, b, c in BAND_PAIRS if MARGIN < abs(c - t) < BAND]
    wrong32 = sum((cos32(a, b) >= t) != (c >= t) for t, a, b, c in inside)
    assert wrong32 > 0
    for thr in THRESHOLDS:
        d = np.array([c - t for t, _, _, c in BAND_PAIRS if t == thr])
        assert (d > BAND).any() or thr + BAND >= 1.0
        assert (d < -BAND).any() and ((-BAND < d) & (d < -MARGIN)).any()
        assert ((MARGIN < d) & (d < BAND)).any() or thr + MARGIN >= 1.0


# the pair sets the direction checks run on, with the unit their offsets are reported in
_PAIR_SETS = {"straddling": lambda: (PAIRS, 1.0), "float_band": lambda: (BAND_PAIRS, BAND)}


@pytest.mark.parametrize("which", ["straddling", "float_band"])
@pytest.mark.parametrize("thr", THRESHOLDS)
def test_direction_guard_decides_as_float64(isa, thr, which):
    """kernel_cache_decide's direction guard decides as the float64 cosine does, for pairs
    straddling each threshold within 3e-6 and for pairs in and around the float32 band
    (offsets reported in bands there)."""
    pairs, unit = _PAIR_SETS[which]()
    wrong = []
    for t, a, b, c in pairs:
        if t != thr or abs(c - thr) <= MARGIN:
            continue
        got = K.kernel_cache_decide(isa, b, a, thr, 0.5)
        if got != ("hit" if c >= thr else "cosine"):
            wrong.append(((c - thr) / unit, got))
    assert not wrong, f"{len(wrong)} decisions differ from float64, e.g. {wrong[:5]}"


@pytest.mark.parametrize("tol", [0.002, 0.02, 0.3])
def test_norm_guard_in_and_around_the_float_band(isa, tol):
    """|b| / |a| - 1 placed within a few float32 bounds of +-tol, on both sides: the float
    look decides the clear ones, the double path the others, and all as float64 does."""
    rng = np.random.default_rng(int(tol * 1e4))
    wrong, checked = [], 0
    for k in BAND_STEPS:
        for side in (1.0, -1.0):
            for inside in (1.0, -1.0):
                ratio = 1.0 + side * (tol - inside * k * BAND)
                a = (rng.standard_t(3, N) * rng.choice([1e-3, 1.0, 1e3])).astype(np.float32)
                b = (a.astype(np.float64) * ratio).astype(np.float32)
                a64, b64 = a.astype(np.float64), b.astype(np.float64)
                rel = abs(np.sqrt((b64 @ b64) / (a64 @ a64)) - 1.0)
                if abs(rel - tol) <= MARGIN:
                    continue
                checked += 1
                got = K.kernel_cache_decide(isa, b, a, 0.99, tol)
                if got != ("hit" if rel <= tol else "norm"):
                    wrong.append(((rel - tol) / BAND, got))
    assert checked > 40 and not wrong, wrong[:5]


@pytest.mark.parametrize("scale", [1e-30, 1e-19, 3e17, 1e19])
def test_extreme_magnitudes_decide_as_float64(isa, scale):
    """Squares that underflow float32 (|f| ~ 1e-19 and below) or overflow it (1e19) leave the
    float look without a bound: the double path decides, as float64 does, far from and near
    the threshold."""
    rng = np.random.default_rng(int(np.log10(scale)) + 40)
    for thr in (0.999, 0.999999):
        for off in (-1e-2, -3e-6, -5e-7, 5e-7, 3e-6):
            if thr + off >= 1.0:
                continue
            a, b = pair(rng, thr + off, scale)
            c = cos64(a, b)
            if abs(c - thr) <= MARGIN:
                continue
            assert K.kernel_cache_decide(isa, b, a, thr, 0.5) == ("hit" if c >= thr else "cosine"), \
                (scale, thr, c - thr)


@pytest.mark.parametrize("which, thr", [("straddling", 0.99999), ("straddling", 0.999999),
                                        ("float_band", 0.9999), ("float_band", 0.999999)])
def test_engine_decides_as_float64(isa, which, thr):
    """End to end through an Engine's lookup: the policy's threshold reaches it without float32
    rounding (float32(0.999999) is 0.99999899..., 1e-9 off, and float32 sums are ~1e-7 off),
    for pairs straddling the threshold and pairs in and around the float32 band."""
    pairs, unit = _PAIR_SETS[which]()
    pol = CachePolicy(enabled=True, cos_threshold=thr, norm_tol=0.5, max_age_ns=10**15,
                      max_run=10**6)
    eng = Engine(_identity_model(pol), config=engine_cfg(isa))
    t = 0
    wrong = []
    for _, a, b, c in (p for p in pairs if p[0] == thr and abs(p[3] - thr) > MARGIN):
        # a is unrelated to the previous pair (cosine ~0): a miss that stores a
        t += 10
        assert not eng.step(a, 0, ts_ns=t).cached
        if eng.step(b, 0, ts_ns=t + 1).cached != (c >= thr):
            wrong.append((c - thr) / unit)
    assert not wrong, f"{len(wrong)} engine decisions differ from float64, e.g. {wrong[:5]}"


def test_engine_recomputes_the_cached_norm_for_each_new_key(isa):
    """|cached| in double is computed on the first lookup that needs it and kept with the
    key; a new key (a miss stores it) must not be judged with the previous key's norm. Keys
    alternate between one direction at norms 1 and 3 (times 1e-17: float32 sums of squares
    below 2^-64, which the float32 look leaves to the double path); each is followed by
    lookups of its own size (so the double path, and the kept norm, decide), which must hit;
    with the previous key's norm kept, the norm guard (tol 0.5) would refuse them."""
    thr = 0.999999
    pol = CachePolicy(enabled=True, cos_threshold=thr, norm_tol=0.5, max_age_ns=10**15,
                      max_run=10**6)
    eng = Engine(_identity_model(pol), config=engine_cfg(isa))
    rng = np.random.default_rng(5)
    base = rng.standard_t(3, N)
    t = 0
    for scale in (1e-17, 3e-17, 1e-17, 3e-17):
        key = (base * scale).astype(np.float32)
        t += 10
        eng.step(pair(rng, 0.5)[1], 0, ts_ns=t)      # unrelated to any key: a miss
        t += 10
        assert not eng.step(key, 0, ts_ns=t).cached  # 1 : 3 from the last key: a miss, stored
        k64 = key.astype(np.float64)
        for _ in range(4):
            u = rng.standard_normal(N)
            u -= (u @ k64) / (k64 @ k64) * k64
            u *= np.linalg.norm(k64) / np.linalg.norm(u)
            target = thr + 0.25 * BAND
            near = (target * k64 + np.sqrt(1.0 - target ** 2) * u).astype(np.float32)
            assert thr + MARGIN < cos64(key, near) < thr + BAND
            assert K.kernel_cache_look_f32(isa, near, key, thr, 0.5) == "undecided"
            t += 1
            assert eng.step(near, 0, ts_ns=t).cached, scale


def _toward(rng, key, target, norm_ratio=1.0):
    """float32 vector whose float64 cosine with `key` is close to `target`, |v| ~ norm_ratio |key|."""
    k64 = key.astype(np.float64)
    u = rng.standard_normal(N)
    u -= (u @ k64) / (k64 @ k64) * k64
    u *= np.linalg.norm(k64) / np.linalg.norm(u)
    s = np.sqrt(max(0.0, 1.0 - target * target))
    return ((target * k64 + s * u) * norm_ratio).astype(np.float32)


@pytest.mark.parametrize("thr", [0.9999, 0.999999])
def test_engine_decides_drifting_ticks_as_float64(isa, thr):
    """A symbol's ticks drift: each one is close to the key the slot holds, so lookups follow
    close pairs and hits (the slot's state after a hit must not change the next decision).
    Mixed in: far jumps and norm misses right after close pairs. Every decision farther than MARGIN
    from the threshold must be the float64 one; the key is tracked as the engine keeps it
    (a miss stores the tick, a hit leaves the key)."""
    tol = 0.5
    pol = CachePolicy(enabled=True, cos_threshold=thr, norm_tol=tol, max_age_ns=10**15,
                      max_run=10**6)
    eng = Engine(_identity_model(pol), config=engine_cfg(isa))
    rng = np.random.default_rng(int(thr * 1e6) + 7)
    key = rng.standard_t(3, N).astype(np.float32)
    t = 1
    assert not eng.step(key, 0, ts_ns=t).cached
    wrong, checked, kinds = [], 0, {"hit": 0, "cosine": 0, "norm": 0}
    for i in range(600):
        u = rng.random()
        if u < 0.08:
            x = _toward(rng, key, 0.5)                       # far jump
        elif u < 0.16:
            x = _toward(rng, key, thr + 1e-6, norm_ratio=1.8)  # aligned, too large: norm miss
        else:
            off = 10.0 ** rng.uniform(-8, -5.5) * rng.choice([-1.0, 1.0])
            x = _toward(rng, key, min(thr + off, 1.0 - 1e-9), norm_ratio=1.0 + rng.uniform(-0.01, 0.01))
        t += 1
        r = eng.step(x, 0, ts_ns=t)
        c = cos64(x, key)
        ratio = np.linalg.norm(x.astype(np.float64)) / np.linalg.norm(key.astype(np.float64))
        if abs(c - thr) > MARGIN and abs(abs(ratio - 1.0) - tol) > 1e-9:
            want = "hit" if (c >= thr and abs(ratio - 1.0) <= tol) else (
                "cosine" if c < thr else "norm")
            checked += 1
            kinds[want] += 1
            if r.miss_reason != want:
                wrong.append((i, want, r.miss_reason, c - thr))
        if not r.cached:
            key = x
    assert checked > 500 and min(kinds.values()) > 20, kinds
    assert not wrong, f"{len(wrong)} engine decisions differ from float64: {wrong[:5]}"


# ---- tight thresholds: the float32 look in the difference form ------------------------------
# The float32 look sums |f - c|^2 and |f|^2 - |c|^2 (fp_cache.h): its error is relative to
# |f - c|^2, so near a hit its band is ~1e-11 in cosine, not ~2e-6, and it proves hits at
# thresholds like 0.999999 that a float32 cosine cannot. Pairs sit at exactly known offsets
# from the threshold: the true cosine of the float32 vectors is computed in integers, and
# one coordinate (zero in f, free in c) tunes it after rounding to well under 1e-13.
TIGHT = (0.999999, 0.9999999, 1.0 - 1e-9)
TIGHT_OFFSETS = (1e-13, 1e-11, 1e-9, 1e-7)


def exact_cos(a, b):
    """(P, A, B) = (a.b, |a|^2, |b|^2) of float32 vectors as exact integers (scaled by 2^298)."""
    ia = [int(v) for v in np.ldexp(a.astype(np.float64), 149)]
    ib = [int(v) for v in np.ldexp(b.astype(np.float64), 149)]
    return (sum(x * y for x, y in zip(ia, ib)), sum(x * x for x in ia), sum(y * y for y in ib))


def exact_side(a, b, thr):
    """(cos(a, b) >= thr exactly, cos - thr as a Decimal to ~40 digits)."""
    from decimal import Decimal, localcontext
    from fractions import Fraction
    p, sa, sb = exact_cos(a, b)
    t = Fraction(thr)
    hit = p >= 0 and p * p * t.denominator ** 2 >= t.numerator ** 2 * sa * sb
    with localcontext() as ctx:
        ctx.prec = 60
        off = Decimal(p) / (Decimal(sa) * Decimal(sb)).sqrt() - Decimal(thr)
    return hit, off


def tight_pair(rng, thr, off, scale, ratio):
    """float32 (f, c) whose exact cosine is thr + off to within ~1e-15, |f| / |c| ~ ratio."""
    from decimal import Decimal, localcontext
    for _ in range(20):
        c = (rng.standard_t(3, N) * scale).astype(np.float32)
        c[0] = 0.0
        c64 = c.astype(np.float64)
        u = rng.standard_normal(N)
        u[0] = 0.0
        u -= (u @ c64) / (c64 @ c64) * c64
        u /= np.linalg.norm(u)
        target = thr + off
        start = target + min(1e-8, (1.0 - target) / 2)   # above target, below 1
        f = ((start * c64 / np.linalg.norm(c64) + np.sqrt(1.0 - start * start) * u)
             * np.linalg.norm(c64) * ratio).astype(np.float32)
        f[0] = 0.0
        p, sc, sf0 = exact_cos(c, f)
        with localcontext() as ctx:
            ctx.prec = 60
            tgt = Decimal(thr) + Decimal(off)
            # cos = p / sqrt(sc (sf0 + beta^2)) = tgt  =>  beta^2 = p^2 / (sc tgt^2) - sf0
            beta2 = (Decimal(p) ** 2 / (Decimal(sc) * tgt * tgt) - Decimal(sf0)) / Decimal(2) ** 298
            if p <= 0 or beta2 <= 0:
                continue
            f[0] = np.float32(float(beta2.sqrt()))
        return f, c
    raise AssertionError("could not place a pair")


def make_tight_pairs(seed):
    rng = np.random.default_rng(seed)
    out = []
    for thr in TIGHT:
        for off in TIGHT_OFFSETS:
            for sign in (1.0, -1.0):
                if thr + sign * off >= 1.0:
                    continue
                for scale, ratio in ((1.0, 1.0), (1e-3, 1.0), (1e3, 1.001), (1.0, 0.999),
                                     (30.0, 1.01)):
                    f, c = tight_pair(rng, thr, sign * off, scale, ratio)
                    hit, got_off = exact_side(f, c, thr)
                    out.append((thr, sign * off, ratio, f, c, hit, float(got_off)))
    return out


TIGHT_PAIRS = make_tight_pairs(31)


def test_tight_pairs_sit_where_intended():
    assert len(TIGHT_PAIRS) > 100
    for thr, off, _, _, _, hit, got in TIGHT_PAIRS:
        assert abs(got - off) <= 0.05 * abs(off), (thr, off, got)
        assert hit == (off > 0)


@pytest.mark.parametrize("thr", TIGHT)
def test_tight_thresholds_decide_exactly(isa, thr):
    """Every pair, down to 1e-13 from the threshold, is decided as the exact cosine says (the
    double path's error is ~2e-14 here); the float32 look never decides otherwise, and it
    decides every pair 1e-9 or more from the threshold whose norms are within 0.1%: hits
    included, which a float32 cosine could not prove at these thresholds."""
    wrong, undecided = [], []
    for t, off, ratio, f, c, hit, _ in TIGHT_PAIRS:
        if t != thr:
            continue
        want = "hit" if hit else "cosine"
        got = K.kernel_cache_decide(isa, f, c, thr, 0.5)
        look = K.kernel_cache_look_f32(isa, f, c, thr, 0.5)
        if got != want or look not in (want, "undecided"):
            wrong.append((off, ratio, got, look))
        if look == "undecided" and abs(off) >= 1e-9 and abs(ratio - 1.0) <= 1e-3:
            undecided.append((off, ratio))
    assert not wrong, f"{len(wrong)} decisions differ from the exact ones: {wrong[:5]}"
    assert not undecided, f"the float32 look left {len(undecided)} pairs undecided: {undecided}"


def test_engine_decides_tight_pairs_exactly(isa):
    thr = 0.9999999
    pol = CachePolicy(enabled=True, cos_threshold=thr, norm_tol=0.5, max_age_ns=10**15,
                      max_run=10**6)
    eng = Engine(_identity_model(pol), config=engine_cfg(isa))
    t, wrong = 0, []
    for _, off, _, f, c, hit, _ in (p for p in TIGHT_PAIRS if p[0] == thr):
        t += 10
        assert not eng.step(-c, 0, ts_ns=t).cached    # opposite to the key: a miss
        assert not eng.step(c, 0, ts_ns=t + 1).cached  # the key, stored
        if eng.step(f, 0, ts_ns=t + 2).cached != hit:
            wrong.append(off)
    assert not wrong, wrong


def _stream_pairs(n_ticks=20000):
    """Consecutive ticks of each symbol, as feature vectors of the demo model on the
    synthetic book stream: what a symbol's slot compares on the bench."""
    import os
    import fastpath
    from fastpath import lob
    model = Model.load(os.path.join(os.path.dirname(fastpath.__file__), "data", "demo.fpm"))
    bs = lob.generate_stream(n_ticks, n_symbols=8, seed=1)
    raws = lob.raw_from_book(bs)
    eng = Engine(model)
    last, pairs = {}, []
    for i in range(n_ticks):
        s = int(bs.symbols[i])
        f = eng.features(raws[i], s)
        eng.step(raws[i], s, int(bs.ts_ns[i]))
        if s in last:
            pairs.append((f, last[s]))
        last[s] = f
    return model.cache_policy, pairs


def test_float_look_decides_the_hits_of_a_real_stream(isa):
    """At the demo bundle's policy (cosine 0.999999) the float32 look decides nearly every
    lookup of the bench stream by itself, hits included (a float32 cosine proved none: each
    hit paid the double sums), and each decision it makes is the double one."""
    pol, pairs = _stream_pairs()
    assert pol.cos_threshold == 0.999999
    thr, tol = pol.cos_threshold, pol.norm_tol
    hits = decided_hits = decided = 0
    for f, c in pairs:
        want = double_decision(isa, f, c, thr, tol)
        assert K.kernel_cache_decide(isa, f, c, thr, tol) == want
        look = K.kernel_cache_look_f32(isa, f, c, thr, tol)
        assert look in (want, "undecided"), (want, look)
        decided += look != "undecided"
        if want == "hit":
            hits += 1
            decided_hits += look == "hit"
    assert hits >= 30
    assert decided_hits >= 0.9 * hits, (decided_hits, hits)
    assert decided >= 0.99 * len(pairs)
