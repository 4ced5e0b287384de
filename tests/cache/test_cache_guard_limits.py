"""The cache's guards at their limits: thresholds of exactly 1 and -1, zero-norm ticks, and the
age and run guards at their boundary values, on every kernel set."""

import numpy as np
import pytest

from fastpath import Engine
from helpers.builders import random_model


F32 = np.float32


def _cache_engine(isa, n=16, n_symbols=4, **pol):
    rng = np.random.default_rng(5)
    policy = dict(enabled=True, cos_threshold=0.999, norm_tol=0.1, max_age_ns=10**12,
                  max_run=1000)
    policy.update(pol)
    return Engine(random_model(rng, [n, 8, 2]),
                  config={"engine": {"simd": isa, "n_symbols": n_symbols}, "cache": policy})


@pytest.mark.parametrize("thr", [1.0, 1.0 - 2.0**-53, 1.0 - 2.0**-52])
def test_exact_repeat_hits_at_threshold_one(isa, thr):
    """Defect guarded: at cos_threshold 1.0 an exact repeat of the key missed as "cosine" about
    one time in four (|f| |c| rounded an ulp above the dot product); a doubled key misses as
    "norm"."""
    from fastpath import _kernels as K
    rng = np.random.default_rng(11)
    e = _cache_engine(isa, cos_threshold=thr, norm_tol=0.0)
    wrong = []
    for i in range(200):
        x = (rng.standard_normal(16) * 10 ** rng.uniform(-4, 4)).astype(F32)
        e.reset(0)
        e.step(x, 0, ts_ns=1)
        r = e.step(x.copy(), 0, ts_ns=2)
        d = e.step(x * F32(2), 0, ts_ns=3)
        if not r.cached or r.miss_reason != "hit" or d.miss_reason != "norm":
            wrong.append((i, r.miss_reason, d.miss_reason))
        if K.kernel_cache_decide(isa, x, x, thr, 0.0) != "hit":
            wrong.append((i, "kernel"))
    assert not wrong, wrong[:5]


def test_opposite_key_passes_the_direction_guard_at_threshold_minus_one(isa):
    # cos_threshold -1 (a policy on the norm alone): cosine -1 >= -1, the same tie at the
    # other end; it missed as "cosine" when |f| |c| rounded below -dot
    from fastpath import _kernels as K
    rng = np.random.default_rng(13)
    e = _cache_engine(isa, cos_threshold=-1.0, norm_tol=0.0)
    wrong = []
    for i in range(200):
        x = (rng.standard_normal(16) * 10 ** rng.uniform(-4, 4)).astype(F32)
        e.reset(0)
        e.step(x, 0, ts_ns=1)
        r = e.step(-x, 0, ts_ns=2)
        if r.miss_reason != "hit" or K.kernel_cache_decide(isa, -x, x, -1.0, 0.0) != "hit":
            wrong.append((i, r.miss_reason))
    assert not wrong, wrong[:5]


def test_cosine_just_below_one_still_misses_at_threshold_one(isa):
    # the tie rule decides ties only: a key turned by 1e-6 rad still misses at threshold 1.0
    e = _cache_engine(isa, cos_threshold=1.0, norm_tol=0.5)
    x = np.zeros(16, F32)
    x[0] = 1.0
    y = x.copy()
    y[1] = F32(1e-3)
    e.step(x, 0, ts_ns=1)
    assert e.step(y, 0, ts_ns=2).miss_reason == "cosine"


def test_zero_norm_ticks(isa):
    # a zero feature vector matches only another zero vector; never a NaN cosine that hits
    e = _cache_engine(isa)
    z = np.zeros(16, F32)
    x = np.ones(16, F32)
    assert e.step(z, 0, ts_ns=1).miss_reason == "cold"
    assert e.step(z, 0, ts_ns=2).cached
    assert e.step(x, 0, ts_ns=3).miss_reason == "cosine"
    assert e.step(z, 0, ts_ns=4).miss_reason == "cosine"
    tiny = np.full(16, 1e-45, F32)            # denormal ticks: a direction, not zero
    assert e.step(tiny, 1, ts_ns=1).miss_reason == "cold"
    assert e.step(tiny, 1, ts_ns=2).cached
    assert e.step(z, 1, ts_ns=3).miss_reason == "cosine"


def test_age_and_run_guards_at_their_limits(isa):
    e = _cache_engine(isa, max_age_ns=100, max_run=2)
    x = np.linspace(1, 2, 16).astype(F32)
    assert e.step(x, 0, ts_ns=0).miss_reason == "cold"
    assert e.step(x, 0, ts_ns=100).cached                       # age == max_age: a hit
    assert e.step(x, 0, ts_ns=100).cached                       # run 2
    assert e.step(x, 0, ts_ns=100).miss_reason == "run"         # run == max_run: refresh
    assert e.step(x, 0, ts_ns=201).miss_reason == "age"         # 101 after the refresh
    e2 = _cache_engine(isa, max_run=0)
    e2.step(x, 0, ts_ns=0)
    assert e2.step(x, 0, ts_ns=1).miss_reason == "run"
