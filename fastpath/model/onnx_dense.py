"""Dense ONNX graphs (MLPs, linear and logistic models) read into layers: _DenseReader walks the
served output's nodes in order, following the one activation tensor from the graph input, one
method per op, folding elementwise affine ops into the layers (onnx_fold) and taking the ones
in front of the first layer into the input map."""
from __future__ import annotations

import numpy as np

from fastpath.errors import ModelError
from fastpath.model.onnx_fold import _CONST_FOLD, _flat_elementwise, _fold_in, _fold_out, _Lead, _lead_step
from fastpath.model.onnx_graph import (_ACTIVATIONS_HINT, _FLOAT, _INSTEAD, _TREE_OPS, SUPPORTED,
                                       _attrs, _declared_width, _input_dtype, _input_rank, _no_twice,
                                       _num, _nums, _reshape_noop, _s, _scaler_attrs)

_ACT = {"Relu": "relu", "Tanh": "tanh", "Sigmoid": "sigmoid"}


class _DenseReader:
    """The state of one walk over a dense graph: the layers read so far ([weight (out, in),
    bias (out,), activation, activation_set]), the affine map waiting for the next layer, the
    post transform, and the tensor the chain has reached."""

    def __init__(self, model, name: str, inp: str, nodes: list, consts: dict,
                 folded: set) -> None:
        g = model.graph
        self.model, self.name, self.nodes, self.consts, self.folded = \
            model, name, nodes, consts, folded
        self.cur = inp
        self.n_in = _declared_width(g, inp)
        self.need_in: list = []      # (width, Reshape node) a Reshape before the first layer needs
        # pending layers: [weight (out, in), bias (out,), activation, activation_set]
        self.layers: list = []
        self.pending = None          # (scale, shift) an elementwise affine waiting for the next layer
        self.post = "none"
        self.skip: set = set()
        self.scores: list = []       # LinearClassifier nodes that write decision scores (post NONE)

        # the element type of the tensor the chain carries (None: not declared): a weight of
        # another type (float64 weights beside a float32 input, as numpy arrays make them) is a
        # graph onnxruntime refuses to load, and integer math is not what fastpath computes
        self.cur_dt = _input_dtype(g, inp)
        self.lead = _Lead()
        self.opset = max((o.version for o in self.model.opset_import if o.domain in ("", "ai.onnx")),
                    default=13)
        self.rank = _input_rank(g, inp)
        if self.rank == 0:
            raise ModelError(f"{self.name}: the model input {inp!r} is declared a scalar (no "
                             f"dimensions); a dense model reads [batch, features]")
        self.flat = self.rank <= 2
        self.reshaped = False
        self.sigmoid_of = {n.output[0]: n for n in self.nodes if n.op_type == "Sigmoid" and n.input
                      and n.output}

    def const(self, tname: str, node, weight: str = "same") -> np.ndarray:
        if tname not in self.consts:
            raise ModelError(f"{self.name}: node {node.name!r} ({node.op_type}) needs {tname!r} to be a "
                             f"constant weight; fastpath imports models with constant weights only")
        c = np.asarray(self.consts[tname])
        if c.dtype.kind not in "fiub":
            raise ModelError(f"{self.name}: node {node.name!r} ({node.op_type}) constant {tname!r} is "
                             f"{c.dtype}, expected numbers")
        if weight != "any" and self.cur_dt is not None and self.cur_dt.kind != "f":
            raise ModelError(f"{self.name}: node {node.name!r} ({node.op_type}) computes on the "
                             f"{self.cur_dt} input; fastpath computes in float: give the graph a float "
                             f"input, or Cast it to float first")
        if weight == "same" and self.cur_dt is not None and c.dtype != self.cur_dt:
            raise ModelError(f"{self.name}: node {node.name!r} ({node.op_type}) constant {tname!r} is "
                             f"{c.dtype} but the tensor it meets is {self.cur_dt}; onnxruntime refuses "
                             f"mixed element types: export the weights as {self.cur_dt}")
        if weight == "float" and c.dtype.kind != "f":
            raise ModelError(f"{self.name}: node {node.name!r} ({node.op_type}) constant {tname!r} is "
                             f"{c.dtype}, expected a float tensor")
        return c.astype(np.float64)

    def leading(self, off, sc, node) -> bool:
        """An elementwise step before the first layer, taken into the model's input map
        (run by the feature stage in float32, as onnxruntime runs it, not folded into the
        first layer: in float32 the folded W * scale and b - W * scale * offset cancel for
        price-like inputs); False when it cannot be (after a layer, or a shift after a
        scale), and the caller folds it."""
        if self.layers or self.pending is not None or self.post != "none":
            self.lead.open = False
            return False
        z = np.zeros(())
        s, o = _flat_elementwise(1.0 if sc is None else sc, z if off is None else off, node, self.name)
        return self.lead.take(None if off is None else o, None if sc is None else s, True)

    def affine(self, scale, shift, node) -> None:
        """x -> x * scale + shift on the current tensor: into the last layer's outputs while
        no activation follows it, else held for the next layer's inputs."""
        self.lead.open = False
        scale, shift = _flat_elementwise(scale, shift, node, self.name)
        if self.post != "none":
            raise ModelError(f"{self.name}: {node.op_type} node {node.name!r} after the output's "
                             f"{self.post} is not supported; the probabilities must be the output")
        try:
            if self.layers and not self.layers[-1][3] and self.pending is None:
                _fold_out(self.layers[-1], scale, shift)
            elif self.pending is None:
                self.pending = (scale, shift)
            else:
                self.pending = (self.pending[0] * scale, self.pending[1] * scale + shift)
        except ValueError:
            raise ModelError(f"{self.name}: {node.op_type} node {node.name!r} constant does not match "
                             f"the width of its input") from None

    def dense(self, W: np.ndarray, b: np.ndarray, node) -> None:
        self.lead.open = False
        if self.post != "none":
            raise ModelError(f"{self.name}: {node.op_type} node {node.name!r} after the {self.post} output "
                             f"transform; fastpath serves models whose softmax comes last")
        if self.pending is not None:
            try:
                W, b = _fold_in(W, b, *self.pending)
            except ValueError:
                raise ModelError(f"{self.name}: the elementwise ops before node {node.name!r} do not "
                                 f"match its {W.shape[1]} inputs") from None
            self.pending = None
        self.layers.append([W, b, "identity", False])

    def concat_1p_p(self, cat) -> None:
        """Check the Concat of a binary classifier's [1 - p, p] (axis 1, given)."""
        _no_twice(cat, self.name)
        try:
            cat_a = _attrs(cat)
        except ModelError as exc:
            raise ModelError(f"{self.name}: {exc}") from None
        if "axis" not in cat_a and self.opset >= 4:
            # required since opset 4: onnxruntime cannot load the graph
            raise ModelError(f"{self.name}: Concat node {cat.name!r} has no axis "
                             f"attribute (required since opset 4)")
        if _num(cat_a, "axis", 1, cat, self.name) not in (1, -1):
            raise ModelError(f"{self.name}: Concat node {cat.name!r} not over axis 1")

    def logistic2_after_activation(self, node, idx: int):
        """The Concat that ends p = Sigmoid(z), 1 - p, [1 - p, p] when z is a one-wide layer
        whose activation is already set (Model.to_onnx writes a tanh / relu / sigmoid last
        layer and a logistic2 post so), with the Sub and the Concat to skip; None when the
        Sigmoid is not followed by them (a second activation)."""
        p = node.output[0]
        if not self.layers or self.layers[-1][0].shape[0] != 1 or self.pending is not None or \
                self.post != "none":
            return None
        sub = next((n for n in self.nodes[idx + 1:] if n.op_type == "Sub"
                    and list(n.input[1:]) == [p] and n.input[0] in self.consts), None)
        if sub is None:
            return None
        one = self.const(sub.input[0], sub)
        if one.size != 1 or float(one.reshape(-1)[0]) != 1.0:
            return None
        cat = next((n for n in self.nodes[idx + 1:] if n.op_type == "Concat"
                    and list(n.input) == [sub.output[0], p]), None)
        if cat is None:
            return None
        _no_twice(sub, self.name)
        self.concat_1p_p(cat)
        return sub, cat

    def read(self, target: str, props: list) -> dict:
        """The graph's layers, post transform and input map, as read_onnx returns them."""
        for idx, node in enumerate(self.nodes):
            op = node.op_type
            if id(node) in self.skip or op == "Constant" or \
                    (op in _CONST_FOLD and node.output and node.output[0] in self.folded):
                continue
            cur_rank = self._check_step(node)
            try:
                attrs = _attrs(node)
            except ModelError as exc:
                raise ModelError(f"{self.name}: {exc}") from None
            self.cur = self._step(node, attrs, idx, cur_rank)
            if op in ("Cast", "Scaler", "LinearRegressor", "LinearClassifier", "Normalizer"):
                self.cur_dt = np.dtype(np.float32)       # what these write (Cast: only to float)
        return self._result(target, props)

    def _check_step(self, node) -> int:
        """Refuse a node the walk cannot take here (an op fastpath does not run, a layer on
        an unflattened input, a chain that forks); the rank of the tensor it reads."""
        op = node.op_type
        if op == "Mul" and len(node.input) == 2:
            # x * sigmoid(x): nn.SiLU as both torch exporters write it; it was refused as a
            # Mul whose "weight" was not a constant, which named no activation
            for a_in, b_in in (node.input, node.input[::-1]):
                sig = self.sigmoid_of.get(b_in)
                if sig is not None and sig.input[0] == a_in:
                    raise ModelError(f"{self.name}: nodes {sig.name!r} (Sigmoid) and {node.name!r} "
                                     f"(Mul) compute x * sigmoid(x), SiLU / Swish, which is not "
                                     f"an activation fastpath runs; {_ACTIVATIONS_HINT}")
        if op not in SUPPORTED:
            hint = _INSTEAD.get(op, "fastpath imports dense models (MLPs, linear and logistic "
                                    "models) built from " + ", ".join(SUPPORTED[:-1]) +
                                " and tree ensembles (" + " / ".join(_TREE_OPS) + ")")
            raise ModelError(f"{self.name}: unsupported ONNX op {op!r} (node {node.name!r}); {hint}")
        # the rank of the tensor a Flatten here reads: a Reshape or Flatten before it made it
        # (batch, features)
        cur_rank = 2 if self.reshaped else self.rank
        if op in ("Flatten", "Reshape"):
            self.flat = True
            self.reshaped = True
        if op in ("Gemm", "MatMul", "LinearRegressor", "LinearClassifier") and not self.flat:
            # a rank-3 input reaches the layer unflattened: Gemm refuses it, MatMul multiplies
            # each inner row apart; neither is the (batch, features) layer read here
            raise ModelError(f"{self.name}: {op} node {node.name!r} reads the rank-{self.rank} model "
                             f"input; a dense layer reads (batch, features): flatten the input "
                             f"first")
        if op in ("Gemm", "Add", "Sub", "Mul", "Div") and self.opset < 7:
            # these broadcast by a `broadcast` / `axis` attribute before opset 7 (an axis-0
            # constant is per row, not per feature), and onnxruntime has no kernel for them
            raise ModelError(f"{self.name}: {op} node {node.name!r} of opset {self.opset}: before opset 7 "
                             f"its broadcasting differs and onnxruntime cannot run it; export "
                             f"with opset 7 or later")
        binary = op in ("Add", "Sub", "Mul", "Div", "MatMul")
        if not node.input or node.input[0] != self.cur and not (binary and self.cur in node.input):
            raise ModelError(f"{self.name}: node {node.name!r} ({op}) does not continue the chain from "
                             f"{self.cur!r}; fastpath imports sequential models only")
        _no_twice(node, self.name)
        return cur_rank

    def _step(self, node, attrs: dict, idx: int, cur_rank: int) -> str:
        """Take one node into the model; the tensor the chain continues from."""
        op = node.op_type
        if op in ("Flatten", "Identity"):
            self._flatten(node, attrs, cur_rank)
        elif op == "Cast":
            if attrs.get("to") != _FLOAT:
                raise ModelError(f"{self.name}: Cast node {node.name!r} casts to type {attrs.get('to')}; "
                                 f"fastpath computes in float32: export with float inputs")
        elif op == "Reshape":
            self._reshape(node, attrs)
        elif op == "Normalizer":
            if self.post != "softmax" or attrs.get("norm") not in (b"L1", "L1"):
                raise ModelError(f"{self.name}: Normalizer node {node.name!r} is supported only as "
                                 f"the L1 norm right after a softmax (probabilities that already "
                                 f"sum to 1)")
        elif op == "Scaler":
            off, sc = _scaler_attrs(attrs, node, self.name)
            # onnxruntime: y = (x - offset) * scale, in float32
            if not self.leading(off, sc, node):
                self.affine(sc, -off * sc, node)
        elif op in ("Add", "Sub", "Mul", "Div"):
            return self._elementwise(node, idx)
        elif op == "Gemm":
            self._gemm(node, attrs)
        elif op == "MatMul":
            if node.input[0] != self.cur:
                raise ModelError(f"{self.name}: MatMul node {node.name!r} multiplies from the left; "
                                 f"expected x @ W")
            B = self.const(node.input[1], node)
            if B.ndim != 2:
                raise ModelError(f"{self.name}: MatMul node {node.name!r} weight has shape {B.shape}")
            self.dense(B.T.copy(), np.zeros(B.shape[1]), node)
        elif op == "LinearRegressor":
            self._linear_regressor(node, attrs)
        elif op == "LinearClassifier":
            return self._linear_classifier(node, attrs)
        elif op == "BatchNormalization":
            # opset 15 lets the scale / bias and mean / var be other float types than x
            gamma, beta, mean, var = (self.const(node.input[i], node, "float").reshape(-1)
                                      for i in range(1, 5))
            eps = float(_num(attrs, "epsilon", 1e-5, node, self.name))
            # before opset 7 the mode was is_test, default 0: normalized by the batch's own
            # statistics, not the running ones folded here
            if _num(attrs, "training_mode", 0, node, self.name) or \
                    (self.opset < 7 and not _num(attrs, "is_test", 0, node, self.name)):
                raise ModelError(f"{self.name}: BatchNormalization node {node.name!r} in training mode; "
                                 f"export the model in eval mode (model.eval())")
            sc = gamma / np.sqrt(var + eps)
            self.affine(sc, beta - mean * sc, node)
        elif op == "Softmax":
            self._softmax(node, attrs, idx)
        elif op == "Concat":
            raise ModelError(f"{self.name}: Concat node {node.name!r} is supported only as the "
                             f"[1 - p, p] of a binary classifier")
        else:  # activation
            return self._activation(node, idx)
        return node.output[0]

    def _flatten(self, node, attrs: dict, cur_rank: int) -> None:
        """Flatten and Identity are no-ops where they keep (batch, features)."""
        op = node.op_type
        ax = _num(attrs, "axis", 1, node, self.name) if op == "Flatten" else 1
        if op == "Flatten" and cur_rank == 1:
            # onnxruntime: Flatten of (n,) at axis 0 (or -1, which is 0 there) is (1, n),
            # one row of the features, what the layers read; at axis 1 it is (n, 1), each
            # feature a row
            if ax not in (0, -1):
                raise ModelError(f"{self.name}: Flatten node {node.name!r} (axis {ax}) of the "
                                 f"rank-1 model input makes each feature a row (shape "
                                 f"(n, 1)); give it axis 0, or declare the input as "
                                 f"[batch, features]")
        elif op == "Flatten" and (ax + cur_rank if ax < 0 else ax) != 1:
            # any other axis moves features between rows (axis 0: one row of the whole
            # batch; the last axis of a rank-3 input: a row per inner row)
            raise ModelError(f"{self.name}: Flatten node {node.name!r} with axis {ax} of a "
                             f"rank-{cur_rank} tensor is not (batch, features); expected "
                             f"axis 1")

    def _reshape(self, node, attrs: dict) -> None:
        """A Reshape to (batch, features) is a no-op; any other is refused."""
        shape = self.const(node.input[1], node, "any")
        if np.asarray(self.consts[node.input[1]]).dtype != np.int64:
            # onnxruntime loads a Reshape with an int64 shape only
            raise ModelError(f"{self.name}: Reshape node {node.name!r} shape {node.input[1]!r} is "
                             f"{np.asarray(self.consts[node.input[1]]).dtype}, expected int64")
        shape = shape.astype(np.int64).reshape(-1)
        width = self.layers[-1][0].shape[0] if self.layers else self.n_in
        if _num(attrs, "allowzero", 0, node, self.name) and 0 in shape.tolist():
            raise ModelError(f"{self.name}: Reshape node {node.name!r} with allowzero=1 to "
                             f"{shape.tolist()} makes an empty tensor")
        if not _reshape_noop(shape, width):
            if width == 0 and len(shape) == 2 and shape[0] in (-1, 0, 1) and shape[1] > 0:
                # the input's width is not declared: a no-op only if the first layer
                # reads exactly shape[1] features, checked when the layers are known
                self.need_in.append((int(shape[1]), node))
            else:
                raise ModelError(f"{self.name}: Reshape node {node.name!r} to {shape.tolist()} is "
                                 f"not a (batch, features) no-op on a {width or '?'}-wide "
                                 f"input; onnxruntime would change the rows")

    def _elementwise(self, node, idx: int) -> str:
        """Add / Sub / Mul / Div by a constant: into the input map, the layer before, or the next."""
        op = node.op_type
        out_name = node.output[0]
        first = node.input[0] == self.cur
        other = node.input[1] if first else node.input[0]
        c = self.const(other, node)
        if op == "Sub" and not first and c.size == 1 and float(c.reshape(-1)[0]) == 1.0:
            # skl2onnx's binary classifier: p = sigmoid(z); [1 - p, p] via Sub + Concat
            cat = next((n for n in self.nodes[idx + 1:] if n.op_type == "Concat"
                        and list(n.input) == [out_name, self.cur]), None)
            if cat is not None and self.layers and self.layers[-1][2] == "sigmoid" and \
                    self.layers[-1][0].shape[0] == 1 and self.pending is None and self.post == "none":
                self.concat_1p_p(cat)
                self.layers[-1][2] = "identity"
                self.post = "logistic2"
                self.skip.add(id(cat))
                return cat.output[0]
        if op == "Div" and (not first or np.any(c == 0)):
            raise ModelError(f"{self.name}: Div node {node.name!r} is not x / nonzero constant")
        if self.leading(*_lead_step(op, first, c), node):
            pass
        elif op == "Add":
            self.affine(1.0, c, node)
        elif op == "Mul":
            self.affine(c, 0.0, node)
        elif op == "Div":
            self.affine(1.0 / c, 0.0, node)
        else:
            self.affine(1.0 if first else -1.0, -c if first else c, node)
        return out_name

    def _gemm(self, node, attrs: dict) -> None:
        """Gemm: a dense layer (x @ B^T or x @ B, alpha, beta, C)."""
        a = attrs
        if self.opset < 11 and (len(node.input) < 3 or not node.input[2]):
            # C became optional in opset 11: onnxruntime refuses to load the graph
            raise ModelError(f"{self.name}: Gemm node {node.name!r} without a bias (C) input in "
                             f"opset {self.opset}; C is required before opset 11 (onnxruntime "
                             f"cannot load it): give it a zero bias or export with opset 11+")
        if self.rank == 1 and not self.reshaped:
            raise ModelError(f"{self.name}: Gemm node {node.name!r} reads the rank-1 model input; "
                             f"Gemm takes (batch, features) (onnxruntime cannot load it): "
                             f"declare the input as [batch, {self.n_in or 'features'}]")
        if _num(a, "transA", 0, node, self.name):
            raise ModelError(f"{self.name}: Gemm node {node.name!r} with transA=1 is not an MLP layer")
        B = self.const(node.input[1], node)
        if B.ndim != 2:
            raise ModelError(f"{self.name}: Gemm node {node.name!r} weight has shape {B.shape}")
        W = (B if _num(a, "transB", 0, node, self.name) else B.T) * float(_num(a, "alpha", 1.0, node, self.name))
        b = np.zeros(W.shape[0])
        beta = float(_num(a, "beta", 1.0, node, self.name))
        if len(node.input) > 2 and node.input[2]:
            C = self.const(node.input[2], node)
            if C.ndim > 2 or (C.ndim == 2 and C.shape[0] != 1):
                # C broadcasts to (batch, outputs): a row of C per batch row is not a bias
                raise ModelError(f"{self.name}: Gemm node {node.name!r} bias shape {C.shape} is "
                                 f"not a bias over its {W.shape[0]} outputs (expected "
                                 f"({W.shape[0]},) or (1, {W.shape[0]}))")
            try:
                b = np.broadcast_to(C.reshape(-1) if C.size != 1 else C.reshape(()),
                                    (W.shape[0],)).astype(np.float64)
            except ValueError:
                raise ModelError(f"{self.name}: Gemm node {node.name!r} bias shape {C.shape} does "
                                 f"not match {W.shape[0]} outputs") from None
            # beta 0: onnxruntime checks C's shape but never reads its values (a NaN /
            # Inf there is not 0 * Inf)
            b = b * beta if beta != 0.0 else np.zeros(W.shape[0])
        self.dense(W, b, node)

    def _linear_regressor(self, node, attrs: dict) -> None:
        """LinearRegressor (ai.onnx.ml): a dense layer."""
        if attrs.get("post_transform", b"NONE") not in (b"NONE", "NONE"):
            raise ModelError(f"{self.name}: LinearRegressor node {node.name!r} with post_transform "
                             f"{attrs['post_transform']!r}; export it without one")
        t = _num(attrs, "targets", 1, node, self.name)
        if not isinstance(t, (int, np.integer)):
            raise ModelError(f"{self.name}: LinearRegressor node {node.name!r} attribute targets "
                             f"is {t!r}, expected an integer")
        coef = _nums(attrs, "coefficients", [], node, self.name)
        if t < 1 or coef.size == 0 or coef.size % t:
            raise ModelError(f"{self.name}: LinearRegressor node {node.name!r} has {coef.size} "
                             f"coefficients for {t} targets")
        W = coef.reshape(t, -1)
        b = _nums(attrs, "intercepts", [0.0] * t, node, self.name)
        if b.size != t:
            raise ModelError(f"{self.name}: LinearRegressor node {node.name!r} has {b.size} "
                             f"intercepts for {t} targets")
        self.dense(W, b, node)

    def _linear_classifier(self, node, attrs: dict) -> str:
        """LinearClassifier (ai.onnx.ml): a dense layer and its post transform; the chain goes on from its scores."""
        if len(node.output) != 2:
            raise ModelError(f"{self.name}: LinearClassifier node {node.name!r} without its scores "
                             f"output")
        if attrs.get("classlabels_ints") and attrs.get("classlabels_strings"):
            # the spec allows one of the two; with both, the class count is two numbers
            raise ModelError(f"{self.name}: LinearClassifier node {node.name!r} has both "
                             f"classlabels_ints and classlabels_strings; a classifier gives "
                             f"one")
        labels = attrs.get("classlabels_ints", attrs.get("classlabels_strings", []))
        coef = _nums(attrs, "coefficients", [], node, self.name)
        b = _nums(attrs, "intercepts", [], node, self.name)
        n_cls = len(labels)
        rows = b.size
        if rows < 1 or coef.size == 0 or coef.size % rows:
            raise ModelError(f"{self.name}: LinearClassifier node {node.name!r} has {coef.size} "
                             f"coefficients for {rows} intercepts")
        if rows != n_cls:
            # onnxruntime's one-row binary case writes scores fastpath does not reproduce
            raise ModelError(f"{self.name}: LinearClassifier node {node.name!r} has {rows} rows of "
                             f"coefficients for {n_cls} classes; export one row per class "
                             f"(skl2onnx does)")
        self.dense(coef.reshape(rows, -1), b, node)
        try:
            pt = _s(attrs.get("post_transform", b"NONE"))
        except ModelError as exc:
            raise ModelError(f"{self.name}: LinearClassifier node {node.name!r}: {exc}") from None
        if pt == "LOGISTIC":
            self.layers[-1][2] = "sigmoid"
            self.layers[-1][3] = True
        elif pt == "SOFTMAX":
            self.post = "softmax"
        elif pt == "NONE":
            self.scores.append(node)
        elif pt != "NONE":
            raise ModelError(f"{self.name}: LinearClassifier node {node.name!r} post_transform "
                             f"{pt} is not supported (NONE, LOGISTIC, SOFTMAX are)")
        return node.output[1]

    def _softmax(self, node, attrs: dict, idx: int) -> None:
        """Softmax: the post transform, after the last layer only."""
        ax = _num(attrs, "axis", -1 if self.model.opset_import and max(
            (o.version for o in self.model.opset_import if o.domain in ("", "ai.onnx")),
            default=13) >= 13 else 1, node, self.name)
        if self.post != "none":
            raise ModelError(f"{self.name}: Softmax node {node.name!r} after the output's {self.post} "
                             f"(a second softmax); fastpath serves one output transform")
        if self.rank == 1 and not self.reshaped:
            # a rank-1 tensor (a [features] input, no batch axis) has axis 0 only: axis 1
            # (the default before opset 13) is out of range, and onnxruntime fails; axis 0
            # is its features axis, as -1 is (onnxruntime runs it: it was refused here)
            if ax not in (0, -1):
                raise ModelError(f"{self.name}: Softmax node {node.name!r} over axis {ax} of "
                                 f"the rank-1 tensor a [features] input makes; give it "
                                 f"axis=-1 (or 0), or declare the input as "
                                 f"[batch, features]")
            ax = -1
        # after the last layer's activation too: the engine runs the activation, then
        # the softmax (Model.to_onnx writes a relu / tanh / sigmoid last layer so, as
        # torch exports Linear -> ReLU -> Softmax)
        if ax not in (1, -1) or not self.layers or self.pending is not None:
            raise ModelError(f"{self.name}: Softmax node {node.name!r} must come right after the "
                             f"last dense layer (or its activation), over axis 1")
        if any(n.op_type in ("Gemm", "MatMul", "LinearRegressor", "LinearClassifier")
               for n in self.nodes[idx + 1:]):
            raise ModelError(f"{self.name}: unsupported ONNX op 'Softmax' (node {node.name!r}) "
                             f"between layers; fastpath supports a softmax only as the "
                             f"model's last step (classifier probabilities)")
        self.layers[-1][3] = True
        self.post = "softmax"

    def _activation(self, node, idx: int) -> str:
        """Relu / Tanh / Sigmoid: the last layer's activation (a Sigmoid then 1 - p and a Concat: logistic2)."""
        op = node.op_type
        tail = self.logistic2_after_activation(node, idx) if op == "Sigmoid" and self.layers and \
            self.layers[-1][3] else None
        if tail is not None:
            # the activation stays; the Sigmoid, 1 - p and the Concat are the post
            self.post = "logistic2"
            self.skip.update(id(n) for n in tail)
            return tail[1].output[0]
        if not self.layers or self.layers[-1][3] or self.pending is not None or self.post != "none":
            raise ModelError(f"{self.name}: {op} node {node.name!r} must follow a dense layer "
                             f"(Gemm or MatMul), and only one activation per layer")
        self.layers[-1][2] = _ACT[op]
        self.layers[-1][3] = True
        return node.output[0]

    def _result(self, target: str, props: list) -> dict:
        if self.cur != target:
            raise ModelError(f"{self.name}: the chain ends at {self.cur!r}, not at the graph output {target!r}")
        if not self.layers:
            raise ModelError(f"{self.name}: no Gemm or MatMul layer found")
        k = self.layers[0][0].shape[1]
        if self.n_in and k != self.n_in:
            raise ModelError(f"{self.name}: the graph input has {self.n_in} features but the first layer "
                             f"reads {k}; onnxruntime cannot run this model on its own input")
        for w, rn in self.need_in:
            if w != k:
                raise ModelError(f"{self.name}: Reshape node {rn.name!r} makes rows of {w} features but "
                                 f"the first layer reads {k}; onnxruntime would change the rows")
        if self.pending is not None:
            raise ModelError(f"{self.name}: elementwise ops after the last layer's activation cannot be "
                             f"folded into a dense layer")
        # class probabilities: a softmax / logistic2 output, or a LinearClassifier's sigmoids.
        # A LinearClassifier without a post transform (RidgeClassifier, LinearSVC) writes decision
        # scores, unbounded: read as probabilities by a classifier head they made signals of
        # +-4 and confidences above 1 ("scores" names such a node; Model.from_onnx asks for a head)
        classifier = self.post != "none" or any(n.op_type == "LinearClassifier" for n in self.nodes)
        if self.post != "none":
            self.scores.clear()
        return {"layers": tuple((w, b, act) for w, b, act, _ in self.layers), "post": self.post,
                "output": target, "classifier": classifier and not self.scores,
                "scores": self.scores[0].name if self.scores else None, "producer": self.model.producer_name,
                "input": self.lead.result(k, self.name), "metadata": props}
