"""Engine configuration: one TOML file (or dict) validated into typed, frozen objects.

Design: every key is declared once with its type and allowed range; anything
else is an error that names the key, the value and what is allowed, so a typo
never silently falls back to a default. Cache keys left out of the config keep
the model bundle's own policy.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from fastpath.errors import ConfigError

SIMD_CHOICES = ("auto", "avx2", "scalar")
BACKENDS = ("cpu", "gpu", "auto")


def _check(key: str, value: Any, typ, lo=None, hi=None, choices=None) -> Any:
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if typ == (str, int):      # placement.core: "auto" or a CPU number
        if isinstance(value, bool) or not (value == "auto" or isinstance(value, int) and 0 <= value < 1 << 16):
            raise ConfigError(f"{key} must be \"auto\" or a CPU number, got {value!r}")
        return value
    if typ is not bool and isinstance(value, bool) or not isinstance(value, typ):
        raise ConfigError(f"{key} must be {typ.__name__}, got {type(value).__name__} {value!r}")
    if choices is not None and value not in choices:
        raise ConfigError(f"{key} must be one of {list(choices)}, got {value!r}")
    if typ is float and value != value:
        raise ConfigError(f"{key} must be a number, got NaN")
    if lo is not None and value < lo or hi is not None and value > hi:
        raise ConfigError(f"{key} must be in [{lo}, {hi}], got {value!r}")
    return value


# key -> (type, lo, hi, choices)
_CACHE_KEYS = {
    "enabled": (bool, None, None, None),
    "cos_threshold": (float, -1.0, 1.0, None),
    "norm_tol": (float, 0.0, 1e6, None),
    "max_age_ns": (int, 0, 2**62, None),
    "max_run": (int, 0, 2**32 - 1, None),
}
_ENGINE_KEYS = {
    "n_symbols": (int, 1, 1 << 22, None),
    "simd": (str, None, None, SIMD_CHOICES),
    "backend": (str, None, None, BACKENDS),
    "latency_records": (int, 1, 1 << 24, None),
}


_PLACEMENT_KEYS = {
    "core": ((str, int), None, None, None),
    "policy": (str, None, None, ("fifo", "rr", "other")),
    "priority": (int, 0, 99, None),
    "allow_priority_above_80": (bool, None, None, None),
}
_MEMORY_KEYS = {
    "huge_pages": (str, None, None, ("auto", "1g", "2m", "thp", "none")),
    "mlock": (bool, None, None, None),
}


def validate_cache_policy(obj: Any, prefix: str) -> None:
    for k, (typ, lo, hi, ch) in _CACHE_KEYS.items():
        _check(f"{prefix}.{k}", getattr(obj, k), typ, lo, hi, ch)


@dataclass(frozen=True)
class CacheConfig:
    """Cache keys set by the config; None leaves the model's value."""
    enabled: bool | None = None
    cos_threshold: float | None = None
    norm_tol: float | None = None
    max_age_ns: int | None = None
    max_run: int | None = None

    def apply(self, policy):
        from dataclasses import replace
        over = {k: getattr(self, k) for k in _CACHE_KEYS if getattr(self, k) is not None}
        return replace(policy, **over)


@dataclass(frozen=True)
class PlacementConfig:
    """Where and how the step() thread runs (applied by fastpath.control.place)."""
    core: Any = "auto"
    policy: str = "fifo"
    priority: int = 50
    allow_priority_above_80: bool = False

    def __post_init__(self) -> None:
        for k, (typ, lo, hi, ch) in _PLACEMENT_KEYS.items():
            _check(f"placement.{k}", getattr(self, k), typ, lo, hi, ch)
        from fastpath.control.placement import check_priority
        check_priority(self.policy, self.priority, self.allow_priority_above_80)


@dataclass(frozen=True)
class MemoryConfig:
    """Backing of the weights arena and cache slots (fastpath.control.memory)."""
    huge_pages: str = "auto"
    mlock: bool = True

    def __post_init__(self) -> None:
        for k, (typ, lo, hi, ch) in _MEMORY_KEYS.items():
            _check(f"memory.{k}", getattr(self, k), typ, lo, hi, ch)


@dataclass(frozen=True)
class EngineConfig:
    n_symbols: int = 4096
    simd: str = "auto"
    backend: str = "cpu"
    latency_records: int = 65536
    cache: CacheConfig = field(default_factory=CacheConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    source: str = "<defaults>"

    def __post_init__(self) -> None:
        for k, (typ, lo, hi, ch) in _ENGINE_KEYS.items():
            _check(f"engine.{k}", getattr(self, k), typ, lo, hi, ch)
        if self.latency_records & (self.latency_records - 1):
            raise ConfigError(f"engine.latency_records must be a power of two, got "
                              f"{self.latency_records}")
        for k, (typ, lo, hi, ch) in _CACHE_KEYS.items():
            v = getattr(self.cache, k)
            if v is not None:
                _check(f"cache.{k}", v, typ, lo, hi, ch)

    @classmethod
    def from_dict(cls, d: Mapping, source: str = "<dict>") -> "EngineConfig":
        if not isinstance(d, Mapping):
            raise ConfigError(f"config must be a mapping of sections, got {type(d).__name__}")
        sections = {"engine": _ENGINE_KEYS, "cache": _CACHE_KEYS, "placement": _PLACEMENT_KEYS,
                    "memory": _MEMORY_KEYS}
        for sec, body in d.items():
            if sec not in sections:
                raise ConfigError(f"unknown config section [{sec}]; allowed: {sorted(sections)}")
            if not isinstance(body, Mapping):
                raise ConfigError(f"[{sec}] must be a table of keys, got {type(body).__name__}")
            for k in body:
                if k not in sections[sec]:
                    raise ConfigError(f"unknown key {sec}.{k}; allowed in [{sec}]: "
                                      f"{sorted(sections[sec])}")
        # values are checked once, by each section's dataclass
        return cls(**dict(d.get("engine", {})), cache=CacheConfig(**d.get("cache", {})),
                   placement=PlacementConfig(**d.get("placement", {})),
                   memory=MemoryConfig(**d.get("memory", {})), source=source)

    def resolve_simd(self) -> str:
        """The kernel set to use: FASTPATH_SIMD=scalar forces scalar; 'auto' takes the best."""
        from fastpath._engine import best_isa, supported_isas
        env = os.environ.get("FASTPATH_SIMD", "").strip().lower()
        if env and env not in SIMD_CHOICES:
            raise ConfigError(f"FASTPATH_SIMD must be one of {list(SIMD_CHOICES)}, got {env!r}")
        want = "scalar" if env == "scalar" else (env if env and self.simd == "auto" else self.simd)
        if want == "auto":
            return best_isa()
        if want not in supported_isas():
            raise ConfigError(f"engine.simd = {want!r} but this CPU supports only "
                              f"{supported_isas()}")
        return want


def load_config(cfg: Any = None) -> EngineConfig:
    """None -> defaults; EngineConfig as is; a mapping; or a path to a TOML file."""
    if cfg is None:
        return EngineConfig()
    if isinstance(cfg, EngineConfig):
        return cfg
    if isinstance(cfg, Mapping):
        return EngineConfig.from_dict(cfg)
    if isinstance(cfg, (str, os.PathLike)):
        import tomllib
        path = os.fspath(cfg)
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path!r}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path} is not valid TOML: {exc}") from None
        try:
            return EngineConfig.from_dict(data, source=path)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None
    raise ConfigError(f"config must be None, a dict, a TOML path or an EngineConfig, got "
                      f"{type(cfg).__name__}")
