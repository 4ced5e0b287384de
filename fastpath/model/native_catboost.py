"""CatBoost -> Model: Model.from_catboost(model | .cbm | .json).

Design: the model's JSON export is read (a model object or a .cbm file through catboost's
own save_model(format="json"); a .json file without catboost). An oblivious tree of depth D
tests one float32 border per level, `x > border` setting bit d of the leaf index, so it
becomes a complete tree of BRANCH_GT nodes with 2^D leaves; a NaN takes the side of its
feature's nan_value_treatment (AsTrue: bit set; AsFalse / AsIs: not). scale_and_bias becomes
a leaf scale and base values. Categorical features (CTRs), text / embedding features,
non-symmetric trees and losses whose transform the tree stage lacks are refused.
"""
from __future__ import annotations

import json
import math
import os
import tempfile

import numpy as np

from fastpath.errors import ModelError
from fastpath.model.model import register_format
from fastpath.model.native_trees import MAX_NODES, Leaf, Split, build_ensemble, tree_model

GT = 3
MAX_DEPTH = 16
_IDENTITY = {"RMSE", "MAE", "Quantile", "MAPE", "Huber", "Expectile", "Lq", "LogLinQuantile"}


def _json(src) -> tuple:
    if hasattr(src, "save_model") and type(src).__module__.split(".")[0] == "catboost":
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "model.json")
            src.save_model(p, format="json")
            with open(p, encoding="utf-8") as fh:
                return json.load(fh), f"<{type(src).__name__}>"
    if isinstance(src, dict):
        return src, "<model dict>"
    if isinstance(src, (str, os.PathLike)):
        name = os.fspath(src)
        if str(name).endswith(".cbm"):
            import catboost
            try:
                m = catboost.CatBoost()
                m.load_model(name)
            except Exception as exc:  # noqa: BLE001 - catboost's own error, named
                raise ModelError(f"{name}: catboost cannot read it: {exc}") from None
            return _json(m)[0], os.path.basename(name)
        try:
            with open(name, encoding="utf-8") as fh:
                return json.load(fh), os.path.basename(name)
        except (OSError, ValueError) as exc:
            raise ModelError(f"cannot read the CatBoost model {name!r}: {exc}") from None
    raise ModelError(f"Model.from_catboost takes a catboost model or the path of its .cbm / "
                     f".json, got {type(src).__name__}")


def _tree(t: dict, tree: int, feats: dict, dim: int, scale: float) -> list:
    splits = t.get("splits") or []
    D = len(splits)
    if D > MAX_DEPTH:
        raise ModelError(f"tree {tree}: depth {D} is past {MAX_DEPTH}")
    lv = np.asarray(t["leaf_values"], np.float64)
    if lv.size != (1 << D) * dim:
        raise ModelError(f"tree {tree}: {lv.size} leaf values, expected {(1 << D) * dim} "
                         f"(2^{D} leaves x {dim} dimensions)")
    if not np.all(np.isfinite(lv)):
        raise ModelError(f"tree {tree}: a leaf value is not finite")
    levels = []
    for d, s in enumerate(splits):
        if s.get("split_type") != "FloatFeature":
            raise ModelError(f"tree {tree} node {d}: split type {s.get('split_type')!r} is not "
                             f"supported (float features only: no categorical CTRs, one-hot "
                             f"or text features)")
        fi = int(s["float_feature_index"])
        if fi not in feats:
            raise ModelError(f"tree {tree} node {d}: float feature {fi} is not in the "
                             f"model's features")
        b = float(np.float32(s["border"]))
        if not math.isfinite(b):
            raise ModelError(f"tree {tree} node {d} (feature {feats[fi][0]}): border "
                             f"{s['border']!r} is not a finite float32")
        levels.append((feats[fi][0], b, feats[fi][1]))
    # a complete tree: node i at level d; its true child (x > border) sets bit d of the leaf
    nodes, index = [], {}
    n_inner = (1 << D) - 1
    for i in range(n_inner):
        d = int(math.log2(i + 1))
        f, b, nan_true = levels[d]
        nodes.append(Split(GT, f, b, 2 * i + 2, 2 * i + 1, nan_true))
    for leaf in range(1 << D):
        # the node path: bit d of leaf is the choice at level d (1: the true child)
        i = 0
        for d in range(D):
            i = 2 * i + (2 if (leaf >> d) & 1 else 1)
        index[i] = leaf
    for i in range(n_inner, 2 * n_inner + 1):
        leaf = index[i]
        nodes.append(Leaf([(k, float(lv[leaf * dim + k]) * scale) for k in range(dim)]))
    return nodes


def catboost_ensemble(src, max_nodes: int = MAX_NODES) -> tuple:
    j, name = _json(src)
    try:
        if "oblivious_trees" not in j:
            raise ModelError("only symmetric (oblivious) trees are supported; train with "
                             "grow_policy='SymmetricTree'")
        info = j.get("features_info", {})
        for k in ("categorical_features", "text_features", "embedding_features"):
            if info.get(k):
                raise ModelError(f"{k.replace('_', ' ')} are not supported (float features "
                                 f"only)")
        ff = info.get("float_features", [])
        feats = {}
        for f in ff:
            treat = f.get("nan_value_treatment", "AsIs")
            if treat not in ("AsIs", "AsFalse", "AsTrue"):
                raise ModelError(f"feature {f.get('flat_feature_index')}: nan_value_treatment "
                                 f"{treat!r} unknown")
            feats[int(f["feature_index"])] = (int(f["flat_feature_index"]), treat == "AsTrue")
        if not feats:
            raise ModelError("the model has no float features")
        n_features = max(v[0] for v in feats.values()) + 1
        loss = j["model_info"]["params"]["loss_function"]["type"]
        sb = j.get("scale_and_bias", [1.0, [0.0]])
        scale, bias = float(sb[0]), [float(b) for b in sb[1]]
        trees = j["oblivious_trees"]
        if loss in ("Logloss", "CrossEntropy"):
            post, classifier, T, dim = "LOGISTIC", True, 2, 1
        elif loss == "MultiClass":
            dim = len(bias)
            post, classifier, T = "SOFTMAX", True, dim
        elif loss in _IDENTITY:
            post, classifier, T, dim = "NONE", False, 1, 1
        else:
            raise ModelError(f"loss {loss!r}: its output transform is not one fastpath's tree "
                             f"stage has (supported: RMSE and the other identity losses, "
                             f"Logloss, CrossEntropy, MultiClass)")
        if len(bias) != dim or not trees:
            raise ModelError(f"scale_and_bias holds {len(bias)} biases for {dim} dimensions")
        src_trees = [_tree(t, i, feats, dim, scale) for i, t in enumerate(trees)]
        te = build_ensemble(src_trees, n_features, T, base_values=bias, post_transform=post,
                            classifier=classifier, max_nodes=max_nodes)
    except ModelError as exc:
        raise ModelError(f"{name}: {exc}") from None
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ModelError(f"{name}: a malformed CatBoost model: {exc!r}") from None
    return te, name


def model_from_catboost(cls, src, head=None, max_nodes: int = MAX_NODES):
    """See Model.from_catboost."""
    te, name = catboost_ensemble(src, max_nodes)
    return tree_model(cls, te, name, "catboost", head)


register_format(from_catboost=model_from_catboost)
