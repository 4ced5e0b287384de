"""Turning (model, backend, config) into what the compiled Engine needs; the builders of the
default engine and of the engines `fastpath doctor` sizes (they import the engine when called).

The config (fastpath.config) says what was asked for, and this module decides what runs on
this CPU (the kernel set) and which cache policy is in force and where it came from
(cache_origin).
"""
from __future__ import annotations

import os
import dataclasses
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from fastpath._core import best_isa, supported_isas
from fastpath.config import SIMD_CHOICES, MemoryConfig, load_config
from fastpath.gpu._refusal import gpu_refusal
from fastpath.model import Model
from fastpath.model.bundle import _path
from fastpath.errors import BackendError, ConfigError, ModelError

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


def resolve_backend(m: Any, cfg: Any, backend: str, simd: str) -> tuple:
    """(backend that runs: "cpu" | "gpu", reason in words, auto's measurement or None).

    backend="gpu": the GPU or an error (BackendError: no usable GPU, or a model the GPU stage
    does not serve). backend="auto" takes the GPU only where all hold: gpu_status() is ok,
    the model is an fp32 MLP, and [gpu] auto says so: auto = "gpu" takes it without measuring,
    auto = "measure" (the default) times the inference a cache miss pays on this CPU's kernel
    set and on the GPU in [gpu] mode, alike (fastpath.gpu.auto_choice), and keeps the faster at
    p50. Anything else: the CPU, and the reason
    says which condition failed (Engine.backend_reason, Engine.backend_report)."""
    if backend == "cpu":
        return "cpu", "cpu requested", None
    # the gpu package (which wraps the engine) is imported only when a GPU backend is asked
    # for, and looked up per call so that gpu_status / auto_choice stay replaceable
    import fastpath.gpu as _gpu
    refusal = gpu_refusal(m, cfg)
    ok, why = _gpu.gpu_status()
    if backend == "gpu":
        if refusal:
            raise BackendError(f"backend='gpu': {refusal}")
        if not ok:
            raise BackendError(f"backend='gpu' is not available: {why}")
        return "gpu", f"gpu requested ({why}; mode {cfg.gpu.mode})", None
    if not ok:
        return "cpu", f"auto: cpu chosen ({why})", None
    if refusal:
        return "cpu", f"auto: cpu chosen ({refusal})", None
    if cfg.gpu.auto == "gpu":
        return "gpu", f"auto: gpu chosen (gpu.auto = 'gpu'; {why}; mode {cfg.gpu.mode})", None
    c = _gpu.auto_choice(m, cfg.gpu.mode, isa=simd, device=cfg.gpu.device)
    return c["backend"], c["reason"], c


def open_gpu_backend(model: Any, g: Any):
    """The GPU stage of an engine whose backend resolved to "gpu", under its [gpu] config `g`
    (fastpath.gpu.GpuBackend, looked up per call so that it stays replaceable)."""
    import fastpath.gpu as _gpu
    return _gpu.GpuBackend(model, g.mode, g.device, max_batch=g.max_batch,
                           timeout_ns=g.timeout_ms * 1_000_000)


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


def engine_region_bytes(model: Any = None, config: Any = None) -> int:
    """Bytes the engine asks the control plane to map for this model and config (weights
    arena + per-symbol state, fp_engine_sizes), read from an engine built with that region
    unlocked on base pages: what `fastpath doctor` counts as the engine's locked part."""
    from fastpath._engine import Engine
    cfg = dataclasses.replace(load_config(config), memory=MemoryConfig("none", False))
    m = load_model(DEMO_MODEL if model is None else model)

    def asked(n: int) -> int:
        return int(Engine(m, "cpu", dataclasses.replace(cfg, n_symbols=n)).memory.bytes)

    n = cfg.n_symbols
    if n <= 3:
        return asked(n)
    # the per-symbol state is a fixed stride: sized from three small engines rather than the
    # real one, which for millions of symbols would map (and fault in) GBs just to be measured
    b1, b2, b3 = asked(1), asked(2), asked(3)
    if b3 - b2 != b2 - b1:
        return asked(n)
    return b1 + (n - 1) * (b2 - b1)


def default_engine():
    """The engine behind fastpath.step(): the embedded demo model, CPU, default config."""
    from fastpath._engine import Engine
    return Engine(DEMO_MODEL, backend="cpu", config=None)


__all__ = ["BatchResult", "ResolvedConfig", "DEMO_MODEL", "EXAMPLE_CONFIG", "resolve",
           "resolve_simd", "resolve_backend", "cache_origin", "load_model", "gpu_refusal", "open_gpu_backend",
           "engine_region_bytes", "default_engine"]
