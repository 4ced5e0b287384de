"""scikit-learn -> Model: Model.from_sklearn(estimator).

Design: the fitted estimator's own arrays are read (tree_ of a DecisionTree and of each tree
of a forest or GradientBoosting, the predictors of a HistGradientBoosting): sklearn compares a
float32 input (trees) or its float64 cast (HistGradientBoosting) with a float64 threshold,
`x <= t` going left and a NaN the missing_go_to_left way, so each split is one BRANCH_LEQ node
and TreeEnsemble rounds t to the largest float32 <= t. Outputs are what predict_proba (class
probabilities) or predict (values) return: a forest's leaves are divided by its tree count;
boosting adds its init estimator's raw prediction as base values and the loss's link (logistic,
softmax). Categorical HistGradientBoosting splits, multi-output classifiers and links the tree
stage lacks (the log link of poisson / gamma) are refused.
"""
from __future__ import annotations

import numpy as np

from fastpath.errors import ModelError
from fastpath.model.model import register_format
from fastpath.model.native_trees import (LEQ, MAX_NODES, Leaf, Split, build_ensemble,
                                         check_shape, tree_model)


def _cart(tr, tree: int, leaf_values) -> list:
    """Source nodes of an sklearn Tree; leaf_values(i) -> [(target, value)]."""
    lc = np.asarray(tr.children_left, np.int64)
    rc = np.asarray(tr.children_right, np.int64)
    inner = lc != -1
    check_shape(tree, lc, rc, inner)
    feat = np.asarray(tr.feature, np.int64)
    thr = np.asarray(tr.threshold, np.float64)
    mgl = np.asarray(getattr(tr, "missing_go_to_left", np.zeros(lc.size)), np.int64)
    nodes = []
    for i in range(lc.size):
        if not inner[i]:
            nodes.append(Leaf(leaf_values(i)))
            continue
        if np.isnan(thr[i]):
            raise ModelError(f"tree {tree} node {i} (feature {int(feat[i])}): NaN threshold")
        nodes.append(Split(LEQ, int(feat[i]), float(thr[i]), int(lc[i]), int(rc[i]),
                           bool(mgl[i])))
    return nodes


def _hist(pred, tree: int, klass: int) -> list:
    nd = pred.nodes
    leaf = nd["is_leaf"].astype(bool)
    lc = np.where(leaf, -1, nd["left"].astype(np.int64))
    rc = np.where(leaf, -1, nd["right"].astype(np.int64))
    check_shape(tree, lc, rc, ~leaf)
    nodes = []
    for i in range(nd.size):
        if leaf[i]:
            nodes.append(Leaf([(klass, float(nd["value"][i]))]))
            continue
        f = int(nd["feature_idx"][i])
        if nd["is_categorical"][i]:
            raise ModelError(f"tree {tree} node {i} (feature {f}): categorical splits of "
                             f"HistGradientBoosting are not supported; encode the feature "
                             f"as numeric")
        t = float(nd["num_threshold"][i])
        if np.isnan(t):
            raise ModelError(f"tree {tree} node {i} (feature {f}): NaN threshold")
        nodes.append(Split(LEQ, f, t, int(lc[i]), int(rc[i]), bool(nd["missing_go_to_left"][i])))
    return nodes


def _classes(est) -> int:
    if getattr(est, "n_outputs_", 1) != 1:
        raise ModelError(f"{type(est).__name__} with {est.n_outputs_} outputs: multi-output "
                         f"classifiers are not supported")
    k = len(est.classes_)
    if k < 2:
        raise ModelError(f"{type(est).__name__} fitted on {k} class: nothing to predict")
    return k


def _forest(est, trees: list, nf: int, max_nodes: int):
    """DecisionTree / RandomForest / ExtraTrees (one tree: a forest of one)."""
    n = len(trees)
    if hasattr(est, "classes_"):
        k = _classes(est)

        def leaf(tr):
            v = np.asarray(tr.value, np.float64)[:, 0, :]
            s = v.sum(1, keepdims=True)
            p = v / np.where(s == 0, 1.0, s) / n
            return lambda i: [(j, float(p[i, j])) for j in range(k)]
        src = [_cart(tr, t, leaf(tr)) for t, tr in enumerate(trees)]
        return build_ensemble(src, nf, k, classifier=True, max_nodes=max_nodes)
    m = int(getattr(est, "n_outputs_", 1))

    def leaf(tr):
        v = np.asarray(tr.value, np.float64)[:, :, 0]
        return lambda i: [(j, float(v[i, j])) for j in range(m)]
    src = [_cart(tr, t, leaf(tr)) for t, tr in enumerate(trees)]
    return build_ensemble(src, nf, m, aggregate="AVERAGE" if n > 1 else "SUM",
                          max_nodes=max_nodes)


def _link(est) -> str:
    loss = getattr(est, "_loss", None)
    return type(getattr(loss, "link", None)).__name__


def _boosting(est, nf: int, max_nodes: int):
    """GradientBoosting (estimators_ per stage and class), base values from the init."""
    lr = float(est.learning_rate)
    init = np.asarray(est._raw_predict_init(np.zeros((1, nf), np.float32)),
                      np.float64).reshape(-1)
    stages = est.estimators_
    K = stages.shape[1]
    scale, post, classifier, T = 1.0, "NONE", False, 1
    if hasattr(est, "classes_"):
        k = _classes(est)
        classifier = True
        if est.loss == "exponential":
            # predict_proba is expit(2 * raw): doubling is exact in binary
            scale, post, T = 2.0, "LOGISTIC", 2
        elif k == 2:
            post, T = "LOGISTIC", 2
        else:
            post, T = "SOFTMAX", k
    src = []
    for s in range(stages.shape[0]):
        for c in range(K):
            tr = stages[s, c].tree_
            v = np.asarray(tr.value, np.float64)[:, 0, 0]
            src.append(_cart(tr, len(src), lambda i, v=v, c=c: [(c, float(lr * v[i]) * scale)]))
    return build_ensemble(src, nf, T, base_values=init * scale, post_transform=post,
                          classifier=classifier, max_nodes=max_nodes)


def _hist_boosting(est, nf: int, max_nodes: int):
    link = _link(est)
    base = np.asarray(est._baseline_prediction, np.float64).reshape(-1)
    if hasattr(est, "classes_"):
        k = _classes(est)
        post, T, classifier = ("LOGISTIC", 2, True) if k == 2 else ("SOFTMAX", k, True)
        if link not in ("LogitLink", "MultinomialLogit"):
            raise ModelError(f"{type(est).__name__} with link {link}: not supported")
    else:
        if link != "IdentityLink":
            raise ModelError(f"{type(est).__name__} with loss {est.loss!r} maps its raw "
                             f"score through {link}, which fastpath's tree stage lacks "
                             f"(supported: the identity-link losses)")
        post, T, classifier = "NONE", 1, False
    src = []
    for preds in est._predictors:
        for c, p in enumerate(preds):
            src.append(_hist(p, len(src), c))
    return build_ensemble(src, nf, T, base_values=base, post_transform=post,
                          classifier=classifier, max_nodes=max_nodes)


def sklearn_ensemble(est, max_nodes: int = MAX_NODES):
    """(TreeEnsemble, name) from a fitted scikit-learn tree estimator."""
    name = type(est).__name__
    nf = getattr(est, "n_features_in_", None)
    if nf is None:
        raise ModelError(f"{name}: not a fitted scikit-learn estimator (no n_features_in_); "
                         f"fit it first")
    try:
        if hasattr(est, "tree_") and name.startswith(("DecisionTree", "ExtraTree")):
            te = _forest(est, [est.tree_], nf, max_nodes)
        elif name in ("RandomForestRegressor", "RandomForestClassifier",
                      "ExtraTreesRegressor", "ExtraTreesClassifier"):
            te = _forest(est, [e.tree_ for e in est.estimators_], nf, max_nodes)
        elif name in ("GradientBoostingRegressor", "GradientBoostingClassifier"):
            te = _boosting(est, nf, max_nodes)
        elif name in ("HistGradientBoostingRegressor", "HistGradientBoostingClassifier"):
            te = _hist_boosting(est, nf, max_nodes)
        else:
            raise ModelError("not supported: expected a DecisionTree, RandomForest, "
                             "ExtraTrees, GradientBoosting or HistGradientBoosting regressor "
                             "or classifier")
    except ModelError as exc:
        raise ModelError(f"{name}: {exc}") from None
    return te, name


def model_from_sklearn(cls, est, head=None, max_nodes: int = MAX_NODES):
    """See Model.from_sklearn."""
    te, name = sklearn_ensemble(est, max_nodes)
    return tree_model(cls, te, name, "sklearn", head)


register_format(from_sklearn=model_from_sklearn)
