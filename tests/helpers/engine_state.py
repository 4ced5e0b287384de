"""An engine's whole per-symbol state, for tests that bad input changes nothing."""
import numpy as np
import pytest

from fastpath import Engine
from helpers.builders import engine_cfg, windowed_model


@pytest.fixture
def pair(isa):
    """Two identical engines, both warmed with the same ticks."""
    rng = np.random.default_rng(21)
    m = windowed_model(rng)
    a, b = Engine(m, config=engine_cfg(isa)), Engine(m, config=engine_cfg(isa))
    warm = rng.standard_normal((30, m.raw_len)).astype(np.float32)
    for i, x in enumerate(warm):
        a.step(x, i % 3, ts_ns=i)
        b.step(x, i % 3, ts_ns=i)
    return a, b, rng


def assert_same_state(a, b, rng):
    """Same counters now, and the same answers (results, cache decisions) from here on."""
    sa, sb = a.stats(), b.stats()
    for k in ("ticks", "hits", "misses", "miss_reasons"):
        assert sa[k] == sb[k], k
    x = rng.standard_normal(a.raw_len).astype(np.float32)
    for s in range(3):
        np.testing.assert_array_equal(a.features(x, s), b.features(x, s))
    for t in range(6):
        y = x if t % 2 else x + np.float32(t * 1e-3)
        ra, rb = a.step(y, t % 3, ts_ns=1000 + t), b.step(y, t % 3, ts_ns=1000 + t)
        assert (ra.signal, ra.cached, ra.miss_reason) == (rb.signal, rb.cached, rb.miss_reason)


def good(eng):
    return np.zeros(eng.raw_len, np.float32)
