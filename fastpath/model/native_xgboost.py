"""XGBoost -> Model: Model.from_xgboost(booster | XGBModel | .json | .ubj).

Design: the booster's JSON model is read (a Booster gives it through save_raw("json"); a
.json file is read without xgboost, a .ubj file through xgboost). XGBoost's splits are already
float32 with `x < t` going left and a NaN the default_left way, so each is one BRANCH_LT node;
the leaf values are float32 as XGBoost adds them. base_score is turned into margin space by the
objective (logit for the logistic ones); the transform is the objective's (logistic, softmax,
identity). Categorical splits, vector leaves, dart and objectives whose transform the tree
stage lacks (exp for count:poisson, reg:gamma, reg:tweedie) are refused.
"""
from __future__ import annotations

import json
import math
import os

import numpy as np

from fastpath.errors import ModelError
from fastpath.model.model import register_format
from fastpath.model.native_trees import (LT, MAX_NODES, Leaf, Split, build_ensemble,
                                         check_shape, tree_model)

_IDENTITY = {"reg:squarederror", "reg:linear", "reg:squaredlogerror", "reg:pseudohubererror",
             "reg:absoluteerror", "reg:quantileerror", "binary:logitraw"}


def _json(src) -> tuple:
    """(model dict, name for errors)."""
    if hasattr(src, "get_booster"):
        src = src.get_booster()
    if hasattr(src, "save_raw"):
        return json.loads(bytes(src.save_raw("json"))), "<xgboost.Booster>"
    if isinstance(src, dict):
        return src, "<model dict>"
    if isinstance(src, (str, os.PathLike)):
        name = os.fspath(src)
        if str(name).endswith(".ubj"):
            import xgboost
            try:
                b = xgboost.Booster(model_file=name)
            except Exception as exc:  # noqa: BLE001 - xgboost's own error, named
                raise ModelError(f"{name}: xgboost cannot read it: {exc}") from None
            return json.loads(bytes(b.save_raw("json"))), os.path.basename(name)
        try:
            with open(name, encoding="utf-8") as fh:
                return json.load(fh), os.path.basename(name)
        except (OSError, ValueError) as exc:
            raise ModelError(f"cannot read the XGBoost model {name!r}: {exc}") from None
    raise ModelError(f"Model.from_xgboost takes an xgboost Booster / XGBModel or the path of "
                     f"its .json / .ubj, got {type(src).__name__}")


def _floats(s: str) -> list:
    return [float(np.float32(v)) for v in s.strip("[]").split(",") if v.strip()]


def _tree(t: dict, tree: int, n_features: int, klass: int) -> list:
    try:
        lc = np.asarray(t["left_children"], np.int64)
        rc = np.asarray(t["right_children"], np.int64)
        feat = np.asarray(t["split_indices"], np.int64)
        cond = np.asarray(t["split_conditions"], np.float64)
        dl = np.asarray(t["default_left"], np.int64)
        st = np.asarray(t.get("split_type", np.zeros(lc.size)), np.int64)
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelError(f"tree {tree}: a malformed tree ({exc!r})") from None
    n = lc.size
    if n < 1 or any(a.size != n for a in (rc, feat, cond, dl, st)):
        raise ModelError(f"tree {tree}: its node arrays differ in length (a truncated file?)")
    if int(t.get("tree_param", {}).get("size_leaf_vector", "1")) > 1:
        raise ModelError(f"tree {tree}: vector leaves (multi_strategy multi_output_tree) are "
                         f"not supported")
    inner = lc != -1
    check_shape(tree, lc, rc, inner)
    nodes = []
    for i in range(n):
        if not inner[i]:
            v = float(np.float32(cond[i]))
            if not math.isfinite(v):
                raise ModelError(f"tree {tree} node {i}: leaf value {v!r} is not finite")
            nodes.append(Leaf([(klass, v)]))
            continue
        f = int(feat[i])
        if f < 0 or f >= n_features:
            raise ModelError(f"tree {tree} node {i}: feature {f} is outside the model's "
                             f"{n_features} features")
        if st[i] != 0:
            raise ModelError(f"tree {tree} node {i} (feature {f}): categorical splits are not "
                             f"supported; one-hot encode the feature or train it as numeric")
        # the JSON holds the float32 XGBoost compares with, printed shortest: read it back
        # as that float32 (as a double it lies beside it, and would round the other way)
        c = float(np.float32(cond[i]))
        if not math.isfinite(c):
            raise ModelError(f"tree {tree} node {i} (feature {f}): threshold {cond[i]!r} is "
                             f"not a finite float32 number")
        nodes.append(Split(LT, f, c, int(lc[i]), int(rc[i]), bool(dl[i])))
    return nodes


def _objective(name: str, base: list, k: int) -> tuple:
    """(post transform, classifier, n_targets, base margins)."""
    if name in _IDENTITY:
        return "NONE", False, 1, base[:1]
    if name in ("binary:logistic", "reg:logistic"):
        p = base[0]
        if not 0.0 < p < 1.0:
            raise ModelError(f"base_score {p!r} of {name} must lie in (0, 1)")
        # XGBoost's ProbToMargin in float32: -log(1/p - 1)
        return "LOGISTIC", True, 2, [float(np.float32(-math.log(1.0 / p - 1.0)))]
    if name in ("multi:softprob", "multi:softmax"):
        if len(base) == 1:
            base = base * k
        if len(base) != k:
            raise ModelError(f"base_score holds {len(base)} values for {k} classes")
        return "SOFTMAX", True, k, base
    raise ModelError(f"objective {name!r}: its output transform is not one fastpath's tree "
                     f"stage has (supported: reg:squarederror and the other identity "
                     f"objectives, binary:logistic, reg:logistic, binary:logitraw, "
                     f"multi:softprob / multi:softmax as probabilities)")


def xgboost_ensemble(src, max_nodes: int = MAX_NODES) -> tuple:
    """(TreeEnsemble, name) from an XGBoost booster, model or saved model."""
    j, name = _json(src)
    try:
        learner = j["learner"]
        mp = learner["learner_model_param"]
        gb = learner["gradient_booster"]
        if gb.get("name") != "gbtree":
            raise ModelError(f"booster {gb.get('name')!r} is not supported (gbtree only: "
                             f"dart weights and gblinear are not trees fastpath runs)")
        model = gb["model"]
        trees = model["trees"]
        info = model["tree_info"]
        n_features = int(mp["num_feature"])
        k = max(int(mp.get("num_class", "0")), 1)
        if int(mp.get("num_target", "1")) > 1:
            raise ModelError("multi-target models are not supported")
        if len(info) != len(trees) or int(model["gbtree_model_param"]["num_trees"]) != len(trees):
            raise ModelError(f"the model lists {model['gbtree_model_param']['num_trees']} trees "
                             f"and {len(info)} classes of trees, and holds {len(trees)}")
        if n_features < 1 or not trees:
            raise ModelError("a model needs at least one feature and one tree")
        obj = learner["objective"]["name"]
        post, classifier, n_targets, base = _objective(obj, _floats(mp["base_score"]), k)
        src_trees = []
        for t, tr in enumerate(trees):
            c = int(info[t])
            if not 0 <= c < k:
                raise ModelError(f"tree {t} is for class {c}, the model has {k}")
            src_trees.append(_tree(tr, t, n_features, c if k > 1 else 0))
        te = build_ensemble(src_trees, n_features, n_targets, base_values=base,
                            post_transform=post, classifier=classifier, max_nodes=max_nodes)
    except ModelError as exc:
        raise ModelError(f"{name}: {exc}") from None
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ModelError(f"{name}: a malformed XGBoost model: {exc!r}") from None
    return te, name


def model_from_xgboost(cls, src, head=None, max_nodes: int = MAX_NODES):
    """See Model.from_xgboost."""
    te, name = xgboost_ensemble(src, max_nodes)
    return tree_model(cls, te, name, "xgboost", head)


register_format(from_xgboost=model_from_xgboost)
