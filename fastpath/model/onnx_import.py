"""ONNX -> the dense layers of an MLP, as (weight, bias, activation). Needs the optional `onnx` package (pip install 'fastpath[onnx]').

Design: walk the graph's nodes in order (ONNX requires topological order),
following the single activation tensor from the graph input to the graph
output; weights must be initializers or Constant nodes. Anything that is not
one dense layer after another with an optional activation is refused with the
op and node named, never approximated. It returns plain arrays, not Layer objects, so
it depends on nothing in fastpath but the errors (Model.from_onnx builds the Layers).
"""
from __future__ import annotations

import os

import numpy as np

from fastpath.errors import ModelError

SUPPORTED = ("Gemm", "MatMul", "Add", "Relu", "Tanh", "Sigmoid", "Flatten", "Identity", "Constant")
_ACT = {"Relu": "relu", "Tanh": "tanh", "Sigmoid": "sigmoid"}


def _attrs(node) -> dict:
    from onnx import helper
    try:
        return {a.name: helper.get_attribute_value(a) for a in node.attribute}
    except Exception as exc:  # noqa: BLE001 - onnx raises ValueError/TypeError on malformed attrs
        raise ModelError(f"node {node.name!r} ({node.op_type}) has a malformed attribute "
                         f"({type(exc).__name__}: {exc})") from None


def _num(attrs: dict, key: str, default, node, name: str):
    """A numeric attribute, or a ModelError naming the node when it has another type."""
    v = attrs.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or v != v:
        raise ModelError(f"{name}: node {node.name!r} ({node.op_type}) attribute {key} is "
                         f"{v!r}, expected a number")
    return v


def _tensor(t, what: str) -> np.ndarray:
    from onnx import numpy_helper
    if type(t).__name__ != "TensorProto":
        raise ModelError(f"{what} is a {type(t).__name__}, expected a tensor")
    try:
        return numpy_helper.to_array(t)
    except Exception as exc:  # noqa: BLE001 - malformed tensors raise several types
        raise ModelError(f"{what} is not a readable tensor ({type(exc).__name__}: {exc})") from None


def layers_from_onnx(path: str | os.PathLike) -> tuple:
    """((weight (out, in) float64, bias (out,), activation name), ...) in graph order."""
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
        raise ModelError(f"{name} is not a readable ONNX model ({type(exc).__name__}: {exc})") from None
    g = model.graph
    consts = {t.name: _tensor(t, f"{name}: initializer {t.name!r}") for t in g.initializer}
    inputs = [i.name for i in g.input if i.name not in consts]
    if len(inputs) != 1:
        raise ModelError(f"{name}: expected one graph input, found {inputs}")
    if len(g.output) != 1:
        raise ModelError(f"{name}: expected one graph output, found {[o.name for o in g.output]}")
    cur = inputs[0]
    # pending layers: [weight (out, in), bias (out,), activation]
    layers: list = []

    def const(tname: str, node) -> np.ndarray:
        if tname not in consts:
            raise ModelError(f"{name}: node {node.name!r} ({node.op_type}) needs {tname!r} to be a "
                             f"constant weight; fastpath imports MLPs with constant weights only")
        return np.asarray(consts[tname], dtype=np.float64)

    for node in g.node:
        op = node.op_type
        if op not in SUPPORTED:
            raise ModelError(f"{name}: unsupported ONNX op {op!r} (node {node.name!r}); fastpath "
                             f"imports MLPs built from {', '.join(SUPPORTED[:-1])}")
        n_in = {"Gemm": (2, 3), "MatMul": (2, 2), "Add": (2, 2), "Constant": (0, 0)}.get(op, (1, 1))
        if not n_in[0] <= len(node.input) <= n_in[1] or len(node.output) != 1 or not node.output[0]:
            raise ModelError(f"{name}: node {node.name!r} ({op}) has {len(node.input)} inputs and "
                             f"{len(node.output)} outputs; expected {n_in[0]}-{n_in[1]} inputs and "
                             f"one output")
        if op == "Constant":
            try:
                a = _attrs(node)
            except ModelError as exc:
                raise ModelError(f"{name}: {exc}") from None
            if "value" not in a:
                raise ModelError(f"{name}: Constant node {node.name!r} without a tensor value")
            consts[node.output[0]] = _tensor(a["value"], f"{name}: Constant node {node.name!r}")
            continue
        if not node.input or node.input[0] != cur and not (op in ("Add", "MatMul") and cur in node.input):
            raise ModelError(f"{name}: node {node.name!r} ({op}) does not continue the chain from "
                             f"{cur!r}; fastpath imports sequential MLPs only")
        try:
            attrs = _attrs(node)
        except ModelError as exc:
            raise ModelError(f"{name}: {exc}") from None
        if op in ("Flatten", "Identity"):
            if op == "Flatten" and _num(attrs, "axis", 1, node, name) != 1:
                raise ModelError(f"{name}: Flatten node {node.name!r} with axis != 1")
        elif op == "Gemm":
            a = attrs
            if _num(a, "transA", 0, node, name):
                raise ModelError(f"{name}: Gemm node {node.name!r} with transA=1 is not an MLP layer")
            B = const(node.input[1], node)
            if B.ndim != 2:
                raise ModelError(f"{name}: Gemm node {node.name!r} weight has shape {B.shape}")
            W = (B if _num(a, "transB", 0, node, name) else B.T) * float(_num(a, "alpha", 1.0, node, name))
            b = np.zeros(W.shape[0])
            if len(node.input) > 2 and node.input[2]:
                C = const(node.input[2], node) * float(_num(a, "beta", 1.0, node, name))
                try:
                    b = np.broadcast_to(C.reshape(-1) if C.size != 1 else C.reshape(()),
                                        (W.shape[0],)).astype(np.float64)
                except ValueError:
                    raise ModelError(f"{name}: Gemm node {node.name!r} bias shape {C.shape} does "
                                     f"not match {W.shape[0]} outputs") from None
            layers.append([W, b, "identity", False])
        elif op == "MatMul":
            other = node.input[1] if node.input[0] == cur else None
            if other is None:
                raise ModelError(f"{name}: MatMul node {node.name!r} multiplies from the left; "
                                 f"expected x @ W")
            B = const(other, node)
            if B.ndim != 2:
                raise ModelError(f"{name}: MatMul node {node.name!r} weight has shape {B.shape}")
            layers.append([B.T.copy(), np.zeros(B.shape[1]), "identity", False])
        elif op == "Add":
            other = node.input[1] if node.input[0] == cur else node.input[0]
            if not layers or layers[-1][2] != "identity" or layers[-1][3]:
                raise ModelError(f"{name}: Add node {node.name!r} is not a bias after a MatMul/Gemm")
            C = const(other, node)
            out = layers[-1][0].shape[0]
            try:
                layers[-1][1] = layers[-1][1] + np.broadcast_to(C.reshape(-1) if C.size != 1
                                                                else C.reshape(()), (out,))
            except ValueError:
                raise ModelError(f"{name}: Add node {node.name!r} bias shape {C.shape} does not "
                                 f"match {out} outputs") from None
        else:  # activation
            if not layers or layers[-1][3]:
                raise ModelError(f"{name}: {op} node {node.name!r} must follow a dense layer "
                                 f"(Gemm or MatMul), and only one activation per layer")
            layers[-1][2] = _ACT[op]
            layers[-1][3] = True
        cur = node.output[0]
    if cur != g.output[0].name:
        raise ModelError(f"{name}: the chain ends at {cur!r}, not at the graph output "
                         f"{g.output[0].name!r}")
    if not layers:
        raise ModelError(f"{name}: no Gemm or MatMul layer found")
    return tuple((w, b, act) for w, b, act, _ in layers)
