"""ONNX -> Model: Model.from_onnx. The graph as onnx_import reads it (plain arrays) becomes a
Model; a file Model.to_onnx wrote gets back its feature spec, head, weight format, cache
policy and meta from fastpath's record (onnx_meta)."""
from __future__ import annotations

import os

from fastpath.errors import ModelError
from fastpath.model import onnx_meta
from fastpath.model.bundle import _path
from fastpath.model.features import FeatureSpec, InputScaler
from fastpath.model.head import _CLI_HEAD, Head
from fastpath.model.layer import Layer
from fastpath.model.model import register_format
from fastpath.model.onnx_import import read_onnx
from fastpath.model.policy import CachePolicy


def model_from_onnx(cls, path: str | os.PathLike, head: Head | None = None):
    """An instance of cls (Model or a subclass) from the ONNX file at path; see
    Model.from_onnx."""
    # a str: a bytes path's basename (b'model.onnx') in meta["source"] made the model
    # one Model.save refused (meta must hold JSON values)
    name = _path(path, "Model.from_onnx")
    g = read_onnx(name)
    record = onnx_meta.find(g["metadata"], name)
    fs = sc = None
    if g.get("input") is not None:
        try:
            sc = InputScaler(*g["input"])
            fs = FeatureSpec.identity(sc.n)
        except ModelError as exc:
            raise ModelError(f"{name}: the input scaler: {exc}") from None
    meta = {"source": os.path.basename(name), "onnx_output": g["output"]}
    if "trees" in g:
        if record is not None:
            raise ModelError(f"{name}: the graph is a tree ensemble but its "
                             f"metadata_props hold fastpath's record of an MLP "
                             f"({onnx_meta.KEY!r}, which Model.to_onnx writes for MLPs "
                             f"only): which model the file describes it does not say")
        try:
            return cls((), fs, CachePolicy(enabled=False), meta, "none", head,
                       trees=g["trees"], input_scaler=sc)
        except ModelError as exc:
            # as for layers: the file is named, so a caller loading several knows which
            raise ModelError(f"{name}: {exc}") from None
    try:
        layers = tuple(Layer(w, b, act) for w, b, act in g["layers"])
    except ModelError as exc:
        raise ModelError(f"{name}: {exc}") from None
    if record is not None:
        # the model as fastpath wrote it: the record's spec, head, weights, policy, meta
        return onnx_meta.restore(
            record, name, layers, g["post"], sc, head,
            lambda fs, h, pol, w, m: cls(layers, fs, pol, m, g["post"], h, weights=w,
                                         input_scaler=sc))
    try:
        n_out = 2 if g["post"] == "logistic2" else layers[-1].weight.shape[0]
        if head is None and g["classifier"] and n_out in (2, 3):
            head = Head("classifier2" if n_out == 2 else "classifier3")
        if head is None and g.get("scores") is not None:
            raise ModelError(
                f"LinearClassifier node {g['scores']!r} writes decision scores "
                f"(post_transform NONE, as RidgeClassifier and LinearSVC export), not "
                f"class probabilities: a classifier head would read them as "
                f"probabilities (signals beyond +-1, confidences beyond [0, 1]); give a "
                f"head for the scores, e.g. head=Head('regression', outputs=(i,)), or "
                f"export a classifier with probabilities (LogisticRegression, "
                f"CalibratedClassifierCV){_CLI_HEAD}")
        return cls(layers, fs, CachePolicy(enabled=False), meta, g["post"], head,
                   input_scaler=sc)
    except ModelError as exc:
        raise ModelError(f"{name}: {exc}") from None


register_format(from_onnx=model_from_onnx)
