"""Model types: an MLP (Layer) or a tree ensemble (fastpath.model.trees), the feature spec
that feeds it and the cache policy that guards it, each validated completely when built, so
an Engine is never made from half a model. What was validated stays so: each array is a
copy of the caller's, read-only (a write raises ValueError; build a new Layer or FeatureSpec,
or use the with_* methods), and models compare and hash by content (== on a model read back
from its bundle is True).

The file formats live beside this one (bundle.py: .fpm; onnx_import.py / onnx_export.py);
the Model methods that read and write them, and fit_cache_policy (fastpath.tuning, which
needs the engine), import those modules when called. Nothing here imports the engine or the
control plane.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from fastpath._checks import check_symbol_ids, check_value, one_of, plain_fields
from fastpath.errors import ConfigError, InputError, ModelError

ACTIVATIONS = ("identity", "relu", "tanh", "sigmoid")
# what follows the last dense layer, as exporters write it: nothing, a softmax (classifier
# probabilities), or one logit z -> [1 - sigmoid(z), sigmoid(z)] (a binary classifier)
POSTS = ("none", "softmax", "logistic2")
# the hidden layers' weight format in the engine (the output layer stays fp32); the model
# always holds fp32 weights, the engine rounds or quantizes them when it packs them
WEIGHT_TYPES = ("fp32", "bf16", "int8")
# head kind -> the output indices it reads, in order, by default
HEAD_KINDS = {"tanh_sigmoid": (0, 1), "regression": (0,), "classifier3": (0, 1, 2),
              "classifier2": (0, 1)}
MAX_LAYERS = 16
# how far outside [0, 1] a classifier head's input may be and still be read as a probability
# (float32 rounding); the C core's FP_PROB_TOL (csrc/fp_math.h)
PROB_TOL = 1e-4
_F32_TINY = float(np.finfo(np.float32).tiny)
_F32_MAX = float(np.finfo(np.float32).max)
MAX_WIDTH = 1 << 16

# The cache keys a config may set, key -> (type, lo, hi, choices); fastpath.control.config
# reads this table for its [cache] section, so a key is declared once.
CACHE_KEYS = {
    "enabled": (bool, None, None, None),
    "cos_threshold": (float, -1.0, 1.0, None),
    "norm_tol": (float, 0.0, 1e6, None),
    "max_age_ns": (int, 0, 2**62, None),
    "max_run": (int, 0, 2**32 - 1, None),
}


# a bundle saved with a head its outputs cannot take (before that was refused) loads with another
_BUNDLE_HEAD = "; a bundle saved with it loads with another, Model.load(path, head=...)"
# how to give a head on the command line (calibrate, serve, doctor take a model file)
_CLI_HEAD = ("; on the command line (calibrate, serve, doctor) give it with --head "
             "KIND[:OUTPUTS][@SCALE], e.g. --head regression:0")


def validate_cache_policy(obj: Any, prefix: str = "cache") -> None:
    """Check each cache key of `obj` (a CachePolicy or config section) against CACHE_KEYS."""
    for k, (typ, lo, hi, ch) in CACHE_KEYS.items():
        check_value(f"{prefix}.{k}", getattr(obj, k), typ, lo, hi, ch)


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


@dataclass(frozen=True, eq=False)
class Layer:
    """Dense layer: y = activation(weight @ x + bias); weight is (out, in)."""
    weight: np.ndarray
    bias: np.ndarray
    activation: str = "identity"

    def __post_init__(self) -> None:
        w = _f32(self.weight, "layer weight", 2)
        b = _f32(self.bias, "layer bias", 1)
        if b.shape[0] != w.shape[0]:
            raise ModelError(f"bias has {b.shape[0]} values but weight has {w.shape[0]} rows")
        if not (1 <= w.shape[0] <= MAX_WIDTH and 1 <= w.shape[1] <= MAX_WIDTH):
            raise ModelError(f"layer shape {w.shape} outside 1..{MAX_WIDTH}")
        if not one_of(self.activation, ACTIVATIONS):
            raise ModelError(f"activation {self.activation!r} not supported; expected one of "
                             f"{ACTIVATIONS}")
        object.__setattr__(self, "activation", str(self.activation))
        object.__setattr__(self, "weight", _frozen(w))
        object.__setattr__(self, "bias", _frozen(b))

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return _key(self, ("weight", "bias", "activation")) == \
            _key(other, ("weight", "bias", "activation"))

    def __hash__(self) -> int:
        return _cached_hash(self, ("weight", "bias", "activation"))

    def __reduce__(self):
        # copy.deepcopy and pickle rebuild through the constructor: restored as plain state,
        # the arrays came back writable (and unchecked)
        return (self.__class__, (self.weight, self.bias, self.activation))


@dataclass(frozen=True, eq=False)
class FeatureSpec:
    """How a raw tick becomes the model input.

    features = (pre - mean) * inv_std, with pre = [raw[z_idx], rolling mean of
    raw[w_idx] over the last `window` ticks of the symbol, rolling std (ddof 0)
    of the same]. n_feat = len(z_idx) + 2 * len(w_idx)."""
    raw_len: int
    z_idx: np.ndarray
    w_idx: np.ndarray
    window: int
    mean: np.ndarray
    inv_std: np.ndarray
    field_names: tuple = ()

    def __post_init__(self) -> None:
        if isinstance(self.raw_len, bool) or not isinstance(self.raw_len, (int, np.integer)) \
                or not 1 <= self.raw_len <= MAX_WIDTH:
            raise ModelError(f"feature spec raw_len must be an int in 1..{MAX_WIDTH}, "
                             f"got {self.raw_len!r}")
        if isinstance(self.field_names, (str, bytes)):
            raise ModelError(f"feature spec field_names must be a sequence of names, got the "
                             f"string {self.field_names!r}")
        # None is no names, as () is (it was the TypeError "'NoneType' object is not iterable")
        names = () if self.field_names is None else self.field_names
        if not isinstance(names, Iterable):
            raise ModelError(f"feature spec field_names must be a sequence of names (or None), "
                             f"got {type(names).__name__} {names!r}")
        z = np.asarray(self.z_idx)
        w = np.asarray(self.w_idx)
        for name, ix in (("z_idx", z), ("w_idx", w)):
            if ix.ndim != 1 or (ix.size and ix.dtype.kind not in "iu"):
                raise ModelError(f"feature spec {name} must be a 1-d integer array, got "
                                 f"{ix.dtype} shape {ix.shape}")
            if ix.size and (ix.min() < 0 or ix.max() >= self.raw_len):
                raise ModelError(f"feature spec {name} indexes outside raw[0:{self.raw_len}]")
        n_feat = len(z) + 2 * len(w)
        if n_feat < 1:
            raise ModelError("feature spec selects no features")
        win = self.window
        if len(w) and (isinstance(win, bool) or not isinstance(win, (int, np.integer))
                       or not 1 <= win <= 1 << 16):
            raise ModelError(f"feature spec window must be an int in 1..65536, got {self.window!r}")
        mean = _f32(self.mean, "feature spec mean", 1)
        inv = _f32(self.inv_std, "feature spec inv_std", 1)
        if mean.shape[0] != n_feat or inv.shape[0] != n_feat:
            raise ModelError(f"feature spec mean/inv_std need {n_feat} values (len(z_idx) + "
                             f"2*len(w_idx)), got {mean.shape[0]} and {inv.shape[0]}")
        object.__setattr__(self, "raw_len", int(self.raw_len))
        object.__setattr__(self, "window", int(self.window) if len(w) else 1)
        object.__setattr__(self, "z_idx", _frozen(z.astype(np.int32)))
        object.__setattr__(self, "w_idx", _frozen(w.astype(np.int32)))
        object.__setattr__(self, "mean", _frozen(mean))
        object.__setattr__(self, "inv_std", _frozen(inv))
        object.__setattr__(self, "field_names", tuple(str(n) for n in names))

    _FIELDS = ("raw_len", "z_idx", "w_idx", "window", "mean", "inv_std", "field_names")

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return _key(self, self._FIELDS) == _key(other, self._FIELDS)

    def __hash__(self) -> int:
        return _cached_hash(self, self._FIELDS)

    def __reduce__(self):
        # as Layer's: through the constructor, so a copy's arrays are frozen too
        return (self.__class__, tuple(getattr(self, f) for f in self._FIELDS))

    @property
    def n_feat(self) -> int:
        return len(self.z_idx) + 2 * len(self.w_idx)

    @classmethod
    def identity(cls, n: int) -> "FeatureSpec":
        """raw -> raw unchanged: raw_len n, every field z-scored with mean 0 and inv_std 1."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= MAX_WIDTH:
            # numpy's TypeError (None, "3") or ValueError (-1) came out of the arrays below
            raise ModelError(f"FeatureSpec.identity(n): n is the raw tick's length, an int in "
                             f"1..{MAX_WIDTH}, got {n!r}")
        n = int(n)
        return cls(n, np.arange(n, dtype=np.int32), np.zeros(0, np.int32), 1,
                   np.zeros(n, np.float32), np.ones(n, np.float32))

    @classmethod
    def fit(cls, raws: np.ndarray, z_idx: Iterable[int], w_idx: Iterable[int] = (),
            window: int = 32, symbols: np.ndarray | None = None,
            field_names: Sequence[str] = ()) -> "FeatureSpec":
        """Fit mean/inv_std from recorded raw ticks (n, raw_len), replaying the windows per
        symbol (symbols: one integer id per tick; the ticks in the order the engine will see
        them). A feature that does not vary on these ticks (std <= 1e-12) gets inv_std 1."""
        field_names = () if field_names is None else field_names
        if isinstance(raws, np.ndarray) and raws.dtype.kind not in "iuf":
            # a bool mask passed for ticks was fitted as 0s and 1s
            raise ModelError(f"calibration ticks must be a numeric array, got dtype {raws.dtype}")
        try:
            r64 = np.asarray(raws)
            if r64.dtype.kind not in "fiu":
                # a list of complex values or text is refused, not cast (_numbers)
                r64 = _numbers(r64, np.float32)
        except (TypeError, ValueError) as exc:
            raise ModelError(f"calibration ticks must be numbers: {exc}") from None
        if r64.dtype.kind == "f" and r64.dtype.itemsize > 4 and r64.ndim == 2 and r64.size:
            # a finite float64 beyond float32 was cast to Inf and then named as one
            big = np.isfinite(r64) & (np.abs(r64) > _F32_MAX)
            if big.any():
                i, j = (int(v) for v in np.argwhere(big)[0])
                raise ModelError(f"calibration ticks: row {i} field {j} is "
                                 f"{float(r64[i, j])!r}, beyond float32's range (fastpath "
                                 f"computes in float32)")
        raws = np.asarray(r64, dtype=np.float32)
        if raws.ndim != 2 or raws.shape[0] < 2:
            raise ModelError(f"calibration needs a 2-d array of at least 2 ticks, got {raws.shape}")
        bad = ~np.isfinite(raws)
        if bad.any():
            i, j = (int(v) for v in np.argwhere(bad)[0])
            name = f" ({field_names[j]})" if j < len(field_names) else ""
            raise ModelError(f"calibration ticks must be finite: row {i} field {j}{name} is "
                             f"{raws[i, j]} ({int(bad.any(1).sum())} row(s) hold NaN/Inf)")
        n, R = raws.shape
        # checked before the replay indexes with them: a float index (1.7) was truncated to
        # field 1 by the int64 cast, True read field 1, and one past raw_len was numpy's
        # IndexError
        z = _fit_indices(z_idx, R, "z_idx")
        w = _fit_indices(w_idx, R, "w_idx")
        # checked here too, before the replay below indexes with it (the spec's own check
        # comes after: a window of -3 was an IndexError from numpy)
        if len(w) and (isinstance(window, bool) or not isinstance(window, (int, np.integer))
                       or not 1 <= window <= 1 << 16):
            raise ModelError(f"feature spec window must be an int in 1..65536, got {window!r}")
        if symbols is None:
            symbols = np.zeros(n, np.int64)
        else:
            sy = np.asarray(symbols)
            if sy.shape == (n,) and sy.dtype.kind == "i":
                check_symbol_ids(sy)    # another shape or dtype: window_pre_features says
        pre = window_pre_features(raws, symbols, z, w, window)
        mean = pre.mean(axis=0, dtype=np.float64)
        std = pre.std(axis=0, dtype=np.float64)
        inv = np.where(std > 1e-12, 1.0 / np.maximum(std, 1e-12), 1.0)
        return cls(R, z, w, window, mean.astype(np.float32), inv.astype(np.float32),
                   tuple(field_names))

    def apply(self, raws: np.ndarray, symbols: np.ndarray | None = None) -> np.ndarray:
        """Reference (numpy) features for a sequence of ticks, windows replayed per symbol."""
        try:
            raws = _numbers(raws, np.float32)
        except (TypeError, ValueError) as exc:
            raise InputError(f"FeatureSpec.apply: raws must be numbers, got "
                             f"{type(raws).__name__} ({exc})") from None
        if raws.ndim != 2 or raws.shape[1] != self.raw_len:
            # a wider row was read by its first raw_len fields, silently (another layout's
            # ticks), a narrower one was numpy's IndexError
            raise InputError(f"FeatureSpec.apply: raws must have shape (n, {self.raw_len}), "
                             f"got {raws.shape}")
        if symbols is None:
            symbols = np.zeros(len(raws), np.int64)
        pre = window_pre_features(raws, symbols, self.z_idx, self.w_idx, self.window)
        return ((pre - self.mean) * self.inv_std).astype(np.float32)


@dataclass(frozen=True, eq=False)
class InputScaler:
    """The affine map an imported model reads its input through: y = (x - offset) * scale per
    input, in float32, which is what onnxruntime's Scaler (skl2onnx's StandardScaler,
    MinMaxScaler) computes. Model.from_onnx reads it from the graph's leading ops and runs it
    in the feature stage, before the first layer, instead of folding it into that layer (in
    float32 the folded W * scale and b - W * scale * offset are both large for price-like
    inputs, x ~ 6.5e4, and their difference is not: the fold lost the inputs' last digits).

    A Model keeps it as model.input_scaler beside its feature_spec, and the two stay apart:
    feature_spec turns a raw tick into the model's input (the ONNX graph's input: the user's
    to set, replace or calibrate), input_scaler turns that into the first layer's input (the
    model's: it was fitted with the layers). The feature stage runs the spec, then the
    scaler as two more float32 ops per feature, as onnxruntime runs it on the features it is
    given (not composed into the spec's mean and inv_std: a spec that centres price-like
    fields, mean ~6.5e4, then a scaler with an offset, composes to a mean whose float32
    rounding moved the features; see fp_features_scale in csrc/fp_features.h).
    Model.features(raws) is the numpy reference of the two. Any way of setting the spec
    (with_feature_spec, calibrate, dataclasses.replace, the constructor) keeps the scaler."""
    offset: np.ndarray
    scale: np.ndarray

    def __post_init__(self) -> None:
        off = _f32(self.offset, "input scaler offset", 1)
        sc = _f32(self.scale, "input scaler scale", 1)
        if off.shape != sc.shape or not 1 <= off.shape[0] <= MAX_WIDTH:
            raise ModelError(f"input scaler offset and scale need the same length in "
                             f"1..{MAX_WIDTH}, got {off.shape[0]} and {sc.shape[0]}")
        object.__setattr__(self, "offset", _frozen(off))
        object.__setattr__(self, "scale", _frozen(sc))

    _FIELDS = ("offset", "scale")

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return _key(self, self._FIELDS) == _key(other, self._FIELDS)

    def __hash__(self) -> int:
        return _cached_hash(self, self._FIELDS)

    def __reduce__(self):
        return (self.__class__, (self.offset, self.scale))

    @property
    def n(self) -> int:
        return self.offset.shape[0]

    def apply(self, x: np.ndarray) -> np.ndarray:
        """(x - offset) * scale in float32, the ops onnxruntime's Scaler runs: the model's
        inputs (n,) or (rows, n) as the first layer reads them."""
        try:
            x = _numbers(x, np.float32)
        except (TypeError, ValueError) as exc:
            raise InputError(f"InputScaler.apply: x must be numbers, got {type(x).__name__} "
                             f"({exc})") from None
        if x.ndim not in (1, 2) or x.shape[-1] != self.n:
            raise InputError(f"InputScaler.apply: x must have shape ({self.n},) or (rows, "
                             f"{self.n}), got {x.shape}")
        return ((x - self.offset) * self.scale).astype(np.float32)


def window_pre_features(raws: np.ndarray, symbols: np.ndarray, z_idx: np.ndarray,
                        w_idx: np.ndarray, window: int) -> np.ndarray:
    """[raw[z_idx], rolling mean, rolling std] per tick, the numpy reference of the C window.

    Each tick's window (its symbol's last `window` ticks, itself included; fewer while the
    symbol warms up) in float64 and two passes, the mean and then the mean square about it:
    no running sums, so nothing cancels (prices at 1e5 with a spread of 0.01 keep their
    std, where sums over the whole stream kept none of it)."""
    n = len(raws)
    k = len(w_idx)
    symbols = np.asarray(symbols)
    if symbols.shape != (n,) or symbols.dtype.kind not in "iu":
        # every tick needs its symbol: with fewer symbols than ticks the rows past them were
        # never written (np.empty) and a fit's mean came out as 1e33; with more, an IndexError
        raise InputError(f"symbols must be an integer array of shape ({n},), one per tick, got "
                         f"{symbols.dtype} {symbols.shape}")
    pre = np.empty((n, len(z_idx) + 2 * k), np.float32)
    pre[:, :len(z_idx)] = raws[:, z_idx]
    if k:
        vals = raws[:, w_idx].astype(np.float64)
        for s in np.unique(symbols):
            rows = np.flatnonzero(symbols == s)
            m, sd = _rolling_mean_std(vals[rows], window)
            pre[rows, len(z_idx):len(z_idx) + k] = m
            pre[rows, len(z_idx) + k:] = sd
    return pre


def _fit_indices(idx: Iterable[int], raw_len: int, what: str) -> np.ndarray:
    """Field indices for FeatureSpec.fit as int64, each an int (not a bool or a float) in
    0..raw_len-1; a ModelError naming the first bad one otherwise."""
    try:
        vals = list(idx)
    except TypeError:
        raise ModelError(f"feature spec {what} must be a sequence of field indices, got "
                         f"{idx!r}") from None
    for v in vals:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise ModelError(f"feature spec {what} must hold integer field indices, got {v!r}")
        if not 0 <= v < raw_len:
            raise ModelError(f"feature spec {what} holds field {int(v)}, outside the ticks' "
                             f"fields 0..{raw_len - 1}")
    return np.asarray(vals, dtype=np.int64)


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


def _rolling_mean_std(v: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean and std (ddof 0) of v[max(0, i - window + 1):i + 1] for every row i of v
    (ticks x fields), two-pass in float64, in chunks of rows so that memory stays small."""
    n, k = v.shape
    m = np.empty((n, k))
    sd = np.empty((n, k))
    head = min(window - 1, n)
    for i in range(head):       # the warm-up: windows of 1 .. window - 1 ticks
        w = v[:i + 1]
        mu = w.mean(axis=0)
        m[i] = mu
        sd[i] = np.sqrt(((w - mu) ** 2).mean(axis=0))
    if n >= window:
        full = np.lib.stride_tricks.sliding_window_view(v, window, axis=0)   # (n-W+1, k, W)
        step = max(1, (1 << 22) // max(1, k * window))
        for a in range(0, len(full), step):
            w = full[a:a + step]
            mu = w.mean(axis=-1)
            m[window - 1 + a:window - 1 + a + len(w)] = mu
            sd[window - 1 + a:window - 1 + a + len(w)] = np.sqrt(
                ((w - mu[..., None]) ** 2).mean(axis=-1))
    return m, sd


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


@dataclass(frozen=True)
class Head:
    """How step() turns the model's outputs into (signal in [-1, 1], confidence in [0, 1]).

    kind:
      "tanh_sigmoid"  two raw outputs: signal = tanh(out[a]), confidence = sigmoid(out[b]);
                      outputs = (a, b), default (0, 1)
      "regression"    one predicted value: signal = tanh(out[a] / scale), confidence =
                      |signal|; outputs = (a,), default (0,); scale is fitted by calibrate
                      (fastpath.tuning.fit_head_scale) so typical predictions use the range
      "classifier3"   down / flat / up probabilities: signal = p(up) - p(down), confidence =
                      the largest probability; outputs = (down, flat, up), default (0, 1, 2)
      "classifier2"   down / up probabilities, the same formulas; outputs = (down, up)
    """
    kind: str = "tanh_sigmoid"
    scale: float = 1.0
    outputs: tuple = ()

    def __post_init__(self) -> None:
        if not one_of(self.kind, HEAD_KINDS):
            raise ModelError(f"head kind {self.kind!r} not supported; expected one of "
                             f"{tuple(HEAD_KINDS)}")
        s = self.scale
        # the engine divides by the scale in float32: a scale finite in float64 only (1e39)
        # or one that rounds to 0 there (1e-46) would be refused by the C core as a bug
        if isinstance(s, bool) or not isinstance(s, (int, float, np.integer, np.floating)) or \
                not (np.isfinite(s) and _F32_TINY <= s <= _F32_MAX):
            raise ModelError(f"head scale must be a finite number > 0 that float32 holds (in "
                             f"[{_F32_TINY:.3g}, {_F32_MAX:.4g}]), got {s!r}")
        if isinstance(self.outputs, (int, np.integer)) and not isinstance(self.outputs, bool):
            # Head("regression", s, 0) was a TypeError ("'int' object is not iterable")
            raise ModelError(f"head outputs must be a tuple of output indices, e.g. "
                             f"({int(self.outputs)},), got the int {self.outputs!r}")
        try:
            outs = tuple(self.outputs) or HEAD_KINDS[self.kind]
        except TypeError:
            raise ModelError(f"head outputs must be a tuple of output indices, got "
                             f"{self.outputs!r}") from None
        if len(outs) != len(HEAD_KINDS[self.kind]) or not all(
                isinstance(i, (int, np.integer)) and not isinstance(i, bool) and i >= 0
                for i in outs):
            raise ModelError(f"head {self.kind!r} reads {len(HEAD_KINDS[self.kind])} output "
                             f"indices (>= 0), got {self.outputs!r}")
        object.__setattr__(self, "scale", float(s))
        object.__setattr__(self, "outputs", tuple(int(i) for i in outs))

    @classmethod
    def default_for(cls, n_outputs: int, post: str) -> "Head":
        """The head a model gets when none is given: probabilities (softmax / logistic2) of
        2 or 3 classes are a classifier, one output is a regression, two raw outputs are
        tanh / sigmoid; anything else must name its head."""
        if post in ("softmax", "logistic2"):
            if n_outputs in (2, 3):
                return cls("classifier2" if n_outputs == 2 else "classifier3")
        elif n_outputs == 1:
            return cls("regression")
        elif n_outputs == 2:
            return cls("tanh_sigmoid")
        raise ModelError(f"the last layer has {n_outputs} outputs and no head was given: without "
                         f"one the last layer must have 2 outputs (tanh / sigmoid head), 1 "
                         f"(regression head) or, after a softmax / logistic2 post transform, 2 or "
                         f"3 class probabilities (classifier head); give a head, e.g. "
                         f"Head('classifier3', outputs=(down, flat, up)) or "
                         f"Head('regression', outputs=(i,)){_CLI_HEAD}")

    def check(self, n_outputs: int) -> None:
        bad = [i for i in self.outputs if i >= n_outputs]
        if bad:
            raise ModelError(f"head {self.kind!r} reads output(s) {bad} but the model has "
                             f"{n_outputs} output(s)")
        if len(set(self.outputs)) != len(self.outputs):
            raise ModelError(f"head {self.kind!r} reads the same output twice: {self.outputs}")

    def apply(self, out: np.ndarray) -> tuple:
        """(signal, confidence) for outputs (..., n_outputs), in float64 numpy (the reference
        of the C heads). A classifier head reads probabilities: a finite output outside
        [0, 1] (beyond PROB_TOL, float32 rounding) is an InputError, as the engine refuses
        such a tick; within the tolerance the answer is clamped to its range, as there."""
        i = self.outputs
        o = _head_outputs(out, max(i) + 1, f"head {self.kind!r} (outputs {i})")
        if self.kind == "tanh_sigmoid":
            return np.tanh(o[..., i[0]]), _sigmoid(o[..., i[1]])
        if self.kind == "regression":
            s = np.tanh(o[..., i[0]] / self.scale)
            return s, np.abs(s)
        off = (o < -PROB_TOL) | (o > 1.0 + PROB_TOL)        # NaN stays NaN, as before
        if off.any():
            at = tuple(int(v) for v in np.argwhere(off)[0])
            row = "" if len(at) == 1 else f" of row {at[0] if len(at) == 2 else at[:-1]}"
            raise InputError(f"head {self.kind!r} (outputs {i}) reads class probabilities, "
                             f"each in [0, 1]; output {at[-1]}{row} is {float(o[at]):.6g}: "
                             f"margins or scores, not probabilities (give a head for raw "
                             f"outputs, e.g. Head('regression', outputs=(i,)))")
        return (np.clip(o[..., i[-1]] - o[..., i[0]], -1.0, 1.0),
                np.clip(o.max(axis=-1), 0.0, 1.0))

    def to_json(self) -> dict:
        return {"kind": self.kind, "scale": self.scale, "outputs": list(self.outputs)}


def _head_outputs(out: Any, need: int, what: str) -> np.ndarray:
    """out as float64 (..., n) with n >= need, what a head reads by index; an InputError
    naming the head otherwise (too few outputs was numpy's IndexError, text its ValueError)."""
    try:
        o = _numbers(out, np.float64)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{what}: outputs must be numbers, got {type(out).__name__} "
                         f"({exc})") from None
    if o.ndim < 1 or o.shape[-1] < need:
        raise InputError(f"{what}: outputs must have shape (..., n) with n >= {need}, got "
                         f"{o.shape}")
    return o


def _sigmoid(o: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-o)) in o's float type: where exp(-o) overflows (o below -709 in float64,
    -88 in float32) it gives 0, as the engine answers, without numpy's overflow warning (an
    exception under -W error)."""
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-o))


def _layer_tuple(layers: Any) -> tuple:
    """Model.layers as a tuple; a ModelError for one Layer or None given bare (a TypeError
    "'Layer' object is not iterable" before)."""
    if isinstance(layers, Layer):
        raise ModelError("layers must be a sequence of Layer: wrap a single one, (layer,)")
    if isinstance(layers, (str, bytes)) or not isinstance(layers, Iterable):
        raise ModelError(f"layers must be a sequence of Layer (empty for a tree ensemble), "
                         f"got {type(layers).__name__}")
    return tuple(layers)


def _meta(meta: Any) -> dict:
    """The model's meta as a new dict: None is no meta (it was a TypeError from dict()), a
    mapping is copied, anything else is refused (dict() read a list of pairs as a dict and
    failed on other lists with a ValueError about 'update sequence elements')."""
    if meta is None:
        return {}
    if not isinstance(meta, Mapping):
        raise ModelError(f"meta must be a dict of JSON values (or None), got "
                         f"{type(meta).__name__}")
    return dict(meta)


def _json_scalar(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(type(o).__name__)


def _meta_key(meta: dict) -> Any:
    """meta as the bundle keeps it (JSON: tuples and numpy values become lists and numbers),
    so a model read back equals the one written; compared as is when it is not JSON."""
    import json
    try:
        return json.dumps(meta, sort_keys=True, default=_json_scalar)
    except (TypeError, ValueError):
        return meta


@dataclass(frozen=True, eq=False)
class Model:
    """An MLP (layers) or a tree ensemble (trees, layers empty) with its feature spec, cache
    policy, output transform and head.

    The last layer has any width; `post` transforms it into the model's outputs (what
    onnxruntime returns: "softmax" and "logistic2" give class probabilities) and `head_spec`
    maps the outputs to (signal, confidence); None picks Head.default_for(n_outputs, post).

    A model imported from ONNX with a scaler in front has input_scaler: the model reads its
    input x (what onnxruntime reads, what forward() and to_onnx take) as
    input_scaler.apply(x) = (x - offset) * scale. feature_spec turns a raw tick into that
    input x; the feature stage runs the spec then the scaler (in float32, as onnxruntime
    runs the scaler; see InputScaler), and features(raws) is the numpy reference of the
    first layer's inputs."""
    layers: tuple
    feature_spec: FeatureSpec | None = None
    cache_policy: CachePolicy = field(default_factory=CachePolicy)
    meta: dict = field(default_factory=dict)
    post: str = "none"
    head_spec: Head | None = None
    weights: str = "fp32"
    # a tree ensemble instead of layers (layers empty, post "none": the ensemble carries its
    # own post transform); see fastpath.model.trees
    trees: Any = None
    # the affine map the model reads its input through (an imported Scaler, Sub / Div...),
    # applied after feature_spec (by the feature stage, as two float32 ops a feature).
    # A Model field rather than a mark inside FeatureSpec: the spec is the user's to replace,
    # the scaler is the model's (it was fitted with the layers), and a spec replaced any way
    # (with_feature_spec, calibrate, dataclasses.replace) keeps it. Stop 22 stored the spec
    # with the scaler already composed into it, so replace(model, feature_spec=fs) silently
    # dropped the scaler: the layers then read unscaled inputs.
    input_scaler: InputScaler | None = None

    def __post_init__(self) -> None:
        if not one_of(self.weights, WEIGHT_TYPES):
            raise ModelError(f"weights {self.weights!r} not supported; expected one of "
                             f"{list(WEIGHT_TYPES)}")
        if not one_of(self.post, POSTS):
            raise ModelError(f"post transform {self.post!r} not supported; expected one of {POSTS}")
        object.__setattr__(self, "weights", str(self.weights))
        object.__setattr__(self, "post", str(self.post))
        if self.input_scaler is not None and not isinstance(self.input_scaler, InputScaler):
            raise ModelError(f"input_scaler must be a fastpath.model.types.InputScaler or None, "
                             f"got {type(self.input_scaler).__name__}")
        if self.trees is not None:
            if self.weights != "fp32":
                raise ModelError(f"weights {self.weights!r} apply to an MLP's layers; a tree "
                                 f"ensemble keeps its float32 thresholds and leaf values (use 'fp32')")
            self._init_trees()
            self._check_scaler()
            return
        layers = _layer_tuple(self.layers)
        if not 1 <= len(layers) <= MAX_LAYERS:
            raise ModelError(f"a model needs 1..{MAX_LAYERS} layers, got {len(layers)}")
        for i, l in enumerate(layers):
            if not isinstance(l, Layer):
                raise ModelError(f"layer {i} is a {type(l).__name__}, expected fastpath.model.Layer")
            if i and l.weight.shape[1] != layers[i - 1].weight.shape[0]:
                raise ModelError(f"layer {i} takes {l.weight.shape[1]} inputs but layer {i - 1} "
                                 f"gives {layers[i - 1].weight.shape[0]}")
        width = layers[-1].weight.shape[0]
        if self.post == "logistic2" and width != 1:
            raise ModelError(f"post 'logistic2' turns one logit into two probabilities; the last "
                             f"layer has {width} outputs")
        if self.post == "softmax" and width < 2:
            raise ModelError("post 'softmax' needs at least 2 outputs")
        n_out = 2 if self.post == "logistic2" else width
        head = self.head_spec if self.head_spec is not None else Head.default_for(n_out, self.post)
        if not isinstance(head, Head):
            raise ModelError(f"head_spec must be a fastpath.model.Head, got {type(head).__name__}")
        head.check(n_out)
        act = layers[-1].activation
        if head.kind.startswith("classifier") and self.post == "none" and act != "sigmoid":
            # only a softmax / logistic2 post transform or a sigmoid last layer makes
            # probabilities; these are the last layer's raw values (logits, margins, decision
            # scores), which the head read as probabilities: signals beyond +-1 and
            # confidences beyond [0, 1], or inside them and meaningless
            raise ModelError(f"head {head.kind!r} reads class probabilities, but this model's "
                             f"outputs are its last layer's {act} values with no post "
                             f"transform (post 'none'): not probabilities; if they are logits "
                             f"give post='softmax' (post='logistic2' for one logit), else a "
                             f"head for raw outputs, e.g. Head('regression', outputs=(i,)) or "
                             f"Head('tanh_sigmoid', outputs=(a, b)){_BUNDLE_HEAD}{_CLI_HEAD}")
        fs = self.feature_spec
        if fs is None:
            fs = FeatureSpec.identity(layers[0].weight.shape[1])
        if not isinstance(fs, FeatureSpec):
            raise ModelError(f"feature_spec must be a FeatureSpec, got {type(fs).__name__}")
        if fs.n_feat != layers[0].weight.shape[1]:
            raise ModelError(f"the feature spec makes {fs.n_feat} features but the first layer "
                             f"takes {layers[0].weight.shape[1]} inputs")
        if not isinstance(self.cache_policy, CachePolicy):
            raise ModelError(f"cache_policy must be a CachePolicy, got "
                             f"{type(self.cache_policy).__name__}")
        object.__setattr__(self, "layers", layers)
        object.__setattr__(self, "head_spec", head)
        object.__setattr__(self, "feature_spec", fs)
        object.__setattr__(self, "meta", _meta(self.meta))
        self._check_scaler()

    def _check_scaler(self) -> None:
        sc, fs = self.input_scaler, self.feature_spec
        if sc is not None and sc.n != fs.n_feat:
            raise ModelError(f"the input scaler takes {sc.n} inputs but the feature spec makes "
                             f"{fs.n_feat} features")

    def features(self, raws: np.ndarray, symbols: np.ndarray | None = None) -> np.ndarray:
        """The first layer's (or the trees') inputs for raw ticks (n, raw_len), windows
        replayed per symbol, float32: feature_spec.apply, then the input scaler when the model
        has one (input_scaler.apply). The numpy reference of what the feature stage computes
        (Engine.features, one tick)."""
        f = self.feature_spec.apply(raws, symbols)
        sc = self.input_scaler
        if sc is None:
            return f
        with np.errstate(over="ignore", invalid="ignore"):
            # a feature the scaler takes past float32's range is Inf here, as in the engine
            # (which refuses the tick)
            return sc.apply(f)

    _FIELDS = ("layers", "feature_spec", "cache_policy", "post", "head_spec", "weights", "trees",
               "input_scaler")

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in self._FIELDS) and \
            _meta_key(self.meta) == _meta_key(other.meta)

    def __hash__(self) -> int:
        # meta (a dict) is left out: models equal in all fields are equal in these, and the
        # generated hash raised TypeError on it (and on the arrays)
        return hash(tuple(getattr(self, f) for f in self._FIELDS))

    def _init_trees(self) -> None:
        from fastpath.model.trees import TreeEnsemble
        t = self.trees
        if not isinstance(t, TreeEnsemble):
            raise ModelError(f"trees must be a fastpath.model.TreeEnsemble, got {type(t).__name__}")
        if self.layers is not None and _layer_tuple(self.layers):
            raise ModelError("a model is either layers or a tree ensemble, not both")
        if self.post != "none":
            raise ModelError("a tree ensemble carries its own post transform; post must be 'none'")
        n_out = t.n_outputs
        head = self.head_spec
        if head is None:
            if t.classifier and n_out in (2, 3) and not t.gives_probabilities():
                # a classifier head reads its outputs as probabilities: these are not, and
                # the signal and confidence would leave [-1, 1] and [0, 1]
                raise ModelError(f"the tree classifier's outputs are not class probabilities "
                                 f"(post transform {t.post_transform}"
                                 f"{', leaf sums outside [0, 1]' if t.post_transform == 'NONE' else ''}"
                                 f"; XGBoost's multi:softmax exports raw margins so), which "
                                 f"the classifier heads read; give a head for them, e.g. "
                                 f"Head('regression', outputs=(i,)), or export probabilities "
                                 f"(multi:softprob, a LOGISTIC / SOFTMAX post transform)"
                                 f"{_CLI_HEAD}")
            if t.classifier and n_out in (2, 3):
                head = Head("classifier2" if n_out == 2 else "classifier3")
            elif not t.classifier and n_out in (1, 2):
                head = Head.default_for(n_out, "none")
            else:
                raise ModelError(f"the tree ensemble has {n_out} outputs "
                                 f"({'classes' if t.classifier else 'targets'}) and no head was "
                                 f"given; give one, e.g. Head('classifier3', outputs=(down, flat, "
                                 f"up)) or Head('regression', outputs=(i,)){_CLI_HEAD}")
        if not isinstance(head, Head):
            raise ModelError(f"head_spec must be a fastpath.model.Head, got {type(head).__name__}")
        head.check(n_out)
        if head.kind.startswith("classifier") and t.classifier and not t.gives_probabilities():
            # the default's rule above, for a head given: the same margins / z-scores read as
            # probabilities (the engine refuses such a tick only when one leaves [0, 1])
            raise ModelError(f"head {head.kind!r} reads class probabilities, but the tree "
                             f"classifier's outputs are not (post transform "
                             f"{t.post_transform}"
                             f"{', leaf sums outside [0, 1]' if t.post_transform == 'NONE' else ''}"
                             f"; XGBoost's multi:softmax exports raw margins so); give a head "
                             f"for them, e.g. Head('regression', outputs=(i,)), or export "
                             f"probabilities (multi:softprob, a LOGISTIC / SOFTMAX post "
                             f"transform){_BUNDLE_HEAD}{_CLI_HEAD}")
        if self.feature_spec is None and t.n_features > MAX_WIDTH:
            # the identity spec it would get reported its raw_len, a spec the caller never gave
            raise ModelError(f"the tree ensemble takes {t.n_features} inputs; a tick holds at "
                             f"most {MAX_WIDTH} values (give a feature spec that makes "
                             f"{t.n_features} features, or select fewer features)")
        fs = self.feature_spec if self.feature_spec is not None else \
            FeatureSpec.identity(t.n_features)
        if not isinstance(fs, FeatureSpec):
            raise ModelError(f"feature_spec must be a FeatureSpec, got {type(fs).__name__}")
        if fs.n_feat != t.n_features:
            raise ModelError(f"the feature spec makes {fs.n_feat} features but the tree ensemble "
                             f"takes {t.n_features} inputs")
        if not isinstance(self.cache_policy, CachePolicy):
            raise ModelError(f"cache_policy must be a CachePolicy, got "
                             f"{type(self.cache_policy).__name__}")
        object.__setattr__(self, "layers", ())
        object.__setattr__(self, "head_spec", head)
        object.__setattr__(self, "feature_spec", fs)
        object.__setattr__(self, "meta", _meta(self.meta))

    # -------------------------------------------------------------- shapes
    @property
    def kind(self) -> str:
        """'mlp' (dense layers) or 'trees' (a tree ensemble)."""
        return "mlp" if self.trees is None else "trees"

    @property
    def dims(self) -> list:
        if self.trees is not None:
            return [self.trees.n_features, self.trees.n_outputs]
        return [self.layers[0].weight.shape[1]] + [l.weight.shape[0] for l in self.layers]

    @property
    def n_outputs(self) -> int:
        """Outputs after the post transform (what predict() and onnxruntime return)."""
        if self.trees is not None:
            return self.trees.n_outputs
        return 2 if self.post == "logistic2" else self.layers[-1].weight.shape[0]

    @property
    def raw_len(self) -> int:
        return self.feature_spec.raw_len

    def _unfitted(self) -> tuple:
        """(cache policy, meta) with a fitted policy switched off and its fit report dropped:
        for a change the shadow replay that fitted it never saw."""
        pol, meta = self.cache_policy, self.meta
        if pol.fitted:
            pol = replace(pol, enabled=False, fitted_max_error=None)
        meta = {k: v for k, v in meta.items() if k != "cache_policy_fit"}
        return pol, meta

    def with_feature_spec(self, fs: FeatureSpec) -> "Model":
        """This model on another feature spec. The cache compares features, and another spec
        scales them otherwise, so a fitted cache policy (and its fit report in meta) is
        dropped, as calibrate drops it; the same spec keeps it.

        A model with an input scaler (imported from ONNX with a Scaler in front) reads fs's
        features through it, as it always did: fs makes the model's input (the ONNX graph's
        input) and the scaler follows."""
        if fs == self.feature_spec:
            return replace(self, feature_spec=fs)
        pol, meta = self._unfitted()
        return replace(self, feature_spec=fs, cache_policy=pol, meta=meta)

    def with_cache_policy(self, policy: CachePolicy) -> "Model":
        """This model with another cache policy; the report of an earlier fit (meta's
        "cache_policy_fit") goes with the policy it described."""
        if policy == self.cache_policy:
            return replace(self, cache_policy=policy)
        meta = {k: v for k, v in self.meta.items() if k != "cache_policy_fit"}
        return replace(self, cache_policy=policy, meta=meta)

    def with_weights(self, weights: str) -> "Model":
        """This model run with "fp32", "bf16" or "int8" hidden-layer weights (the output layer
        stays fp32). The outputs move, so a fitted cache policy (and its fit report in meta)
        is dropped; a one-layer model has no hidden layer, runs the same, and keeps its policy.

        How far the outputs move depends on the inputs, not only on the weights: measure it
        on your own ticks. The bench's figures are for z-scored features; a model fed raw
        inputs of mixed scale (the identity feature spec, no scaler in front of its first
        layer) loses its small inputs and cancels its large ones against the bias: on such a
        model (price ~6.5e4 beside a spread of 1e-2) the signal moved by up to 0.8 (bf16) and
        2.0 (int8, half the signs flipped), where fp32 stayed within 3e-5 of float64. A
        scaler imported in front of the model (input_scaler) runs in the feature stage, so
        the first layer keeps the file's weights and reads centred inputs: on a
        StandardScaler + MLPRegressor (32, 16) pipeline fed such prices, bf16 moved the signal
        by up to 0.004 and int8 by 0.009 (2 sign flips in 1000 ticks), where the scaler folded
        into the first layer moved it by 2.0 with either (half the signs flipped)."""
        pol, meta = self.cache_policy, self.meta
        # only hidden layers are packed reduced (fp_mlp.c): a single layer is the output
        # layer, its outputs do not move, and the fit still holds
        if pol.fitted and weights != self.weights and self.trees is None and len(self.layers) > 1:
            pol = replace(pol, enabled=False, fitted_max_error=None)
            # the fit report would describe a policy no longer in force (as calibrate drops it)
            meta = {k: v for k, v in meta.items() if k != "cache_policy_fit"}
        return replace(self, weights=weights, cache_policy=pol, meta=meta)

    def with_head(self, head: Head) -> "Model":
        """This model with another head (the outputs are unchanged; the cache's stored signals
        depend on the head, so a fitted cache policy and its fit report in meta are dropped;
        the same head keeps them)."""
        if head == self.head_spec:
            return replace(self, head_spec=head)
        pol, meta = self._unfitted()
        return replace(self, head_spec=head, cache_policy=pol, meta=meta)

    # --------------------------------------------------- numpy reference
    def forward(self, features: np.ndarray) -> np.ndarray:
        """Model outputs (post transform, no head) for the model's inputs (n_feat,) or
        (n, n_feat), in float32 numpy: what onnxruntime returns for them. A model with an
        input scaler reads them through it first (input_scaler.apply); for raw ticks use
        outputs()."""
        sc = self.input_scaler
        if sc is not None:
            features = sc.apply(_feature_rows(features, sc.n, "Model.forward"))
        return self._layers_forward(features)

    def outputs(self, raws: np.ndarray, symbols: np.ndarray | None = None) -> np.ndarray:
        """Model outputs (post transform, no head) for raw ticks (n, raw_len), windows
        replayed per symbol: the numpy reference of what the engine computes before the
        head (features(): the feature spec then the input scaler, as the feature stage runs
        them; then the layers or trees)."""
        return self._layers_forward(self.features(raws, symbols))

    def _layers_forward(self, features: np.ndarray) -> np.ndarray:
        if self.trees is not None:
            return self.trees.forward(features)
        x = _feature_rows(features, self.layers[0].weight.shape[1], "Model.forward")
        for l in self.layers:
            x = x @ l.weight.T + l.bias
            if l.activation == "relu":
                x = np.maximum(x, 0)
            elif l.activation == "tanh":
                x = np.tanh(x)
            elif l.activation == "sigmoid":
                x = _sigmoid(x)
        x = x.astype(np.float32)
        if self.post == "softmax":
            e = np.exp(x - x.max(axis=-1, keepdims=True))
            x = e / e.sum(axis=-1, keepdims=True)
        elif self.post == "logistic2":
            p = _sigmoid(x.astype(np.float64)).astype(np.float32)
            x = np.concatenate([1.0 - p, p], axis=-1)
        return x.astype(np.float32)

    @staticmethod
    def head(out: np.ndarray) -> tuple:
        """(signal, confidence) = (tanh(out0), sigmoid(out1)): the two-output head. A model's
        own head (any kind) is self.head_spec.apply(out)."""
        out = _head_outputs(out, 2, "Model.head (outputs 0 and 1)")
        return np.tanh(out[..., 0]), _sigmoid(out[..., 1])

    def signal(self, out: np.ndarray) -> tuple:
        """(signal, confidence) for model outputs (n_outputs,) or (n, n_outputs) by this
        model's head (numpy reference)."""
        try:
            o = _numbers(out, np.float64)
        except (TypeError, ValueError) as exc:
            raise InputError(f"Model.signal: outputs must be numbers, got "
                             f"{type(out).__name__} ({exc})") from None
        if o.ndim not in (1, 2) or o.shape[-1] != self.n_outputs:
            # a narrower row was numpy's IndexError; a wider one was read silently (a
            # classifier's confidence, the max over the row, came from outputs it lacks)
            raise InputError(f"Model.signal: outputs must have shape ({self.n_outputs},) or "
                             f"(n, {self.n_outputs}), got {o.shape}")
        return self.head_spec.apply(o)

    # ------------------------------------------------- formats and fitting
    def save(self, path: str | os.PathLike) -> None:
        """Write the native bundle (weights + feature spec + cache policy) atomically."""
        from fastpath.model.bundle import save
        save(self, path)

    def to_bytes(self) -> bytes:
        from fastpath.model.bundle import to_bytes
        return to_bytes(self)

    @classmethod
    def load(cls, path: str | os.PathLike, head: "Head | None" = None) -> "Model":
        """Read a native bundle; any damage is a ModelError naming it, never a partial model.
        head: this head in place of the bundle's (as with_head: a fitted cache policy is
        dropped when it differs), the way to read a bundle whose stored head its outputs
        cannot take (a classifier head over margins, saved before that was refused)."""
        from fastpath.model.bundle import load
        return load(path, head)

    @classmethod
    def from_bytes(cls, blob: bytes, name: str = "<bytes>",
                   head: "Head | None" = None) -> "Model":
        from fastpath.model.bundle import from_bytes
        return from_bytes(blob, name, head)

    def to_onnx(self, path: str | os.PathLike, opset: int = 17) -> None:
        """Write the MLP as ONNX: Gemm (transB=1) + activation per layer, then the post
        transform (softmax, logistic2); input "features" [N, n_feat], output "out" [N,
        n_outputs]: onnxruntime returns what forward() does. A model with an input scaler
        writes it first, as Sub and Mul (the ops onnxruntime's Scaler runs), not folded into
        the first layer: for a model imported from ONNX the file returns what the original
        returns, and from_onnx reads the scaler back.

        What the graph does not hold (the feature spec, the head, the weight format, the
        cache policy and meta) goes into the file's metadata_props under "fastpath.model"
        (fastpath.model.onnx_meta; onnxruntime ignores it), so from_onnx gives back a model
        equal to this one, which serves the same signals. The graph holds the fp32 weights:
        onnxruntime's outputs differ from a bf16 / int8 engine's by what weights_error
        measures. Meta must hold JSON values, as for Model.save. Needs the onnx package."""
        if self.trees is not None:
            raise ModelError("writing a tree ensemble as ONNX is not supported; keep the ONNX "
                             "file it came from, or save the model as a bundle (Model.save)")
        from fastpath.model.bundle import _path
        from fastpath.model.onnx_export import to_onnx
        to_onnx(self, _path(path, "Model.to_onnx"), opset)

    @classmethod
    def from_onnx(cls, path: str | os.PathLike, head: "Head | None" = None) -> "Model":
        """Import an MLP, linear model or tree ensemble from ONNX as torch.onnx.export,
        skl2onnx and onnxmltools write it (see fastpath.model.onnx_import for the ops).

        A file Model.to_onnx wrote holds fastpath's record (metadata_props "fastpath.model",
        see fastpath.model.onnx_meta): the model comes back with its feature spec, head,
        weight format, cache policy and meta as written (equal to the model exported; meta
        is the model's, without the "source" / "onnx_output" an import adds), `head` in place
        of the stored one when given (as with_head: a fitted policy dropped when it
        differs). A damaged record is a ModelError naming the file, never another model. If
        the graph is no longer the one written (its weights' digest differs: edited or
        retrained since), the cache is read as off and a UserWarning says so.

        Any other file (torch, skl2onnx, onnxmltools) gets the identity feature spec (raw =
        model input), fp32, the cache off (fit a policy with fit_cache_policy or enable one
        in the config), meta {"source": the file's name, "onnx_output": the output served}
        and `head`, or the default head for its outputs (Head.default_for).

        The affine map the graph reads its input through (a Scaler, or Sub / Add then Mul /
        Div by constants) becomes the model's input_scaler, run by the feature stage in
        float32 as onnxruntime runs it: the feature spec makes the graph's input, the scaler
        follows it, and the first layer keeps the file's weights."""
        from fastpath.model import onnx_meta
        from fastpath.model.bundle import _path
        from fastpath.model.onnx_import import read_onnx
        # a str: a bytes path's basename (b'model.onnx') in meta["source"] made the model
        # one Model.save refused (meta must hold JSON values)
        name = _path(path, "Model.from_onnx")
        g = read_onnx(name)
        record = onnx_meta.find(g["metadata"], name)
        fs = sc = None
        if g.get("input") is not None:
            try:
                sc = InputScaler(*g["input"])
                fs = FeatureSpec.identity(sc.n)
            except ModelError as exc:
                raise ModelError(f"{name}: the input scaler: {exc}") from None
        meta = {"source": os.path.basename(name), "onnx_output": g["output"]}
        if "trees" in g:
            if record is not None:
                raise ModelError(f"{name}: the graph is a tree ensemble but its "
                                 f"metadata_props hold fastpath's record of an MLP "
                                 f"({onnx_meta.KEY!r}, which Model.to_onnx writes for MLPs "
                                 f"only): which model the file describes it does not say")
            try:
                return cls((), fs, CachePolicy(enabled=False), meta, "none", head,
                           trees=g["trees"], input_scaler=sc)
            except ModelError as exc:
                # as for layers: the file is named, so a caller loading several knows which
                raise ModelError(f"{name}: {exc}") from None
        try:
            layers = tuple(Layer(w, b, act) for w, b, act in g["layers"])
        except ModelError as exc:
            raise ModelError(f"{name}: {exc}") from None
        if record is not None:
            # the model as fastpath wrote it: the record's spec, head, weights, policy, meta
            return onnx_meta.restore(
                record, name, layers, g["post"], sc, head,
                lambda fs, h, pol, w, m: cls(layers, fs, pol, m, g["post"], h, weights=w,
                                             input_scaler=sc))
        try:
            n_out = 2 if g["post"] == "logistic2" else layers[-1].weight.shape[0]
            if head is None and g["classifier"] and n_out in (2, 3):
                head = Head("classifier2" if n_out == 2 else "classifier3")
            if head is None and g.get("scores") is not None:
                raise ModelError(
                    f"LinearClassifier node {g['scores']!r} writes decision scores "
                    f"(post_transform NONE, as RidgeClassifier and LinearSVC export), not "
                    f"class probabilities: a classifier head would read them as "
                    f"probabilities (signals beyond +-1, confidences beyond [0, 1]); give a "
                    f"head for the scores, e.g. head=Head('regression', outputs=(i,)), or "
                    f"export a classifier with probabilities (LogisticRegression, "
                    f"CalibratedClassifierCV){_CLI_HEAD}")
            return cls(layers, fs, CachePolicy(enabled=False), meta, g["post"], head,
                       input_scaler=sc)
        except ModelError as exc:
            raise ModelError(f"{name}: {exc}") from None

    def fit_cache_policy(self, raws: np.ndarray, symbols: np.ndarray | None = None,
                         max_error: float = 0.01, ts_ns: np.ndarray | None = None, **kw):
        """(a copy of this model with the fitted policy, the fit report): the loosest cache
        policy whose hits all stay within max_error of the fresh signal in a shadow replay of
        these ticks; the cache stays off when none does. See fastpath.tuning.fit_cache_policy."""
        # the one upward import of this package: fitting replays ticks through the engine
        from fastpath.tuning import fit_cache_policy
        pol, rep = fit_cache_policy(self, raws, symbols, max_error=max_error, ts_ns=ts_ns, **kw)
        meta = dict(self.meta)
        meta["cache_policy_fit"] = rep.summary()
        return replace(self, cache_policy=pol, meta=meta), rep
