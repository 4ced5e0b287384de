"""CachePolicy: when a cached result may stand in for a fresh one, and CACHE_KEYS, the table of
its keys that the config's [cache] section reads too."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fastpath._checks import check_value, plain_fields
from fastpath.errors import ConfigError

# The cache keys a config may set, key -> (type, lo, hi, choices); fastpath.control.config
# reads this table for its [cache] section, so a key is declared once.
CACHE_KEYS = {
    "enabled": (bool, None, None, None),
    "cos_threshold": (float, -1.0, 1.0, None),
    "norm_tol": (float, 0.0, 1e6, None),
    "max_age_ns": (int, 0, 2**62, None),
    "max_run": (int, 0, 2**32 - 1, None),
}


def validate_cache_policy(obj: Any, prefix: str = "cache") -> None:
    """Check each cache key of `obj` (a CachePolicy or config section) against CACHE_KEYS."""
    for k, (typ, lo, hi, ch) in CACHE_KEYS.items():
        check_value(f"{prefix}.{k}", getattr(obj, k), typ, lo, hi, ch)


@dataclass(frozen=True)
class CachePolicy:
    """When a cached result may stand in for a fresh one (all four guards must pass).

    Off by default: a reused result is a stale one, and thresholds that are not fitted to the
    model and its data can return hits far from the fresh signal (an unfitted cosine 0.999 /
    norm 2% policy gave signal errors up to 1.6 and sign flips on real order-book data).
    fitted_max_error is the largest |signal error| that every hit kept in the shadow replay
    the policy was fitted by (fastpath.tuning.fit_cache_policy); None when it was not fitted."""
    enabled: bool = False
    cos_threshold: float = 0.999
    norm_tol: float = 0.02
    max_age_ns: int = 50_000_000
    max_run: int = 16
    fitted_max_error: float | None = None

    def __post_init__(self) -> None:
        # numpy numbers as the Python ones they hold, as the config's [cache] section takes
        # them (np.int64 was "must be int, got int64", np.float32 "must be float")
        plain_fields(self, CACHE_KEYS)
        validate_cache_policy(self, "cache")
        e = self.fitted_max_error
        if e is not None:
            if isinstance(e, bool) or not isinstance(e, (int, float, np.integer, np.floating)) \
                    or not 0.0 < float(e) <= 2.0:
                raise ConfigError(f"cache.fitted_max_error must be None or a signal error in "
                                  f"(0, 2], got {e!r}")
            object.__setattr__(self, "fitted_max_error", float(e))

    @property
    def fitted(self) -> bool:
        return self.fitted_max_error is not None
