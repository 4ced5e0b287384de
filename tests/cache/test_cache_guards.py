"""Each cache guard on its own through Engine.step: a repeat hits; another symbol, a scaled
vector (norm), a rotated one (cosine), an old entry (age) or a long run of hits (run) misses."""

import numpy as np

from fastpath import Engine
from helpers.builders import engine_cfg, random_model


# ------------------------------------------------------------------ cache semantics
def _eng(isa, **cache):
    rng = np.random.default_rng(11)
    return Engine(random_model(rng, [32, 16, 2]), config=engine_cfg(isa, **cache))


def test_same_vector_twice_hits(isa):
    eng = _eng(isa)
    x = np.random.default_rng(0).standard_normal(32).astype(np.float32)
    r1, r2 = eng.step(x, 0, ts_ns=0), eng.step(x, 0, ts_ns=1)
    assert (r1.cached, r2.cached) == (False, True)
    assert r1.miss_reason == "cold" and r2.miss_reason == "hit"
    assert (r2.signal, r2.confidence) == (r1.signal, r1.confidence)
    assert r2.latency.infer_ns == 0 and r1.latency.infer_ns > 0


def test_other_symbol_never_hits(isa):
    eng = _eng(isa)
    x = np.ones(32, np.float32)
    eng.step(x, 0, ts_ns=0)
    for s in range(1, 16):
        assert not eng.step(x, s, ts_ns=1).cached


def test_scaled_vector_misses_on_norm(isa):
    eng = _eng(isa)
    x = np.random.default_rng(1).standard_normal(32).astype(np.float32)
    eng.step(x, 0, ts_ns=0)
    r = eng.step(2 * x, 0, ts_ns=1)
    assert not r.cached and r.miss_reason == "norm"


def test_rotated_vector_misses_on_cosine(isa):
    eng = _eng(isa)
    rng = np.random.default_rng(2)
    x = rng.standard_normal(32).astype(np.float32)
    eng.step(x, 0, ts_ns=0)
    y = x + 0.2 * rng.standard_normal(32).astype(np.float32)
    assert eng.step(y, 0, ts_ns=1).miss_reason == "cosine"


def test_age_limit_forces_miss(isa):
    eng = _eng(isa, max_age_ns=1000)
    x = np.ones(32, np.float32)
    eng.step(x, 0, ts_ns=0)
    assert eng.step(x, 0, ts_ns=1000).cached
    r = eng.step(x, 0, ts_ns=1001)
    assert not r.cached and r.miss_reason == "age"
    assert eng.step(x, 0, ts_ns=1500).cached     # refreshed at 1001


def test_run_limit_forces_miss(isa):
    eng = _eng(isa, max_run=3)
    x = np.ones(32, np.float32)
    got = [eng.step(x, 0, ts_ns=t).miss_reason for t in range(9)]
    assert got == ["cold", "hit", "hit", "hit", "run", "hit", "hit", "hit", "run"]
    st = eng.stats()
    assert st["miss_reasons"]["run"] == 2 and st["forced_refreshes"] == 2
    assert st["hits"] == 6 and st["misses"] == 3 and st["ticks"] == 9


def test_disabled_cache_always_computes(isa):
    eng = _eng(isa, enabled=False)
    x = np.ones(32, np.float32)
    assert [eng.step(x, 0).cached for _ in range(3)] == [False] * 3
    assert eng.stats()["miss_reasons"]["disabled"] == 3


def test_hit_within_guards_is_close_to_fresh_result(isa):
    """A hit allowed by cos >= 0.9999 and 1% norm returns the result of a nearby vector."""
    eng = _eng(isa, cos_threshold=0.9999, norm_tol=0.01)
    ref = _eng(isa, enabled=False)
    rng = np.random.default_rng(5)
    x = rng.standard_normal(32).astype(np.float32)
    eng.step(x, 0, ts_ns=0)
    y = (x + 1e-3 * rng.standard_normal(32)).astype(np.float32)
    r = eng.step(y, 0, ts_ns=1)
    assert r.cached
    assert abs(r.signal - ref.step(y, 0).signal) < 0.01
