"""Model -> ONNX: the MLP and its post transform as a graph, so onnxruntime and other
runtimes can check fastpath's outputs (Model.forward) one for one, and what the graph does
not hold (feature spec, head, weight format, cache policy, meta) as fastpath's record in the
file's metadata_props (fastpath.model.onnx_meta), so Model.from_onnx serves the same signals.
A model's input scaler (Model.input_scaler, read from an imported graph's Scaler) is written
in front as Sub then Mul, the float32 ops onnxruntime's Scaler runs, not folded into the
first layer (in float32 the fold cancels for price-like inputs): the file's input is then the
model's input before the scaler, as in the file it was imported from.
Needs the optional `onnx` package."""
from __future__ import annotations

import os
import re
import threading
import uuid

import numpy as np

from fastpath.errors import ModelError
from fastpath.model import onnx_meta
from fastpath.model.bundle import _named, _path
from fastpath.model.model import register_format


# weights above this many bytes are written as external data (protobuf's limit is 2 GiB for
# the whole message; the graph itself is small)
_EXTERNAL_BYTES = 1 << 30


def to_onnx(model, path: str | os.PathLike, opset: int = 17) -> None:
    """[Sub, Mul: the input scaler,] Gemm (transB=1) + activation per layer, then the post
    transform as the importer reads it back (softmax: Softmax over axis 1; logistic2: Sigmoid,
    1 - p, Concat [1 - p, p]); input "features" [N, n_feat], output "out" [N, n_outputs];
    metadata_props {"fastpath.model": onnx_meta.to_text(model)} and its sha256
    ("fastpath.model.sha256")."""
    try:
        import onnx
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        raise ModelError("writing ONNX needs the onnx package: pip install 'fastpath[onnx]'") from None
    top = onnx.defs.onnx_opset_version()
    # below 7 Gemm wants a broadcast attribute (onnxruntime has no kernel for it); above what
    # the installed onnx knows, the file would carry a number no runtime has defined
    if isinstance(opset, (bool, np.bool_)) or not isinstance(opset, (int, np.integer)) or \
            not 7 <= opset <= top:
        raise ModelError(f"opset must be an int in 7..{top} (this onnx package's newest), got "
                         f"{opset!r}")
    # first: a meta JSON cannot hold is refused before anything is written
    record = onnx_meta.to_text(model)
    ops = {"relu": "Relu", "tanh": "Tanh", "sigmoid": "Sigmoid"}
    nodes, arrays, cur = [], [], "features"
    sc = model.input_scaler
    if sc is not None:
        # Sub and Mul of the default domain rather than a Scaler (ai.onnx.ml): the same
        # float ops, and any ONNX runtime has them
        arrays += [("in_offset", sc.offset), ("in_scale", sc.scale)]
        nodes += [helper.make_node("Sub", [cur, "in_offset"], ["centred"]),
                  helper.make_node("Mul", ["centred", "in_scale"], ["scaled"])]
        cur = "scaled"
    for i, l in enumerate(model.layers):
        arrays += [(f"W{i}", l.weight), (f"B{i}", l.bias)]
        nodes.append(helper.make_node("Gemm", [cur, f"W{i}", f"B{i}"], [f"gemm{i}"], transB=1))
        cur = f"gemm{i}"
        if l.activation in ops:
            nodes.append(helper.make_node(ops[l.activation], [cur], [f"act{i}"]))
            cur = f"act{i}"
    # without the post transform the file would return logits where Model.forward returns
    # probabilities
    if model.post == "softmax":
        nodes.append(helper.make_node("Softmax", [cur], ["probs"], axis=1))
        cur = "probs"
    elif model.post == "logistic2":
        arrays.append(("one", np.ones(1, np.float32)))
        nodes += [helper.make_node("Sigmoid", [cur], ["p1"]),
                  helper.make_node("Sub", ["one", "p1"], ["p0"]),
                  helper.make_node("Concat", ["p0", "p1"], ["probs"], axis=1)]
        cur = "probs"
    nodes.append(helper.make_node("Identity", [cur], ["out"]))
    dest = os.fsdecode(os.fspath(path))
    if dest.lower().endswith(".fpm"):
        # Engine(path) reads a path by its suffix: ONNX named .fpm went to the bundle reader
        # ("bad magic"), as Model.save refuses a bundle named .onnx
        raise ModelError(f"Model.to_onnx writes ONNX, not a fastpath bundle (.fpm): name it "
                         f".onnx, or write a bundle with Model.save({dest!r})")
    if os.path.isdir(dest):
        raise ModelError(f"Model.to_onnx: {dest!r} is a directory; give the file's name (e.g. "
                         f"{os.path.join(dest, 'model.onnx')!r})")
    # one protobuf message holds at most 2 GiB (protobuf refused to build a graph holding a
    # 23k-wide layer): past _EXTERNAL_BYTES the weights go to a file beside the model, which
    # onnxruntime and Model.from_onnx read from there
    big = sum(a.nbytes for _, a in arrays) > _EXTERNAL_BYTES
    # a data file of its own name per export: the graph's rename below is then the one
    # commit point (a reader, or a crash, sees the old pair or the new pair, never the old
    # graph over the new weights), and the replaced model's data goes only after it
    base = os.path.basename(dest)
    location = f"{base}.{uuid.uuid4().hex[:12]}.data"
    data = os.path.join(os.path.dirname(dest), location)
    stale = _own_data_files(dest)
    # the thread too, as Model.save names its own: two threads writing one path shared a temp
    # file, and the model renamed into place could hold both writes (or the second checker /
    # rename found the file gone)
    tmp = f"{dest}.tmp{os.getpid()}.{threading.get_ident()}"
    tmpdir = tmp_data = None
    if big:
        # the pair is written and checked in a folder of its own, then renamed into place:
        # written straight to `data`, the weights of a model already at `path` were
        # overwritten before the new one was checked, and deleted when it failed, so a
        # failed export broke the good model it was to replace
        tmpdir = f"{tmp}.d"
        tmp = os.path.join(tmpdir, os.path.basename(dest))
        tmp_data = os.path.join(tmpdir, location)
    try:
        if big:
            os.mkdir(tmpdir)
            inits = _write_external(arrays, tmp_data, location)
        else:
            inits = [numpy_helper.from_array(a, k) for k, a in arrays]
        g = helper.make_graph(
            nodes, "fastpath_mlp",
            [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", model.dims[0]])],
            [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", model.n_outputs])],
            inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", int(opset))],
                              producer_name="fastpath")
        m.ir_version = 8
        helper.set_model_props(m, onnx_meta.props(record))
        # a temp file renamed over `path`, as Model.save writes: a failed write (disk full)
        # must not leave a truncated file that a later Engine(path) reads as a damaged model
        onnx.save(m, tmp)
        # by path: the checker then reads the external data too (and allows > 2 GiB)
        onnx.checker.check_model(tmp)
        if big:
            os.replace(tmp_data, data)      # a new name: the model at `dest` is untouched
        os.replace(tmp, dest)
        for f in stale:                     # the replaced model's weights (big or small now)
            if f != data:
                try:
                    os.unlink(f)
                except OSError:
                    pass
    except OSError as exc:
        # a folder that does not exist was named by the temp file's name, not the caller's
        named = _named(exc, dest)
        if named is not exc:
            raise named from None
        raise
    finally:
        for f in (tmp, tmp_data):
            if f is not None:
                try:
                    os.unlink(f)
                except OSError:
                    pass
        if tmpdir is not None:
            try:
                os.rmdir(tmpdir)
            except OSError:
                pass


def _own_data_files(dest: str) -> list:
    """The external data files of the model now at `dest` that to_onnx wrote (named
    <name>.data or <name>.<hex>.data beside it; a hand-made model's other files are left)."""
    import onnx
    base = os.path.basename(dest)
    pat = re.compile(re.escape(base) + r"(\.[0-9a-f]{12})?\.data")
    folder = os.path.dirname(dest) or "."
    try:
        # the graph is parsed only where a file of ours lies beside it: an inline model
        # (up to 1 GiB) is not read for nothing
        if not any(pat.fullmatch(f) for f in os.listdir(folder)):
            return []
    except OSError:
        return []
    try:
        m = onnx.load(dest, load_external_data=False)
    except Exception:  # noqa: BLE001 - nothing there, or not ONNX: nothing of ours to remove
        return []
    out = set()
    for t in m.graph.initializer:
        for e in t.external_data:
            if e.key == "location" and pat.fullmatch(e.value):
                out.add(os.path.join(os.path.dirname(dest), e.value))
    return sorted(out)


def _write_external(arrays: list, data: str, location: str) -> list:
    """The arrays written one after another (little-endian float32) to `data`, as tensors
    that name their place there (ONNX external data)."""
    from onnx import TensorProto, external_data_helper
    out = []
    # written anew: onnx's own writer appends to an existing file
    with open(data, "wb") as f:
        for k, a in arrays:
            a = np.ascontiguousarray(a, dtype="<f4")
            off = f.tell()
            f.write(memoryview(a).cast("B"))
            t = TensorProto()
            t.name = k
            t.data_type = TensorProto.FLOAT
            t.dims.extend(a.shape)
            t.raw_data = b""    # set_external_data asks for the field; cleared below
            external_data_helper.set_external_data(t, location, offset=off, length=a.nbytes)
            t.data_location = TensorProto.EXTERNAL
            t.ClearField("raw_data")
            out.append(t)
    return out


def _model_to_onnx(model, path: str | os.PathLike, opset: int) -> None:
    to_onnx(model, _path(path, "Model.to_onnx"), opset)


register_format(to_onnx=_model_to_onnx)
