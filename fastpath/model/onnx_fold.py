"""Constant folding for the ONNX importer: Constant nodes and Identity / Transpose / Cast of a
constant computed here as onnxruntime computes them, elementwise affine ops folded into the
dense layer before or after them, and the leading affine map (_Lead) that becomes the model's
input scaler."""
from __future__ import annotations

import numpy as np

from fastpath.errors import ModelError
from fastpath.model.onnx_graph import _FLOAT, SUPPORTED, _attrs, _no_twice, _tensor

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


def _read_constants(g, consts: dict, name: str) -> set:
    """Every node of the graph checked for its arity, its Constant nodes and the Identity /
    Transpose / Cast of a constant computed into consts; the names of the outputs folded."""
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
    return folded
