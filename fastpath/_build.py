"""The builders of engines: the default engine behind fastpath.step() and the engines
`fastpath doctor` sizes. Above the compiled engine (it imports fastpath._engine); what the
engine itself needs to resolve a model, backend and config lives below it, in
fastpath._resolve, and is re-exported here under its old names.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from fastpath._engine import Engine
from fastpath._resolve import (DEMO_MODEL, EXAMPLE_CONFIG, BatchResult, ResolvedConfig,
                               cache_origin, load_model, resolve, resolve_backend,
                               resolve_simd)
from fastpath.config import MemoryConfig, load_config
from fastpath.gpu._refusal import gpu_refusal


def engine_region_bytes(model: Any = None, config: Any = None) -> int:
    """Bytes the engine asks the control plane to map for this model and config (weights
    arena + per-symbol state, fp_engine_sizes), read from an engine built with that region
    unlocked on base pages: what `fastpath doctor` counts as the engine's locked part."""
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
    return Engine(DEMO_MODEL, backend="cpu", config=None)


__all__ = ["BatchResult", "ResolvedConfig", "DEMO_MODEL", "EXAMPLE_CONFIG", "resolve",
           "resolve_simd", "resolve_backend", "cache_origin", "load_model", "gpu_refusal",
           "engine_region_bytes", "default_engine"]
