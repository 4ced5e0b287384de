"""Turning (model, backend, config) into what the compiled Engine needs; the default engine."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from fastpath.errors import BackendError, ModelError

DEMO_MODEL = os.path.join(os.path.dirname(__file__), "data", "demo.fpm")
EXAMPLE_CONFIG = os.path.join(os.path.dirname(__file__), "data", "fastpath.example.toml")


class BatchResult(NamedTuple):
    """step_batch output, one entry per tick: signal, confidence (float32), cached (bool),
    total_ns (int64, in-C time per tick)."""
    signal: np.ndarray
    confidence: np.ndarray
    cached: np.ndarray
    total_ns: np.ndarray


@dataclass(frozen=True)
class ResolvedConfig:
    """The config an Engine runs with: file/dict values over the model's cache policy."""
    n_symbols: int
    latency_records: int
    simd_resolved: str
    cache: Any            # fastpath.model.CachePolicy
    memory: Any           # fastpath.control.config.MemoryConfig
    source: Any           # fastpath.control.config.EngineConfig


def load_model(model: Any):
    from fastpath.model import Model
    if isinstance(model, Model):
        return model
    if isinstance(model, (str, os.PathLike)):
        p = os.fspath(model)
        if p.lower().endswith(".onnx"):
            return Model.from_onnx(p)
        return Model.load(p)
    raise ModelError(f"model must be a fastpath.Model or a path to .onnx / .fpm, got "
                     f"{type(model).__name__}")


def resolve(model: Any, backend: Any, config: Any):
    from fastpath.control.config import load_config
    from fastpath.errors import ConfigError
    from fastpath.gpu import gpu_status
    m = load_model(model)
    cfg = load_config(config)
    if backend is None:
        backend = cfg.backend
    if backend not in ("cpu", "gpu", "auto"):
        raise ConfigError(f"backend must be 'cpu', 'gpu' or 'auto', got {backend!r}")
    if backend == "cpu":
        reason = "cpu requested"
    else:
        ok, why = gpu_status()
        if backend == "gpu":
            raise BackendError(f"backend='gpu' is not available: {why}")
        reason = f"auto: cpu chosen ({why})"
        backend = "cpu"
    # cfg.cache.apply goes through dataclasses.replace, so CachePolicy validates the merge
    rc = ResolvedConfig(cfg.n_symbols, cfg.latency_records, cfg.resolve_simd(),
                        cfg.cache.apply(m.cache_policy), cfg.memory, cfg)
    return m, rc, backend, reason


def default_engine():
    """The engine behind fastpath.step(): the embedded demo model, CPU, default config."""
    from fastpath._engine import Engine
    return Engine(DEMO_MODEL, backend="cpu", config=None)
