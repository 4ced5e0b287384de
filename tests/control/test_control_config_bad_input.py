"""Config errors: a bad value or a malformed TOML file is a ConfigError naming the key; the example
config loads."""

import numpy as np
import pytest

from fastpath import ConfigError, Engine
from helpers.builders import windowed_model


# ----------------------------------------------------------------------- config
CONFIG_CASES = [
    ({"engine": {"n_symbols": 0}}, "engine.n_symbols"),
    ({"engine": {"n_symbols": -5}}, "engine.n_symbols"),
    ({"engine": {"n_symbols": 1 << 30}}, "engine.n_symbols"),
    ({"engine": {"n_symbols": "4096"}}, "engine.n_symbols"),
    ({"engine": {"n_symbols": 4.0}}, "engine.n_symbols"),
    ({"engine": {"n_symbols": True}}, "engine.n_symbols"),
    ({"engine": {"simd": "avx1024"}}, "engine.simd"),
    ({"engine": {"simd": 1}}, "engine.simd"),
    ({"engine": {"backend": "tpu"}}, "engine.backend"),
    ({"engine": {"latency_records": 1000}}, "engine.latency_records"),
    ({"engine": {"latency_records": 0}}, "engine.latency_records"),
    ({"engine": {"nsymbols": 5}}, "engine.nsymbols"),
    ({"cache": {"cos_threshold": 1.5}}, "cache.cos_threshold"),
    ({"cache": {"cos_threshold": float("nan")}}, "cache.cos_threshold"),
    ({"cache": {"cos_threshold": "high"}}, "cache.cos_threshold"),
    ({"cache": {"norm_tol": -0.1}}, "cache.norm_tol"),
    ({"cache": {"max_age_ns": -1}}, "cache.max_age_ns"),
    ({"cache": {"max_age_ns": 1.5}}, "cache.max_age_ns"),
    ({"cache": {"max_run": -2}}, "cache.max_run"),
    ({"cache": {"max_run": 2**33}}, "cache.max_run"),
    ({"cache": {"enabled": 1}}, "cache.enabled"),
    ({"cache": {"enabled": "yes"}}, "cache.enabled"),
    ({"cache": {"threshold": 0.9}}, "cache.threshold"),
    ({"caches": {}}, "caches"),
    ({"engine": 5}, "engine"),
]


@pytest.mark.parametrize("cfg,key", CONFIG_CASES)
def test_config_errors_name_the_key(cfg, key):
    m = windowed_model(np.random.default_rng(0))
    with pytest.raises(ConfigError) as exc:
        Engine(m, config=cfg)
    assert key in str(exc.value)


def test_config_toml_errors(tmp_path):
    m = windowed_model(np.random.default_rng(0))
    p = tmp_path / "c.toml"
    p.write_text("[cache]\nmax_run = \"lots\"\n")
    with pytest.raises(ConfigError, match=r"c.toml: cache.max_run must be int, got str"):
        Engine(m, config=str(p))
    p.write_text("[cache\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        Engine(m, config=str(p))
    with pytest.raises(ConfigError, match="cannot read config file"):
        Engine(m, config=str(tmp_path / "none.toml"))
    with pytest.raises(ConfigError, match="config must be None, a dict"):
        Engine(m, config=42)


def test_example_config_loads():
    import os
    from fastpath.control.config import load_config
    from fastpath._build import EXAMPLE_CONFIG as p
    assert os.path.exists(p)          # shipped inside the installed package
    cfg = load_config(p)
    assert cfg.n_symbols == 4096 and cfg.cache.overrides() == {}
    eng = Engine(windowed_model(np.random.default_rng(0)), config=p)
    assert eng.n_symbols == 4096
