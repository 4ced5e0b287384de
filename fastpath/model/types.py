"""Models: an MLP, the feature spec that feeds it and the cache policy that guards it.

Design: a Model is validated completely when it is built, so an Engine is never
made from half a model. The native bundle (.fpm) is one file: a magic, a JSON
header describing every array, the arrays (64-byte aligned offsets), then a
CRC32 of everything before it and an end marker, so truncation and corruption
are detected before a single weight is used. ONNX import reads the graph with
the `onnx` package (optional extra) and accepts only the ops an MLP needs.
"""
from __future__ import annotations

import json
import os
import struct
import zlib
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Sequence

import numpy as np

from fastpath.errors import ModelError

ACTIVATIONS = ("identity", "relu", "tanh", "sigmoid")
MAX_LAYERS = 16
MAX_WIDTH = 1 << 16

_MAGIC = b"FPMODEL\x01"
_END = b"FPEND\x00\x00\x00"
_VERSION = 1


def _f32(a: Any, what: str, ndim: int) -> np.ndarray:
    try:
        arr = np.asarray(a)
    except Exception as exc:  # noqa: BLE001 - any conversion failure is a model error
        raise ModelError(f"{what} is not an array: {exc}") from None
    if arr.dtype.kind not in "fiu":
        raise ModelError(f"{what} must be numeric, got dtype {arr.dtype}")
    if arr.ndim != ndim:
        raise ModelError(f"{what} must be {ndim}-d, got shape {arr.shape}")
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    if not np.all(np.isfinite(arr)):
        bad = np.argwhere(~np.isfinite(arr))[0]
        raise ModelError(f"{what} contains NaN/Inf (first at index {tuple(int(i) for i in bad)})")
    return arr


@dataclass(frozen=True)
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
        if self.activation not in ACTIVATIONS:
            raise ModelError(f"activation {self.activation!r} not supported; expected one of "
                             f"{ACTIVATIONS}")
        object.__setattr__(self, "weight", w)
        object.__setattr__(self, "bias", b)


@dataclass(frozen=True)
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
        if not isinstance(self.raw_len, (int, np.integer)) or not 1 <= self.raw_len <= MAX_WIDTH:
            raise ModelError(f"feature spec raw_len must be an int in 1..{MAX_WIDTH}, "
                             f"got {self.raw_len!r}")
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
        if len(w) and (not isinstance(self.window, (int, np.integer)) or not
                       1 <= self.window <= 1 << 16):
            raise ModelError(f"feature spec window must be an int in 1..65536, got {self.window!r}")
        mean = _f32(self.mean, "feature spec mean", 1)
        inv = _f32(self.inv_std, "feature spec inv_std", 1)
        if mean.shape[0] != n_feat or inv.shape[0] != n_feat:
            raise ModelError(f"feature spec mean/inv_std need {n_feat} values (len(z_idx) + "
                             f"2*len(w_idx)), got {mean.shape[0]} and {inv.shape[0]}")
        object.__setattr__(self, "raw_len", int(self.raw_len))
        object.__setattr__(self, "window", int(self.window) if len(w) else 1)
        object.__setattr__(self, "z_idx", z.astype(np.int32))
        object.__setattr__(self, "w_idx", w.astype(np.int32))
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "inv_std", inv)
        object.__setattr__(self, "field_names", tuple(str(n) for n in self.field_names))

    @property
    def n_feat(self) -> int:
        return len(self.z_idx) + 2 * len(self.w_idx)

    @classmethod
    def identity(cls, n: int) -> "FeatureSpec":
        """raw -> raw unchanged: raw_len n, every field z-scored with mean 0 and inv_std 1."""
        return cls(n, np.arange(n, dtype=np.int32), np.zeros(0, np.int32), 1,
                   np.zeros(n, np.float32), np.ones(n, np.float32))

    @classmethod
    def fit(cls, raws: np.ndarray, z_idx: Iterable[int], w_idx: Iterable[int] = (),
            window: int = 32, symbols: np.ndarray | None = None,
            field_names: Sequence[str] = ()) -> "FeatureSpec":
        """Fit mean/inv_std from recorded raw ticks (n, raw_len), replaying the windows per symbol."""
        raws = np.asarray(raws, dtype=np.float32)
        if raws.ndim != 2 or raws.shape[0] < 2:
            raise ModelError(f"calibration needs a 2-d array of at least 2 ticks, got {raws.shape}")
        if not np.all(np.isfinite(raws)):
            raise ModelError("calibration ticks contain NaN/Inf")
        z = np.asarray(list(z_idx), dtype=np.int64)
        w = np.asarray(list(w_idx), dtype=np.int64)
        n, R = raws.shape
        if symbols is None:
            symbols = np.zeros(n, np.int64)
        pre = window_pre_features(raws, symbols, z, w, window)
        mean = pre.mean(axis=0, dtype=np.float64)
        std = pre.std(axis=0, dtype=np.float64)
        inv = np.where(std > 1e-12, 1.0 / np.maximum(std, 1e-12), 1.0)
        return cls(R, z, w, window, mean.astype(np.float32), inv.astype(np.float32),
                   tuple(field_names))

    def apply(self, raws: np.ndarray, symbols: np.ndarray | None = None) -> np.ndarray:
        """Reference (numpy) features for a sequence of ticks, windows replayed per symbol."""
        raws = np.asarray(raws, dtype=np.float32)
        if symbols is None:
            symbols = np.zeros(len(raws), np.int64)
        pre = window_pre_features(raws, symbols, self.z_idx, self.w_idx, self.window)
        return ((pre - self.mean) * self.inv_std).astype(np.float32)


def window_pre_features(raws: np.ndarray, symbols: np.ndarray, z_idx: np.ndarray,
                        w_idx: np.ndarray, window: int) -> np.ndarray:
    """[raw[z_idx], rolling mean, rolling std] per tick, the numpy reference of the C window."""
    n = len(raws)
    k = len(w_idx)
    pre = np.empty((n, len(z_idx) + 2 * k), np.float32)
    pre[:, :len(z_idx)] = raws[:, z_idx]
    if k:
        vals = raws[:, w_idx].astype(np.float64)
        symbols = np.asarray(symbols)
        for s in np.unique(symbols):
            rows = np.flatnonzero(symbols == s)
            v = vals[rows]
            c1 = np.cumsum(v, axis=0)
            c2 = np.cumsum(v * v, axis=0)
            c1 = np.vstack([np.zeros((1, k)), c1])
            c2 = np.vstack([np.zeros((1, k)), c2])
            idx = np.arange(1, len(rows) + 1)
            lo = np.maximum(idx - window, 0)
            cnt = (idx - lo)[:, None].astype(np.float64)
            m = (c1[idx] - c1[lo]) / cnt
            var = (c2[idx] - c2[lo]) / cnt - m * m
            pre[rows, len(z_idx):len(z_idx) + k] = m
            pre[rows, len(z_idx) + k:] = np.sqrt(np.maximum(var, 0.0))
    return pre


@dataclass(frozen=True)
class CachePolicy:
    """When a cached result may stand in for a fresh one (all four guards must pass)."""
    enabled: bool = True
    cos_threshold: float = 0.999
    norm_tol: float = 0.02
    max_age_ns: int = 50_000_000
    max_run: int = 16

    def __post_init__(self) -> None:
        from fastpath.control.config import validate_cache_policy
        validate_cache_policy(self, "cache")


@dataclass(frozen=True)
class Model:
    """An MLP with its feature spec and cache policy; output width must be 2 (signal, confidence)."""
    layers: tuple
    feature_spec: FeatureSpec | None = None
    cache_policy: CachePolicy = field(default_factory=CachePolicy)
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        layers = tuple(self.layers)
        if not 1 <= len(layers) <= MAX_LAYERS:
            raise ModelError(f"a model needs 1..{MAX_LAYERS} layers, got {len(layers)}")
        for i, l in enumerate(layers):
            if not isinstance(l, Layer):
                raise ModelError(f"layer {i} is a {type(l).__name__}, expected fastpath.model.Layer")
            if i and l.weight.shape[1] != layers[i - 1].weight.shape[0]:
                raise ModelError(f"layer {i} takes {l.weight.shape[1]} inputs but layer {i - 1} "
                                 f"gives {layers[i - 1].weight.shape[0]}")
        if layers[-1].weight.shape[0] != 2:
            raise ModelError(f"the last layer must have 2 outputs (signal, confidence logits), got "
                             f"{layers[-1].weight.shape[0]}")
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
        object.__setattr__(self, "feature_spec", fs)
        object.__setattr__(self, "meta", dict(self.meta))

    # -------------------------------------------------------------- shapes
    @property
    def dims(self) -> list:
        return [self.layers[0].weight.shape[1]] + [l.weight.shape[0] for l in self.layers]

    @property
    def raw_len(self) -> int:
        return self.feature_spec.raw_len

    def with_feature_spec(self, fs: FeatureSpec) -> "Model":
        return replace(self, feature_spec=fs)

    def with_cache_policy(self, policy: CachePolicy) -> "Model":
        return replace(self, cache_policy=policy)

    # --------------------------------------------------- numpy reference
    def forward(self, features: np.ndarray) -> np.ndarray:
        """MLP output (no head) for features (n_feat,) or (n, n_feat), in float32 numpy."""
        x = np.asarray(features, dtype=np.float32)
        for l in self.layers:
            x = x @ l.weight.T + l.bias
            if l.activation == "relu":
                x = np.maximum(x, 0)
            elif l.activation == "tanh":
                x = np.tanh(x)
            elif l.activation == "sigmoid":
                x = 1.0 / (1.0 + np.exp(-x))
        return x.astype(np.float32)

    @staticmethod
    def head(out: np.ndarray) -> tuple:
        """(signal, confidence) = (tanh(out0), sigmoid(out1))."""
        out = np.asarray(out, dtype=np.float64)
        return np.tanh(out[..., 0]), 1.0 / (1.0 + np.exp(-out[..., 1]))

    # ------------------------------------------------------------ bundle
    def save(self, path: str | os.PathLike) -> None:
        """Write the native bundle (weights + feature spec + cache policy) atomically."""
        arrays: list = []
        for i, l in enumerate(self.layers):
            arrays += [(f"layer{i}.weight", l.weight), (f"layer{i}.bias", l.bias)]
        fs = self.feature_spec
        arrays += [("fs.z_idx", fs.z_idx), ("fs.w_idx", fs.w_idx), ("fs.mean", fs.mean),
                   ("fs.inv_std", fs.inv_std)]
        table, payload, off = [], bytearray(), 0
        for name, a in arrays:
            a = np.ascontiguousarray(a)
            pad = (-off) % 64
            payload += b"\0" * pad
            off += pad
            table.append({"name": name, "dtype": a.dtype.str, "shape": list(a.shape),
                          "offset": off, "nbytes": a.nbytes})
            payload += a.tobytes()
            off += a.nbytes
        pol = self.cache_policy
        header = {
            "format": "fastpath-model", "version": _VERSION,
            "layers": [{"activation": l.activation} for l in self.layers],
            "feature_spec": {"raw_len": fs.raw_len, "window": fs.window,
                             "field_names": list(fs.field_names)},
            "cache_policy": {"enabled": pol.enabled, "cos_threshold": pol.cos_threshold,
                             "norm_tol": pol.norm_tol, "max_age_ns": pol.max_age_ns,
                             "max_run": pol.max_run},
            "meta": self.meta, "arrays": table,
        }
        hb = json.dumps(header, sort_keys=True).encode()
        body = _MAGIC + struct.pack("<II", _VERSION, len(hb)) + hb
        body += b"\0" * ((-len(body)) % 64) + bytes(payload)
        blob = body + struct.pack("<I", zlib.crc32(body)) + _END
        tmp = f"{os.fspath(path)}.tmp{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(blob)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Model":
        """Read a native bundle; any damage is a ModelError naming it, never a partial model."""
        try:
            with open(path, "rb") as f:
                blob = f.read()
        except OSError as exc:
            raise ModelError(f"cannot read model file {os.fspath(path)!r}: {exc.strerror}") from None
        return cls.from_bytes(blob, name=os.fspath(path))

    @classmethod
    def from_bytes(cls, blob: bytes, name: str = "<bytes>") -> "Model":
        n = len(blob)
        minimum = len(_MAGIC) + 8 + 4 + len(_END)
        if n < minimum or blob[:len(_MAGIC)] != _MAGIC:
            if blob[:len(_MAGIC) - 1] == _MAGIC[:-1]:
                raise ModelError(f"{name}: unsupported bundle version byte {blob[7:8]!r}")
            raise ModelError(f"{name} is not a fastpath model bundle (.fpm): bad magic "
                             f"{blob[:8]!r}, expected {_MAGIC!r}")
        if blob[-len(_END):] != _END:
            raise ModelError(f"{name} is truncated or has trailing garbage: no end marker "
                             f"({n} bytes)")
        body, crc = blob[:-len(_END) - 4], struct.unpack("<I", blob[-len(_END) - 4:-len(_END)])[0]
        if zlib.crc32(body) != crc:
            raise ModelError(f"{name} is corrupt: CRC32 mismatch ({zlib.crc32(body):#010x} != "
                             f"{crc:#010x})")
        version, hlen = struct.unpack("<II", body[8:16])
        if version != _VERSION:
            raise ModelError(f"{name}: bundle version {version}, this fastpath reads {_VERSION}")
        try:
            header = json.loads(body[16:16 + hlen].decode())
            start = 16 + hlen + ((-(16 + hlen)) % 64)
            arrays = {}
            for e in header["arrays"]:
                dt = np.dtype(e["dtype"])
                if dt.kind not in "fiu" or dt.hasobject:
                    raise ModelError(f"{name}: array {e['name']} has dtype {dt}")
                shape = tuple(int(s) for s in e["shape"])
                nb = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
                lo = start + int(e["offset"])
                if nb != int(e["nbytes"]) or lo < start or lo + nb > len(body):
                    raise ModelError(f"{name}: array {e['name']} {shape} does not fit the file")
                arrays[e["name"]] = np.frombuffer(body, dt, count=nb // dt.itemsize,
                                                  offset=lo).reshape(shape).copy()
            layers = tuple(Layer(arrays[f"layer{i}.weight"], arrays[f"layer{i}.bias"],
                                 l["activation"]) for i, l in enumerate(header["layers"]))
            f = header["feature_spec"]
            fs = FeatureSpec(f["raw_len"], arrays["fs.z_idx"], arrays["fs.w_idx"], f["window"],
                             arrays["fs.mean"], arrays["fs.inv_std"], tuple(f["field_names"]))
            pol = CachePolicy(**header["cache_policy"])
            return cls(layers, fs, pol, header.get("meta", {}))
        except ModelError as exc:
            raise ModelError(f"{name}: {exc}") from None
        except (KeyError, TypeError, ValueError, UnicodeDecodeError) as exc:
            raise ModelError(f"{name}: malformed bundle header ({type(exc).__name__}: {exc})") from None

    # -------------------------------------------------------------- onnx
    def to_onnx(self, path: str | os.PathLike, opset: int = 17) -> None:
        """Write the MLP (not the feature stage or head) as ONNX: Gemm (transB=1) + activation
        per layer, input "features" [N, n_feat], output "out" [N, 2]. Needs the onnx package."""
        try:
            import onnx
            from onnx import TensorProto, helper, numpy_helper
        except ImportError:
            raise ModelError("writing ONNX needs the onnx package: pip install 'fastpath[onnx]'") from None
        ops = {"relu": "Relu", "tanh": "Tanh", "sigmoid": "Sigmoid"}
        nodes, inits, cur = [], [], "features"
        for i, l in enumerate(self.layers):
            inits += [numpy_helper.from_array(l.weight, f"W{i}"),
                      numpy_helper.from_array(l.bias, f"B{i}")]
            nodes.append(helper.make_node("Gemm", [cur, f"W{i}", f"B{i}"], [f"gemm{i}"], transB=1))
            cur = f"gemm{i}"
            if l.activation in ops:
                nodes.append(helper.make_node(ops[l.activation], [cur], [f"act{i}"]))
                cur = f"act{i}"
        nodes.append(helper.make_node("Identity", [cur], ["out"]))
        g = helper.make_graph(
            nodes, "fastpath_mlp",
            [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", self.dims[0]])],
            [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 2])], inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="fastpath")
        m.ir_version = 8
        onnx.checker.check_model(m)
        onnx.save(m, os.fspath(path))

    @classmethod
    def from_onnx(cls, path: str | os.PathLike) -> "Model":
        """Import an MLP from ONNX (torch.onnx.export or skl2onnx): Gemm, MatMul+Add, Relu, Tanh,
        Sigmoid, Flatten, Identity. Gets the identity feature spec (raw = model input)."""
        from fastpath._onnx import layers_from_onnx
        return cls(layers_from_onnx(path), None, CachePolicy(),
                   {"source": os.path.basename(os.fspath(path))})


def fit_cache_policy(model: "Model", raws: np.ndarray, symbols: np.ndarray, ts_ns: np.ndarray,
                     max_error: float = 0.01, margin: float = 0.5,
                     cos_grid=(0.999, 0.9995, 0.9998, 0.9999, 0.99995, 0.99998, 0.99999,
                               0.999995, 0.999999),
                     norm_grid=(0.02, 0.01, 0.005, 0.002, 0.001)) -> tuple:
    """The cache policy with the highest hit rate whose hits, replayed in shadow against a
    cache-less engine on these ticks, are all within margin * max_error of the fresh signal.
    Returns (CachePolicy, report dict). Guards other than cosine and norm keep the model's."""
    from fastpath._engine import Engine
    budget = max_error * margin
    fresh = Engine(model, config={"cache": {"enabled": False}}).step_batch(raws, symbols, ts_ns)
    best, rows = None, []
    base = model.cache_policy
    for c in cos_grid:
        for t in norm_grid:
            pol = CachePolicy(True, float(c), float(t), base.max_age_ns, base.max_run)
            r = Engine(model.with_cache_policy(pol)).step_batch(raws, symbols, ts_ns)
            err = np.abs(r.signal - fresh.signal)[r.cached]
            mx = float(err.max()) if len(err) else 0.0
            rows.append({"cos_threshold": c, "norm_tol": t, "hit_rate": float(r.cached.mean()),
                         "max_error": mx, "mean_error": float(err.mean()) if len(err) else 0.0})
            if mx <= budget and (best is None or rows[-1]["hit_rate"] > best[1]["hit_rate"]):
                best = (pol, rows[-1])
    if best is None:
        pol = CachePolicy(False, base.cos_threshold, base.norm_tol, base.max_age_ns, base.max_run)
        return pol, {"chosen": None, "budget": budget, "grid": rows,
                     "note": "no policy on the grid kept every hit within the budget: cache off"}
    return best[0], {"chosen": best[1], "budget": budget, "grid": rows}
