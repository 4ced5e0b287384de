"""FeatureSpec (a raw tick -> the model's input: z-scored fields and per-symbol rolling window
statistics) and InputScaler (the affine map an imported model reads that input through), with
window_pre_features, the numpy reference of the C window."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from fastpath._checks import check_symbol_ids
from fastpath.errors import InputError, ModelError
from fastpath.model._arrays import (_F32_MAX, MAX_WIDTH, _cached_hash, _f32, _frozen, _key,
                                    _numbers)


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
