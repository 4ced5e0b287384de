"""The [gpu] configuration section and the GPU backend's own arguments: modes, devices, batch
sizes and timeouts are checked and refused with the key's name.
"""

import numpy as np
import pytest

from fastpath.errors import ConfigError
from fastpath.gpu import GpuBackend, GpuEngine, gpu_mode

from helpers.builders import random_model


def test_gpu_mode_from_config():
    assert gpu_mode(None) == "launch"
    assert gpu_mode({"gpu": {"mode": "persistent"}}) == "persistent"
    with pytest.raises(ConfigError, match="gpu.mode"):
        gpu_mode({"gpu": {"mode": "zero-copy"}})


def test_gpu_config_section():
    from fastpath._build import EXAMPLE_CONFIG
    from fastpath.control.config import load_config
    c = load_config({"gpu": {"mode": "persistent", "device": 1, "max_batch": 64,
                             "timeout_ms": 20, "auto": "gpu"}})
    assert (c.gpu.mode, c.gpu.device, c.gpu.max_batch, c.gpu.timeout_ms, c.gpu.auto) == (
        "persistent", 1, 64, 20, "gpu")
    assert load_config(None).gpu.mode == "launch" and load_config(None).gpu.auto == "measure"
    assert load_config(EXAMPLE_CONFIG).gpu == load_config(None).gpu
    for bad, msg in (({"mod": "launch"}, "unknown key gpu.mod"),
                     ({"mode": "zero-copy"}, "gpu.mode"),
                     ({"device": -1}, "gpu.device"),
                     ({"max_batch": 0}, "gpu.max_batch"),
                     ({"timeout_ms": "1s"}, "gpu.timeout_ms"),
                     ({"auto": "always"}, "gpu.auto")):
        with pytest.raises(ConfigError, match=msg):
            load_config({"gpu": bad})
    with pytest.raises(ConfigError, match=r"\[gpu\] must be a table"):
        load_config({"gpu": "launch"})


@pytest.mark.parametrize("bad", [0, -5, float("nan"), True, "1s"])
def test_timeout_must_be_a_positive_number(fake_gpu, bad):
    """GpuBackend took a zero, negative, NaN or string timeout and failed only at the first tick."""
    m = random_model(np.random.default_rng(17), [4, 2])
    for mode in ("launch", "persistent"):
        with pytest.raises(ConfigError, match="timeout_ns must be a number of ns >= 1"):
            GpuBackend(m, mode, cuda=fake_gpu, timeout_ns=bad)
        with pytest.raises(ConfigError, match="timeout_ns must be a number of ns >= 1"):
            GpuEngine(m, None, mode=mode, timeout_ns=bad)
    assert not fake_gpu.launches
    with GpuBackend(m, "launch", cuda=fake_gpu, timeout_ns=1.5e9) as be:   # a float is fine
        assert be.path.timeout_ns == 1_500_000_000


def test_backend_timeout_past_int64_is_a_config_error(fake_gpu):
    """A timeout past int64 raised OverflowError from the persistent path's start."""
    m = random_model(np.random.default_rng(10), [4, 2])
    with pytest.raises(ConfigError, match="timeout_ns must be at most 2\\*\\*63 - 1"):
        GpuBackend(m, "persistent", cuda=fake_gpu, timeout_ns=1e30)
    with GpuBackend(m, "persistent", cuda=fake_gpu, timeout_ns=2**63 - 1) as be:
        y, bad, _ = be.infer(np.ones(4, np.float32))
        assert not bad
