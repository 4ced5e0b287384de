"""ONNX -> the dense layers of an MLP or linear model, as (weight, bias, activation), plus
the post transform of its outputs. Needs the optional `onnx` package (pip install
'fastpath[onnx]').

Design: pick the graph output the engine serves (the only one, or, for a classifier that
writes `label` and `probabilities`, the float probabilities), keep only the nodes it depends
on, and walk them in order (ONNX requires topological order), following the single
activation tensor from the graph input; weights must be initializers, Constant nodes (any of
value / value_float(s) / value_int(s)) or an Identity / Transpose / Cast to float of one,
which is computed here. Each tensor is defined once (ONNX's single assignment).
What the exporters write around the layers is read as the same function, never approximated
by another: Cast to float, Reshape to (batch, n), Flatten and Identity are no-ops; the affine
map the graph reads its input through, a Scaler (ai.onnx.ml: (x - offset) * scale) or
Sub / Add then Mul / Div by constants, is returned as "input" (offset, scale) and becomes the
model's input scaler, which the feature stage runs in float32 as onnxruntime does (folded
into the first layer, W * scale and b - W * scale * offset cancelled in float32 for
price-like inputs); other elementwise Mul / Add / Sub / Div by a constant (after a layer, or
a shift after a scale) and a BatchNormalization are affine maps folded into the dense layer
before or after them; LinearRegressor and
LinearClassifier (ai.onnx.ml) are dense layers; a final Softmax, or Sigmoid -> 1 - p ->
Concat (skl2onnx's binary classifier), is the post transform. A TreeEnsembleRegressor /
TreeEnsembleClassifier (ai.onnx.ml) between such no-ops is read into a
fastpath.model.TreeEnsemble (_read_trees), with the input map before it. Anything else is refused with
the op and node named and what to export instead. It returns plain arrays, not Layer objects,
so it depends on nothing in fastpath but the errors (Model.from_onnx builds the Layers).
"""
from __future__ import annotations

import itertools
import os

import numpy as np

from fastpath.errors import ModelError
from fastpath.model.trees import TreeEnsemble

SUPPORTED = ("Gemm", "MatMul", "Add", "Sub", "Mul", "Div", "Relu", "Tanh", "Sigmoid", "Softmax",
             "Flatten", "Identity", "Cast", "Reshape", "BatchNormalization", "Scaler",
             "LinearRegressor", "LinearClassifier", "Normalizer", "Concat", "Constant")
_ACT = {"Relu": "relu", "Tanh": "tanh", "Sigmoid": "sigmoid"}
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


# the attributes a Constant node may hold its value in (opset 12+ added the scalar and list
# forms, which exporters write for a scaler's mean or a 1.0): one dtype each, as the runtime
# reads them
_CONST_FORMS = {"value_float": np.float32, "value_floats": np.float32, "value_int": np.int64,
                "value_ints": np.int64}


def _constant(a: dict, node, name: str) -> np.ndarray:
    """The value of a Constant node, whichever attribute holds it; anything else (a string,
    a sparse tensor) is named, never read as some other number."""
    forms = [k for k in a if k == "value" or k in _CONST_FORMS]
    if len(forms) != 1 or len(a) != 1:
        raise ModelError(f"{name}: Constant node {node.name!r} has attributes {sorted(a)}; "
                         f"expected exactly one of value, {', '.join(_CONST_FORMS)}")
    k = forms[0]
    if k == "value":
        return _tensor(a["value"], f"{name}: Constant node {node.name!r}")
    v = a[k]
    scalar = not k.endswith("s")
    ok = (isinstance(v, (int, float)) and not isinstance(v, bool)) if scalar else \
        isinstance(v, (list, tuple)) and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)
    if not ok:
        raise ModelError(f"{name}: Constant node {node.name!r} attribute {k} is "
                         f"{type(v).__name__}, expected {'a number' if scalar else 'numbers'}")
    return np.asarray(v, _CONST_FORMS[k])


_CONST_FOLD = ("Identity", "Transpose", "Cast")


def _fold_const(op: str, a: dict, c: np.ndarray, node, name: str) -> np.ndarray:
    """Identity / Transpose / Cast to float of a constant, as onnxruntime computes it."""
    if op == "Identity":
        return c
    if op == "Transpose":
        perm = a.get("perm")
        if perm is None:
            return np.ascontiguousarray(c.T)
        if not isinstance(perm, (list, tuple)) or sorted(perm) != list(range(c.ndim)) or \
                any(isinstance(p, bool) for p in perm):
            raise ModelError(f"{name}: Transpose node {node.name!r} perm {perm!r} is not a "
                             f"permutation of the {c.ndim} axes of its constant")
        return np.ascontiguousarray(np.transpose(c, perm))
    if c.dtype.kind not in "fiub":
        raise ModelError(f"{name}: Cast node {node.name!r} casts a {c.dtype} constant to "
                         f"float; expected numbers")
    return c.astype(np.float32)


def _cast_to(node):
    return next((a.i for a in node.attribute if a.name == "to"), None)


def _fold_out(layer: list, scale: np.ndarray, shift: np.ndarray) -> None:
    """layer's outputs y -> y * scale + shift, folded into its weight and bias."""
    n = layer[0].shape[0]
    sc = np.broadcast_to(scale, (n,)).astype(np.float64)
    sh = np.broadcast_to(shift, (n,)).astype(np.float64)
    layer[0] = layer[0] * sc[:, None]
    layer[1] = layer[1] * sc + sh


def _fold_in(W: np.ndarray, b: np.ndarray, scale: np.ndarray, shift: np.ndarray) -> tuple:
    """A dense layer fed x * scale + shift instead of x: the same map of x."""
    n = W.shape[1]
    sc = np.broadcast_to(scale, (n,)).astype(np.float64)
    sh = np.broadcast_to(shift, (n,)).astype(np.float64)
    return W * sc[None, :], b + W @ sh


def _flat_elementwise(scale, shift, node, name: str) -> tuple:
    """An elementwise op's constants as float64 scalars or (n,) vectors: (1, n) is
    elementwise over the features; (n, 1) broadcasts against the batch axis instead and makes
    an (n, n) output in onnxruntime, and (1, 1, n) makes the tensor 3-d, which a following
    Gemm or BatchNormalization reads otherwise."""
    scale, shift = np.asarray(scale, np.float64), np.asarray(shift, np.float64)
    if scale.ndim > 1 or shift.ndim > 1:
        sq = [a.reshape(-1) if a.ndim == 2 and a.shape[0] == 1 else a for a in (scale, shift)]
        if any(a.ndim > 1 for a in sq):
            raise ModelError(f"{name}: {node.op_type} node {node.name!r} is not elementwise "
                             f"over the features (constant shape {scale.shape} / {shift.shape})")
        scale, shift = sq
    return scale, shift


def _lead_step(op: str, first: bool, c: np.ndarray) -> tuple:
    """An elementwise op by a constant c as a step of the input map y = (x - offset) * scale:
    (offset, scale or None): None marks a pure shift, an offset of None a pure scale. Where
    the op is one float op of onnxruntime's, so is the step: x - c, x + c (= x - (-c)),
    x * c, and c - x as (x - c) * -1 (negation is exact). x / c becomes x * (1 / c): the
    reciprocal is rounded once, and the product differs from the quotient by at most an ulp
    (1e-7 relative), far below what folding it into the first layer lost."""
    if op == "Sub":
        return (c, None) if first else (c, -1.0)
    if op == "Add":
        return -c, None
    if op == "Mul":
        return None, c
    return None, 1.0 / c       # Div by a nonzero constant, checked by the caller


class _Lead:
    """The leading affine map of the graph, y = (x - offset) * scale, gathered op by op while
    it keeps that form: shifts, then scales (a Scaler is one of each). Successive shifts are
    summed and successive scales multiplied in float64 and rounded to float32 once, which can
    differ from onnxruntime's step-by-step rounding by an ulp of the intermediate. A shift
    after a scale (x * a - c) is not that form with onnxruntime's rounding (it rounds x * a,
    then subtracts; (x - c / a) * a rounds otherwise, and for a price x * a ~ 2e5 the two
    differ by ulps of 2e5). Before dense layers (shift_after_scale=True) it is taken anyway as
    (x - (offset + c / scale)) * scale, and before a tree ensemble refused: skl2onnx writes a
    MinMaxScaler so (x * scale + min), and onnxruntime's own rounding of x * scale (~6.5e4,
    ulp 4e-3) moves its answer by ~1e-3 of the output's spread from the float64 pipeline on
    price-like inputs. No one-op map reproduces that rounding; measured on such a pipeline
    (MinMaxScaler + MLPRegressor, x ~ 6.5e4 +- 0.5) against scikit-learn's float64 answer,
    this form was 7.8e-4 of the spread off, onnxruntime 9.6e-4 and the old fold into the
    first layer 2.3e-3 (and the fold leaves the layer uncentred inputs, which bf16 / int8
    weights lose). A tree compares against thresholds, where such a difference takes the
    other branch than onnxruntime: refused there."""

    def __init__(self) -> None:
        self.offset = np.zeros(())
        self.scale = np.ones(())
        self.stage = 0          # 0: nothing yet, 1: shifts only, 2: a scale seen
        self.open = True

    def take(self, off, sc, shift_after_scale: bool = False) -> bool:
        """Add the step (off, sc) (see _lead_step) when it keeps the form; False otherwise."""
        if not self.open:
            return False
        if off is not None and self.stage == 2:
            s0 = np.asarray(self.scale, np.float64)
            if not shift_after_scale or np.any(s0 == 0):
                return False
            try:
                with np.errstate(over="ignore"):
                    o = self.offset + off / s0
            except ValueError:
                return False
            if not np.all(np.isfinite(o)) or np.any(np.abs(o) > np.finfo(np.float32).max):
                return False
            off = o - self.offset
        try:
            # a step whose constant does not broadcast against the map so far (a (2,) shift
            # after a (4,) scale) is not taken; the caller folds it, which names the mismatch
            if off is None:
                o = self.offset
            elif self.stage == 0:
                # the first shift as it is: 0.0 + c made an offset of -0.0 +0.0, and x - (-0.0)
                # (+0.0 at x = -0.0, what onnxruntime's Sub gives) became x - 0.0 (-0.0)
                o = np.array(off, np.float64)
            else:
                o = self.offset + off
            s = self.scale * sc if sc is not None else self.scale
            np.broadcast_shapes(np.shape(o), np.shape(s))
        except ValueError:
            return False
        self.offset, self.scale = o, s
        self.stage = 2 if sc is not None else max(self.stage, 1)
        return True

    def result(self, width: int, name: str):
        """(offset, scale) as float64 (width,) vectors, or None when there was no map."""
        if self.stage == 0:
            return None
        try:
            return (np.broadcast_to(self.offset, (width,)).astype(np.float64),
                    np.broadcast_to(self.scale, (width,)).astype(np.float64))
        except ValueError:
            raise ModelError(f"{name}: the elementwise ops before the first layer (shapes "
                             f"{np.shape(self.offset)}, {np.shape(self.scale)}) do not match "
                             f"its {width} inputs") from None


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


def layers_from_onnx(path: str | os.PathLike) -> tuple:
    """((weight (out, in) float64, bias (out,), activation name), ...) in graph order. A
    graph with a scaler in front is refused: its layers alone (the scaler is no longer folded
    into the first) are not the model; Model.from_onnx keeps it as the input scaler."""
    g = read_onnx(path)
    if g.get("input") is not None:
        raise ModelError(f"{os.fspath(path)}: the graph reads its input through a scaler, "
                         f"which is not one of its layers; use Model.from_onnx, which keeps it "
                         f"as the model's input_scaler")
    if "layers" not in g:
        raise ModelError(f"{os.fspath(path)}: the graph is a tree ensemble, not dense layers; "
                         f"use Model.from_onnx")
    return g["layers"]


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


def read_onnx(path: str | os.PathLike) -> dict:
    """{"layers": ((weight, bias, activation), ...), "post": "none" | "softmax" | "logistic2",
    "output": the graph output served, "classifier": whether it holds class probabilities,
    "producer": who wrote the file, "input": (offset, scale) float64 vectors of the input
    map y = (x - offset) * scale, or None, "metadata": the file's metadata_props as (key,
    value) pairs}; a tree ensemble: "trees" instead of "layers"."""
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
    g = model.graph
    props = [(p.key, p.value) for p in model.metadata_props]
    consts = {t.name: _tensor(t, f"{name}: initializer {t.name!r}") for t in g.initializer}
    inputs = [i.name for i in g.input if i.name not in consts]
    if len(inputs) != 1:
        shadow = [i.name for i in g.input if i.name in consts]
        # onnxruntime reads an input with an initializer of its name as an input with a
        # default value; which of them is the model's input the file does not say
        extra = (f" ({shadow} have initializers of the same name: onnxruntime reads them as "
                 f"inputs with default values; fastpath reads them as weights, so leave the "
                 f"model input without an initializer)") if shadow and not inputs else ""
        raise ModelError(f"{name}: expected one graph input, found {inputs}{extra}")
    if not g.output:
        raise ModelError(f"{name}: the graph has no output")
    # every node of the file is checked, not only the served output's: a malformed node is a
    # malformed file, whichever branch it sits on
    # outputs of nodes computed here from constants (never on the chain); by name, as a
    # node's Python object is not the same on each walk over g.node
    folded: set = set()
    for node in g.node:
        op = node.op_type
        if op in _CONST_FOLD and node.domain in ("", "ai.onnx") and len(node.input) == 1 \
                and node.input[0] in consts and len(node.output) == 1 and node.output[0] \
                and (op != "Cast" or _cast_to(node) == _FLOAT):
            # exporters write these on weights (torch: an Identity per tied parameter, a
            # Transpose of a Linear weight without constant folding): the value is the
            # weight's, as the runtime computes it. A Cast of a constant to another type
            # (class labels to int64 on a classifier's label branch) is left alone: no
            # weight is made of it
            _no_twice(node, name)
            try:
                a = _attrs(node)
            except ModelError as exc:
                raise ModelError(f"{name}: {exc}") from None
            consts[node.output[0]] = _fold_const(op, a, np.asarray(consts[node.input[0]]),
                                                 node, name)
            folded.add(node.output[0])
            continue
        if op not in SUPPORTED:
            continue
        n_in = {"Gemm": (2, 3), "MatMul": (2, 2), "Add": (2, 2), "Sub": (2, 2), "Mul": (2, 2),
                "Div": (2, 2), "Reshape": (2, 2), "Constant": (0, 0),
                "BatchNormalization": (5, 5), "Concat": (1, 64)}.get(op, (1, 1))
        n_out = (1, 2) if op in ("LinearClassifier", "BatchNormalization") else (1, 1)
        if not n_in[0] <= len(node.input) <= n_in[1] or not n_out[0] <= len(node.output) <= n_out[1] \
                or not node.output[-1]:
            raise ModelError(f"{name}: node {node.name!r} ({op}) has {len(node.input)} inputs and "
                             f"{len(node.output)} outputs; expected {n_in[0]}-{n_in[1]} inputs and "
                             f"{'one output' if n_out[1] == 1 else '1-2 outputs'}")
        if op == "Constant":
            _no_twice(node, name)
            try:
                a = _attrs(node)
            except ModelError as exc:
                raise ModelError(f"{name}: {exc}") from None
            consts[node.output[0]] = _constant(a, node, name)
            continue
    target = _pick_output(g, name)
    nodes = _slice(g, target)
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
    if any(n.op_type in _TREE_OPS for n in nodes):
        # a tensor defined twice is refused as on the MLP path (onnxruntime refuses most)
        _check_ssa(g, name)
        rank = _input_rank(g, inputs[0])
        trees, lead = _read_trees(nodes, inputs[0], target, name,
                                  _declared_width(g, inputs[0]) if rank > 2 else
                                  _input_width(g, inputs[0]), consts, rank)
        return {"trees": trees, "post": "none", "output": target,
                "classifier": trees.classifier, "producer": model.producer_name, "input": lead,
                "metadata": props}
    _check_ssa(g, name)
    cur = inputs[0]
    n_in = _declared_width(g, inputs[0])
    need_in: list = []      # (width, Reshape node) a Reshape before the first layer needs
    # pending layers: [weight (out, in), bias (out,), activation, activation_set]
    layers: list = []
    pending = None          # (scale, shift) an elementwise affine waiting for the next layer
    post = "none"
    skip: set = set()
    scores: list = []       # LinearClassifier nodes that write decision scores (post NONE)

    # the element type of the tensor the chain carries (None: not declared): a weight of
    # another type (float64 weights beside a float32 input, as numpy arrays make them) is a
    # graph onnxruntime refuses to load, and integer math is not what fastpath computes
    cur_dt = _input_dtype(g, inputs[0])

    def const(tname: str, node, weight: str = "same") -> np.ndarray:
        if tname not in consts:
            raise ModelError(f"{name}: node {node.name!r} ({node.op_type}) needs {tname!r} to be a "
                             f"constant weight; fastpath imports models with constant weights only")
        c = np.asarray(consts[tname])
        if c.dtype.kind not in "fiub":
            raise ModelError(f"{name}: node {node.name!r} ({node.op_type}) constant {tname!r} is "
                             f"{c.dtype}, expected numbers")
        if weight != "any" and cur_dt is not None and cur_dt.kind != "f":
            raise ModelError(f"{name}: node {node.name!r} ({node.op_type}) computes on the "
                             f"{cur_dt} input; fastpath computes in float: give the graph a float "
                             f"input, or Cast it to float first")
        if weight == "same" and cur_dt is not None and c.dtype != cur_dt:
            raise ModelError(f"{name}: node {node.name!r} ({node.op_type}) constant {tname!r} is "
                             f"{c.dtype} but the tensor it meets is {cur_dt}; onnxruntime refuses "
                             f"mixed element types: export the weights as {cur_dt}")
        if weight == "float" and c.dtype.kind != "f":
            raise ModelError(f"{name}: node {node.name!r} ({node.op_type}) constant {tname!r} is "
                             f"{c.dtype}, expected a float tensor")
        return c.astype(np.float64)

    lead = _Lead()

    def leading(off, sc, node) -> bool:
        """An elementwise step before the first layer, taken into the model's input map
        (run by the feature stage in float32, as onnxruntime runs it, not folded into the
        first layer: in float32 the folded W * scale and b - W * scale * offset cancel for
        price-like inputs); False when it cannot be (after a layer, or a shift after a
        scale), and the caller folds it."""
        if layers or pending is not None or post != "none":
            lead.open = False
            return False
        z = np.zeros(())
        s, o = _flat_elementwise(1.0 if sc is None else sc, z if off is None else off, node, name)
        return lead.take(None if off is None else o, None if sc is None else s, True)

    def affine(scale, shift, node) -> None:
        """x -> x * scale + shift on the current tensor: into the last layer's outputs while
        no activation follows it, else held for the next layer's inputs."""
        nonlocal pending
        lead.open = False
        scale, shift = _flat_elementwise(scale, shift, node, name)
        if post != "none":
            raise ModelError(f"{name}: {node.op_type} node {node.name!r} after the output's "
                             f"{post} is not supported; the probabilities must be the output")
        try:
            if layers and not layers[-1][3] and pending is None:
                _fold_out(layers[-1], scale, shift)
            elif pending is None:
                pending = (scale, shift)
            else:
                pending = (pending[0] * scale, pending[1] * scale + shift)
        except ValueError:
            raise ModelError(f"{name}: {node.op_type} node {node.name!r} constant does not match "
                             f"the width of its input") from None

    def dense(W: np.ndarray, b: np.ndarray, node) -> None:
        nonlocal pending
        lead.open = False
        if post != "none":
            raise ModelError(f"{name}: {node.op_type} node {node.name!r} after the {post} output "
                             f"transform; fastpath serves models whose softmax comes last")
        if pending is not None:
            try:
                W, b = _fold_in(W, b, *pending)
            except ValueError:
                raise ModelError(f"{name}: the elementwise ops before node {node.name!r} do not "
                                 f"match its {W.shape[1]} inputs") from None
            pending = None
        layers.append([W, b, "identity", False])

    def concat_1p_p(cat) -> None:
        """Check the Concat of a binary classifier's [1 - p, p] (axis 1, given)."""
        _no_twice(cat, name)
        try:
            cat_a = _attrs(cat)
        except ModelError as exc:
            raise ModelError(f"{name}: {exc}") from None
        if "axis" not in cat_a and opset >= 4:
            # required since opset 4: onnxruntime cannot load the graph
            raise ModelError(f"{name}: Concat node {cat.name!r} has no axis "
                             f"attribute (required since opset 4)")
        if _num(cat_a, "axis", 1, cat, name) not in (1, -1):
            raise ModelError(f"{name}: Concat node {cat.name!r} not over axis 1")

    def logistic2_after_activation(node, idx: int):
        """The Concat that ends p = Sigmoid(z), 1 - p, [1 - p, p] when z is a one-wide layer
        whose activation is already set (Model.to_onnx writes a tanh / relu / sigmoid last
        layer and a logistic2 post so), with the Sub and the Concat to skip; None when the
        Sigmoid is not followed by them (a second activation)."""
        p = node.output[0]
        if not layers or layers[-1][0].shape[0] != 1 or pending is not None or \
                post != "none":
            return None
        sub = next((n for n in nodes[idx + 1:] if n.op_type == "Sub"
                    and list(n.input[1:]) == [p] and n.input[0] in consts), None)
        if sub is None:
            return None
        one = const(sub.input[0], sub)
        if one.size != 1 or float(one.reshape(-1)[0]) != 1.0:
            return None
        cat = next((n for n in nodes[idx + 1:] if n.op_type == "Concat"
                    and list(n.input) == [sub.output[0], p]), None)
        if cat is None:
            return None
        _no_twice(sub, name)
        concat_1p_p(cat)
        return sub, cat

    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                default=13)
    rank = _input_rank(g, inputs[0])
    if rank == 0:
        raise ModelError(f"{name}: the model input {inputs[0]!r} is declared a scalar (no "
                         f"dimensions); a dense model reads [batch, features]")
    flat = rank <= 2
    reshaped = False
    sigmoid_of = {n.output[0]: n for n in nodes if n.op_type == "Sigmoid" and n.input
                  and n.output}
    for idx, node in enumerate(nodes):
        op = node.op_type
        if id(node) in skip or op == "Constant" or \
                (op in _CONST_FOLD and node.output and node.output[0] in folded):
            continue
        if op == "Mul" and len(node.input) == 2:
            # x * sigmoid(x): nn.SiLU as both torch exporters write it; it was refused as a
            # Mul whose "weight" was not a constant, which named no activation
            for a_in, b_in in (node.input, node.input[::-1]):
                sig = sigmoid_of.get(b_in)
                if sig is not None and sig.input[0] == a_in:
                    raise ModelError(f"{name}: nodes {sig.name!r} (Sigmoid) and {node.name!r} "
                                     f"(Mul) compute x * sigmoid(x), SiLU / Swish, which is not "
                                     f"an activation fastpath runs; {_ACTIVATIONS_HINT}")
        if op not in SUPPORTED:
            hint = _INSTEAD.get(op, "fastpath imports dense models (MLPs, linear and logistic "
                                    "models) built from " + ", ".join(SUPPORTED[:-1]) +
                                " and tree ensembles (" + " / ".join(_TREE_OPS) + ")")
            raise ModelError(f"{name}: unsupported ONNX op {op!r} (node {node.name!r}); {hint}")
        # the rank of the tensor a Flatten here reads: a Reshape or Flatten before it made it
        # (batch, features)
        cur_rank = 2 if reshaped else rank
        if op in ("Flatten", "Reshape"):
            flat = True
            reshaped = True
        if op in ("Gemm", "MatMul", "LinearRegressor", "LinearClassifier") and not flat:
            # a rank-3 input reaches the layer unflattened: Gemm refuses it, MatMul multiplies
            # each inner row apart; neither is the (batch, features) layer read here
            raise ModelError(f"{name}: {op} node {node.name!r} reads the rank-{rank} model "
                             f"input; a dense layer reads (batch, features): flatten the input "
                             f"first")
        if op in ("Gemm", "Add", "Sub", "Mul", "Div") and opset < 7:
            # these broadcast by a `broadcast` / `axis` attribute before opset 7 (an axis-0
            # constant is per row, not per feature), and onnxruntime has no kernel for them
            raise ModelError(f"{name}: {op} node {node.name!r} of opset {opset}: before opset 7 "
                             f"its broadcasting differs and onnxruntime cannot run it; export "
                             f"with opset 7 or later")
        binary = op in ("Add", "Sub", "Mul", "Div", "MatMul")
        if not node.input or node.input[0] != cur and not (binary and cur in node.input):
            raise ModelError(f"{name}: node {node.name!r} ({op}) does not continue the chain from "
                             f"{cur!r}; fastpath imports sequential models only")
        _no_twice(node, name)
        try:
            attrs = _attrs(node)
        except ModelError as exc:
            raise ModelError(f"{name}: {exc}") from None
        out_name = node.output[0]
        if op in ("Flatten", "Identity"):
            ax = _num(attrs, "axis", 1, node, name) if op == "Flatten" else 1
            if op == "Flatten" and cur_rank == 1:
                # onnxruntime: Flatten of (n,) at axis 0 (or -1, which is 0 there) is (1, n),
                # one row of the features, what the layers read; at axis 1 it is (n, 1), each
                # feature a row
                if ax not in (0, -1):
                    raise ModelError(f"{name}: Flatten node {node.name!r} (axis {ax}) of the "
                                     f"rank-1 model input makes each feature a row (shape "
                                     f"(n, 1)); give it axis 0, or declare the input as "
                                     f"[batch, features]")
            elif op == "Flatten" and (ax + cur_rank if ax < 0 else ax) != 1:
                # any other axis moves features between rows (axis 0: one row of the whole
                # batch; the last axis of a rank-3 input: a row per inner row)
                raise ModelError(f"{name}: Flatten node {node.name!r} with axis {ax} of a "
                                 f"rank-{cur_rank} tensor is not (batch, features); expected "
                                 f"axis 1")
        elif op == "Cast":
            if attrs.get("to") != _FLOAT:
                raise ModelError(f"{name}: Cast node {node.name!r} casts to type {attrs.get('to')}; "
                                 f"fastpath computes in float32: export with float inputs")
        elif op == "Reshape":
            shape = const(node.input[1], node, "any")
            if np.asarray(consts[node.input[1]]).dtype != np.int64:
                # onnxruntime loads a Reshape with an int64 shape only
                raise ModelError(f"{name}: Reshape node {node.name!r} shape {node.input[1]!r} is "
                                 f"{np.asarray(consts[node.input[1]]).dtype}, expected int64")
            shape = shape.astype(np.int64).reshape(-1)
            width = layers[-1][0].shape[0] if layers else n_in
            if _num(attrs, "allowzero", 0, node, name) and 0 in shape.tolist():
                raise ModelError(f"{name}: Reshape node {node.name!r} with allowzero=1 to "
                                 f"{shape.tolist()} makes an empty tensor")
            if not _reshape_noop(shape, width):
                if width == 0 and len(shape) == 2 and shape[0] in (-1, 0, 1) and shape[1] > 0:
                    # the input's width is not declared: a no-op only if the first layer
                    # reads exactly shape[1] features, checked when the layers are known
                    need_in.append((int(shape[1]), node))
                else:
                    raise ModelError(f"{name}: Reshape node {node.name!r} to {shape.tolist()} is "
                                     f"not a (batch, features) no-op on a {width or '?'}-wide "
                                     f"input; onnxruntime would change the rows")
        elif op == "Normalizer":
            if post != "softmax" or attrs.get("norm") not in (b"L1", "L1"):
                raise ModelError(f"{name}: Normalizer node {node.name!r} is supported only as "
                                 f"the L1 norm right after a softmax (probabilities that already "
                                 f"sum to 1)")
        elif op == "Scaler":
            off, sc = _scaler_attrs(attrs, node, name)
            # onnxruntime: y = (x - offset) * scale, in float32
            if not leading(off, sc, node):
                affine(sc, -off * sc, node)
        elif op in ("Add", "Sub", "Mul", "Div"):
            first = node.input[0] == cur
            other = node.input[1] if first else node.input[0]
            c = const(other, node)
            if op == "Sub" and not first and c.size == 1 and float(c.reshape(-1)[0]) == 1.0:
                # skl2onnx's binary classifier: p = sigmoid(z); [1 - p, p] via Sub + Concat
                cat = next((n for n in nodes[idx + 1:] if n.op_type == "Concat"
                            and list(n.input) == [out_name, cur]), None)
                if cat is not None and layers and layers[-1][2] == "sigmoid" and \
                        layers[-1][0].shape[0] == 1 and pending is None and post == "none":
                    concat_1p_p(cat)
                    layers[-1][2] = "identity"
                    post = "logistic2"
                    skip.add(id(cat))
                    cur = cat.output[0]
                    continue
            if op == "Div" and (not first or np.any(c == 0)):
                raise ModelError(f"{name}: Div node {node.name!r} is not x / nonzero constant")
            if leading(*_lead_step(op, first, c), node):
                pass
            elif op == "Add":
                affine(1.0, c, node)
            elif op == "Mul":
                affine(c, 0.0, node)
            elif op == "Div":
                affine(1.0 / c, 0.0, node)
            else:
                affine(1.0 if first else -1.0, -c if first else c, node)
        elif op == "Gemm":
            a = attrs
            if opset < 11 and (len(node.input) < 3 or not node.input[2]):
                # C became optional in opset 11: onnxruntime refuses to load the graph
                raise ModelError(f"{name}: Gemm node {node.name!r} without a bias (C) input in "
                                 f"opset {opset}; C is required before opset 11 (onnxruntime "
                                 f"cannot load it): give it a zero bias or export with opset 11+")
            if rank == 1 and not reshaped:
                raise ModelError(f"{name}: Gemm node {node.name!r} reads the rank-1 model input; "
                                 f"Gemm takes (batch, features) (onnxruntime cannot load it): "
                                 f"declare the input as [batch, {n_in or 'features'}]")
            if _num(a, "transA", 0, node, name):
                raise ModelError(f"{name}: Gemm node {node.name!r} with transA=1 is not an MLP layer")
            B = const(node.input[1], node)
            if B.ndim != 2:
                raise ModelError(f"{name}: Gemm node {node.name!r} weight has shape {B.shape}")
            W = (B if _num(a, "transB", 0, node, name) else B.T) * float(_num(a, "alpha", 1.0, node, name))
            b = np.zeros(W.shape[0])
            beta = float(_num(a, "beta", 1.0, node, name))
            if len(node.input) > 2 and node.input[2]:
                C = const(node.input[2], node)
                if C.ndim > 2 or (C.ndim == 2 and C.shape[0] != 1):
                    # C broadcasts to (batch, outputs): a row of C per batch row is not a bias
                    raise ModelError(f"{name}: Gemm node {node.name!r} bias shape {C.shape} is "
                                     f"not a bias over its {W.shape[0]} outputs (expected "
                                     f"({W.shape[0]},) or (1, {W.shape[0]}))")
                try:
                    b = np.broadcast_to(C.reshape(-1) if C.size != 1 else C.reshape(()),
                                        (W.shape[0],)).astype(np.float64)
                except ValueError:
                    raise ModelError(f"{name}: Gemm node {node.name!r} bias shape {C.shape} does "
                                     f"not match {W.shape[0]} outputs") from None
                # beta 0: onnxruntime checks C's shape but never reads its values (a NaN /
                # Inf there is not 0 * Inf)
                b = b * beta if beta != 0.0 else np.zeros(W.shape[0])
            dense(W, b, node)
        elif op == "MatMul":
            if node.input[0] != cur:
                raise ModelError(f"{name}: MatMul node {node.name!r} multiplies from the left; "
                                 f"expected x @ W")
            B = const(node.input[1], node)
            if B.ndim != 2:
                raise ModelError(f"{name}: MatMul node {node.name!r} weight has shape {B.shape}")
            dense(B.T.copy(), np.zeros(B.shape[1]), node)
        elif op == "LinearRegressor":
            if attrs.get("post_transform", b"NONE") not in (b"NONE", "NONE"):
                raise ModelError(f"{name}: LinearRegressor node {node.name!r} with post_transform "
                                 f"{attrs['post_transform']!r}; export it without one")
            t = _num(attrs, "targets", 1, node, name)
            if not isinstance(t, (int, np.integer)):
                raise ModelError(f"{name}: LinearRegressor node {node.name!r} attribute targets "
                                 f"is {t!r}, expected an integer")
            coef = _nums(attrs, "coefficients", [], node, name)
            if t < 1 or coef.size == 0 or coef.size % t:
                raise ModelError(f"{name}: LinearRegressor node {node.name!r} has {coef.size} "
                                 f"coefficients for {t} targets")
            W = coef.reshape(t, -1)
            b = _nums(attrs, "intercepts", [0.0] * t, node, name)
            if b.size != t:
                raise ModelError(f"{name}: LinearRegressor node {node.name!r} has {b.size} "
                                 f"intercepts for {t} targets")
            dense(W, b, node)
        elif op == "LinearClassifier":
            if len(node.output) != 2:
                raise ModelError(f"{name}: LinearClassifier node {node.name!r} without its scores "
                                 f"output")
            if attrs.get("classlabels_ints") and attrs.get("classlabels_strings"):
                # the spec allows one of the two; with both, the class count is two numbers
                raise ModelError(f"{name}: LinearClassifier node {node.name!r} has both "
                                 f"classlabels_ints and classlabels_strings; a classifier gives "
                                 f"one")
            labels = attrs.get("classlabels_ints", attrs.get("classlabels_strings", []))
            coef = _nums(attrs, "coefficients", [], node, name)
            b = _nums(attrs, "intercepts", [], node, name)
            n_cls = len(labels)
            rows = b.size
            if rows < 1 or coef.size == 0 or coef.size % rows:
                raise ModelError(f"{name}: LinearClassifier node {node.name!r} has {coef.size} "
                                 f"coefficients for {rows} intercepts")
            if rows != n_cls:
                # onnxruntime's one-row binary case writes scores fastpath does not reproduce
                raise ModelError(f"{name}: LinearClassifier node {node.name!r} has {rows} rows of "
                                 f"coefficients for {n_cls} classes; export one row per class "
                                 f"(skl2onnx does)")
            dense(coef.reshape(rows, -1), b, node)
            try:
                pt = _s(attrs.get("post_transform", b"NONE"))
            except ModelError as exc:
                raise ModelError(f"{name}: LinearClassifier node {node.name!r}: {exc}") from None
            if pt == "LOGISTIC":
                layers[-1][2] = "sigmoid"
                layers[-1][3] = True
            elif pt == "SOFTMAX":
                post = "softmax"
            elif pt == "NONE":
                scores.append(node)
            elif pt != "NONE":
                raise ModelError(f"{name}: LinearClassifier node {node.name!r} post_transform "
                                 f"{pt} is not supported (NONE, LOGISTIC, SOFTMAX are)")
            out_name = node.output[1]
        elif op == "BatchNormalization":
            # opset 15 lets the scale / bias and mean / var be other float types than x
            gamma, beta, mean, var = (const(node.input[i], node, "float").reshape(-1)
                                      for i in range(1, 5))
            eps = float(_num(attrs, "epsilon", 1e-5, node, name))
            # before opset 7 the mode was is_test, default 0: normalized by the batch's own
            # statistics, not the running ones folded here
            if _num(attrs, "training_mode", 0, node, name) or \
                    (opset < 7 and not _num(attrs, "is_test", 0, node, name)):
                raise ModelError(f"{name}: BatchNormalization node {node.name!r} in training mode; "
                                 f"export the model in eval mode (model.eval())")
            sc = gamma / np.sqrt(var + eps)
            affine(sc, beta - mean * sc, node)
            out_name = node.output[0]
        elif op == "Softmax":
            ax = _num(attrs, "axis", -1 if model.opset_import and max(
                (o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                default=13) >= 13 else 1, node, name)
            if post != "none":
                raise ModelError(f"{name}: Softmax node {node.name!r} after the output's {post} "
                                 f"(a second softmax); fastpath serves one output transform")
            if rank == 1 and not reshaped:
                # a rank-1 tensor (a [features] input, no batch axis) has axis 0 only: axis 1
                # (the default before opset 13) is out of range, and onnxruntime fails; axis 0
                # is its features axis, as -1 is (onnxruntime runs it: it was refused here)
                if ax not in (0, -1):
                    raise ModelError(f"{name}: Softmax node {node.name!r} over axis {ax} of "
                                     f"the rank-1 tensor a [features] input makes; give it "
                                     f"axis=-1 (or 0), or declare the input as "
                                     f"[batch, features]")
                ax = -1
            # after the last layer's activation too: the engine runs the activation, then
            # the softmax (Model.to_onnx writes a relu / tanh / sigmoid last layer so, as
            # torch exports Linear -> ReLU -> Softmax)
            if ax not in (1, -1) or not layers or pending is not None:
                raise ModelError(f"{name}: Softmax node {node.name!r} must come right after the "
                                 f"last dense layer (or its activation), over axis 1")
            if any(n.op_type in ("Gemm", "MatMul", "LinearRegressor", "LinearClassifier")
                   for n in nodes[idx + 1:]):
                raise ModelError(f"{name}: unsupported ONNX op 'Softmax' (node {node.name!r}) "
                                 f"between layers; fastpath supports a softmax only as the "
                                 f"model's last step (classifier probabilities)")
            layers[-1][3] = True
            post = "softmax"
        elif op == "Concat":
            raise ModelError(f"{name}: Concat node {node.name!r} is supported only as the "
                             f"[1 - p, p] of a binary classifier")
        else:  # activation
            tail = logistic2_after_activation(node, idx) if op == "Sigmoid" and layers and \
                layers[-1][3] else None
            if tail is not None:
                # the activation stays; the Sigmoid, 1 - p and the Concat are the post
                post = "logistic2"
                skip.update(id(n) for n in tail)
                cur = tail[1].output[0]
                continue
            if not layers or layers[-1][3] or pending is not None or post != "none":
                raise ModelError(f"{name}: {op} node {node.name!r} must follow a dense layer "
                                 f"(Gemm or MatMul), and only one activation per layer")
            layers[-1][2] = _ACT[op]
            layers[-1][3] = True
        cur = out_name
        if op in ("Cast", "Scaler", "LinearRegressor", "LinearClassifier", "Normalizer"):
            cur_dt = np.dtype(np.float32)       # what these write (Cast: only to float)
    if cur != target:
        raise ModelError(f"{name}: the chain ends at {cur!r}, not at the graph output {target!r}")
    if not layers:
        raise ModelError(f"{name}: no Gemm or MatMul layer found")
    k = layers[0][0].shape[1]
    if n_in and k != n_in:
        raise ModelError(f"{name}: the graph input has {n_in} features but the first layer "
                         f"reads {k}; onnxruntime cannot run this model on its own input")
    for w, rn in need_in:
        if w != k:
            raise ModelError(f"{name}: Reshape node {rn.name!r} makes rows of {w} features but "
                             f"the first layer reads {k}; onnxruntime would change the rows")
    if pending is not None:
        raise ModelError(f"{name}: elementwise ops after the last layer's activation cannot be "
                         f"folded into a dense layer")
    # class probabilities: a softmax / logistic2 output, or a LinearClassifier's sigmoids.
    # A LinearClassifier without a post transform (RidgeClassifier, LinearSVC) writes decision
    # scores, unbounded: read as probabilities by a classifier head they made signals of
    # +-4 and confidences above 1 ("scores" names such a node; Model.from_onnx asks for a head)
    classifier = post != "none" or any(n.op_type == "LinearClassifier" for n in nodes)
    if post != "none":
        scores.clear()
    return {"layers": tuple((w, b, act) for w, b, act, _ in layers), "post": post,
            "output": target, "classifier": classifier and not scores,
            "scores": scores[0].name if scores else None, "producer": model.producer_name,
            "input": lead.result(k, name), "metadata": props}


_TREE_OPS = ("TreeEnsembleRegressor", "TreeEnsembleClassifier")
_ML_OPS = ("Scaler", "LinearRegressor", "LinearClassifier", "Normalizer") + _TREE_OPS
# what may stand before or after a tree ensemble without changing a float: the exporters
# write these around it
_TREE_NOOPS = ("Cast", "Identity", "Reshape", "Flatten")
_MODES = {"BRANCH_LEQ": 0, "BRANCH_LT": 1, "BRANCH_GTE": 2, "BRANCH_GT": 3, "BRANCH_EQ": 4,
          "BRANCH_NEQ": 5, "LEAF": 6}


def _s(v) -> str:
    """A string attribute (onnx hands them over as bytes); damaged bytes are a ModelError."""
    if not isinstance(v, bytes):
        return str(v)
    try:
        return v.decode()
    except UnicodeDecodeError:
        raise ModelError(f"a string attribute holds {v[:40]!r}, which is not UTF-8 text "
                         f"(a damaged file?)") from None


def _inexact_before_trees(op: str, step: tuple, lead: "_Lead") -> str:
    """Why the step (offset, scale) of an op before a tree ensemble, taken into the input map
    lead, would not give the very float32 values onnxruntime's ops give, or "". The feature
    stage runs one (x - offset) * scale; onnxruntime rounds after each op. One shift then one
    scale is the same pair of roundings (c - x is (x - c) * -1: negation is exact), but two
    nonzero shifts (or two scales other than +-1) are summed (multiplied) here and rounded
    once, and x / c is x * (1 / c), where 1 / c is rounded unless c is a power of 2. Before
    dense layers such an ulp is noise; before a tree it decides a branch at a threshold."""
    off, sc = step
    if op == "Div":
        recip = np.asarray(sc, np.float64)          # 1 / c, as _lead_step took it
        c = 1.0 / recip
        if not (np.all(recip.astype(np.float32).astype(np.float64) == recip)
                and np.all(c * recip == 1.0)):
            return (f"x / c by a constant whose reciprocal is not exact in float32 (c = "
                    f"{float(np.ravel(c)[0]):g}...) is run as x * (1 / c)")
    if off is not None and np.any(np.asarray(off) != 0) and lead.stage \
            and np.any(np.asarray(lead.offset) != 0):
        return "a second shift of the input is added to the first and run as one"
    if sc is not None and np.any(np.abs(np.asarray(sc)) != 1) and lead.stage == 2 \
            and np.any(np.abs(np.asarray(lead.scale)) != 1):
        return "a second scale of the input is multiplied into the first and run as one"
    return ""


def _read_trees(nodes: list, inp: str, target: str, name: str, n_in: int, consts: dict,
                rank: int = 2):
    """The chain input -> no-ops -> one tree ensemble -> no-ops -> target, read into a
    TreeEnsemble by onnxruntime's reading of the attributes: a tree is the nodes sharing a
    tree id, its root the first of them; children and leaf weights are (tree id, node id).
    Returns (the ensemble, its input map (offset, scale) or None): a Scaler or elementwise
    Sub / Add / Mul / Div by constants before the ensemble (skl2onnx writes a pipeline's
    StandardScaler so) is the model's input map, run by the feature stage in float32 with
    onnxruntime's ops, so the ensemble compares the values onnxruntime compares."""
    cur, ens = inp, None
    lead = _Lead()
    reshapes: list = []     # (shape, node, after the ensemble): checked once widths are known
    for node in nodes:
        op = node.op_type
        if op in _TREE_OPS:
            if ens is not None:
                raise ModelError(f"{name}: more than one tree ensemble on the output's path; "
                                 f"fastpath serves one ensemble per model")
            if not node.input or node.input[0] != cur:
                raise ModelError(f"{name}: {op} node {node.name!r} does not read the model input")
            if rank > 2 and not any(n.op_type in ("Flatten", "Reshape") for n in
                                    nodes[:nodes.index(node)]):
                # onnxruntime's ensemble reads rows of a 2-d input and refuses others: the
                # features of a (batch, a, b) input are a * b values only once flattened
                raise ModelError(f"{name}: {op} node {node.name!r} reads the rank-{rank} model "
                                 f"input; a tree ensemble reads (batch, features): flatten the "
                                 f"input first")
            ens = node
            cur = node.output[-1] if op == "TreeEnsembleClassifier" else node.output[0]
            if op == "TreeEnsembleClassifier" and len(node.output) < 2:
                raise ModelError(f"{name}: {op} node {node.name!r} has no probabilities output")
            continue
        if op in ("Mul", "Div") and len(node.input) == 2 and cur in node.input and ens is not None:
            # onnxmltools multiplies LightGBM's probabilities by a constant 1
            other = node.input[1] if node.input[0] == cur else node.input[0]
            c = consts.get(other)
            if op == "Div" and other != node.input[1]:
                c = None
            if c is not None and np.asarray(c).size and np.all(np.asarray(c, np.float64) == 1.0):
                cur = node.output[0]
                continue
        if ens is None and op in ("Scaler", "Sub", "Add", "Mul", "Div") and node.input \
                and cur in node.input and (op != "Scaler" or node.input[0] == cur):
            _no_twice(node, name)
            if op == "Scaler":
                try:
                    a = _attrs(node)
                except ModelError as exc:
                    raise ModelError(f"{name}: {exc}") from None
                step = _scaler_attrs(a, node, name)
            else:
                first = node.input[0] == cur
                other = node.input[1] if first else node.input[0]
                if len(node.input) != 2 or other not in consts:
                    raise ModelError(f"{name}: node {node.name!r} ({op}) before the tree "
                                     f"ensemble needs a constant operand")
                c = np.asarray(consts[other])
                if c.dtype != np.float32:
                    raise ModelError(f"{name}: node {node.name!r} ({op}) constant {other!r} is "
                                     f"{c.dtype}; fastpath reads a float32 graph (onnxruntime "
                                     f"refuses mixed element types)")
                c = c.astype(np.float64)
                if op == "Div" and (not first or np.any(c == 0)):
                    raise ModelError(f"{name}: Div node {node.name!r} is not x / nonzero constant")
                step = _lead_step(op, first, c)
            s, o = _flat_elementwise(1.0 if step[1] is None else step[1],
                                     0.0 if step[0] is None else step[0], node, name)
            why = _inexact_before_trees(op, step, lead)
            if why:
                raise ModelError(f"{name}: {op} node {node.name!r} before the tree ensemble: "
                                 f"{why}, which rounds otherwise than onnxruntime's ops one by "
                                 f"one, and a value that lands on the other side of a split's "
                                 f"threshold takes the other branch; export the scaler as one "
                                 f"Scaler (or one Sub / Add then one Mul, or Div by a power of "
                                 f"2)")
            if not lead.take(None if step[0] is None else o, None if step[1] is None else s):
                raise ModelError(f"{name}: {op} node {node.name!r} before the tree ensemble "
                                 f"shifts the input after scaling it (or does not match the "
                                 f"width of the ops before it); fastpath reads the ensemble's "
                                 f"input map as (x - offset) * scale: export the scaler alone "
                                 f"(a Scaler, or Sub then Mul / Div)")
            cur = node.output[0]
            continue
        if op not in _TREE_NOOPS or not node.input or node.input[0] != cur:
            hint = f"; {_INSTEAD[op]}" if op in _INSTEAD else ""
            raise ModelError(f"{name}: op {op} (node {node.name!r}) next to a tree ensemble is "
                             f"not supported; fastpath reads a tree ensemble with only Cast / "
                             f"Identity / Reshape / Flatten around it{hint}")
        if op == "Cast":
            to = _attrs(node).get("to")
            if to not in (_FLOAT, 11):      # float, double: the values pass unchanged
                raise ModelError(f"{name}: Cast node {node.name!r} to type {to} next to a tree "
                                 f"ensemble; only casts to float / double are no-ops")
        if op == "Reshape":
            if len(node.input) != 2 or node.input[1] not in consts:
                raise ModelError(f"{name}: Reshape node {node.name!r} needs a constant shape")
            shape = np.asarray(consts[node.input[1]])
            if shape.dtype.kind not in "iu":
                raise ModelError(f"{name}: Reshape node {node.name!r} shape is {shape.dtype}, "
                                 f"expected int64")
            shape = shape.astype(np.int64).reshape(-1)
            if _attrs(node).get("allowzero") and 0 in shape.tolist():
                raise ModelError(f"{name}: Reshape node {node.name!r} with allowzero=1 to "
                                 f"{shape.tolist()} makes an empty tensor")
            reshapes.append((shape, node, ens is not None))
        cur = node.output[0]
    if ens is None or cur != target:
        raise ModelError(f"{name}: the tree ensemble's chain ends at {cur!r}, not at the graph "
                         f"output {target!r}")
    # an attribute given twice (nodes_values twice: onnxruntime refuses the node; the reader
    # kept the last copy)
    _no_twice(ens, name)
    try:
        a = _attrs(ens)
    except ModelError as exc:
        raise ModelError(f"{name}: {exc}") from None
    what = f"{name}: {ens.op_type} node {ens.name!r}"

    def seq(key, kind):
        # a damaged file can hold an attribute of another type under a known name (one
        # float for a list of ints, a tensor for a list of strings): name it, not TypeError
        v = a[key]
        ok = isinstance(v, (list, tuple)) and all(
            isinstance(x, kind) and not isinstance(x, bool) for x in v)
        if not ok:
            raise ModelError(f"{what}: attribute {key} is {type(v).__name__} "
                             f"{str(v)[:60]}, expected a list of "
                             f"{'/'.join(k.__name__ for k in kind)}")
        return list(v)

    def ints(key, required=True):
        if a.get(key) is None:
            if required:
                raise ModelError(f"{what} has no {key} attribute")
            return None
        return np.asarray(seq(key, (int,)), dtype=np.int64)

    def floats(key):
        if key in a and key + "_as_tensor" in a:
            # two sources of one list: onnxruntime refuses the node; reading either one would
            # serve a model it never ran
            raise ModelError(f"{what} has both {key} and {key}_as_tensor; a node gives one of "
                             f"them (as onnxruntime requires)")
        if key in a:
            return np.asarray(seq(key, (int, float)), dtype=np.float64)
        tkey = key + "_as_tensor"
        if tkey in a:
            t = _tensor(a[tkey], f"{what} attribute {tkey}")
            if t.dtype != np.float32:
                # onnxruntime refuses a double tensor here for a float input, and rounding one
                # to float would move splits: the thresholds must be what the runtime reads
                raise ModelError(f"{what}: {tkey} holds {t.dtype}; fastpath serves float32 "
                                 f"models, export the ensemble for float inputs")
            return np.asarray(t, np.float64).reshape(-1)
        return None

    treeids, nodeids = ints("nodes_treeids"), ints("nodes_nodeids")
    feats, tids, fids = ints("nodes_featureids"), ints("nodes_truenodeids"), ints("nodes_falsenodeids")
    try:
        modes = [_s(m) for m in seq("nodes_modes", (bytes, str))] if "nodes_modes" in a else []
        agg = _s(a.get("aggregate_function", "SUM"))
        post = _s(a.get("post_transform", "NONE"))
    except ModelError as exc:
        raise ModelError(f"{what}: {exc}") from None
    vals = floats("nodes_values")
    n = treeids.size
    if vals is None:
        # onnxruntime refuses a node without thresholds (even one of leaves only); zeros in
        # their place would split every node at 0
        raise ModelError(f"{what} has no nodes_values (or nodes_values_as_tensor): the split "
                         f"thresholds are missing")
    # onnxruntime tracks a missing value to the true branch where this is exactly 1 (not any
    # nonzero value): 2 or -1 send a NaN down the comparison like 0
    miss = ints("nodes_missing_value_tracks_true", required=False)
    if miss is None or miss.size == 0:
        miss = np.zeros(n, np.int64)
    for k, arr in (("nodes_nodeids", nodeids), ("nodes_featureids", feats),
                   ("nodes_truenodeids", tids), ("nodes_falsenodeids", fids),
                   ("nodes_modes", modes), ("nodes_values", vals),
                   ("nodes_missing_value_tracks_true", miss)):
        if len(arr) != n:
            raise ModelError(f"{what}: {k} has {len(arr)} values, nodes_treeids {n}")
    bad = [m for m in modes if m not in _MODES]
    if bad:
        raise ModelError(f"{what}: node mode {bad[0]!r} unknown; expected one of {tuple(_MODES)}")
    clf = ens.op_type == "TreeEnsembleClassifier"
    pre = "class" if clf else "target"
    wt_tree, wt_node, wt_id = ints(f"{pre}_treeids"), ints(f"{pre}_nodeids"), ints(f"{pre}_ids")
    wv = floats(f"{pre}_weights")
    if wv is None or not (wt_tree.size == wt_node.size == wt_id.size == wv.size):
        raise ModelError(f"{what}: the {pre}_treeids / _nodeids / _ids / _weights attributes "
                         f"are missing or of different lengths")
    if clf:
        labels = [seq(k, (int, bytes, str)) for k in ("classlabels_int64s", "classlabels_strings")
                  if a.get(k)]
        if len(labels) > 1:
            # the spec allows one of the two; with both, the class count is two numbers
            raise ModelError(f"{what} has both classlabels_int64s ({len(labels[0])}) and "
                             f"classlabels_strings ({len(labels[1])}); a classifier gives one")
        labels = labels[0] if labels else None
        if not labels:
            raise ModelError(f"{what} has no class labels")
        n_targets = len(labels)
    else:
        n_targets = _num(a, "n_targets", 1, ens, name)
        if not isinstance(n_targets, (int, np.integer)):
            # an int attribute: 2.5 is damage (onnxruntime refuses it), not a count to round
            raise ModelError(f"{what}: attribute n_targets is {n_targets!r}, expected an integer")
        n_targets = int(n_targets)
    base = floats("base_values")
    base = np.zeros(0) if base is None else base
    # trees in order of first appearance, nodes re-indexed per tree
    order: dict = {}
    for i, t in enumerate(treeids.tolist()):
        order.setdefault(t, []).append(i)
    tree_list = list(order)
    if n and int(np.count_nonzero(treeids[1:] != treeids[:-1])) + 1 != len(tree_list):
        # onnxruntime starts a new tree wherever the tree id changes: a tree whose nodes come
        # back after another tree's is two trees there (two interleaved stumps whose leaves
        # add to 11 answered 44), one here. Refused rather than read either way.
        runs = np.flatnonzero(np.r_[True, treeids[1:] != treeids[:-1]])
        seen: set = set()
        for r in runs.tolist():
            t = int(treeids[r])
            if t in seen:
                raise ModelError(f"{what}: the nodes of tree id {t} are not listed together "
                                 f"(node {r} of the list returns to it after another tree's "
                                 f"nodes); onnxruntime reads each run of one tree id as a tree "
                                 f"of its own: list each tree's nodes together")
            seen.add(t)
    perm = np.concatenate([np.asarray(order[t], np.int64) for t in tree_list]) if n else \
        np.zeros(0, np.int64)
    offsets = np.zeros(len(tree_list) + 1, np.int64)
    local: dict = {}
    for k, t in enumerate(tree_list):
        idx = order[t]
        offsets[k + 1] = offsets[k] + len(idx)
        loc = {}
        for j, i in enumerate(idx):
            nid = int(nodeids[i])
            if nid in loc:
                raise ModelError(f"{what}: tree {t} has node id {nid} twice")
            loc[nid] = j
        local[t] = loc
    mode_a = np.asarray([_MODES[modes[i]] for i in perm], np.int32)
    tc = np.zeros(n, np.int64)
    fc = np.zeros(n, np.int64)
    for g, i in enumerate(perm.tolist()):
        if mode_a[g] == 6:
            tc[g] = fc[g] = -1
            continue
        loc = local[int(treeids[i])]
        for arr, ref, which in ((tc, tids, "true"), (fc, fids, "false")):
            r = int(ref[i])
            if r not in loc:
                raise ModelError(f"{what}: tree {int(treeids[i])} node {int(nodeids[i])} has "
                                 f"{which} child {r}, which is not a node of that tree")
            arr[g] = loc[r]
    gidx = {}
    for k, t in enumerate(tree_list):
        for nid, j in local[t].items():
            gidx[(t, nid)] = int(offsets[k]) + j
    w_node = np.zeros(wv.size, np.int64)
    for k, (t, nid) in enumerate(zip(wt_tree.tolist(), wt_node.tolist())):
        g = gidx.get((t, nid))
        if g is None:
            raise ModelError(f"{what}: a leaf weight names tree {t} node {nid}, which does not "
                             f"exist")
        w_node[k] = g
    # a node two splits point to (onnxmltools' LightGBM categorical split) is copied per path
    offsets, mode_a, tc, fc, perm, w_node, w_src = _unshare(offsets, mode_a, tc, fc, perm, w_node,
                                                           what, tree_list, nodeids, feats, miss)
    wt_id, wv = wt_id[w_src], wv[w_src]
    if not n_in:
        # the input's width left open: a Reshape to (batch, k) before the ensemble says it
        # (rows of k features, checked below like a declared width); the ensemble's highest
        # feature index is only a lower bound
        n_in = next((int(s[1]) for s, _rn, after in reshapes
                     if not after and len(s) == 2 and s[0] in (-1, 0, 1) and s[1] > 0), 0)
    if not n_in and lead.stage and (np.ndim(lead.offset) or np.ndim(lead.scale)):
        # a per-feature scaler says the input's width (onnxruntime broadcasts it against
        # the rows, so they are that wide); the ensemble may split on fewer of them
        n_in = int(np.broadcast(lead.offset, lead.scale).shape[0])
    n_feat = n_in if n_in else _n_features(feats, mode_a, perm)
    for shape, rn, after in reshapes:
        w = n_targets if after else n_in
        if not _reshape_noop(shape, w):
            raise ModelError(f"{name}: Reshape node {rn.name!r} to {shape.tolist()} "
                             f"{'after' if after else 'before'} the tree ensemble is not a "
                             f"(batch, {'outputs' if after else 'features'}) no-op on a "
                             f"{w or '?'}-wide row; onnxruntime would change the rows")
    try:
        ens_out = TreeEnsemble(n_feat, n_targets, offsets, mode_a, feats[perm],
                               vals[perm].astype(np.float32),
                               tc, fc, (miss[perm] == 1).astype(np.uint8), w_node, wt_id,
                               wv.astype(np.float32), base.astype(np.float32), agg, post, clf)
        return ens_out, lead.result(ens_out.n_features, name)
    except ModelError as exc:
        raise ModelError(f"{what}: {_file_ids(str(exc), tree_list, offsets, nodeids, perm)}") \
            from None


# how many nodes the trees of one ensemble may unfold into (_unshare): a real export's shared
# subtrees copy to a few times its size; a crafted chain of splits whose two children are the
# same node doubles the paths at each one. The leaf weights copied with them are capped the
# same: a leaf carries any number of weights, so a 1.6 KB file (20 such splits above one leaf
# of 64 weights: 2^20 paths, 67 M weight copies) passed the node cap and ran Model.from_onnx
# out of memory (MemoryError at 3.7 GB), where it is refused now before anything is copied
_MAX_UNFOLDED_NODES = 1 << 22
_MAX_UNFOLDED_WEIGHTS = 1 << 22


def _unshare(offsets, mode_a, tc, fc, perm, w_node, what: str, tree_list: list, nodeids,
             feats, miss):
    """Trees whose nodes are reached by more than one split, unfolded into trees. onnxmltools
    writes a LightGBM categorical split as a chain of BRANCH_EQ nodes (one per category sent
    left) whose true children are all one node; onnxruntime follows node ids, so every path
    into that node runs its subtree. A copy of the subtree per path (its leaf weights with it,
    in their listed order) runs the same comparisons and adds the same leaves. A tree with a
    cycle or an unreachable node is left as it is, for TreeEnsemble to refuse and name.
    onnxruntime 1.32 runs such a chain (BRANCH_EQ on one feature, one true child, each next
    one the false child of the one before) as one set-membership test whose missing-value
    track is the first node's: a later node tracking NaN to the true branch is ignored
    there (nodes 0, 1, 2 on categories 1, 2, 5 with only node 2's track true sent a NaN
    false, where the nodes one by one send it true). Such a chain is refused.
    Returns the new (offsets, mode, tc, fc, perm, w_node) and, per new weight, the index of
    the weight it copies."""
    n = int(offsets[-1])
    w_src = np.arange(w_node.size)
    start = np.repeat(offsets[:-1], np.diff(offsets))
    inner = mode_a != 6
    indeg = np.bincount(np.concatenate([(start + tc)[inner], (start + fc)[inner]]), minlength=n)
    if not np.any(indeg > 1):
        return offsets, mode_a, tc, fc, perm, w_node, w_src
    tree_of = np.searchsorted(offsets, np.flatnonzero(indeg > 1), side="right") - 1
    shared = set(tree_of.tolist())
    new_off, srcs, ntcs, nfcs = [0], [], [], []
    copies: list = [[] for _ in range(n)]       # old global node -> its new global nodes
    n_w = np.bincount(w_node, minlength=n).tolist()     # weights on each node
    total = total_w = 0
    for t in range(offsets.size - 1):
        lo, hi = int(offsets[t]), int(offsets[t + 1])
        sizes = _unfolded_size(lo, hi, mode_a, tc, fc, n_w) if t in shared else None
        size = None if sizes is None else sizes[0]
        if size is None:
            # untouched (or left for TreeEnsemble to refuse): the same nodes, in order
            src = list(range(lo, hi))
            ltc, lfc = tc[lo:hi].tolist(), fc[lo:hi].tolist()
        else:
            for i in range(hi - lo):
                p = lo + i
                if mode_a[p] != 4 or mode_a[lo + int(fc[p])] != 4:
                    continue
                q = lo + int(fc[p])
                if tc[q] == tc[p] and feats[perm[q]] == feats[perm[p]] and miss[perm[q]] == 1 \
                        and miss[perm[p]] != 1:
                    raise ModelError(f"{what}: tree id {tree_list[t]} node id "
                                     f"{int(nodeids[perm[q]])} continues a chain of BRANCH_EQ "
                                     f"splits with one true child (node id "
                                     f"{int(nodeids[perm[p]])} before it) and tracks a missing "
                                     f"value to the true branch where the node before it does "
                                     f"not; onnxruntime reads the chain as one set-membership "
                                     f"test with the first node's missing-value track, which "
                                     f"fastpath does not reproduce: give the chain's nodes one "
                                     f"missing-value track")
            total += size
            total_w += sizes[1]
            if total > _MAX_UNFOLDED_NODES or total_w > _MAX_UNFOLDED_WEIGHTS:
                top = lo + int(np.argmax(indeg[lo:hi]))
                raise ModelError(f"{what}: tree id {tree_list[t]} has nodes shared by several "
                                 f"splits (node id {int(nodeids[perm[top]])} "
                                 f"has {int(indeg[lo:hi].max())} parents); fastpath copies such a "
                                 f"node per path, and the ensemble would unfold into more than "
                                 f"{_MAX_UNFOLDED_NODES} nodes or leaf weights; export fewer "
                                 f"categories per split or smaller trees")
            src, ltc, lfc = [], [], []
            stack = [(0, -1, True)]             # (old local node, new parent, true side)
            while stack:
                i, parent, side = stack.pop()
                j = len(src)
                src.append(lo + i)
                ltc.append(-1)
                lfc.append(-1)
                if parent >= 0:
                    (ltc if side else lfc)[parent] = j
                if mode_a[lo + i] != 6:
                    stack.append((int(fc[lo + i]), j, False))
                    stack.append((int(tc[lo + i]), j, True))
        base = new_off[-1]
        for j, g in enumerate(src):
            copies[g].append(base + j)
        srcs += src
        ntcs += ltc
        nfcs += lfc
        new_off.append(base + len(src))
    src_a = np.asarray(srcs, np.int64)
    # weight k (on old node g) once per copy of g, in the listed order: no tuple per copy
    per = [copies[g] for g in w_node.tolist()]
    w_src = np.repeat(np.arange(w_node.size, dtype=np.int64), [len(c) for c in per])
    w_new = np.fromiter(itertools.chain.from_iterable(per), np.int64, count=w_src.size)
    return (np.asarray(new_off, np.int64), mode_a[src_a], np.asarray(ntcs, np.int64),
            np.asarray(nfcs, np.int64), perm[src_a], w_new, w_src)


def _unfolded_size(lo: int, hi: int, mode_a, tc, fc, n_w):
    """(nodes, leaf weights) of tree [lo, hi) once every node has one parent (a node and its
    n_w[node] weights counted once per path into it), or None when the tree has a cycle or a
    node the root does not reach. Python ints: a crafted tree's counts pass 2^64."""
    m = hi - lo
    size = [0] * m
    wsize = [0] * m
    state = [0] * m             # 0: not seen, 1: on the current path, 2: done
    stack = [(0, False)]
    while stack:
        i, done = stack.pop()
        if done:
            g = lo + i
            if mode_a[g] == 6:
                size[i], wsize[i] = 1, n_w[g]
            else:
                a, b = int(tc[g]), int(fc[g])
                size[i] = 1 + size[a] + size[b]
                wsize[i] = n_w[g] + wsize[a] + wsize[b]
            state[i] = 2
            continue
        if state[i] == 1:
            return None
        if state[i] == 2:
            continue
        state[i] = 1
        stack.append((i, True))
        if mode_a[lo + i] != 6:
            for c in (int(fc[lo + i]), int(tc[lo + i])):
                if state[c] == 1:
                    return None
                if state[c] == 0:
                    stack.append((c, False))
    if 0 in state:
        return None
    return size[0], wsize[0]


def _file_ids(msg: str, tree_list: list, offsets: np.ndarray, nodeids: np.ndarray,
              perm: np.ndarray) -> str:
    """A TreeEnsemble message names trees by position and nodes by index within their tree;
    the file names them by tree id and node id (what its author can look up), and its root is
    the tree's first listed node, which an unreachable node usually means is not the real one."""
    import re

    def sub(m):
        t = int(m.group(1))
        if t >= len(tree_list):
            return m.group(0)
        out = f"tree id {tree_list[t]}"
        if m.group(3) is not None:
            g = int(offsets[t]) + int(m.group(3))
            nid = int(nodeids[perm[g]]) if g < int(offsets[t + 1]) else m.group(3)
            out += f"{m.group(2)} node id {nid}"
        return out
    msg2 = re.sub(r"\btree (\d+)(?:(:?) node (\d+))?", sub, msg)
    if "cannot be reached from the root" in msg:
        t = re.search(r"\btree (\d+)", msg)
        if t and int(t.group(1)) < len(tree_list):
            root = int(nodeids[perm[int(offsets[int(t.group(1))])]])
            msg2 += (f" (a tree's root is its first listed node, here node id {root}: list "
                     f"each tree's root first)")
    return msg2


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
