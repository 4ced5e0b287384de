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
from conftest import ISAS, engine_cfg

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


@pytest.mark.parametrize("thr", THRESHOLDS)
def test_direction_guard_matches_float64(isa, thr):
    wrong = []
    for t, a, b, c in PAIRS:
        if t != thr or abs(c - thr) <= MARGIN:
            continue
        got = K.kernel_cache_decide(isa, b, a, thr, 0.5)
        want = "hit" if c >= thr else "cosine"
        if got != want:
            wrong.append((c - thr, got))
    assert not wrong, f"{len(wrong)} decisions differ from float64, e.g. {wrong[:5]}"


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


@pytest.mark.parametrize("thr", [0.99999, 0.999999])
def test_engine_decides_as_float64(isa, thr):
    """End to end: the policy's threshold reaches the lookup without float32 rounding
    (float32(0.999999) is 0.99999899..., 1e-9 off, and float32 sums are ~1e-7 off)."""
    pol = CachePolicy(enabled=True, cos_threshold=thr, norm_tol=0.5, max_age_ns=10**15,
                      max_run=10**6)
    eng = Engine(_identity_model(pol), config=engine_cfg(isa))
    t = 0
    wrong = []
    for _, a, b, c in (p for p in PAIRS if p[0] == thr and abs(p[3] - thr) > MARGIN):
        # a is unrelated to the previous pair (cosine ~0): a miss that stores a
        t += 10
        assert not eng.step(a, 0, ts_ns=t).cached
        r = eng.step(b, 0, ts_ns=t + 1)
        if r.cached != (c >= thr):
            wrong.append(c - thr)
    assert not wrong, f"{len(wrong)} engine decisions differ from float64, e.g. {wrong[:5]}"


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
