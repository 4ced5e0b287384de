"""Turning (model, backend, config) into what the compiled Engine needs, below the engine.

The config (fastpath.config) says what was asked for, and this module decides what runs on
this CPU (the kernel set), which cache policy is in force and where it came from
(cache_origin), and which backend runs the model. The GPU stage sits above the engine
(fastpath.gpu imports it): it registers its backend choice and its opener here when it is
imported (register_gpu_stage; fastpath's own __init__ imports it), so the engine never imports
the GPU package.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

from fastpath._batch import BatchResult
from fastpath._core import best_isa, supported_isas
from fastpath.config import SIMD_CHOICES, load_config
from fastpath.model import Model
from fastpath.model.bundle import _path
from fastpath.errors import BackendError, ConfigError, ModelError

DEMO_MODEL = os.path.join(os.path.dirname(__file__), "data", "demo.fpm")
EXAMPLE_CONFIG = os.path.join(os.path.dirname(__file__), "data", "fastpath.example.toml")


@dataclass(frozen=True)
class ResolvedConfig:
    """The config an Engine runs with: file/dict values over the model's cache policy."""
    n_symbols: int
    latency_records: int
    simd_resolved: str
    cache: Any            # fastpath.model.CachePolicy
    memory: Any           # fastpath.config.MemoryConfig
    source: Any           # fastpath.config.EngineConfig
    # which cache policy is in force and why: "fitted (max error E)", "config",
    # "model (set explicitly, not fitted)", "off (not fitted)", "off (config)", "off"
    cache_origin: str


def resolve_simd(simd: str = "auto") -> str:
    """The kernel set engines run (avx512, avx2 or scalar). FASTPATH_SIMD=scalar forces scalar
    whatever the config says (the escape hatch); FASTPATH_SIMD=avx512|avx2 is taken where the
    config says "auto"; "auto" takes the best set this CPU and OS run. Asking for a set the CPU
    cannot run is a ConfigError naming who asked and what the CPU has: a silent fallback would
    leave a host believed to run one set running another."""
    env = os.environ.get("FASTPATH_SIMD", "").strip().lower()
    if env and env not in SIMD_CHOICES:
        raise ConfigError(f"FASTPATH_SIMD must be one of {list(SIMD_CHOICES)}, got {env!r}")
    if env == "scalar" or (env and simd == "auto"):
        want, who = env, f"FASTPATH_SIMD={env}"
    else:
        want, who = simd, f"engine.simd = {simd!r}"
    if want == "auto":
        return best_isa()
    if want not in supported_isas():
        raise ConfigError(f"{who} but this CPU (or its OS) cannot run the {want} kernel set; "
                          f"it supports {supported_isas()} (best: {best_isa()!r})")
    return want


def cache_origin(over: dict, policy: Any) -> str:
    """Where the policy in force (`policy`: the config's keys `over` applied to the model's
    policy) comes from, in words for stats() and logs."""
    if not policy.enabled:
        if over.get("enabled") is False:
            return "off (config)"
        return "off" if policy.fitted_max_error is not None else "off (not fitted)"
    if policy.fitted_max_error is not None:
        return f"fitted (max error {policy.fitted_max_error:g})"
    if over:
        return "config"
    return "model (set explicitly, not fitted)"


def load_model(model: Any):
    if isinstance(model, Model):
        return model
    # bytes too, as Model.load and open() take a path
    if isinstance(model, (str, bytes, os.PathLike)):
        p = _path(model, "Engine(model)")
        if p.lower().endswith(".onnx"):
            return Model.from_onnx(p)
        return Model.load(p)
    raise ModelError(f"model must be a fastpath.Model or a path to .onnx / .fpm, got "
                     f"{type(model).__name__}")


class GpuStageHooks(NamedTuple):
    """What the GPU stage (fastpath.gpu) registers: resolve_backend(model, cfg, backend, simd)
    -> (backend, reason, auto's measurement or None) for backend "gpu" / "auto", and
    open_stage(engine) -> the engine's ExternalStage (fastpath.gpu._tick.GpuStage)."""
    resolve_backend: Callable[..., tuple]
    open_stage: Callable[[Any], Any]


_gpu_stage: GpuStageHooks | None = None


def register_gpu_stage(resolve_backend: Callable[..., tuple],
                       open_stage: Callable[[Any], Any]) -> None:
    """Called by fastpath.gpu when it is imported: how engines choose and open the GPU stage."""
    global _gpu_stage
    _gpu_stage = GpuStageHooks(resolve_backend, open_stage)


def _no_gpu_stage() -> str:
    return "the GPU stage (fastpath.gpu) is not loaded"


def resolve_backend(m: Any, cfg: Any, backend: str, simd: str) -> tuple:
    """(backend that runs: "cpu" | "gpu", reason in words, auto's measurement or None).
    "cpu" is decided here; "gpu" and "auto" by the GPU stage (fastpath.gpu.resolve_backend:
    the GPU or a BackendError, and what auto chose and why)."""
    if backend == "cpu":
        return "cpu", "cpu requested", None
    if _gpu_stage is None:
        if backend == "gpu":
            raise BackendError(f"backend='gpu' is not available: {_no_gpu_stage()}")
        return "cpu", f"auto: cpu chosen ({_no_gpu_stage()})", None
    return _gpu_stage.resolve_backend(m, cfg, backend, simd)


def open_gpu_stage(engine: Any):
    """The GPU stage of an engine whose backend resolved to "gpu" (BackendError where it
    cannot be set up)."""
    if _gpu_stage is None:
        raise BackendError(f"backend='gpu' is not available: {_no_gpu_stage()}")
    return _gpu_stage.open_stage(engine)


def resolve(model: Any, backend: Any, config: Any, report: bool = False):
    """(model, ResolvedConfig, backend that runs, reason); with report=True a fifth item:
    backend="auto"'s measurement (fastpath.gpu.auto_choice's dict) or None."""
    m = load_model(model)
    cfg = load_config(config)
    # [engine] weights runs the model as with_weights does: a fitted cache policy measured on
    # other weights is dropped (not reported as "fitted" for weights it never saw), and
    # Engine.model.weights says what runs
    if cfg.weights and m.trees is None and cfg.weights != m.weights:
        m = m.with_weights(cfg.weights)
    if backend is None:
        backend = cfg.backend
    if backend not in ("cpu", "gpu", "auto"):
        raise ConfigError(f"backend must be 'cpu', 'gpu' or 'auto', got {backend!r}")
    simd = resolve_simd(cfg.simd)
    backend, reason, measured = resolve_backend(m, cfg, backend, simd)
    # cfg.cache.apply goes through dataclasses.replace, so CachePolicy validates the merge
    pol = cfg.cache.apply(m.cache_policy)
    rc = ResolvedConfig(cfg.n_symbols, cfg.latency_records, simd, pol,
                        cfg.memory, cfg, cache_origin(cfg.cache.overrides(), pol))
    return (m, rc, backend, reason, measured) if report else (m, rc, backend, reason)


__all__ = ["BatchResult", "ResolvedConfig", "DEMO_MODEL", "EXAMPLE_CONFIG", "resolve",
           "resolve_simd", "resolve_backend", "cache_origin", "load_model", "register_gpu_stage",
           "open_gpu_stage"]
