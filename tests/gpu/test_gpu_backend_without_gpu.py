"""Asking for the GPU backend on a host without a GPU is a clear error."""

import numpy as np
import pytest

import fastpath
from fastpath import ConfigError, Engine
from helpers.builders import windowed_model


def test_gpu_backend_without_gpu_is_clear():
    m = windowed_model(np.random.default_rng(0))
    with pytest.raises(fastpath.BackendError, match="backend='gpu' is not available"):
        Engine(m, backend="gpu")
    eng = Engine(m, backend="auto")
    assert eng.backend == "cpu" and eng.backend_reason.startswith("auto: cpu chosen")
    with pytest.raises(ConfigError, match="backend must be"):
        Engine(m, backend="fpga")
