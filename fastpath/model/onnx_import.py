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
fastpath.model.TreeEnsemble, with the input map before it. Anything else is refused with
the op and node named and what to export instead. It returns plain arrays, not Layer objects
(Model.from_onnx, in onnx_load, builds the Layers).

The reader is in four parts below this module: onnx_graph (loading the file, attributes,
the output served and the nodes it needs), onnx_fold (constant folding, the affine maps and
the input map), onnx_dense (the walk over a dense graph, one method per op) and onnx_trees
(tree ensembles).
"""
from __future__ import annotations

import os

from fastpath.errors import ModelError
from fastpath.model.onnx_dense import _DenseReader
from fastpath.model.onnx_fold import _read_constants
from fastpath.model.onnx_graph import (_TREE_OPS, SUPPORTED, _check_domains, _check_ssa,
                                       _declared_width, _input_rank, _input_width, _load,
                                       _pick_output, _slice, _tensor)
from fastpath.model.onnx_trees import _read_trees

__all__ = ["SUPPORTED", "read_onnx", "layers_from_onnx"]


def read_onnx(path: str | os.PathLike) -> dict:
    """{"layers": ((weight, bias, activation), ...), "post": "none" | "softmax" | "logistic2",
    "output": the graph output served, "classifier": whether it holds class probabilities,
    "producer": who wrote the file, "input": (offset, scale) float64 vectors of the input
    map y = (x - offset) * scale, or None, "metadata": the file's metadata_props as (key,
    value) pairs}; a tree ensemble: "trees" instead of "layers"."""
    name, model = _load(path)
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
    folded = _read_constants(g, consts, name)
    target = _pick_output(g, name)
    nodes = _slice(g, target)
    _check_domains(nodes, name)
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
    return _DenseReader(model, name, inputs[0], nodes, consts, folded).read(target, props)


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
