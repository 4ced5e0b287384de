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

Input scaler: a model imported from ONNX with a Scaler (or Sub / Div...) in front keeps it
as Model.input_scaler, stored as the arrays "scaler.offset" and "scaler.scale" with
"input_scaler": "after_feature_spec" in the header. The feature spec arrays hold
Model.feature_spec (raw tick -> the model's input), the scaler arrays the scaler the feature
stage runs after it, as the Model keeps them. The key and arrays are written only for a
model that has a scaler: any other model is written byte for byte as before, and bundles
without them (all written before) are read with no scaler, as they ran.

"input_scaler": true marked the layout of a development build that never shipped (the
scaler composed into the spec arrays, which this reader would run with the scaler a second
time): refused, naming the fix (import the ONNX file again). A reader that predates the key
refuses both (unknown header key).

The header's feature_spec, cache_policy, head, weights and meta (with the feature spec's
arrays) are also what Model.to_onnx records in an ONNX file's metadata_props
(fastpath.model.onnx_meta): written by serving_fields / pack_arrays and read by
read_feature_spec / read_head / _policy / build_with_head, here, for both files.

Unknown keys: a header key this reader does not know is refused, and so is an unknown key
inside one of its objects (feature_spec, cache_policy, head, trees, a layer, an array table
entry; _OBJECT_KEYS): a newer writer's addition may change what the model computes.

Cache policy in the header: since the cache is off unless a policy was fitted, the header
records `fitted_max_error` (null when not fitted). Bundles written before that key existed
(still version 1) are read as follows: the policy stays enabled only when the bundle's meta
records a shadow-replay fit ("cache_policy_fit" with max_error and margin, as the demo
bundle's training script wrote it), with fitted_max_error = max_error * margin; any other
enabled policy in such a bundle was the old unfitted default and is read as off. Those fields
are read as written or refused: chosen an object (or null), max_error and margin JSON
numbers (a bool or a string is damage, not 1.0 or float("2")), their product in (0, 2].
"""
from __future__ import annotations

import json
import math
import os
import re
import struct
import threading
import zlib
from dataclasses import replace

import numpy as np

from fastpath.errors import ModelError
from fastpath.model.features import FeatureSpec, InputScaler
from fastpath.model.head import Head
from fastpath.model.layer import Layer
from fastpath.model.model import Model, register_format
from fastpath.model.policy import CachePolicy
from fastpath.model.trees import TreeEnsemble

MAGIC = b"FPMODEL\x01"
END = b"FPEND\x00\x00\x00"
VERSION = 1
# the header's "input_scaler": the feature spec arrays hold the spec before the scaler
SCALER_AFTER_SPEC = "after_feature_spec"


_TREE_ARRAYS = ("tree_offsets", "mode", "feature", "threshold", "true_child", "false_child",
                "nan_true", "weight_node", "weight_target", "weight_value", "base_values")


def to_bytes(model: Model) -> bytes:
    arrays: list = []
    for i, l in enumerate(model.layers):
        arrays += [(f"layer{i}.weight", l.weight), (f"layer{i}.bias", l.bias)]
    t = model.trees
    if t is not None:
        arrays += [(f"trees.{k}", getattr(t, k)) for k in _TREE_ARRAYS]
    arrays += _spec_arrays(model.feature_spec)
    # getattr: a model-like object without the field (written before it existed) has none
    sc = getattr(model, "input_scaler", None)
    if sc is not None:
        arrays += [("scaler.offset", sc.offset), ("scaler.scale", sc.scale)]
    table, payload = pack_arrays(arrays)
    header = {
        "format": "fastpath-model", "version": VERSION,
        "layers": [{"activation": l.activation} for l in model.layers],
        **serving_fields(model),
        "post": model.post,
        **({} if t is None else {"trees": {
            "n_features": t.n_features, "n_targets": t.n_targets, "aggregate": t.aggregate,
            "post_transform": t.post_transform, "classifier": t.classifier}}),
        **({} if sc is None else {"input_scaler": SCALER_AFTER_SPEC}),
        "arrays": table,
    }
    hb = dumps(header)
    body = MAGIC + struct.pack("<II", VERSION, len(hb)) + hb
    body += b"\0" * ((-len(body)) % 64) + bytes(payload)
    return body + struct.pack("<I", zlib.crc32(body)) + END


# The fields that say how a model serves beside its weights: the feature spec (raw tick ->
# the model's input; its arrays are SPEC_ARRAYS), the head, the weight format, the cache
# policy and meta. The bundle's header holds them, and so does the metadata Model.to_onnx
# writes into an ONNX file (fastpath.model.onnx_meta), through these functions: one writer,
# one reader, the same checks.
SPEC_ARRAYS = ("fs.z_idx", "fs.w_idx", "fs.mean", "fs.inv_std")


def _spec_arrays(fs: FeatureSpec) -> list:
    return [("fs.z_idx", fs.z_idx), ("fs.w_idx", fs.w_idx), ("fs.mean", fs.mean),
            ("fs.inv_std", fs.inv_std)]


def serving_fields(model: Model) -> dict:
    """The header's "feature_spec", "cache_policy", "head", "weights" and "meta" of `model`
    (meta checked to be writable as JSON: _check_meta)."""
    try:
        _check_meta(model.meta)
    except RecursionError:
        # a meta that holds itself (meta["self"] = meta) recursed without end
        raise ModelError("cannot write the model: meta holds a reference to itself (or is "
                         "nested too deep for JSON)") from None
    fs, pol = model.feature_spec, model.cache_policy
    return {
        "feature_spec": {"raw_len": fs.raw_len, "window": fs.window,
                         "field_names": list(fs.field_names)},
        "cache_policy": {"enabled": pol.enabled, "cos_threshold": pol.cos_threshold,
                         "norm_tol": pol.norm_tol, "max_age_ns": pol.max_age_ns,
                         "max_run": pol.max_run, "fitted_max_error": pol.fitted_max_error},
        "head": model.head_spec.to_json(), "weights": model.weights, "meta": model.meta,
    }


def pack_arrays(arrays: list) -> tuple:
    """(the array table, the payload) for [(name, array), ...]: each array's bytes at a
    64-byte aligned offset, as _read_arrays reads them back."""
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
    return table, payload


def dumps(header: dict) -> bytes:
    """The header as JSON (sorted keys; numpy values in meta as plain numbers and lists);
    a ModelError naming what JSON cannot hold."""
    try:
        return json.dumps(header, sort_keys=True, default=_json_default).encode()
    except (TypeError, ValueError) as exc:
        raise ModelError(f"cannot write the model: meta must hold JSON values (str keys; "
                         f"numbers, strings, lists, dicts, numpy scalars and arrays): "
                         f"{exc}") from None


_DTYPE = re.compile(r"[<>|=]?[fiu][1248]")
_HEADER_KEYS = frozenset(("format", "version", "layers", "feature_spec", "cache_policy", "post",
                          "head", "weights", "trees", "input_scaler", "meta", "arrays"))


# the keys of each object inside the header, as every version has written them: a key this
# reader does not know is refused there too, as at the top level (a newer writer's
# "head": {..., "clip": 0.5} or an array's "encoding" was dropped in silence, and the model
# served without it)
_OBJECT_KEYS = {
    "layers[]": frozenset(("activation",)),
    "arrays[]": frozenset(("name", "dtype", "shape", "offset", "nbytes")),
    "feature_spec": frozenset(("raw_len", "window", "field_names")),
    "cache_policy": frozenset(("enabled", "cos_threshold", "norm_tol", "max_age_ns", "max_run",
                               "fitted_max_error")),
    "head": frozenset(("kind", "scale", "outputs")),
    "trees": frozenset(("n_features", "n_targets", "aggregate", "post_transform", "classifier")),
}


def _known(obj: dict, kind: str, what: str | None = None) -> dict:
    """obj, a header object, when it holds only keys this reader knows; a ModelError naming
    the others."""
    extra = sorted(set(obj) - _OBJECT_KEYS[kind])
    if extra:
        raise ModelError(f"unknown key(s) {extra} in {what or kind}; this fastpath reads "
                         f"{sorted(_OBJECT_KEYS[kind])} there (a bundle from a newer fastpath?)")
    return obj


def _expected_arrays(header: dict) -> list:
    """The array names the header's model needs, no more and no fewer."""
    layers = header["layers"]
    if not isinstance(layers, list) or not all(isinstance(l, dict) for l in layers):
        # a dict or a string has a len() too: {} read as no layers, "ab" as two
        raise ModelError(f"layers must be a JSON list of objects ({{\"activation\": ...}} per "
                         f"layer; empty for a tree ensemble), got {layers!r:.60}")
    for i, l in enumerate(layers):
        _known(l, "layers[]", f"layers[{i}]")
    names = [f"layer{i}.{k}" for i in range(len(layers)) for k in ("weight", "bias")]
    if _obj(header.get("trees"), "trees", optional=True) is not None:
        names += [f"trees.{k}" for k in _TREE_ARRAYS]
    names += list(SPEC_ARRAYS)
    sj = header.get("input_scaler")
    # the layout is checked before the arrays are: a damaged value (false, 0) on a bundle
    # without scaler arrays was "missing arrays ['scaler.offset', ...]", not its name
    if sj is True:
        raise ModelError("input_scaler true: the layout of a development build that never "
                         "shipped (its feature spec holds the scaler too, which would run "
                         "twice); import the model's ONNX file again and save it")
    if sj is not None and sj != SCALER_AFTER_SPEC:
        raise ModelError(f"input_scaler must be {SCALER_AFTER_SPEC!r} (or absent), got {sj!r}")
    if sj is not None:
        names += ["scaler.offset", "scaler.scale"]
    return names


def _int(v, what: str) -> int:
    # a JSON float, bool or string where a count or offset belongs is damage, not a value to
    # round: int(1.5) and int(True) would read other bytes than the writer meant
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ModelError(f"{what} must be an integer >= 0, got {v!r}")
    return v


def _obj(v, what: str, optional: bool = False):
    """A header value that must be a JSON object (None too where optional): a list or string
    there was an AttributeError / TypeError about .get or indices, not the field's name."""
    if not isinstance(v, dict) and not (optional and v is None):
        raise ModelError(f"{what} must be a JSON object{' (or absent)' if optional else ''}, "
                         f"got {type(v).__name__} {v!r:.60}")
    return v


def _real(v, what: str) -> float:
    """A JSON number read as a float: a bool (float(True) is 1.0) or a string (float('2') is
    2.0) where a number belongs is damage, not a value to convert."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ModelError(f"{what} must be a number, got {type(v).__name__} {v!r:.60}")
    try:
        return float(v)
    except OverflowError:
        raise ModelError(f"{what} must be a number float holds, got an int of "
                         f"{len(str(abs(v)))} digits") from None


def _read_arrays(table, body: bytes, start: int) -> dict:
    """The arrays of the table, each checked to lie inside the payload, 64-byte aligned, after
    the one before it (as to_bytes writes them): an edited offset that points into another
    array, or a shape that does not match its bytes, is refused, never read."""
    if not isinstance(table, list):
        raise ModelError(f"the array table must be a JSON list, got {type(table).__name__}")
    arrays: dict = {}
    end = 0
    for e in table:
        if not isinstance(e, dict) or not isinstance(e.get("name"), str):
            raise ModelError(f"array table entry {e!r} is not an object with a name")
        nm = e["name"]
        _known(e, "arrays[]", f"the array table entry of {nm}")
        if nm in arrays:
            raise ModelError(f"array {nm} is listed twice")
        # only the plain numeric types to_bytes writes: np.dtype parses anything else (record
        # and comma strings through ast) and raises what it likes on a damaged one
        if not isinstance(e.get("dtype"), str) or not _DTYPE.fullmatch(e["dtype"]):
            raise ModelError(f"array {nm} has dtype {e.get('dtype')!r}, expected a numeric type "
                             f"string such as '<f4' or '<i4'")
        dt = np.dtype(e["dtype"])
        shape = e["shape"]
        if not isinstance(shape, list):
            raise ModelError(f"array {nm} shape must be a list, got {shape!r}")
        shape = tuple(_int(s, f"array {nm} shape") for s in shape)
        nb = math.prod(shape) * dt.itemsize
        off = _int(e["offset"], f"array {nm} offset")
        if nb != _int(e["nbytes"], f"array {nm} nbytes") or start + off + nb > len(body):
            raise ModelError(f"array {nm} {shape} {dt} does not fit the file")
        if off % 64 or off < end:
            raise ModelError(f"array {nm} offset {off} is not 64-byte aligned after the array "
                             f"before it (which ends at {end}): arrays must not overlap")
        end = off + nb
        arrays[nm] = np.frombuffer(body, dt, count=nb // dt.itemsize,
                                   offset=start + off).reshape(shape).copy()
    return arrays


def _json_default(o):
    # numpy scalars and arrays (a fit's metrics, a training date's pieces) are written as
    # the plain numbers and lists they hold; anything else is refused by json.dumps
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


# how deep meta's lists and dicts may nest: the reader's json.loads recurses once a level on
# the caller's stack, so a meta nested ~990 deep was written (from a shallow stack) and then
# refused as "malformed bundle header (RecursionError)" by a load five frames deeper (a
# server's handler, a test): a bundle that saved and never loaded back
MAX_META_DEPTH = 100


def _check_meta(meta, path: str = "meta", depth: int = 0) -> None:
    """JSON turns a non-string key into a string: the model read back would not have the meta
    it was saved with, so such a key is refused by name instead. Nesting past MAX_META_DEPTH
    (a meta that holds itself too) is refused: a reader on a deeper stack could not read it."""
    if isinstance(meta, (dict, list, tuple)) and depth >= MAX_META_DEPTH:
        raise ModelError(f"cannot write the model: meta holds a reference to itself or is "
                         f"nested more than {MAX_META_DEPTH} lists / dicts deep (at {path[:80]}"
                         f"{'...' if len(path) > 80 else ''}); a bundle reader could not read "
                         f"it back on every call stack")
    if isinstance(meta, dict):
        for k, v in meta.items():
            if not isinstance(k, str):
                raise ModelError(f"cannot write the model: {path} key {k!r} is a "
                                 f"{type(k).__name__}; JSON keys are strings")
            _check_meta(v, f"{path}[{k!r}]", depth + 1)
    elif isinstance(meta, (list, tuple)):
        for i, v in enumerate(meta):
            _check_meta(v, f"{path}[{i}]", depth + 1)


def _path(path, what: str) -> str:
    # open(None) is a TypeError, and open(3) reads file descriptor 3: a path is a str or
    # os.PathLike (bytes too, as open takes them)
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise ModelError(f"{what} takes a file path (str or os.PathLike), got "
                         f"{type(path).__name__} {path!r}")
    if isinstance(path, bytes) and path.startswith(MAGIC[:-1]):
        # a bundle's bytes (Model.to_bytes, a blob from a store) handed over as the model:
        # open() said "embedded null byte", a ValueError naming nothing
        raise ModelError(f"{what} takes a file path, got the bytes of a fastpath bundle "
                         f"({len(path)} bytes); read them with Model.from_bytes(blob)")
    name = os.fsdecode(path)
    if "\0" in name:
        raise ModelError(f"{what}: the path {name[:60]!r} holds a NUL character; a file path "
                         f"cannot (bytes of a file to read? Model.from_bytes takes a bundle's)")
    return name


def save(model: Model, path: str | os.PathLike) -> None:
    """Write the bundle atomically (a temp file renamed over `path`)."""
    path = _path(path, "Model.save")
    if os.fspath(path).lower().endswith(".onnx"):
        # Engine(path) and fastpath.load read a path by its suffix: a bundle named .onnx
        # would be handed to the ONNX reader and never load
        raise ModelError(f"Model.save writes a fastpath bundle (.fpm), not ONNX: name it .fpm, "
                         f"or write ONNX with Model.to_onnx({os.fspath(path)!r})")
    if os.path.isdir(path):
        raise ModelError(f"Model.save: {os.fspath(path)!r} is a directory; give the bundle's file "
                         f"name (e.g. {os.path.join(os.fspath(path), 'model.fpm')!r})")
    blob = to_bytes(model)
    # the thread too: two threads saving one path shared a temp file, and the bundle renamed
    # into place could be a mix of both writes (the second rename then FileNotFoundError)
    tmp = f"{os.fspath(path)}.tmp{os.getpid()}.{threading.get_ident()}"
    try:
        with open(tmp, "wb") as f:
            f.write(blob)
        os.replace(tmp, path)
    except BaseException as exc:
        # a failed write (disk full, a directory at `path`) leaves no half file beside it
        try:
            os.unlink(tmp)
        except OSError:
            pass
        named = _named(exc, path) if isinstance(exc, OSError) else exc
        if named is not exc:
            raise named from None
        raise


def _named(exc: OSError, dest: str) -> OSError:
    """An OSError about the folder of the temp file a write goes through (dest + ".tmp..."):
    one that does not exist, is not a folder or cannot be written, as the same error about
    `dest` (the message named a file the caller never gave). Same type, errno and reason; any
    other error (a stale temp file: FileExistsError) is returned as it is."""
    f = exc.filename
    if not isinstance(exc, (FileNotFoundError, NotADirectoryError, PermissionError)) or \
            not (isinstance(f, str) and f.startswith(dest + ".tmp")):
        return exc
    return OSError(exc.errno, exc.strerror, dest)


def load(path: str | os.PathLike, head: Head | None = None) -> Model:
    path = _path(path, "Model.load")
    try:
        with open(path, "rb") as f:
            # the magic first: a wrong file handed over by mistake (a multi-GB tick dump) is
            # named as such, not read whole into memory (a MemoryError, or minutes of I/O)
            start = f.read(len(MAGIC))
            # a file shorter than the magic but its start (a bundle cut short) goes on to
            # from_bytes, which calls it truncated, not a file of another kind
            if not start or start[:len(MAGIC) - 1] != MAGIC[:min(len(start), len(MAGIC) - 1)]:
                # an ONNX file opens with its ir_version field (protobuf tag 0x08): a model
                # named otherwise (model.bin) was read as a bundle, by its suffix
                # (Model.load reads bundles only: a file already named .onnx is told to use
                # from_onnx, not to take the name it has)
                onnx_name = os.fsdecode(path).lower().endswith(".onnx")
                hint = ("" if start[:1] != b"\x08" else
                        "; it is named .onnx: read it with Model.from_onnx (Engine(path) "
                        "reads a .onnx file by its name)" if onnx_name else
                        "; it looks like an ONNX file: name it .onnx or read it with "
                        "Model.from_onnx")
                raise ModelError(f"{os.fspath(path)} is not a fastpath model bundle (.fpm): bad "
                                 f"magic {start!r}, expected {MAGIC!r}{hint}")
            blob = start + f.read()
    except OSError as exc:
        raise ModelError(f"cannot read model file {os.fspath(path)!r}: {exc.strerror}") from None
    return from_bytes(blob, name=os.fspath(path), head=head)


def _policy(p: dict, meta: dict) -> CachePolicy:
    if not isinstance(p, dict):
        raise ModelError(f"cache_policy must be a JSON object, got {p!r}")
    p = dict(_known(p, "cache_policy"))
    if "fitted_max_error" not in p:         # written before fits were recorded
        # a meta of another type is refused by Model, with its name
        fit = meta.get("cache_policy_fit") if isinstance(meta, dict) else None
        fitted = None
        if isinstance(fit, dict) and fit.get("chosen") is not None:
            # the fields that switch the cache on are read as the training script wrote them
            # (chosen: the policy, an object; max_error and margin: numbers) or refused: a
            # JSON true read as 1.0 was a fitted max error of 1.0, a margin "2" doubled it,
            # a chosen "no" kept the cache on
            what = "meta.cache_policy_fit"
            if not isinstance(fit["chosen"], dict):
                raise ModelError(f"{what}.chosen must be the chosen policy (a JSON object) or "
                                 f"null, got {type(fit['chosen']).__name__} "
                                 f"{fit['chosen']!r:.60}")
            if fit["chosen"] and fit.get("max_error") is not None:
                e, m = _real(fit["max_error"], f"{what}.max_error"), \
                    _real(fit.get("margin", 1.0), f"{what}.margin")
                fitted = e * m
                if not 0.0 < fitted <= 2.0:     # NaN too
                    raise ModelError(f"{what}: max_error {e!r} x margin {m!r} = {fitted!r} is "
                                     f"not a signal error in (0, 2]")
        if fitted is None:
            p["enabled"] = False
        p["fitted_max_error"] = fitted
    return CachePolicy(**p)


def read_feature_spec(f, arrays: dict) -> FeatureSpec:
    """The header's "feature_spec" object with its arrays (SPEC_ARRAYS, from _read_arrays)."""
    f = _known(_obj(f, "feature_spec"), "feature_spec")
    # checked here, not only by FeatureSpec: a spec without windows ignores its window, so a
    # damaged one (a string, true) was read as 1 in silence
    _int(f["window"], "feature_spec.window")
    names = f["field_names"]
    if not isinstance(names, list) or not all(isinstance(x, str) for x in names):
        raise ModelError(f"feature_spec.field_names must be a list of strings, got {names!r}")
    return FeatureSpec(f["raw_len"], arrays["fs.z_idx"], arrays["fs.w_idx"], f["window"],
                       arrays["fs.mean"], arrays["fs.inv_std"], tuple(names))


def read_head(h, optional: bool = False) -> Head | None:
    """The header's "head" object as a Head (None when absent and optional)."""
    h = _obj(h, "head", optional=optional)
    if h is None:
        return None
    _known(h, "head")
    if not isinstance(h.get("outputs"), list):
        raise ModelError(f"head.outputs must be a list of output indices, got "
                         f"{h.get('outputs')!r}")
    return Head(h["kind"], h["scale"], tuple(h["outputs"]))


def build_with_head(build, stored: Head | None, policy: CachePolicy, meta,
                    head: Head | None) -> Model:
    """build(head, policy, meta), the model a file describes, with `head` (given by the
    caller) in place of the stored one: as Model.with_head, a fitted cache policy (and its
    fit report) dropped when the head differs; a stored head its outputs cannot take (a
    classifier head over margins, written before those were refused) is not built at all."""
    if head is None:
        return build(stored, policy, meta)
    if not isinstance(head, Head):
        raise ModelError(f"head must be a fastpath.model.Head, got {type(head).__name__}")
    try:
        model = build(stored, policy, meta)
    except ModelError:
        # a stored head its outputs cannot take: the model only with the head given, the
        # policy fitted with the stored one dropped (as with_head drops it)
        if policy.fitted:
            policy = replace(policy, enabled=False, fitted_max_error=None)
        if isinstance(meta, dict):
            meta = {k: v for k, v in meta.items() if k != "cache_policy_fit"}
        return build(head, policy, meta)
    return model.with_head(head)


def from_bytes(blob: bytes, name: str = "<bytes>", head: Head | None = None) -> Model:
    """The bundle's model; head: this head in place of the bundle's (as Model.with_head, a
    fitted cache policy dropped when it differs), the only way to read a bundle whose stored
    head its outputs cannot take (a classifier head over margins, written before those were
    refused)."""
    if isinstance(blob, (str, os.PathLike)):
        # a path handed to from_bytes was read as bytes: "bad magic 'fastpath'"
        raise ModelError(f"Model.from_bytes takes the bundle's bytes, got the "
                         f"{type(blob).__name__} {os.fspath(blob)!r}; read a file with "
                         f"Model.load(path)")
    try:
        # a memoryview (of a mapped file, a shared buffer) has no .decode: its header was
        # "malformed (AttributeError)"; an int is not bytes (bytes(n) would allocate n zeros)
        if isinstance(blob, (int, np.integer)):
            raise TypeError
        blob = bytes(blob)
    except TypeError:
        raise ModelError(f"Model.from_bytes takes bytes (or a bytearray / memoryview), got "
                         f"{type(blob).__name__}") from None
    n = len(blob)
    minimum = len(MAGIC) + 8 + 4 + len(END)
    if n < minimum or blob[:len(MAGIC)] != MAGIC:
        if n >= len(MAGIC) and blob[:len(MAGIC) - 1] == MAGIC[:-1] and blob[:len(MAGIC)] != MAGIC:
            raise ModelError(f"{name}: unsupported bundle version byte {blob[7:8]!r}")
        if blob[:min(n, len(MAGIC))] == MAGIC[:min(n, len(MAGIC))] and n:
            # the start of a bundle, cut short: "unsupported version byte b''" (or b'\x01',
            # this reader's own) sent the reader looking for a newer fastpath
            raise ModelError(f"{name} is truncated: {n} bytes, a bundle has at least {minimum}")
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
    if 16 + hlen > len(body):
        # the slice below would stop at the end of the body and the JSON parser then report
        # a decode error about the array bytes it was handed
        raise ModelError(f"{name}: the header length field says {hlen} bytes, but only "
                         f"{len(body) - 16} follow it: the length is damaged")
    try:
        header = json.loads(body[16:16 + hlen].decode())
        if not isinstance(header, dict):
            raise ModelError(f"the header is a JSON {type(header).__name__}, expected an object")
        # a key this reader does not know may change what the model computes: refuse it
        # rather than serve the model without it (a new meaning comes with a new version)
        extra = sorted(set(header) - _HEADER_KEYS)
        if extra:
            raise ModelError(f"unknown header key(s) {extra}; this fastpath reads "
                             f"{sorted(_HEADER_KEYS)} (a bundle from a newer fastpath?)")
        hv = header.get("version", VERSION)
        if header.get("format", "fastpath-model") != "fastpath-model" or \
                isinstance(hv, bool) or not isinstance(hv, int) or hv != VERSION:
            raise ModelError(f"the header says format {header.get('format')!r} version "
                             f"{header.get('version')!r}, expected 'fastpath-model' version "
                             f"{VERSION}")
        start = 16 + hlen + ((-(16 + hlen)) % 64)
        arrays = _read_arrays(header["arrays"], body, start)
        want = set(_expected_arrays(header))
        if set(arrays) != want:
            extra, missing = sorted(set(arrays) - want), sorted(want - set(arrays))
            raise ModelError(f"the array table does not match the model it describes"
                             f"{f': unknown arrays {extra}' if extra else ''}"
                             f"{f': missing arrays {missing}' if missing else ''}")
        layers = tuple(Layer(arrays[f"layer{i}.weight"], arrays[f"layer{i}.bias"],
                             l["activation"]) for i, l in enumerate(header["layers"]))
        fs = read_feature_spec(header["feature_spec"], arrays)
        meta = header.get("meta", {})
        # bundles written before heads were stored have two outputs and no "post" / "head":
        # the defaults (no post transform, tanh / sigmoid) are what they always ran with
        stored = read_head(header.get("head"), optional=True)
        trees = None
        tj = _obj(header.get("trees"), "trees", optional=True)
        if tj is not None:
            _known(tj, "trees")
            if not isinstance(tj.get("classifier"), bool):
                # bool("false") is True: a damaged flag would switch the finishing rules
                raise ModelError(f"trees.classifier must be true or false, got "
                                 f"{tj.get('classifier')!r}")
            trees = TreeEnsemble(_int(tj["n_features"], "trees.n_features"),
                                 _int(tj["n_targets"], "trees.n_targets"),
                                 *[arrays[f"trees.{k}"] for k in _TREE_ARRAYS[:10]],
                                 arrays["trees.base_values"], tj["aggregate"],
                                 tj["post_transform"], tj["classifier"])
        sj = header.get("input_scaler")      # its value checked by _expected_arrays
        scaler = None if sj is None else InputScaler(arrays["scaler.offset"],
                                                     arrays["scaler.scale"])
        policy = _policy(header["cache_policy"], meta)

        def build(h: Head | None, pol: CachePolicy, meta: dict) -> Model:
            # bundles written before weight formats existed ran fp32
            return Model(layers, fs, pol, meta, header.get("post", "none"), h,
                         weights=header.get("weights", "fp32"), trees=trees,
                         input_scaler=scaler)
        return build_with_head(build, stored, policy, meta, head)
    except ModelError as exc:
        raise ModelError(f"{name}: {exc}") from None
    except (KeyError, TypeError, ValueError, UnicodeDecodeError, AttributeError, OverflowError,
            RecursionError) as exc:
        raise ModelError(f"{name}: malformed bundle header ({type(exc).__name__}: {exc})") from None


register_format(save=save, to_bytes=to_bytes, load=load, from_bytes=from_bytes)
