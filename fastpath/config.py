"""Engine configuration: one TOML file (or dict) validated into typed, frozen objects.

Design: every key is declared once with its type and allowed range; anything
else is an error that names the key, the value and what is allowed, so a typo
never silently falls back to a default. Cache keys left out of the config keep
the model bundle's own policy (off unless it was fitted); `enabled = true` here is an
explicit choice that turns the cache on with an unfitted policy. Which kernel set
engine.simd resolves to on this CPU is decided by fastpath._build, not here. It sits beside the
engine, which receives the resolved config; fastpath.control.config re-exports it.
"""
from __future__ import annotations

import os
import re
import sys
import tomllib
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from fastpath._checks import MAX_SYMBOLS
from fastpath._checks import check_value as _check
from fastpath._checks import plain_fields as _plain_fields
from fastpath._checks import _show
from fastpath.errors import ConfigError
from fastpath.model import CACHE_KEYS as _CACHE_KEYS

SIMD_CHOICES = ("auto", "avx512", "avx2", "scalar")     # fastpath._build reads it for FASTPATH_SIMD
BACKENDS = ("cpu", "gpu", "auto")
# hidden layers' weight format; unset (None) keeps the model's own choice (fp32 by default)
WEIGHTS = ("fp32", "bf16", "int8")


# key -> (type, lo, hi, choices)
_ENGINE_KEYS = {
    "n_symbols": (int, 1, MAX_SYMBOLS, None),
    "simd": (str, None, None, SIMD_CHOICES),
    "backend": (str, None, None, BACKENDS),
    "latency_records": (int, 1, 1 << 24, None),
    "weights": (str, None, None, WEIGHTS),
    "stage_times": (bool, None, None, None),
}


_PLACEMENT_KEYS = {
    "core": ((str, int), None, None, None),
    "policy": (str, None, None, ("fifo", "rr", "other")),
    "priority": (int, 0, 99, None),
    "allow_priority_above_80": (bool, None, None, None),
}
_SERVE_KEYS = {
    "ring_slots": (int, 2, 1 << 16, None),
    "max_clients": (int, 1, 64, None),
    "on_full": (str, None, None, ("spin", "reject")),
    "idle": (str, None, None, ("spin", "yield", "sleep")),
    "idle_spin_ns": (int, 0, 10_000_000_000, None),
    "idle_sleep_ns": (int, 1_000, 10_000_000, None),
    "mode": (int, 0o400, 0o777, None),
    "heartbeat_ms": (int, 1, 1000, None),
    "dead_after_ms": (int, 2, 60_000, None),
    "drain_timeout_ms": (int, 0, 60_000, None),
    "stall_timeout_ms": (int, 2, 3_600_000, None),
    "place": (bool, None, None, None),
}
# [gpu]: what backend="gpu" runs and how backend="auto" decides (fastpath.gpu, fastpath._build)
GPU_MODES = ("launch", "persistent")
GPU_AUTO = ("measure", "gpu")
_GPU_KEYS = {
    "mode": (str, None, None, GPU_MODES),
    "device": (int, 0, 63, None),
    "max_batch": (int, 1, 1 << 16, None),
    "timeout_ms": (int, 1, 3_600_000, None),
    "auto": (str, None, None, GPU_AUTO),
}
_MEMORY_KEYS = {
    "huge_pages": (str, None, None, ("auto", "1g", "2m", "thp", "none")),
    "mlock": (bool, None, None, None),
}


# the scheduling policies placement.policy names, as os.sched_setscheduler takes them
POLICIES = {"fifo": getattr(os, "SCHED_FIFO", 1), "rr": getattr(os, "SCHED_RR", 2),
            "other": getattr(os, "SCHED_OTHER", 0)}


def check_priority(policy: str, priority: int, allow_above_80: bool) -> None:
    if policy not in POLICIES:
        raise ConfigError(f"placement.policy must be one of {sorted(POLICIES)}, got {policy!r}")
    if policy == "other":
        if priority != 0:
            raise ConfigError(f"placement.priority must be 0 with policy 'other', got {priority}")
        return
    if not 1 <= priority <= 99:
        raise ConfigError(f"placement.priority must be in [1, 99] for {policy}, got {priority}")
    if priority > 80 and not allow_above_80:
        raise ConfigError(f"placement.priority {priority} > 80 refused: it starves RCU callbacks "
                          f"and ksoftirqd; set placement.allow_priority_above_80 = true to insist")


@dataclass(frozen=True)
class CacheConfig:
    """Cache keys set by the config; None leaves the model's value."""
    enabled: bool | None = None
    cos_threshold: float | None = None
    norm_tol: float | None = None
    max_age_ns: int | None = None
    max_run: int | None = None

    def __post_init__(self) -> None:
        # checked by EngineConfig (with the policy's own bounds); numpy numbers made plain here
        _plain_fields(self, _CACHE_KEYS)

    def overrides(self) -> dict:
        """The keys this config sets."""
        return {k: getattr(self, k) for k in _CACHE_KEYS if getattr(self, k) is not None}

    def apply(self, policy):
        """The policy in force: the config's keys over the model's. Changing a guard of a
        fitted policy makes it a policy the fit says nothing about, so it loses its fit."""
        over = self.overrides()
        if any(k != "enabled" and over[k] != getattr(policy, k) for k in over):
            over["fitted_max_error"] = None
        return replace(policy, **over)


@dataclass(frozen=True)
class PlacementConfig:
    """Where and how the step() thread runs (applied by fastpath.control.place)."""
    core: Any = "auto"
    policy: str = "fifo"
    # None: the policy's own default, 50 for fifo/rr and 0 for "other" (the only value that
    # policy takes): `policy = "other"` alone was refused for a priority the user never wrote
    priority: int | None = None
    allow_priority_above_80: bool = False

    def __post_init__(self) -> None:
        _plain_fields(self, _PLACEMENT_KEYS)
        if self.priority is None:
            object.__setattr__(self, "priority", 0 if self.policy == "other" else 50)
        for k, (typ, lo, hi, ch) in _PLACEMENT_KEYS.items():
            _check(f"placement.{k}", getattr(self, k), typ, lo, hi, ch)
        check_priority(self.policy, self.priority, self.allow_priority_above_80)


@dataclass(frozen=True)
class MemoryConfig:
    """Backing of the weights arena and cache slots (fastpath.control.memory)."""
    huge_pages: str = "auto"
    mlock: bool = True

    def __post_init__(self) -> None:
        _plain_fields(self, _MEMORY_KEYS)
        for k, (typ, lo, hi, ch) in _MEMORY_KEYS.items():
            _check(f"memory.{k}", getattr(self, k), typ, lo, hi, ch)


@dataclass(frozen=True)
class ServeConfig:
    """The serving loop (fastpath.serve, `fastpath serve`): rings, backpressure, idling,
    liveness and who may open the segment."""
    ring_slots: int = 1024           # requests in flight per client; a power of two
    max_clients: int = 8
    on_full: str = "spin"            # a full request ring: "spin" waits, "reject" raises RingFull
    idle: str = "spin"               # after idle_spin_ns with no request: "spin" | "yield" | "sleep"
    idle_spin_ns: int = 100_000
    idle_sleep_ns: int = 50_000
    mode: int = 0o600                # segment file permissions
    heartbeat_ms: int = 1
    dead_after_ms: int = 50          # a heartbeat older than this makes clients check the pid
    drain_timeout_ms: int = 1000     # how long a stop waits for clients to take their answers
    # a live server pid whose loop has not beaten for this long is reported gone to clients
    # (stopped by a signal, a debugger); connect(stall_timeout=) overrides it per client
    stall_timeout_ms: int = 2000
    place: bool = True               # place the worker thread with [placement]

    def __post_init__(self) -> None:
        _plain_fields(self, _SERVE_KEYS)
        m = self.mode
        if isinstance(m, int) and not isinstance(m, bool) and not 0o400 <= m <= 0o777:
            # permissions are octal: `mode = 600` (decimal 600, 0o1130) was refused as
            # "must be in [256, 511]", bounds nobody reads as file modes
            hint = (f"; permissions are octal: write 0o{m} (TOML and Python read {m} as "
                    f"decimal)" if 400 <= m <= 777 and set(str(m)) <= set("01234567") else "")
            # _show: an int past 4300 digits has no str() (a ValueError in place of this one)
            raise ConfigError(f"serve.mode must be file permissions in [0o400, 0o777], got "
                              f"{_show(m)} (= {oct(m) if abs(m) < 1 << 64 else 'too large'})"
                              f"{hint}")
        for k, (typ, lo, hi, ch) in _SERVE_KEYS.items():
            _check(f"serve.{k}", getattr(self, k), typ, lo, hi, ch)
        if self.ring_slots & (self.ring_slots - 1):
            raise ConfigError(f"serve.ring_slots must be a power of two, got {self.ring_slots}")
        if self.mode & 0o600 != 0o600:
            raise ConfigError(f"serve.mode must give the serving user read and write (0o600 "
                              f"bits), got {oct(self.mode)}")
        if self.dead_after_ms <= self.heartbeat_ms:
            raise ConfigError(f"serve.dead_after_ms ({self.dead_after_ms}) must exceed "
                              f"serve.heartbeat_ms ({self.heartbeat_ms}): clients would call a "
                              f"healthy worker dead between two beats")
        if self.stall_timeout_ms <= self.dead_after_ms:
            raise ConfigError(f"serve.stall_timeout_ms ({self.stall_timeout_ms}) must exceed "
                              f"serve.dead_after_ms ({self.dead_after_ms}): a loop is only "
                              f"judged stalled once its heartbeat is older than dead_after_ms")


@dataclass(frozen=True)
class GpuConfig:
    """The GPU stage: the model's forward pass on an NVIDIA GPU, features and cache on the CPU.
    mode "launch": one kernel launch per miss (pinned H2D, kernel, D2H); "persistent": a kernel
    launched once polls a slot in mapped host memory. auto: how backend="auto" decides where a
    GPU is usable and serves the model: "measure" times the forward on both and keeps the
    faster at p50, "gpu" takes the GPU without measuring."""
    mode: str = "launch"
    device: int = 0                  # CUDA device ordinal
    max_batch: int = 1024            # rows per launch (launch mode's batch path)
    timeout_ms: int = 1000           # a GPU answer later than this is a BackendError, not a wait
    auto: str = "measure"

    def __post_init__(self) -> None:
        _plain_fields(self, _GPU_KEYS)
        for k, (typ, lo, hi, ch) in _GPU_KEYS.items():
            _check(f"gpu.{k}", getattr(self, k), typ, lo, hi, ch)


@dataclass(frozen=True)
class EngineConfig:
    n_symbols: int = 4096
    simd: str = "auto"
    backend: str = "cpu"
    latency_records: int = 65536
    weights: str | None = None
    # time each stage of a tick (up to five TSC reads a miss); false: only total_ns
    stage_times: bool = True
    cache: CacheConfig = field(default_factory=CacheConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    gpu: GpuConfig = field(default_factory=GpuConfig)
    source: str = "<defaults>"

    def __post_init__(self) -> None:
        # EngineConfig(serve={...}) as well as EngineConfig(serve=ServeConfig(...)): a table is
        # checked as from_dict checks it; anything else would only fail (AttributeError) when
        # a server or an engine first reads it
        for sec, (cls, keys) in _section_types().items():
            v = getattr(self, sec)
            if isinstance(v, cls):
                continue
            if not isinstance(v, Mapping):
                raise ConfigError(f"config section {sec} must be a {cls.__name__} or a table of "
                                  f"[{sec}] keys, got {type(v).__name__}")
            _check_keys(sec, v, keys)
            object.__setattr__(self, sec, cls(**v))
        _plain_fields(self, _ENGINE_KEYS)
        for k, (typ, lo, hi, ch) in _ENGINE_KEYS.items():
            if k == "weights" and self.weights is None:
                continue
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
        sections = {"engine": _ENGINE_KEYS,
                    **{sec: keys for sec, (_cls, keys) in _section_types().items()}}
        for sec, body in d.items():
            if sec not in sections and not isinstance(body, Mapping):
                # a key written above every [table] (or a dict without its section) belongs
                # to a table; say which, not "unknown section"
                home = [s for s, keys in sections.items() if sec in keys]
                where = (f"; it is a key of [{home[0]}]: write it under [{home[0]}]"
                         if len(home) == 1 else "; no section has such a key" if not home
                         else f"; it is a key of {', '.join('[' + h + ']' for h in home)}")
                raise ConfigError(f"{sec!r} is a key outside any [table]; keys go under their "
                                  f"section, one of {sorted(sections)}{where}")
            if sec not in sections:
                raise ConfigError(f"unknown config section [{sec}]; allowed: {sorted(sections)}")
            _check_keys(sec, body, sections[sec])
        # values are checked once, by each section's dataclass
        return cls(**dict(d.get("engine", {})), cache=CacheConfig(**d.get("cache", {})),
                   placement=PlacementConfig(**d.get("placement", {})),
                   memory=MemoryConfig(**d.get("memory", {})),
                   serve=ServeConfig(**d.get("serve", {})), gpu=GpuConfig(**d.get("gpu", {})),
                   source=source)


def _section_types() -> dict:
    """[section] -> (its dataclass, its keys), for the sections below [engine]."""
    return {"cache": (CacheConfig, _CACHE_KEYS), "placement": (PlacementConfig, _PLACEMENT_KEYS),
            "memory": (MemoryConfig, _MEMORY_KEYS), "serve": (ServeConfig, _SERVE_KEYS),
            "gpu": (GpuConfig, _GPU_KEYS)}


def _check_keys(sec: str, body, keys) -> None:
    if not isinstance(body, Mapping):
        raise ConfigError(f"[{sec}] must be a table of keys, got {type(body).__name__}")
    for k in body:
        if k not in keys:
            raise ConfigError(f"unknown key {sec}.{k}; allowed in [{sec}]: {sorted(keys)}")


def load_config(cfg: Any = None) -> EngineConfig:
    """None -> defaults; EngineConfig as is; a mapping; or a path to a TOML file."""
    if cfg is None:
        return EngineConfig()
    if isinstance(cfg, EngineConfig):
        return cfg
    if isinstance(cfg, Mapping):
        return EngineConfig.from_dict(cfg)
    if isinstance(cfg, (str, os.PathLike)):
        path = os.fspath(cfg)
        data = read_toml(path)
        try:
            return EngineConfig.from_dict(data, source=path)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None
    raise ConfigError(f"config must be None, a dict, a TOML path or an EngineConfig, got "
                      f"{type(cfg).__name__}")


def read_toml(path: str) -> dict:
    """The tables of the TOML file at `path`, or a ConfigError naming the file. One reader for
    every caller (load_config, `fastpath doctor`'s "has a [serve] table"), so a file one of them
    reads is never one another calls broken."""
    text = ""
    try:
        with open(path, "rb") as f:
            # utf-8-sig: editors on Windows save UTF-8 with a byte-order mark, which
            # tomllib refused as "Invalid statement (at line 1, column 1)"
            text = f.read().decode("utf-8-sig")
        data = tomllib.loads(text)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path!r}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        # a binary file (a bundle passed as the config): named, with the first bad byte
        raise ConfigError(f"{path} is not a TOML config: not UTF-8 text (byte "
                          f"{exc.start}: {exc.object[exc.start:exc.start + 1]!r})") from None
    except ValueError:
        # tomllib's int() of a literal past Python's str -> int digit limit (a corrupt or
        # fuzzed file): a ValueError traceback from inside tomllib, not a TOMLDecodeError
        limit = sys.get_int_max_str_digits() or 4300
        m = re.search(r"[0-9_]{%d,}" % limit, text)
        where = f" at line {text.count(chr(10), 0, m.start()) + 1}" if m else ""
        raise ConfigError(f"{path} is not valid TOML: an integer literal{where} of more than "
                          f"{limit} digits, which Python does not read; no key takes a number "
                          f"of that size") from None
    return data
