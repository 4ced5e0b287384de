"""Config values at their extremes: ints past float or repr range are ConfigErrors, each message
names the key and what is expected, and float keys take ints in range."""

import numpy as np
import pytest

from fastpath import ConfigError, Engine
from fastpath._checks import check_value
from fastpath.control.config import EngineConfig, load_config
from fastpath.model import CachePolicy
from helpers.builders import random_model


@pytest.mark.parametrize("cfg,key", [
    ({"cache": {"cos_threshold": 10**400}}, "cache.cos_threshold"),
    ({"cache": {"norm_tol": 10**400}}, "cache.norm_tol"),
    ({"cache": {"norm_tol": -10**400}}, "cache.norm_tol"),
    ({"engine": {"n_symbols": 10**5000}}, "engine.n_symbols"),
    ({"cache": {"max_age_ns": -(10**5000)}}, "cache.max_age_ns"),
])
def test_config_ints_past_float_or_repr_are_config_errors(cfg, key):
    """Defect guarded: an int past float's range raised OverflowError, and one past 4300 digits
    a ValueError from repr(), instead of a ConfigError naming the key."""
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(cfg)


def test_cache_policy_huge_int_is_a_config_error():
    with pytest.raises(ConfigError, match="cache.cos_threshold"):
        CachePolicy(enabled=True, cos_threshold=10**400)


@pytest.mark.parametrize("cfg,key,what", [
    ({"engine": {"n_symbol": 4}}, "engine.n_symbol", "allowed"),
    ({"engine": {"n_symbols": 0}}, "engine.n_symbols", r"\[1, "),
    ({"engine": {"n_symbols": 4.0}}, "engine.n_symbols", "must be int"),
    ({"engine": {"n_symbols": True}}, "engine.n_symbols", "must be int"),
    ({"engine": {"simd": "sse"}}, "engine.simd", "one of"),
    ({"engine": {"latency_records": 1000}}, "engine.latency_records", "power of two"),
    ({"engine": {"stage_times": 1}}, "engine.stage_times", "must be bool"),
    ({"cache": {"cos_threshold": float("nan")}}, "cache.cos_threshold", "NaN"),
    ({"cache": {"cos_threshold": 1.5}}, "cache.cos_threshold", r"\[-1.0, 1.0\]"),
    ({"cache": {"max_run": 2**32}}, "cache.max_run", "must be in"),
    ({"cache": {"max_age_ns": 2**63}}, "cache.max_age_ns", "must be in"),
    ({"cache": {"enabled": "yes"}}, "cache.enabled", "must be bool"),
    ({"cache": 5}, r"\[cache\]", "table"),
    ({"engines": {}}, r"\[engines\]", "allowed"),
])
def test_config_errors_name_the_key_and_what_is_expected(cfg, key, what):
    with pytest.raises(ConfigError, match=key) as ei:
        load_config(cfg)
    assert __import__("re").search(what, str(ei.value)), str(ei.value)
    # the same through the Engine, not another exception type
    with pytest.raises(ConfigError):
        Engine(random_model(np.random.default_rng(0), [8, 4, 2]), config=cfg)


def test_check_value_float_key_accepts_ints_in_range():
    assert check_value("cache.norm_tol", 3, float, 0.0, 1e6) == 3.0
    assert EngineConfig(n_symbols=5).n_symbols == 5
