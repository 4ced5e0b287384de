"""One value check for every declared setting: the config sections and the cache policy.

Lives below both fastpath.model (CachePolicy validates itself) and fastpath.control.config
(every config section), so neither has to import the other to say what a bad value is.
"""
from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from fastpath.errors import ConfigError, InputError

# the most symbols one engine serves ([engine] n_symbols); the stream generator and
# `fastpath calibrate` refuse ids past it, as the config does
MAX_SYMBOLS = 1 << 22


def check_symbol_ids(sy: np.ndarray) -> None:
    """InputError for the first symbol id < 0 in sy (an integer array): the engine steps
    symbols 0..n_symbols-1, so a negative id in calibration or replay data is a mistake in
    the data (FeatureSpec.fit and fit_cache_policy refuse it alike)."""
    if sy.size and sy.min() < 0:
        raise InputError(f"symbols must be >= 0 (the engine's symbol ids), got {sy.min()} at "
                         f"row {int(np.argmax(sy < 0))}")


def check_seconds(what: str, v, lo_open: bool, hi: float | None = 3600.0,
                  none: str = "") -> float:
    """v as seconds: a real number >= 0 (> 0 with lo_open) and <= hi (None: any finite
    number), else an InputError naming `what`; `none`: what None would have meant."""
    # any real number but a bool: numpy's too (np.int64(2), np.float32(0.5) from a config
    # array were refused as "must be a number of seconds in [0, 3600], got 2")
    ok = not isinstance(v, (bool, np.bool_)) and isinstance(v, numbers.Real) and v == v \
        and (0 < v if lo_open else 0 <= v) and (math.isfinite(v) if hi is None else v <= hi)
    if not ok:
        if hi is None:
            raise InputError(f"{what} must be a finite number of seconds "
                             f"{'> 0' if lo_open else '>= 0'}{none}, got {v!r}")
        rng = f"(0, {hi:g}]" if lo_open else f"[0, {hi:g}]"
        raise InputError(f"{what} must be a number of seconds in {rng}, got {v!r}")
    return float(v)


def is_real(value: Any) -> bool:
    """Whether value is a real number given as one: a Python or numpy int or float, never a
    bool (True is an int to Python, and quantile=True read as 1 was a fit to the maximum)."""
    return isinstance(value, (int, float, np.integer, np.floating)) and \
        not isinstance(value, (bool, np.bool_))


def _show(value: Any) -> str:
    """repr(value) for a message; an int of more than 30 digits by its size (past Python's
    4300 digits repr raises ValueError, which would replace the ConfigError)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10 ** 30:
        return f"an int of about 10**{int(abs(value).bit_length() * 0.30103)}"
    return repr(value)


def one_of(v: Any, choices) -> bool:
    """Whether v is one of the named choices, as a string: `in` alone took a numpy array
    (np.array(['relu']) == 'relu' is array([True])), which then broke a model's hash (the
    Engine's "unhashable type") and was saved as a list the bundle reader refused."""
    return isinstance(v, str) and v in choices


def plain(value: Any, typ) -> Any:
    """A numpy number given for a key of type `typ` as the Python value it holds: an integer
    for an int or float key, a floating for a float key, np.bool_ for a bool key (what a
    numpy computation gives: symbols.max() + 1, 10 * np.diff(ts).max(), mask.any()), so
    check_value judges the value, not its type. Never a bool for a numeric key nor a float
    for an int key: those stay as given and are refused by check_value."""
    if typ is bool and isinstance(value, np.bool_):
        return bool(value)
    if typ is int or typ == (str, int) or typ is float:
        if isinstance(value, np.integer):
            return int(value)
        if typ is float and isinstance(value, np.floating):
            return float(value)
    return value


def plain_fields(obj, keys) -> None:
    """plain over the declared keys ({key: (type, ...)}) of a frozen dataclass, in place: the
    object then holds plain Python values (CachePolicy, the control plane's config sections)."""
    for k, (typ, *_rest) in keys.items():
        v = getattr(obj, k)
        p = plain(v, typ)
        if p is not v:
            object.__setattr__(obj, k, p)


def check_value(key: str, value: Any, typ, lo=None, hi=None, choices=None) -> Any:
    """`value` as `typ` (an int is accepted for a float), or a ConfigError naming `key`,
    the value and what is allowed. typ == (str, int) means "auto" or a CPU number."""
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        try:
            value = float(value)
        except OverflowError:
            # an int past float's range (10**400): out of any float key's range
            raise ConfigError(f"{key} must be a float in [{lo}, {hi}], got {_show(value)}, "
                              f"beyond float's range") from None
    if typ == (str, int):      # placement.core: "auto" or a CPU number
        if isinstance(value, bool) or not (value == "auto" or isinstance(value, int) and 0 <= value < 1 << 16):
            raise ConfigError(f"{key} must be \"auto\" or a CPU number, got {_show(value)}")
        return value
    if typ is not bool and isinstance(value, bool) or not isinstance(value, typ):
        raise ConfigError(f"{key} must be {typ.__name__}, got {type(value).__name__} {_show(value)}")
    if choices is not None and value not in choices:
        raise ConfigError(f"{key} must be one of {list(choices)}, got {_show(value)}")
    if typ is float and value != value:
        raise ConfigError(f"{key} must be a number, got NaN")
    if lo is not None and value < lo or hi is not None and value > hi:
        raise ConfigError(f"{key} must be in [{lo}, {hi}], got {_show(value)}")
    return value
