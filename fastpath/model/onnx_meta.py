"""fastpath's own record in an ONNX file: what the graph does not hold but the engine needs
to serve the same signals (the feature spec, the head, the weight format, the cache policy
and meta), written by Model.to_onnx into the file's metadata_props under KEY and read back by
Model.from_onnx. Without it a calibrated model served from its .onnx read raw ticks through
the identity spec, with the default head and fp32: other signals, and no error.

One decision shapes it: the record is the bundle's header, not a second format. Its fields
are written and read by the bundle's own functions (fastpath.model.bundle: serving_fields,
pack_arrays, _read_arrays, read_feature_spec, read_head, _policy, build_with_head), so a
field is checked the same way in either file. The JSON under KEY:

  {"format": "fastpath-onnx-meta", "version": 1,
   "feature_spec", "cache_policy", "head", "weights", "meta": as in the bundle's header,
   "arrays": the bundle's array table for fs.z_idx, fs.w_idx ('<i4'), fs.mean, fs.inv_std
             ('<f4'), "data": base64 of their bytes (so they come back bit for bit),
   "graph_sha256": the digest of the graph's model as fastpath wrote it (graph_digest)}

Every key is required and no other is read: a missing or unknown key, a wrong type, a
damaged array or a spec that does not make the graph's input width is a ModelError naming
the file, never a model that serves otherwise. onnxruntime ignores metadata_props.

The digest covers what the graph computes (layers: weights, biases, activations; the post
transform; the input scaler). When it does not match, the file's graph was changed after
fastpath wrote it (edited, retrained and written back by another tool): a fitted cache
policy's error budget was measured on the other model, so the cache is read as off (its fit
report dropped, as with_weights drops it) and a UserWarning names the file; the spec, head
and weights, which describe the graph's input and outputs, are kept.

The record's own text has a digest beside it, under SUM_KEY: the sha256 of the text's UTF-8
bytes. A record damaged in a way that stays valid (a digit of cos_threshold or of a z-score
mean changed) read as that value: a looser cache or other features, the same silent wrong
signal the record exists to prevent. A digest that does not match, or one without its record,
is a ModelError naming the file. A record without a digest (written before it existed) is read
as before."""
from __future__ import annotations

import base64
import binascii
import hashlib
import json
import warnings
from dataclasses import replace

import numpy as np

from fastpath.errors import ModelError
from fastpath.model import bundle as b
from fastpath.model.bundle import (_OBJECT_KEYS, SPEC_ARRAYS, _obj, _read_arrays, _spec_arrays,
                                   dumps, pack_arrays, serving_fields)

KEY = "fastpath.model"
SUM_KEY = "fastpath.model.sha256"
FORMAT = "fastpath-onnx-meta"
VERSION = 1
_KEYS = frozenset(("format", "version", "feature_spec", "cache_policy", "head", "weights",
                   "meta", "arrays", "data", "graph_sha256"))
# the dtypes the writer gives each array (little-endian whatever the host): read as written
# or refused, as everything else in the record
_DTYPES = {"fs.z_idx": "<i4", "fs.w_idx": "<i4", "fs.mean": "<f4", "fs.inv_std": "<f4"}


def graph_digest(layers, post: str, scaler) -> str:
    """sha256 of what the graph computes: each layer's activation, shape and float32 weights
    and bias, the post transform, the input scaler's offset and scale (little-endian)."""
    h = hashlib.sha256()
    shape = {"post": post, "scaler": None if scaler is None else scaler.n,
             "layers": [[l.activation, list(l.weight.shape)] for l in layers]}
    h.update(json.dumps(shape, sort_keys=True).encode())
    arrays = [a for l in layers for a in (l.weight, l.bias)]
    if scaler is not None:
        arrays += [scaler.offset, scaler.scale]
    for a in arrays:
        h.update(np.ascontiguousarray(a, dtype="<f4").tobytes())
    return h.hexdigest()


def to_text(model) -> str:
    """The record of `model` (an MLP) as the JSON string to_onnx stores under KEY."""
    arrays = [(k, np.ascontiguousarray(a, dtype=_DTYPES[k]))
              for k, a in _spec_arrays(model.feature_spec)]
    table, payload = pack_arrays(arrays)
    record = {"format": FORMAT, "version": VERSION, **serving_fields(model),
              "arrays": table, "data": base64.b64encode(bytes(payload)).decode("ascii"),
              "graph_sha256": graph_digest(model.layers, model.post, model.input_scaler)}
    return dumps(record).decode("utf-8")


def text_digest(text: str) -> str:
    """What to_onnx stores under SUM_KEY for the record `text`."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def props(text: str) -> dict:
    """The metadata_props entries to_onnx writes for the record `text`."""
    return {KEY: text, SUM_KEY: text_digest(text)}


def find(props, name: str):
    """The record's text among the file's metadata_props ((key, value) pairs), checked
    against its digest when the file holds one, or None when the file has no record
    (another exporter's, or fastpath's before the record existed)."""
    props = list(props)
    found = {}
    for key in (KEY, SUM_KEY):
        vals = [v for k, v in props if k == key]
        if len(vals) > 1:
            raise ModelError(f"{name}: metadata_props holds {key!r} {len(vals)} times; "
                             f"fastpath writes it once (which one describes the model the "
                             f"file does not say)")
        found[key] = vals[0] if vals else None
    text, digest = found[KEY], found[SUM_KEY]
    if digest is None:
        return text
    if text is None:
        raise ModelError(f"{name}: metadata_props holds the digest of fastpath's record "
                         f"({SUM_KEY!r}) but not the record ({KEY!r}) it was written with: "
                         f"the record was removed since Model.to_onnx wrote the file, and "
                         f"with it the feature spec, head and cache policy the model serves "
                         f"with; write the file again with Model.to_onnx, or remove both "
                         f"entries to read the graph alone")
    if text_digest(text) != digest:
        raise ModelError(f"{name}: fastpath's record in its metadata_props ({KEY!r}) does "
                         f"not match its sha256 ({SUM_KEY!r}): the record was damaged or "
                         f"edited after Model.to_onnx wrote it, and a changed value there "
                         f"(a cache threshold, a z-score mean) would serve other signals "
                         f"without an error; write the file again from the model with "
                         f"Model.to_onnx")
    return text


def restore(text: str, name: str, layers, post: str, scaler, head, build):
    """The model the record describes: build(feature_spec, head, cache_policy, weights, meta)
    with the record's fields, `head` (when given) in place of the stored one as
    bundle.build_with_head does it. layers / post / scaler: the graph's, for the digest."""
    what = f"{name}: the fastpath record in its metadata_props ({KEY!r}, written by " \
           f"Model.to_onnx)"
    try:
        rec = _parse(text)
        fs = b.read_feature_spec(_complete(rec["feature_spec"], "feature_spec"),
                                 _arrays(rec["arrays"], rec["data"]))
        stored = b.read_head(_complete(rec["head"], "head"))
        meta = rec["meta"]
        if not isinstance(meta, dict):
            raise ModelError(f"meta must be a JSON object, got {type(meta).__name__}")
        policy = b._policy(_complete(rec["cache_policy"], "cache_policy"), meta)
        weights = rec["weights"]
        if not isinstance(weights, str):
            raise ModelError(f"weights must be a string, got {type(weights).__name__} "
                             f"{weights!r:.40}")
        digest = rec["graph_sha256"]
        if not isinstance(digest, str) or len(digest) != 64 or \
                digest.strip("0123456789abcdef"):
            raise ModelError(f"graph_sha256 must be 64 lowercase hex digits, got {digest!r:.80}")
    except ModelError as exc:
        raise ModelError(f"{what}: {exc}") from None
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError,
            RecursionError) as exc:
        raise ModelError(f"{what} is malformed ({type(exc).__name__}: {exc})") from None
    if digest != graph_digest(layers, post, scaler):
        if policy.enabled or policy.fitted:
            warnings.warn(
                f"{name}: its graph is not the one Model.to_onnx wrote (the weights' digest "
                f"differs: edited or retrained since); the cache policy recorded with it was "
                f"fitted to the other model, so the cache is read as off (fit a policy for "
                f"this one with fit_cache_policy); the feature spec, head and weights are "
                f"kept", UserWarning, stacklevel=3)
        policy = replace(policy, enabled=False, fitted_max_error=None)
        meta = {k: v for k, v in meta.items() if k != "cache_policy_fit"}

    def make(h, pol, m):
        # the record's fields on the graph: a refusal here is the record's (or, built with
        # the head given because the stored one does not fit, the record's too)
        try:
            return build(fs, h, pol, weights, m)
        except ModelError as exc:
            raise _Misfit(str(exc)) from None

    try:
        return b.build_with_head(make, stored, policy, meta, head)
    except _Misfit as exc:
        raise ModelError(f"{what} does not fit its graph: {exc}") from None
    except ModelError as exc:
        # the caller's head= (not a Head, or outputs the graph does not have) on a model the
        # record built: named as any reader names it, not as damage to the file's record
        raise ModelError(f"{name}: {exc}") from None


class _Misfit(ModelError):
    """The model the record describes does not build on the file's graph (restore)."""


def _parse(text: str) -> dict:
    rec = json.loads(text)
    if not isinstance(rec, dict):
        raise ModelError(f"it is a JSON {type(rec).__name__}, expected an object")
    fmt, ver = rec.get("format"), rec.get("version")
    if fmt != FORMAT or isinstance(ver, bool) or not isinstance(ver, int) or ver != VERSION:
        raise ModelError(f"it says format {fmt!r} version {ver!r}, this fastpath reads "
                         f"{FORMAT!r} version {VERSION} (a file from a newer fastpath?)")
    _complete(rec, None)
    return rec


def _complete(obj, kind):
    """obj, when it holds exactly the keys the writer writes (kind: a bundle _OBJECT_KEYS
    name, None for the record itself); a ModelError naming the missing and unknown ones."""
    want = _KEYS if kind is None else _OBJECT_KEYS[kind]
    obj = _obj(obj, kind or "the record")
    extra, missing = sorted(set(obj) - want), sorted(want - set(obj))
    if extra or missing:
        raise ModelError(f"{kind or 'the record'} has "
                         f"{f'unknown key(s) {extra}' if extra else ''}"
                         f"{' and ' if extra and missing else ''}"
                         f"{f'no {missing}' if missing else ''}; this fastpath reads exactly "
                         f"{sorted(want)} there")
    return obj


def _arrays(table, data) -> dict:
    """The feature spec's arrays from the table and the base64 data, each checked by the
    bundle's _read_arrays (inside the data, aligned, not overlapping), of the dtype and rank
    the writer gives it, with nothing after the last."""
    if not isinstance(data, str):
        raise ModelError(f"data must be a base64 string, got {type(data).__name__}")
    try:
        payload = base64.b64decode(data.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise ModelError(f"data is not base64 ({exc})") from None
    arrays = _read_arrays(table, payload, 0)
    if set(arrays) != set(SPEC_ARRAYS) or len(arrays) != len(SPEC_ARRAYS):
        raise ModelError(f"the array table holds {sorted(arrays)}, expected "
                         f"{sorted(SPEC_ARRAYS)}")
    end = 0
    for e in table:
        k = e["name"]
        if e["dtype"] != _DTYPES[k] or len(e["shape"]) != 1:
            raise ModelError(f"array {k} is {e['dtype']} {tuple(e['shape'])}, expected "
                             f"{_DTYPES[k]} of one dimension")
        end = e["offset"] + e["nbytes"]
    if len(payload) != end:
        raise ModelError(f"data holds {len(payload)} bytes, the arrays end at {end}")
    return arrays
