"""Array checks the model types share: every array a model holds is validated once (numeric,
finite, within float32), copied, frozen, and compared and hashed by content."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from fastpath.errors import InputError, ModelError

_F32_MAX = float(np.finfo(np.float32).max)
MAX_WIDTH = 1 << 16


def _f32(a: Any, what: str, ndim: int) -> np.ndarray:
    try:
        arr = np.asarray(a)
    except Exception as exc:  # noqa: BLE001 - any conversion failure is a model error
        raise ModelError(f"{what} is not an array: {exc}") from None
    if arr.dtype.kind not in "fiu":
        raise ModelError(f"{what} must be numeric, got dtype {arr.dtype}")
    if arr.ndim != ndim:
        raise ModelError(f"{what} must be {ndim}-d, got shape {arr.shape}")
    # a copy even when the caller's array is already float32: the model keeps what was
    # validated, not a view that the caller's later writes (an optimizer step, a NaN) change
    if arr.dtype.kind == "f" and arr.dtype.itemsize > 4 and arr.size:
        # a finite float64 beyond float32 (1e39, a fold's x / 1e-40) would be cast to Inf and
        # then named as one: say what it is
        big = np.isfinite(arr) & (np.abs(arr) > np.finfo(np.float32).max)
        if big.any():
            at = tuple(int(i) for i in np.argwhere(big)[0])
            raise ModelError(f"{what} holds {float(arr[at])!r} at index {at}, beyond float32's "
                             f"range (fastpath computes in float32)")
    arr = np.array(arr, dtype=np.float32, order="C", copy=True)
    if not np.all(np.isfinite(arr)):
        bad = np.argwhere(~np.isfinite(arr))[0]
        raise ModelError(f"{what} contains NaN/Inf (first at index {tuple(int(i) for i in bad)})")
    return arr


def _frozen(a: np.ndarray) -> np.ndarray:
    # validated once: a later write (an optimizer step on model.layers[0].weight) would
    # change the model under an Engine built from it (engine.model kept reporting the new
    # weights while the engine ran its copy of the old ones) and skip the NaN checks
    a.setflags(write=False)
    return a


def _key(obj: Any, fields: Sequence[str]) -> tuple:
    """What equality and hashing compare: the fields, each array as its dtype, shape and
    bytes (the generated __eq__ compared arrays with ==, and bool() of that raised numpy's
    "truth value is ambiguous" for any two models not the same object)."""
    return tuple((a.dtype.str, a.shape, a.tobytes()) if isinstance(a, np.ndarray) else a
                 for a in (getattr(obj, f) for f in fields))


def _cached_hash(obj: Any, fields: Sequence[str]) -> int:
    # the arrays are frozen, so their hash is computed once (a model as a dict key would
    # otherwise hash every weight on every lookup)
    h = obj.__dict__.get("_hash")
    if h is None:
        h = hash(_key(obj, fields))
        object.__setattr__(obj, "_hash", h)
    return h


def _numbers(x: Any, dtype) -> np.ndarray:
    """x as a `dtype` array when it holds numbers (bool, integer, float, or objects that
    convert); a TypeError otherwise. The cast alone took the real part of complex values (a
    ComplexWarning, then an answer), parsed text and read datetime64 as days since 1970,
    where Engine.predict refuses each of them."""
    a = np.asarray(x)
    if a.dtype.kind not in "biufO":
        raise TypeError(f"dtype {a.dtype} does not hold numbers")
    return np.asarray(a, dtype=dtype)


def _feature_rows(features: Any, n_feat: int, what: str) -> np.ndarray:
    """features as float32 (n_feat,) or (n, n_feat); an InputError naming the shape
    otherwise: a row of another width would be read with its features misplaced (a tree reads
    the ones it splits on and ignores the rest), or fail deep inside numpy."""
    try:
        x = _numbers(features, np.float32)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{what}: features must be numbers, got {type(features).__name__} "
                         f"({exc})") from None
    if x.ndim not in (1, 2) or x.shape[-1] != n_feat:
        raise InputError(f"{what}: features must have shape ({n_feat},) or (n, {n_feat}), got "
                         f"{x.shape}")
    return x
