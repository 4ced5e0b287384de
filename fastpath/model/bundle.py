"""The native model bundle (.fpm): one file holding the weights, the feature spec and the
cache policy, with enough structure that truncation and corruption are caught before a
single weight is used.

Layout: a magic, the format version and a JSON header describing every array, the arrays
(64-byte aligned offsets), then a CRC32 of everything before it and an end marker.

A tree ensemble (fastpath.model.trees) is stored as its arrays ("trees.<name>") with
"trees" in the header (n_features, n_targets, aggregate, post_transform, classifier); such a
bundle has no layers.

Output transform and head in the header: "post" (none / softmax / logistic2) and "head"
(kind, scale, outputs); a bundle without them is read with no post transform and the default
head for its outputs (two outputs: tanh / sigmoid, what every such bundle was written for).

Cache policy in the header: since the cache is off unless a policy was fitted, the header
records `fitted_max_error` (null when not fitted). Bundles written before that key existed
(still version 1) are read as follows: the policy stays enabled only when the bundle's meta
records a shadow-replay fit ("cache_policy_fit" with max_error and margin, as the demo
bundle's training script wrote it), with fitted_max_error = max_error * margin; any other
enabled policy in such a bundle was the old unfitted default and is read as off.
"""
from __future__ import annotations

import json
import os
import struct
import zlib

import numpy as np

from fastpath.errors import ModelError
from fastpath.model.types import CachePolicy, FeatureSpec, Head, Layer, Model

MAGIC = b"FPMODEL\x01"
END = b"FPEND\x00\x00\x00"
VERSION = 1


_TREE_ARRAYS = ("tree_offsets", "mode", "feature", "threshold", "true_child", "false_child",
                "nan_true", "weight_node", "weight_target", "weight_value", "base_values")


def to_bytes(model: Model) -> bytes:
    arrays: list = []
    for i, l in enumerate(model.layers):
        arrays += [(f"layer{i}.weight", l.weight), (f"layer{i}.bias", l.bias)]
    t = model.trees
    if t is not None:
        arrays += [(f"trees.{k}", getattr(t, k)) for k in _TREE_ARRAYS]
    fs = model.feature_spec
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
    pol = model.cache_policy
    header = {
        "format": "fastpath-model", "version": VERSION,
        "layers": [{"activation": l.activation} for l in model.layers],
        "feature_spec": {"raw_len": fs.raw_len, "window": fs.window,
                         "field_names": list(fs.field_names)},
        "cache_policy": {"enabled": pol.enabled, "cos_threshold": pol.cos_threshold,
                         "norm_tol": pol.norm_tol, "max_age_ns": pol.max_age_ns,
                         "max_run": pol.max_run, "fitted_max_error": pol.fitted_max_error},
        "post": model.post, "head": model.head_spec.to_json(), "weights": model.weights,
        **({} if t is None else {"trees": {
            "n_features": t.n_features, "n_targets": t.n_targets, "aggregate": t.aggregate,
            "post_transform": t.post_transform, "classifier": t.classifier}}),
        "meta": model.meta, "arrays": table,
    }
    hb = json.dumps(header, sort_keys=True).encode()
    body = MAGIC + struct.pack("<II", VERSION, len(hb)) + hb
    body += b"\0" * ((-len(body)) % 64) + bytes(payload)
    return body + struct.pack("<I", zlib.crc32(body)) + END


def save(model: Model, path: str | os.PathLike) -> None:
    """Write the bundle atomically (a temp file renamed over `path`)."""
    blob = to_bytes(model)
    tmp = f"{os.fspath(path)}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(blob)
    os.replace(tmp, path)


def load(path: str | os.PathLike) -> Model:
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError as exc:
        raise ModelError(f"cannot read model file {os.fspath(path)!r}: {exc.strerror}") from None
    return from_bytes(blob, name=os.fspath(path))


def _policy(p: dict, meta: dict) -> CachePolicy:
    p = dict(p)
    if "fitted_max_error" not in p:         # written before fits were recorded
        fit = meta.get("cache_policy_fit")
        fitted = None
        if isinstance(fit, dict) and fit.get("chosen") and isinstance(fit.get("max_error"), (int, float)):
            fitted = float(fit["max_error"]) * float(fit.get("margin", 1.0))
        if fitted is None:
            p["enabled"] = False
        p["fitted_max_error"] = fitted
    return CachePolicy(**p)


def from_bytes(blob: bytes, name: str = "<bytes>") -> Model:
    n = len(blob)
    minimum = len(MAGIC) + 8 + 4 + len(END)
    if n < minimum or blob[:len(MAGIC)] != MAGIC:
        if blob[:len(MAGIC) - 1] == MAGIC[:-1]:
            raise ModelError(f"{name}: unsupported bundle version byte {blob[7:8]!r}")
        raise ModelError(f"{name} is not a fastpath model bundle (.fpm): bad magic "
                         f"{blob[:8]!r}, expected {MAGIC!r}")
    if blob[-len(END):] != END:
        raise ModelError(f"{name} is truncated or has trailing garbage: no end marker "
                         f"({n} bytes)")
    body, crc = blob[:-len(END) - 4], struct.unpack("<I", blob[-len(END) - 4:-len(END)])[0]
    if zlib.crc32(body) != crc:
        raise ModelError(f"{name} is corrupt: CRC32 mismatch ({zlib.crc32(body):#010x} != "
                         f"{crc:#010x})")
    version, hlen = struct.unpack("<II", body[8:16])
    if version != VERSION:
        raise ModelError(f"{name}: bundle version {version}, this fastpath reads {VERSION}")
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
        meta = header.get("meta", {})
        # bundles written before heads were stored have two outputs and no "post" / "head":
        # the defaults (no post transform, tanh / sigmoid) are what they always ran with
        h = header.get("head")
        head = None if h is None else Head(h["kind"], h["scale"], tuple(h["outputs"]))
        trees = None
        tj = header.get("trees")
        if tj is not None:
            from fastpath.model.trees import TreeEnsemble
            trees = TreeEnsemble(int(tj["n_features"]), int(tj["n_targets"]),
                                 *[arrays[f"trees.{k}"] for k in _TREE_ARRAYS[:10]],
                                 arrays["trees.base_values"], str(tj["aggregate"]),
                                 str(tj["post_transform"]), bool(tj["classifier"]))
        # bundles written before weight formats existed ran fp32
        return Model(layers, fs, _policy(header["cache_policy"], meta), meta,
                     header.get("post", "none"), head, weights=header.get("weights", "fp32"),
                     trees=trees)
    except ModelError as exc:
        raise ModelError(f"{name}: {exc}") from None
    except (KeyError, TypeError, ValueError, UnicodeDecodeError, AttributeError) as exc:
        raise ModelError(f"{name}: malformed bundle header ({type(exc).__name__}: {exc})") from None
