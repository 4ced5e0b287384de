"""Reading an ONNX graph for the importer: the ops it knows, node attributes as the runtime
reads them, initializers as arrays, the output served and the nodes it depends on, the declared
input, and the checks every graph gets (one definition per tensor). Needs the optional `onnx`
package, imported where a function needs it."""
from __future__ import annotations

import os

import numpy as np

from fastpath.errors import ModelError

SUPPORTED = ("Gemm", "MatMul", "Add", "Sub", "Mul", "Div", "Relu", "Tanh", "Sigmoid", "Softmax",
             "Flatten", "Identity", "Cast", "Reshape", "BatchNormalization", "Scaler",
             "LinearRegressor", "LinearClassifier", "Normalizer", "Concat", "Constant")
_TREE_OPS = ("TreeEnsembleRegressor", "TreeEnsembleClassifier")
_ML_OPS = ("Scaler", "LinearRegressor", "LinearClassifier", "Normalizer") + _TREE_OPS
# what to do instead, for ops people meet in exported models
# what to use instead of an activation the kernels do not run
_ACTIVATIONS_HINT = "use ReLU, Tanh or Sigmoid activations"
_INSTEAD = {
    "ZipMap": "export the classifier with zipmap=False (skl2onnx: options={id(model): "
              "{'zipmap': False}})",
    "Conv": "fastpath serves dense (fully connected) models; flatten the input and use Linear",
    "LeakyRelu": _ACTIVATIONS_HINT,
    "Gelu": _ACTIVATIONS_HINT,
    "Elu": _ACTIVATIONS_HINT,
    # what torch writes for nn.Hardtanh / nn.ReLU6 (Clip), nn.SELU, nn.Softplus, nn.PReLU,
    # nn.Hardsigmoid, nn.Hardswish, nn.Mish
    "Clip": _ACTIVATIONS_HINT + " (Clip is what torch writes for Hardtanh and ReLU6)",
    "Selu": _ACTIVATIONS_HINT,
    "Softplus": _ACTIVATIONS_HINT,
    "PRelu": _ACTIVATIONS_HINT,
    "HardSigmoid": _ACTIVATIONS_HINT,
    "HardSwish": _ACTIVATIONS_HINT,
    "Mish": _ACTIVATIONS_HINT,
    "Dropout": "export the model in eval mode (model.eval()), which drops Dropout",
    "SVMRegressor": "export a linear model or MLP instead of an SVM",
    "SVMClassifier": "export a linear model or MLP instead of an SVM",
    # ai.onnx.ml opset 5's single tree op (onnxruntime 1.20+ runs it); the exporters still
    # write the two ops of opsets 1-3 when asked for that opset
    "TreeEnsemble": "fastpath reads tree ensembles as TreeEnsembleRegressor / "
                    "TreeEnsembleClassifier (ai.onnx.ml opsets 1-3): export with ai.onnx.ml "
                    "opset 3 (skl2onnx / onnxmltools: target_opset={'': 17, 'ai.onnx.ml': 3})",
}
_FLOAT = 1   # TensorProto.FLOAT


def _attrs(node) -> dict:
    from onnx import helper
    try:
        return {a.name: helper.get_attribute_value(a) for a in node.attribute}
    except Exception as exc:  # noqa: BLE001 - onnx raises ValueError/TypeError on malformed attrs
        raise ModelError(f"node {node.name!r} ({node.op_type}) has a malformed attribute "
                         f"({type(exc).__name__}: {exc})") from None


def _no_twice(node, name: str) -> None:
    """An attribute named twice (Gemm alpha=2 and alpha=5): onnxruntime refuses the node,
    and a dict of them would keep the last."""
    seen: set = set()
    for a in node.attribute:
        if a.name in seen:
            raise ModelError(f"{name}: node {node.name!r} ({node.op_type}) has attribute "
                             f"{a.name} twice; a node gives each attribute once")
        seen.add(a.name)


def _num(attrs: dict, key: str, default, node, name: str):
    """A numeric attribute, or a ModelError naming the node when it has another type."""
    v = attrs.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or v != v:
        raise ModelError(f"{name}: node {node.name!r} ({node.op_type}) attribute {key} is "
                         f"{v!r}, expected a number")
    return v


def _scaler_attrs(attrs: dict, node, name: str) -> tuple:
    """A Scaler node's (offset, scale) as float64, or a ModelError: onnxruntime refuses a
    Scaler whose offset and scale differ in length."""
    off = _nums(attrs, "offset", [0.0], node, name)
    sc = _nums(attrs, "scale", [1.0], node, name)
    if off.size != sc.size or not off.size:
        raise ModelError(f"{name}: Scaler node {node.name!r} has {off.size} offsets and "
                         f"{sc.size} scales; expected the same number (1 or one per feature)")
    return off, sc


def _nums(attrs: dict, key: str, default, node, name: str) -> np.ndarray:
    """A list-of-numbers attribute as float64, or a ModelError naming the node when a damaged
    file holds another type there (a string, a tensor)."""
    v = attrs.get(key, default)
    if not isinstance(v, (list, tuple)) or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
        shown = f" {v!r:.40}" if isinstance(v, (bytes, str, list, tuple)) else ""
        raise ModelError(f"{name}: node {node.name!r} ({node.op_type}) attribute {key} is a "
                         f"{type(v).__name__}{shown}, expected a list of numbers")
    return np.asarray(v, np.float64)


def _tensor(t, what: str) -> np.ndarray:
    from onnx import numpy_helper
    if type(t).__name__ != "TensorProto":
        raise ModelError(f"{what} is a {type(t).__name__}, expected a tensor")
    try:
        return numpy_helper.to_array(t)
    except Exception as exc:  # noqa: BLE001 - malformed tensors raise several types
        raise ModelError(f"{what} is not a readable tensor ({type(exc).__name__}: {exc})") from None


def _s(v) -> str:
    """A string attribute (onnx hands them over as bytes); damaged bytes are a ModelError."""
    if not isinstance(v, bytes):
        return str(v)
    try:
        return v.decode()
    except UnicodeDecodeError:
        raise ModelError(f"a string attribute holds {v[:40]!r}, which is not UTF-8 text "
                         f"(a damaged file?)") from None


def _pick_output(g, name: str):
    outs = list(g.output)
    if len(outs) == 1:
        return outs[0].name
    # a classifier: label (int64) + probabilities (float); the engine serves probabilities
    floats = [o.name for o in outs if o.type.tensor_type.elem_type == _FLOAT]
    if len(floats) == 1:
        return floats[0]
    if any(o.type.HasField("map_type") or o.type.HasField("sequence_type") for o in outs):
        raise ModelError(f"{name}: the classifier's outputs are a ZipMap (a list of dicts); "
                         f"{_INSTEAD['ZipMap']}")
    wide = [o.name for o in outs if o.type.tensor_type.elem_type in (11, 10)]  # double, half
    if not floats and len(wide) == 1:
        # skl2onnx converts a classifier for the input type it is shown: float64 rows make
        # double probabilities (and a double graph), which fastpath does not compute
        raise ModelError(f"{name}: the output {wide[0]!r} is "
                         f"{'double' if _out_type(outs, wide[0]) == 11 else 'float16'}; "
                         f"fastpath serves float32 models: export for float32 inputs (skl2onnx: "
                         f"to_onnx(model, X[:1].astype(numpy.float32)))")
    raise ModelError(f"{name}: expected one float graph output (a classifier's probabilities "
                     f"beside its label), found {[o.name for o in outs]}")


def _check_ssa(g, name: str) -> None:
    """Each tensor defined once (ONNX's single assignment; onnxruntime refuses the file
    otherwise): with two definitions, a node output named like the model input or a weight,
    the chain would be read through one of them while the runtime knows neither."""
    where: dict = {}
    for i in g.input:
        where.setdefault(i.name, "a graph input")
    for t in g.initializer:
        if where.get(t.name, "a graph input") != "a graph input":
            raise ModelError(f"{name}: tensor {t.name!r} is defined twice (two initializers "
                             f"of that name); ONNX defines each tensor once")
        where[t.name] = "an initializer"
    for node in g.node:
        for o in node.output:
            if not o:
                continue
            if o in where:
                raise ModelError(f"{name}: tensor {o!r} is defined twice (by {where[o]} and by "
                                 f"node {node.name!r} ({node.op_type})); ONNX defines each "
                                 f"tensor once")
            where[o] = f"node {node.name!r} ({node.op_type})"


def _out_type(outs, oname: str) -> int:
    return next(o.type.tensor_type.elem_type for o in outs if o.name == oname)


def _slice(g, target: str) -> list:
    """The nodes the target output depends on, in graph order (a classifier's label branch,
    ArgMax and friends, is dropped)."""
    need, keep = {target}, []
    for node in reversed(list(g.node)):
        if any(o in need for o in node.output):
            keep.append(node)
            need.update(i for i in node.input if i)
    return keep[::-1]


def _missing_external_data(onnx, name: str) -> str | None:
    """The location of the first external data file the model at `name` names that is not
    a file beside it, or None (none missing, or the file cannot be read even so)."""
    try:
        m = onnx.load(name, load_external_data=False)
        for t in m.graph.initializer:
            if t.data_location == onnx.TensorProto.EXTERNAL:
                loc = next((e.value for e in t.external_data if e.key == "location"), "")
                if not os.path.isfile(os.path.join(os.path.dirname(name), loc)):
                    return loc
    except Exception:  # noqa: BLE001 - the caller's error stands
        return None
    return None


def _reshape_noop(shape: np.ndarray, width: int) -> bool:
    """Whether Reshape to `shape` leaves one row of `width` features (0: unknown) as it is:
    (1 | 0 | -1, width), or (1 | 0, -1); anything else moves features between rows."""
    if len(shape) != 2:
        return False
    a, b = int(shape[0]), int(shape[1])
    return (a in (0, 1) and b == -1) or (a in (-1, 0, 1) and width > 0 and b == width)


def _input_dtype(g, inp: str):
    """The numpy dtype of the graph input's elements, None when the file leaves it open."""
    from onnx import helper
    for i in g.input:
        if i.name == inp and i.type.HasField("tensor_type") and i.type.tensor_type.elem_type:
            try:
                return np.dtype(helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type))
            except Exception:  # noqa: BLE001 - an unknown type code: nothing to compare with
                return None
    return None


def _input_rank(g, inp: str) -> int:
    """The graph input's number of dimensions (2 when the file does not say)."""
    for i in g.input:
        if i.name == inp and i.type.tensor_type.HasField("shape"):
            return len(i.type.tensor_type.shape.dim)
    return 2


def _declared_width(g, inp: str) -> int:
    """The graph input's features per row (the product of its dimensions after the batch;
    one dimension: that one), 0 when the file leaves any of them open."""
    for i in g.input:
        if i.name == inp:
            dims = list(i.type.tensor_type.shape.dim)
            dims = dims[1:] if len(dims) > 1 else dims
            if not dims or not all(d.HasField("dim_value") and d.dim_value > 0 for d in dims):
                return 0
            return int(np.prod([d.dim_value for d in dims]))
    return 0


def _n_features(feats: np.ndarray, mode: np.ndarray, perm: np.ndarray) -> int:
    f = feats[perm][mode != 6]
    return int(f.max()) + 1 if f.size else 1


def _input_width(g, inp: str) -> int:
    """The graph input's feature count (its last dimension), 0 when the file leaves it open."""
    for i in g.input:
        if i.name == inp:
            dims = i.type.tensor_type.shape.dim
            if len(dims) and dims[-1].HasField("dim_value") and dims[-1].dim_value > 0:
                return int(dims[-1].dim_value)
    return 0


def _load(path):
    """(the path as a str, the ModelProto) of the ONNX file at path; a ModelError naming what
    is wrong with it (no onnx package, no file, a fastpath bundle, missing external data, not
    ONNX, no graph)."""
    try:
        import onnx
    except ImportError:
        raise ModelError("reading ONNX needs the onnx package: pip install 'fastpath[onnx]'") from None

    name = os.fspath(path)
    try:
        model = onnx.load(name)
    except FileNotFoundError:
        raise ModelError(f"ONNX file {name!r} not found") from None
    except Exception as exc:  # noqa: BLE001 - protobuf raises several unrelated types
        try:
            with open(name, "rb") as f:
                bundle = f.read(7) == b"FPMODEL"
        except OSError:
            bundle = False
        if bundle:
            # read as ONNX by its suffix (Engine and the CLI choose the reader so)
            raise ModelError(f"{name} is a fastpath bundle, not ONNX: name it .fpm, or read "
                             f"it with Model.load") from None
        missing = _missing_external_data(onnx, name)
        if missing:
            # torch.onnx.export(dynamo=True) writes the weights of even a small MLP to
            # NAME.onnx.data beside the graph; the .onnx copied alone was "not a readable ONNX
            # model (ValidationError: Data of TensorProto ... it is not regular file.)"
            raise ModelError(f"{name} keeps its weights in the external data file "
                             f"{missing!r}, which is not beside it "
                             f"({os.path.dirname(os.path.abspath(name))}): copy it there with "
                             f"the .onnx, or write one self-contained file (torch.onnx.export("
                             f"..., external_data=False), or onnx.save_model(onnx.load(path), "
                             f"out, save_as_external_data=False))") from None
        raise ModelError(f"{name} is not a readable ONNX model ({type(exc).__name__}: {exc})") from None
    if not model.HasField("graph"):
        # an empty file (a failed download, a file truncated to 0 bytes) parses as an empty
        # ModelProto: it was "expected one graph input, found []"
        try:
            size = f"{os.path.getsize(name)} bytes"
        except OSError:
            size = "no size"
        raise ModelError(f"{name} holds no ONNX graph ({size}): an empty or truncated file, or "
                         f"not an ONNX model")
    return name, model


def _check_domains(nodes: list, name: str) -> None:
    for node in nodes:
        # an op is named by its domain and type: a "Gemm" or "TreeEnsembleRegressor" of another
        # domain is a custom op with its own meaning (or none: onnxruntime refuses it), not
        # the one fastpath would read it as
        op = node.op_type
        if op in SUPPORTED or op in _TREE_OPS:
            want = ("ai.onnx.ml",) if op in _ML_OPS else ("", "ai.onnx")
            if node.domain not in want:
                raise ModelError(f"{name}: node {node.name!r} ({op}) is in domain "
                                 f"{node.domain or 'ai.onnx'!r}; fastpath reads {op} of the "
                                 f"{want[0] or 'default (ai.onnx)'} domain only")
