"""Model: an MLP (Layer) or a tree ensemble (fastpath.model.trees) with the feature spec that
feeds it, the cache policy that guards it and the head that reads it, validated completely
when built, so an Engine is never made from half a model. What was validated stays so: each
array is a copy of the caller's, read-only (a write raises ValueError; build a new Layer or
FeatureSpec, or use the with_* methods), and models compare and hash by content (== on a
model read back from its bundle is True).

The file formats sit above this module (bundle.py: .fpm; onnx_load.py / onnx_export.py:
ONNX) and plug their readers and writers in with register_format when fastpath.model imports
them, so every import in the package points down while Model.save, Model.load,
Model.from_onnx and Model.to_onnx stay methods. Nothing here imports the engine or the
control plane; fit_cache_policy calls fastpath.tuning, which drives the engine.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from fastpath._checks import one_of
from fastpath.errors import InputError, ModelError
from fastpath.model._arrays import MAX_WIDTH, _feature_rows, _numbers
from fastpath.model.features import FeatureSpec, InputScaler
from fastpath.model.head import _CLI_HEAD, Head, _head_outputs, _sigmoid
from fastpath.model.layer import Layer
from fastpath.model.policy import CachePolicy
from fastpath.model.trees import TreeEnsemble

# what follows the last dense layer, as exporters write it: nothing, a softmax (classifier
# probabilities), or one logit z -> [1 - sigmoid(z), sigmoid(z)] (a binary classifier)
POSTS = ("none", "softmax", "logistic2")
# the hidden layers' weight format in the engine (the output layer stays fp32); the model
# always holds fp32 weights, the engine rounds or quantizes them when it packs them
WEIGHT_TYPES = ("fp32", "bf16", "int8")
MAX_LAYERS = 16
# a bundle saved with a head its outputs cannot take (before that was refused) loads with another
_BUNDLE_HEAD = "; a bundle saved with it loads with another, Model.load(path, head=...)"


def _layer_tuple(layers: Any) -> tuple:
    """Model.layers as a tuple; a ModelError for one Layer or None given bare (a TypeError
    "'Layer' object is not iterable" before)."""
    if isinstance(layers, Layer):
        raise ModelError("layers must be a sequence of Layer: wrap a single one, (layer,)")
    if isinstance(layers, (str, bytes)) or not isinstance(layers, Iterable):
        raise ModelError(f"layers must be a sequence of Layer (empty for a tree ensemble), "
                         f"got {type(layers).__name__}")
    return tuple(layers)


def _meta(meta: Any) -> dict:
    """The model's meta as a new dict: None is no meta (it was a TypeError from dict()), a
    mapping is copied, anything else is refused (dict() read a list of pairs as a dict and
    failed on other lists with a ValueError about 'update sequence elements')."""
    if meta is None:
        return {}
    if not isinstance(meta, Mapping):
        raise ModelError(f"meta must be a dict of JSON values (or None), got "
                         f"{type(meta).__name__}")
    return dict(meta)


def _json_scalar(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(type(o).__name__)


def _meta_key(meta: dict) -> Any:
    """meta as the bundle keeps it (JSON: tuples and numpy values become lists and numbers),
    so a model read back equals the one written; compared as is when it is not JSON."""
    try:
        return json.dumps(meta, sort_keys=True, default=_json_scalar)
    except (TypeError, ValueError):
        return meta


# The readers and writers of the file formats, by Model method name; each format's module
# installs its own (register_format) when fastpath.model imports it.
_FORMATS: dict[str, Callable[..., Any]] = {}


def register_format(**fns: Callable[..., Any]) -> None:
    """Install a file format's readers and writers behind the Model methods of those names
    (save, to_bytes, load, from_bytes, to_onnx, from_onnx, the native from_* loaders), and
    fastpath.tuning's fit_cache_policy, which needs the engine above this package."""
    _FORMATS.update(fns)


@dataclass(frozen=True, eq=False)
class Model:
    """An MLP (layers) or a tree ensemble (trees, layers empty) with its feature spec, cache
    policy, output transform and head.

    The last layer has any width; `post` transforms it into the model's outputs (what
    onnxruntime returns: "softmax" and "logistic2" give class probabilities) and `head_spec`
    maps the outputs to (signal, confidence); None picks Head.default_for(n_outputs, post).

    A model imported from ONNX with a scaler in front has input_scaler: the model reads its
    input x (what onnxruntime reads, what forward() and to_onnx take) as
    input_scaler.apply(x) = (x - offset) * scale. feature_spec turns a raw tick into that
    input x; the feature stage runs the spec then the scaler (in float32, as onnxruntime
    runs the scaler; see InputScaler), and features(raws) is the numpy reference of the
    first layer's inputs."""
    layers: tuple
    feature_spec: FeatureSpec | None = None
    cache_policy: CachePolicy = field(default_factory=CachePolicy)
    meta: dict = field(default_factory=dict)
    post: str = "none"
    head_spec: Head | None = None
    weights: str = "fp32"
    # a tree ensemble instead of layers (layers empty, post "none": the ensemble carries its
    # own post transform); see fastpath.model.trees
    trees: Any = None
    # the affine map the model reads its input through (an imported Scaler, Sub / Div...),
    # applied after feature_spec (by the feature stage, as two float32 ops a feature).
    # A Model field rather than a mark inside FeatureSpec: the spec is the user's to replace,
    # the scaler is the model's (it was fitted with the layers), and a spec replaced any way
    # (with_feature_spec, calibrate, dataclasses.replace) keeps it. Stop 22 stored the spec
    # with the scaler already composed into it, so replace(model, feature_spec=fs) silently
    # dropped the scaler: the layers then read unscaled inputs.
    input_scaler: InputScaler | None = None

    def __post_init__(self) -> None:
        if not one_of(self.weights, WEIGHT_TYPES):
            raise ModelError(f"weights {self.weights!r} not supported; expected one of "
                             f"{list(WEIGHT_TYPES)}")
        if not one_of(self.post, POSTS):
            raise ModelError(f"post transform {self.post!r} not supported; expected one of {POSTS}")
        object.__setattr__(self, "weights", str(self.weights))
        object.__setattr__(self, "post", str(self.post))
        if self.input_scaler is not None and not isinstance(self.input_scaler, InputScaler):
            raise ModelError(f"input_scaler must be a fastpath.model.types.InputScaler or None, "
                             f"got {type(self.input_scaler).__name__}")
        if self.trees is not None:
            if self.weights != "fp32":
                raise ModelError(f"weights {self.weights!r} apply to an MLP's layers; a tree "
                                 f"ensemble keeps its float32 thresholds and leaf values (use 'fp32')")
            self._init_trees()
            self._check_scaler()
            return
        layers = _layer_tuple(self.layers)
        if not 1 <= len(layers) <= MAX_LAYERS:
            raise ModelError(f"a model needs 1..{MAX_LAYERS} layers, got {len(layers)}")
        for i, l in enumerate(layers):
            if not isinstance(l, Layer):
                raise ModelError(f"layer {i} is a {type(l).__name__}, expected fastpath.model.Layer")
            if i and l.weight.shape[1] != layers[i - 1].weight.shape[0]:
                raise ModelError(f"layer {i} takes {l.weight.shape[1]} inputs but layer {i - 1} "
                                 f"gives {layers[i - 1].weight.shape[0]}")
        width = layers[-1].weight.shape[0]
        if self.post == "logistic2" and width != 1:
            raise ModelError(f"post 'logistic2' turns one logit into two probabilities; the last "
                             f"layer has {width} outputs")
        if self.post == "softmax" and width < 2:
            raise ModelError("post 'softmax' needs at least 2 outputs")
        n_out = 2 if self.post == "logistic2" else width
        head = self.head_spec if self.head_spec is not None else Head.default_for(n_out, self.post)
        if not isinstance(head, Head):
            raise ModelError(f"head_spec must be a fastpath.model.Head, got {type(head).__name__}")
        head.check(n_out)
        act = layers[-1].activation
        if head.kind.startswith("classifier") and self.post == "none" and act != "sigmoid":
            # only a softmax / logistic2 post transform or a sigmoid last layer makes
            # probabilities; these are the last layer's raw values (logits, margins, decision
            # scores), which the head read as probabilities: signals beyond +-1 and
            # confidences beyond [0, 1], or inside them and meaningless
            raise ModelError(f"head {head.kind!r} reads class probabilities, but this model's "
                             f"outputs are its last layer's {act} values with no post "
                             f"transform (post 'none'): not probabilities; if they are logits "
                             f"give post='softmax' (post='logistic2' for one logit), else a "
                             f"head for raw outputs, e.g. Head('regression', outputs=(i,)) or "
                             f"Head('tanh_sigmoid', outputs=(a, b)){_BUNDLE_HEAD}{_CLI_HEAD}")
        fs = self.feature_spec
        if fs is None:
            fs = FeatureSpec.identity(layers[0].weight.shape[1])
        if not isinstance(fs, FeatureSpec):
            raise ModelError(f"feature_spec must be a FeatureSpec, got {type(fs).__name__}")
        if fs.n_feat != layers[0].weight.shape[1]:
            raise ModelError(f"the feature spec makes {fs.n_feat} features but the first layer "
                             f"takes {layers[0].weight.shape[1]} inputs")
        if not isinstance(self.cache_policy, CachePolicy):
            raise ModelError(f"cache_policy must be a CachePolicy, got "
                             f"{type(self.cache_policy).__name__}")
        object.__setattr__(self, "layers", layers)
        object.__setattr__(self, "head_spec", head)
        object.__setattr__(self, "feature_spec", fs)
        object.__setattr__(self, "meta", _meta(self.meta))
        self._check_scaler()

    def _check_scaler(self) -> None:
        sc, fs = self.input_scaler, self.feature_spec
        if sc is not None and sc.n != fs.n_feat:
            raise ModelError(f"the input scaler takes {sc.n} inputs but the feature spec makes "
                             f"{fs.n_feat} features")

    def features(self, raws: np.ndarray, symbols: np.ndarray | None = None) -> np.ndarray:
        """The first layer's (or the trees') inputs for raw ticks (n, raw_len), windows
        replayed per symbol, float32: feature_spec.apply, then the input scaler when the model
        has one (input_scaler.apply). The numpy reference of what the feature stage computes
        (Engine.features, one tick)."""
        f = self.feature_spec.apply(raws, symbols)
        sc = self.input_scaler
        if sc is None:
            return f
        with np.errstate(over="ignore", invalid="ignore"):
            # a feature the scaler takes past float32's range is Inf here, as in the engine
            # (which refuses the tick)
            return sc.apply(f)

    _FIELDS = ("layers", "feature_spec", "cache_policy", "post", "head_spec", "weights", "trees",
               "input_scaler")

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in self._FIELDS) and \
            _meta_key(self.meta) == _meta_key(other.meta)

    def __hash__(self) -> int:
        # meta (a dict) is left out: models equal in all fields are equal in these, and the
        # generated hash raised TypeError on it (and on the arrays)
        return hash(tuple(getattr(self, f) for f in self._FIELDS))

    def _init_trees(self) -> None:
        t = self.trees
        if not isinstance(t, TreeEnsemble):
            raise ModelError(f"trees must be a fastpath.model.TreeEnsemble, got {type(t).__name__}")
        if self.layers is not None and _layer_tuple(self.layers):
            raise ModelError("a model is either layers or a tree ensemble, not both")
        if self.post != "none":
            raise ModelError("a tree ensemble carries its own post transform; post must be 'none'")
        n_out = t.n_outputs
        head = self.head_spec
        if head is None:
            if t.classifier and n_out in (2, 3) and not t.gives_probabilities():
                # a classifier head reads its outputs as probabilities: these are not, and
                # the signal and confidence would leave [-1, 1] and [0, 1]
                raise ModelError(f"the tree classifier's outputs are not class probabilities "
                                 f"(post transform {t.post_transform}"
                                 f"{', leaf sums outside [0, 1]' if t.post_transform == 'NONE' else ''}"
                                 f"; XGBoost's multi:softmax exports raw margins so), which "
                                 f"the classifier heads read; give a head for them, e.g. "
                                 f"Head('regression', outputs=(i,)), or export probabilities "
                                 f"(multi:softprob, a LOGISTIC / SOFTMAX post transform)"
                                 f"{_CLI_HEAD}")
            if t.classifier and n_out in (2, 3):
                head = Head("classifier2" if n_out == 2 else "classifier3")
            elif not t.classifier and n_out in (1, 2):
                head = Head.default_for(n_out, "none")
            else:
                raise ModelError(f"the tree ensemble has {n_out} outputs "
                                 f"({'classes' if t.classifier else 'targets'}) and no head was "
                                 f"given; give one, e.g. Head('classifier3', outputs=(down, flat, "
                                 f"up)) or Head('regression', outputs=(i,)){_CLI_HEAD}")
        if not isinstance(head, Head):
            raise ModelError(f"head_spec must be a fastpath.model.Head, got {type(head).__name__}")
        head.check(n_out)
        if head.kind.startswith("classifier") and t.classifier and not t.gives_probabilities():
            # the default's rule above, for a head given: the same margins / z-scores read as
            # probabilities (the engine refuses such a tick only when one leaves [0, 1])
            raise ModelError(f"head {head.kind!r} reads class probabilities, but the tree "
                             f"classifier's outputs are not (post transform "
                             f"{t.post_transform}"
                             f"{', leaf sums outside [0, 1]' if t.post_transform == 'NONE' else ''}"
                             f"; XGBoost's multi:softmax exports raw margins so); give a head "
                             f"for them, e.g. Head('regression', outputs=(i,)), or export "
                             f"probabilities (multi:softprob, a LOGISTIC / SOFTMAX post "
                             f"transform){_BUNDLE_HEAD}{_CLI_HEAD}")
        if self.feature_spec is None and t.n_features > MAX_WIDTH:
            # the identity spec it would get reported its raw_len, a spec the caller never gave
            raise ModelError(f"the tree ensemble takes {t.n_features} inputs; a tick holds at "
                             f"most {MAX_WIDTH} values (give a feature spec that makes "
                             f"{t.n_features} features, or select fewer features)")
        fs = self.feature_spec if self.feature_spec is not None else \
            FeatureSpec.identity(t.n_features)
        if not isinstance(fs, FeatureSpec):
            raise ModelError(f"feature_spec must be a FeatureSpec, got {type(fs).__name__}")
        if fs.n_feat != t.n_features:
            raise ModelError(f"the feature spec makes {fs.n_feat} features but the tree ensemble "
                             f"takes {t.n_features} inputs")
        if not isinstance(self.cache_policy, CachePolicy):
            raise ModelError(f"cache_policy must be a CachePolicy, got "
                             f"{type(self.cache_policy).__name__}")
        object.__setattr__(self, "layers", ())
        object.__setattr__(self, "head_spec", head)
        object.__setattr__(self, "feature_spec", fs)
        object.__setattr__(self, "meta", _meta(self.meta))

    # -------------------------------------------------------------- shapes
    @property
    def kind(self) -> str:
        """'mlp' (dense layers) or 'trees' (a tree ensemble)."""
        return "mlp" if self.trees is None else "trees"

    @property
    def dims(self) -> list:
        if self.trees is not None:
            return [self.trees.n_features, self.trees.n_outputs]
        return [self.layers[0].weight.shape[1]] + [l.weight.shape[0] for l in self.layers]

    @property
    def n_outputs(self) -> int:
        """Outputs after the post transform (what predict() and onnxruntime return)."""
        if self.trees is not None:
            return self.trees.n_outputs
        return 2 if self.post == "logistic2" else self.layers[-1].weight.shape[0]

    @property
    def raw_len(self) -> int:
        return self.feature_spec.raw_len

    def _unfitted(self) -> tuple:
        """(cache policy, meta) with a fitted policy switched off and its fit report dropped:
        for a change the shadow replay that fitted it never saw."""
        pol, meta = self.cache_policy, self.meta
        if pol.fitted:
            pol = replace(pol, enabled=False, fitted_max_error=None)
        meta = {k: v for k, v in meta.items() if k != "cache_policy_fit"}
        return pol, meta

    def with_feature_spec(self, fs: FeatureSpec) -> "Model":
        """This model on another feature spec. The cache compares features, and another spec
        scales them otherwise, so a fitted cache policy (and its fit report in meta) is
        dropped, as calibrate drops it; the same spec keeps it.

        A model with an input scaler (imported from ONNX with a Scaler in front) reads fs's
        features through it, as it always did: fs makes the model's input (the ONNX graph's
        input) and the scaler follows."""
        if fs == self.feature_spec:
            return replace(self, feature_spec=fs)
        pol, meta = self._unfitted()
        return replace(self, feature_spec=fs, cache_policy=pol, meta=meta)

    def with_cache_policy(self, policy: CachePolicy) -> "Model":
        """This model with another cache policy; the report of an earlier fit (meta's
        "cache_policy_fit") goes with the policy it described."""
        if policy == self.cache_policy:
            return replace(self, cache_policy=policy)
        meta = {k: v for k, v in self.meta.items() if k != "cache_policy_fit"}
        return replace(self, cache_policy=policy, meta=meta)

    def with_weights(self, weights: str) -> "Model":
        """This model run with "fp32", "bf16" or "int8" hidden-layer weights (the output layer
        stays fp32). The outputs move, so a fitted cache policy (and its fit report in meta)
        is dropped; a one-layer model has no hidden layer, runs the same, and keeps its policy.

        How far the outputs move depends on the inputs, not only on the weights: measure it
        on your own ticks. The bench's figures are for z-scored features; a model fed raw
        inputs of mixed scale (the identity feature spec, no scaler in front of its first
        layer) loses its small inputs and cancels its large ones against the bias: on such a
        model (price ~6.5e4 beside a spread of 1e-2) the signal moved by up to 0.8 (bf16) and
        2.0 (int8, half the signs flipped), where fp32 stayed within 3e-5 of float64. A
        scaler imported in front of the model (input_scaler) runs in the feature stage, so
        the first layer keeps the file's weights and reads centred inputs: on a
        StandardScaler + MLPRegressor (32, 16) pipeline fed such prices, bf16 moved the signal
        by up to 0.004 and int8 by 0.009 (2 sign flips in 1000 ticks), where the scaler folded
        into the first layer moved it by 2.0 with either (half the signs flipped)."""
        pol, meta = self.cache_policy, self.meta
        # only hidden layers are packed reduced (fp_mlp.c): a single layer is the output
        # layer, its outputs do not move, and the fit still holds
        if pol.fitted and weights != self.weights and self.trees is None and len(self.layers) > 1:
            pol = replace(pol, enabled=False, fitted_max_error=None)
            # the fit report would describe a policy no longer in force (as calibrate drops it)
            meta = {k: v for k, v in meta.items() if k != "cache_policy_fit"}
        return replace(self, weights=weights, cache_policy=pol, meta=meta)

    def with_head(self, head: Head) -> "Model":
        """This model with another head (the outputs are unchanged; the cache's stored signals
        depend on the head, so a fitted cache policy and its fit report in meta are dropped;
        the same head keeps them)."""
        if head == self.head_spec:
            return replace(self, head_spec=head)
        pol, meta = self._unfitted()
        return replace(self, head_spec=head, cache_policy=pol, meta=meta)

    # --------------------------------------------------- numpy reference
    def forward(self, features: np.ndarray) -> np.ndarray:
        """Model outputs (post transform, no head) for the model's inputs (n_feat,) or
        (n, n_feat), in float32 numpy: what onnxruntime returns for them. A model with an
        input scaler reads them through it first (input_scaler.apply); for raw ticks use
        outputs()."""
        sc = self.input_scaler
        if sc is not None:
            features = sc.apply(_feature_rows(features, sc.n, "Model.forward"))
        return self._layers_forward(features)

    def outputs(self, raws: np.ndarray, symbols: np.ndarray | None = None) -> np.ndarray:
        """Model outputs (post transform, no head) for raw ticks (n, raw_len), windows
        replayed per symbol: the numpy reference of what the engine computes before the
        head (features(): the feature spec then the input scaler, as the feature stage runs
        them; then the layers or trees)."""
        return self._layers_forward(self.features(raws, symbols))

    def _layers_forward(self, features: np.ndarray) -> np.ndarray:
        if self.trees is not None:
            return self.trees.forward(features)
        x = _feature_rows(features, self.layers[0].weight.shape[1], "Model.forward")
        for l in self.layers:
            x = x @ l.weight.T + l.bias
            if l.activation == "relu":
                x = np.maximum(x, 0)
            elif l.activation == "tanh":
                x = np.tanh(x)
            elif l.activation == "sigmoid":
                x = _sigmoid(x)
        x = x.astype(np.float32)
        if self.post == "softmax":
            e = np.exp(x - x.max(axis=-1, keepdims=True))
            x = e / e.sum(axis=-1, keepdims=True)
        elif self.post == "logistic2":
            p = _sigmoid(x.astype(np.float64)).astype(np.float32)
            x = np.concatenate([1.0 - p, p], axis=-1)
        return x.astype(np.float32)

    @staticmethod
    def head(out: np.ndarray) -> tuple:
        """(signal, confidence) = (tanh(out0), sigmoid(out1)): the two-output head. A model's
        own head (any kind) is self.head_spec.apply(out)."""
        out = _head_outputs(out, 2, "Model.head (outputs 0 and 1)")
        return np.tanh(out[..., 0]), _sigmoid(out[..., 1])

    def signal(self, out: np.ndarray) -> tuple:
        """(signal, confidence) for model outputs (n_outputs,) or (n, n_outputs) by this
        model's head (numpy reference)."""
        try:
            o = _numbers(out, np.float64)
        except (TypeError, ValueError) as exc:
            raise InputError(f"Model.signal: outputs must be numbers, got "
                             f"{type(out).__name__} ({exc})") from None
        if o.ndim not in (1, 2) or o.shape[-1] != self.n_outputs:
            # a narrower row was numpy's IndexError; a wider one was read silently (a
            # classifier's confidence, the max over the row, came from outputs it lacks)
            raise InputError(f"Model.signal: outputs must have shape ({self.n_outputs},) or "
                             f"(n, {self.n_outputs}), got {o.shape}")
        return self.head_spec.apply(o)

    # ------------------------------------------------- formats and fitting
    def save(self, path: str | os.PathLike) -> None:
        """Write the native bundle (weights + feature spec + cache policy) atomically."""
        _FORMATS["save"](self, path)

    def to_bytes(self) -> bytes:
        """The native bundle as bytes (what save writes)."""
        return _FORMATS["to_bytes"](self)

    @classmethod
    def load(cls, path: str | os.PathLike, head: "Head | None" = None) -> "Model":
        """Read a native bundle; any damage is a ModelError naming it, never a partial model.
        head: this head in place of the bundle's (as with_head: a fitted cache policy is
        dropped when it differs), the way to read a bundle whose stored head its outputs
        cannot take (a classifier head over margins, saved before that was refused)."""
        return _FORMATS["load"](path, head)

    @classmethod
    def from_bytes(cls, blob: bytes, name: str = "<bytes>",
                   head: "Head | None" = None) -> "Model":
        """A native bundle from bytes (what to_bytes gives); name is the one errors give it."""
        return _FORMATS["from_bytes"](blob, name, head)

    def to_onnx(self, path: str | os.PathLike, opset: int = 17) -> None:
        """Write the MLP as ONNX: Gemm (transB=1) + activation per layer, then the post
        transform (softmax, logistic2); input "features" [N, n_feat], output "out" [N,
        n_outputs]: onnxruntime returns what forward() does. A model with an input scaler
        writes it first, as Sub and Mul (the ops onnxruntime's Scaler runs), not folded into
        the first layer: for a model imported from ONNX the file returns what the original
        returns, and from_onnx reads the scaler back.

        What the graph does not hold (the feature spec, the head, the weight format, the
        cache policy and meta) goes into the file's metadata_props under "fastpath.model"
        (fastpath.model.onnx_meta; onnxruntime ignores it), so from_onnx gives back a model
        equal to this one, which serves the same signals. The graph holds the fp32 weights:
        onnxruntime's outputs differ from a bf16 / int8 engine's by what weights_error
        measures. Meta must hold JSON values, as for Model.save. Needs the onnx package."""
        if self.trees is not None:
            raise ModelError("writing a tree ensemble as ONNX is not supported; keep the ONNX "
                             "file it came from, or save the model as a bundle (Model.save)")
        _FORMATS["to_onnx"](self, path, opset)

    @classmethod
    def from_onnx(cls, path: str | os.PathLike, head: "Head | None" = None) -> "Model":
        """Import an MLP, linear model or tree ensemble from ONNX as torch.onnx.export,
        skl2onnx and onnxmltools write it (see fastpath.model.onnx_import for the ops).

        A file Model.to_onnx wrote holds fastpath's record (metadata_props "fastpath.model",
        see fastpath.model.onnx_meta): the model comes back with its feature spec, head,
        weight format, cache policy and meta as written (equal to the model exported; meta
        is the model's, without the "source" / "onnx_output" an import adds), `head` in place
        of the stored one when given (as with_head: a fitted policy dropped when it
        differs). A damaged record is a ModelError naming the file, never another model. If
        the graph is no longer the one written (its weights' digest differs: edited or
        retrained since), the cache is read as off and a UserWarning says so.

        Any other file (torch, skl2onnx, onnxmltools) gets the identity feature spec (raw =
        model input), fp32, the cache off (fit a policy with fit_cache_policy or enable one
        in the config), meta {"source": the file's name, "onnx_output": the output served}
        and `head`, or the default head for its outputs (Head.default_for).

        The affine map the graph reads its input through (a Scaler, or Sub / Add then Mul /
        Div by constants) becomes the model's input_scaler, run by the feature stage in
        float32 as onnxruntime runs it: the feature spec makes the graph's input, the scaler
        follows it, and the first layer keeps the file's weights."""
        return _FORMATS["from_onnx"](cls, path, head)

    @classmethod
    def from_lightgbm(cls, booster, head: "Head | None" = None, max_nodes: int = 1 << 23) -> "Model":
        """A tree model from a LightGBM booster (or a fitted LGBMRegressor / LGBMClassifier),
        the path of its model.txt or the model text,
        deciding every float32 input as LightGBM's own predict does (its double thresholds,
        zero band, missing types, categorical bitsets, objective transform); what cannot be
        made exact (linear_tree leaves, other objectives) is a ModelError naming the tree,
        node and feature. max_nodes caps the ensemble, copies of subtrees included. See
        fastpath.model.native_lightgbm; parity() measures the agreement."""
        return _FORMATS["from_lightgbm"](cls, booster, head, max_nodes)

    @classmethod
    def from_xgboost(cls, booster, head: "Head | None" = None, max_nodes: int = 1 << 23) -> "Model":
        """A tree model from an XGBoost booster (or XGBModel) or its saved .json / .ubj,
        deciding as XGBoost's predict does (float32 `x < t`, the default direction for NaN,
        base_score in margin space, the objective's transform). See
        fastpath.model.native_xgboost."""
        return _FORMATS["from_xgboost"](cls, booster, head, max_nodes)

    @classmethod
    def from_catboost(cls, model, head: "Head | None" = None,
                      max_nodes: int = 1 << 23) -> "Model":
        """A tree model from a CatBoost model (symmetric trees over float features) or its
        saved .cbm / .json, deciding as CatBoost does (float32 `x > border`, each feature's
        NaN treatment, scale and bias, the loss's transform). See
        fastpath.model.native_catboost."""
        return _FORMATS["from_catboost"](cls, model, head, max_nodes)

    @classmethod
    def from_sklearn(cls, estimator, head: "Head | None" = None,
                     max_nodes: int = 1 << 23) -> "Model":
        """A tree model from a fitted scikit-learn DecisionTree, RandomForest, ExtraTrees,
        GradientBoosting or HistGradientBoosting regressor or classifier, deciding float32
        inputs as its predict does. See fastpath.model.native_sklearn."""
        return _FORMATS["from_sklearn"](cls, estimator, head, max_nodes)

    def fit_cache_policy(self, raws: np.ndarray, symbols: np.ndarray | None = None,
                         max_error: float = 0.01, ts_ns: np.ndarray | None = None, **kw):
        """(a copy of this model with the fitted policy, the fit report): the loosest cache
        policy whose hits all stay within max_error of the fresh signal in a shadow replay of
        these ticks; the cache stays off when none does. See fastpath.tuning.fit_cache_policy."""
        # fastpath.tuning (above the engine, which replays the ticks) registers the fit
        fit = _FORMATS["fit_cache_policy"]
        pol, rep = fit(self, raws, symbols, max_error=max_error, ts_ns=ts_ns, **kw)
        meta = dict(self.meta)
        meta["cache_policy_fit"] = rep.summary()
        return replace(self, cache_policy=pol, meta=meta), rep
