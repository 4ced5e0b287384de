"""fastpath: one market-data tick to a trading signal in about a microsecond.

    import fastpath
    r = fastpath.step(raw, symbol=0)      # default engine, embedded demo model, CPU
    r.signal, r.confidence, r.cached, r.latency.total_ns
"""
from __future__ import annotations

import os as _os

from fastpath._engine import Engine, Latency, Result, clock_info, cpu_features
from fastpath._build import DEMO_MODEL as _DEMO_MODEL
from fastpath._build import BatchResult, resolve_simd as _resolve_simd
from fastpath._default import get_default_engine, set_default_engine, step
from fastpath.errors import (BackendError, ConfigError, EngineBusyError, FastpathError,
                             InputError, ModelError)
from fastpath.model import CachePolicy, FeatureSpec, Layer, Model, TreeEnsemble
from fastpath.errors import RingFull, ServeError, ServerGone
from fastpath.serving import Server, connect, serve
from fastpath.gpu import gpu_status
from fastpath import tuning as _tuning  # noqa: F401 - installs Model.fit_cache_policy

__version__ = "0.1.0"

__all__ = [
    "Engine", "Result", "Latency", "BatchResult", "step", "simd", "configure", "clock_info",
    "get_default_engine", "set_default_engine",
    "cpu_features", "Model", "Layer", "TreeEnsemble", "FeatureSpec", "CachePolicy", "FastpathError", "InputError",
    "ModelError", "ConfigError", "BackendError", "EngineBusyError", "__version__", "gpu_status",
    "serve", "connect", "Server", "get_include", "ServeError", "ServerGone", "RingFull",
]


def get_include() -> str:
    """The directory holding fp_ring.h, for C/C++ clients of a server: cc -I$(python -c
    'import fastpath; print(fastpath.get_include())')."""
    return _os.path.join(_os.path.dirname(__file__), "include")


def simd() -> str:
    """The kernel set engines use by default: 'avx512', 'avx2' or 'scalar', the best this CPU and
    OS run (FASTPATH_SIMD=avx512|avx2|scalar asks for one; a set the CPU cannot run is an error)."""
    return _resolve_simd("auto")


def configure(config=None, model=None) -> Engine:
    """Rebuild the engine behind fastpath.step() from a config (TOML path, dict) and model."""
    eng = Engine(model if model is not None else _DEMO_MODEL, backend=None, config=config)
    set_default_engine(eng)
    return eng
