"""numpy numbers for the configuration's numeric keys: numpy integers are ints in every section
(with the same range checks), numpy floats are floats, and numpy bools and floats are still
refused for integer keys.
"""

import numpy as np
import pytest

import fastpath
from fastpath.control.config import (CacheConfig, EngineConfig, GpuConfig, PlacementConfig,
                                     ServeConfig, load_config)
from fastpath.errors import ConfigError

from helpers.builders import random_model


NP_INTS = [np.int64, np.int32, np.uint16, np.int8]


@pytest.mark.parametrize("t", NP_INTS, ids=lambda t: t.__name__)
def test_numpy_integers_are_ints_in_every_section(t):
    """A numpy integer for an int key (np.unique(...).size, arr.max() + 1) was refused as not an
    int."""
    d = {"engine": {"n_symbols": t(8), "latency_records": t(64)},
         "serve": {"ring_slots": t(64), "max_clients": t(2), "heartbeat_ms": t(2),
                   "dead_after_ms": t(20), "stall_timeout_ms": t(100)},
         "gpu": {"device": t(0), "max_batch": t(64), "timeout_ms": t(5)},
         "placement": {"core": t(0), "priority": t(10)},
         "cache": {"max_run": t(3), "max_age_ns": t(100)}}
    c = EngineConfig.from_dict(d)
    assert (c.n_symbols, c.latency_records) == (8, 64)
    assert (c.serve.ring_slots, c.gpu.max_batch, c.placement.core, c.cache.max_run) == (
        64, 64, 0, 3)
    # the config holds plain Python ints, whatever it was given
    for v in (c.n_symbols, c.latency_records, c.serve.ring_slots, c.serve.max_clients,
              c.gpu.device, c.gpu.max_batch, c.gpu.timeout_ms, c.placement.core,
              c.placement.priority, c.cache.max_run, c.cache.max_age_ns):
        assert type(v) is int, (v, type(v))
    assert load_config(d) == c
    # the keyword API
    e = EngineConfig(n_symbols=t(8), gpu={"max_batch": t(16)}, serve=ServeConfig(mode=0o600))
    assert type(e.n_symbols) is int and type(e.gpu.max_batch) is int
    assert type(GpuConfig(device=t(1)).device) is int
    assert type(PlacementConfig(core=t(3)).core) is int


def test_numpy_integer_config_runs_an_engine(isa):
    m = random_model(np.random.default_rng(4), [6, 8, 2])
    n = np.int64(np.arange(3).max() + 1)
    e = fastpath.Engine(m, config={"engine": {"n_symbols": n, "simd": isa}})
    assert e.n_symbols == 3
    e.step(np.ones(6, np.float32), 2)
    e.close()


@pytest.mark.parametrize("bad, what", [
    (np.bool_(True), "bool"), (True, "bool"), (np.float64(8.0), "float64"),
    (np.float32(8), "float32"), (8.0, "float"), ("8", "str"),
])
def test_numpy_bools_and_floats_are_still_refused_for_int_keys(bad, what):
    with pytest.raises(ConfigError, match=rf"engine.n_symbols must be int, got {what}"):
        EngineConfig(n_symbols=bad)
    with pytest.raises(ConfigError, match=r"gpu.max_batch must be int"):
        load_config({"gpu": {"max_batch": bad}})
    with pytest.raises(ConfigError, match=r"must be int|CPU number"):
        PlacementConfig(core=bad) if what != "str" else PlacementConfig(priority=bad)


def test_numpy_integers_keep_their_range_checks():
    with pytest.raises(ConfigError, match=r"engine.n_symbols must be in \[1, 4194304\], got 0"):
        EngineConfig(n_symbols=np.int64(0))
    with pytest.raises(ConfigError, match="power of two"):
        EngineConfig(latency_records=np.int64(100))
    # the octal hint for file permissions reads a numpy integer too
    with pytest.raises(ConfigError, match=r"permissions are octal: write 0o600"):
        ServeConfig(mode=np.int64(600))
    assert ServeConfig(mode=np.int64(0o640)).mode == 0o640


def test_numpy_floats_for_float_keys():
    """np.float32 and numpy integers were refused for a float key (np.float64 alone passed)."""
    c = EngineConfig(cache={"cos_threshold": np.float32(0.5), "norm_tol": np.int64(1),
                            "enabled": True})
    assert c.cache.cos_threshold == 0.5 and type(c.cache.cos_threshold) is float
    assert c.cache.norm_tol == 1.0
    assert type(CacheConfig(norm_tol=np.float16(0.25)).norm_tol) is float
    with pytest.raises(ConfigError, match=r"cache.cos_threshold must be in \[-1.0, 1.0\]"):
        EngineConfig(cache={"cos_threshold": np.float32(2)})
    with pytest.raises(ConfigError, match="must be a number, got NaN"):
        EngineConfig(cache={"norm_tol": np.float32("nan")})
    with pytest.raises(ConfigError, match="cache.cos_threshold must be float"):
        EngineConfig(cache={"cos_threshold": np.bool_(True)})
    # and the policy in force is built from plain floats
    m = random_model(np.random.default_rng(5), [6, 8, 2])
    e = fastpath.Engine(m, config={"cache": {"cos_threshold": np.float32(0.75)}})
    e.close()
