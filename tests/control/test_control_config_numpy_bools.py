"""numpy bools are bools for the config's bool keys, and still neither a number for a bool nor
a bool for a number."""
import numpy as np
import pytest

import fastpath
from fastpath import Engine
from helpers.scalers import scaler_mlp




def test_numpy_bools_are_bools_for_bool_keys():
    """np.bool_ (what mask.any() returns) for a bool key was refused with "cache.enabled must
    be bool, got bool np.True_", a message that contradicts itself; numpy numbers were made
    plain for numeric keys, numpy bools for bool keys were not."""
    from fastpath.control.config import EngineConfig, load_config
    d = {"cache": {"enabled": np.bool_(False)}, "memory": {"mlock": np.bool_(False)},
         "serve": {"place": np.bool_(True)}, "placement": {"allow_priority_above_80": np.False_}}
    c = EngineConfig.from_dict(d)
    for v in (c.cache.enabled, c.memory.mlock, c.serve.place, c.placement.allow_priority_above_80):
        assert type(v) is bool
    assert (c.cache.enabled, c.memory.mlock, c.serve.place) == (False, False, True)
    assert load_config(d) == c
    m = scaler_mlp()
    e = Engine(m, config={"cache": {"enabled": np.bool_(False)}})
    assert e.config.cache.enabled is False
    e.close()
    # still no bool for a number, nor a number for a bool
    with pytest.raises(fastpath.ConfigError, match="engine.n_symbols must be int"):
        EngineConfig(n_symbols=np.bool_(True))
    with pytest.raises(fastpath.ConfigError, match="cache.enabled must be bool"):
        EngineConfig(cache={"enabled": np.int64(1)})
