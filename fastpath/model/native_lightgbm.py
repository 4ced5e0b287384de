"""LightGBM -> Model: Model.from_lightgbm(booster | "model.txt" | model string).

Design: the booster's own text model is parsed (a Booster gives it through model_to_string,
so lightgbm is needed only to hand one over), and every split keeps LightGBM's decision for a
float32 input, as its predict makes it: a dense row's values with |x| <= 1e-35 (kZeroThreshold)
are read as 0; `x <= t` against the double threshold; a NaN is 0 unless missing_type is NaN;
missing_type Zero / NaN send 0 / NaN the default_left way; a categorical split sends
int(x) in its bitset left, NaN and negatives right. Splits one comparison cannot hold become
region splits (fastpath.model.native_trees). linear_tree leaves are refused.
"""
from __future__ import annotations

import math
import os

import numpy as np

from fastpath.errors import ModelError
from fastpath.model.model import register_format
from fastpath.model.native_trees import (F32, LEQ, MAX_NODES, Leaf, Region, Split,
                                         build_ensemble, check_shape, f32_below, next_up,
                                         tree_model)

# kZeroThreshold (LightGBM's meta.h: 1e-35f), as the double it is compared as
ZERO = float(F32(1e-35))
_IDENTITY = {"regression", "regression_l2", "l2", "mean_squared_error", "mse", "l2_root",
             "root_mean_squared_error", "rmse", "regression_l1", "l1", "mean_absolute_error",
             "mae", "huber", "fair", "quantile", "mape", "mean_absolute_percentage_error"}


def booster_of(src):
    """src's lightgbm.Booster when src is one of LightGBM's scikit-learn estimators
    (LGBMRegressor, LGBMClassifier, LGBMRanker), else src; ModelError when it is not fitted."""
    if type(src).__module__.split(".")[0] == "lightgbm" and hasattr(type(src), "booster_"):
        try:
            return src.booster_
        except Exception:  # noqa: BLE001 - LightGBM's own not-fitted error, said plainly
            raise ModelError(f"the {type(src).__name__} has no booster: fit it before "
                             f"loading it") from None
    return src


def _text(src) -> tuple:
    """(model text, name for errors)."""
    src = booster_of(src)
    if hasattr(src, "model_to_string"):
        return src.model_to_string(), "<lightgbm.Booster>"
    if isinstance(src, (bytes, bytearray)):
        src = bytes(src).decode("utf-8", "replace")
    # the model text always spans lines; a path never does
    if isinstance(src, os.PathLike) or (isinstance(src, str) and "\n" not in src):
        name = os.fspath(src)
        try:
            with open(name, encoding="utf-8", errors="replace") as fh:
                return fh.read(), os.path.basename(str(name))
        except OSError as exc:
            raise ModelError(f"cannot read the LightGBM model {name!r}: {exc}") from None
    if isinstance(src, str):
        return src, "<model string>"
    raise ModelError(f"Model.from_lightgbm takes a lightgbm.Booster (or a fitted LGBMRegressor "
                     f"/ LGBMClassifier), a model.txt path or the model text, got "
                     f"{type(src).__name__}")


def _kv(lines) -> dict:
    d = {}
    for ln in lines:
        k, sep, v = ln.partition("=")
        if sep:
            d[k.strip()] = v.strip()
    return d


def _nums(d: dict, key: str, n: int, tree: int, dtype=float) -> np.ndarray:
    if key not in d:
        raise ModelError(f"tree {tree}: {key} is missing (a truncated model file?)")
    try:
        vals = [dtype(x) for x in d[key].split()] if d[key] else []
    except ValueError:
        raise ModelError(f"tree {tree}: {key} holds a value that is not a number") from None
    if len(vals) != n:
        raise ModelError(f"tree {tree}: {key} has {len(vals)} values, expected {n} (a "
                         f"truncated model file?)")
    return np.array(vals, np.float64 if dtype is float else np.int64)


def _parse(text: str) -> tuple:
    """(header dict, [tree dict, ...])."""
    if not text.lstrip().startswith("tree"):
        raise ModelError("not a LightGBM text model: it does not start with 'tree'")
    blocks = text.split("\nTree=")
    head = _kv(blocks[0].splitlines())
    trees = []
    for b in blocks[1:]:
        lines = b.split("\n\n", 1)[0].splitlines()
        d = _kv(lines[1:])
        d["_index"] = lines[0].strip()
        trees.append(d)
    if "end of trees" not in text:
        raise ModelError("the LightGBM model text has no 'end of trees' line: the file is "
                         "truncated")
    return head, trees


def _cat_dest(bits: np.ndarray, left: int, right: int):
    def dest(x: float) -> int:
        if math.isnan(x):
            return right
        x = 0.0 if abs(x) <= ZERO else x
        # static_cast<int>: truncation; past int's range x86 gives INT_MIN (negative)
        i = int(x) if -2.0 ** 31 < x < 2.0 ** 31 else -1
        if i < 0 or i // 32 >= bits.size:
            return right
        return left if (int(bits[i // 32]) >> (i % 32)) & 1 else right
    return dest


def _num_dest(t: float, miss: int, default_left: bool, left: int, right: int):
    def dest(x: float) -> int:
        if math.isnan(x) and miss != 2:
            x = 0.0
        if abs(x) <= ZERO:
            x = 0.0
        if (miss == 1 and x == 0.0) or (miss == 2 and math.isnan(x)):
            return left if default_left else right
        return left if x <= t else right
    return dest


def _node(d, tree, i, feat, thr, dtype, left, right, cat_b, cat_t, n_features):
    """One source split as a Split or Region."""
    cat = dtype & 1
    default_left = bool(dtype & 2)
    miss = (dtype >> 2) & 3
    if miss == 3:
        raise ModelError(f"tree {tree} node {i} (feature {feat}): missing type {miss} unknown")
    if cat:
        k = int(thr)
        if thr != k or k < 0 or k + 1 >= cat_b.size:
            raise ModelError(f"tree {tree} node {i} (feature {feat}): categorical split "
                             f"{thr!r} names no bitset of the model's {max(cat_b.size - 1, 0)}")
        lo, hi = int(cat_b[k]), int(cat_b[k + 1])
        if not 0 <= lo <= hi <= cat_t.size:
            raise ModelError(f"tree {tree} node {i} (feature {feat}): categorical bitset "
                             f"{k} spans words {lo}..{hi}, past the model's {cat_t.size}")
        bits = cat_t[lo:hi]
        if np.any(bits < 0) or np.any(bits >= 1 << 32):
            raise ModelError(f"tree {tree} node {i} (feature {feat}): a categorical bitset "
                             f"word is outside 0..2**32-1")
        pts = [next_up(-1.0)] + [float(c) for c in range(1, 32 * bits.size + 1)]
        return Region(feat, pts, _cat_dest(bits, left, right), right)
    # +-inf is a real threshold (NaN is refused with the tree's other thresholds): LightGBM
    # splits missing values from every number with x <= inf, NaN on the other side
    dest = _num_dest(thr, miss, default_left, left, right)
    nan_dest = dest(float("nan"))
    if miss != 1 and not (-ZERO <= thr < ZERO):
        # the zero band lies on one side of t: one comparison decides every number
        return Split(LEQ, feat, thr, left, right, nan_dest == left)
    u = next_up(f32_below(thr))
    pts = [-ZERO, next_up(ZERO), u]
    return Region(feat, pts, dest, nan_dest)


def _tree(d: dict, tree: int, n_features: int, klass: int, scale: float) -> list:
    n_leaves = int(d.get("num_leaves", "0") or 0)
    if n_leaves < 1:
        raise ModelError(f"tree {tree}: num_leaves {d.get('num_leaves')!r} is not >= 1")
    if d.get("is_linear", "0") != "0":
        raise ModelError(f"tree {tree}: linear_tree leaves (a linear model per leaf) are not "
                         f"supported: fastpath's leaves hold constants; train without "
                         f"linear_tree")
    lv = _nums(d, "leaf_value", n_leaves, tree)
    bad = np.flatnonzero(~np.isfinite(lv))
    if bad.size:
        raise ModelError(f"tree {tree} leaf {int(bad[0])}: leaf value {lv[bad[0]]!r} is not "
                         f"finite")
    if n_leaves == 1:
        return [Leaf([(klass, float(lv[0]) * scale)])]
    m = n_leaves - 1
    feat = _nums(d, "split_feature", m, tree, int)
    thr = _nums(d, "threshold", m, tree)
    dt = _nums(d, "decision_type", m, tree, int)
    lc = _nums(d, "left_child", m, tree, int)
    rc = _nums(d, "right_child", m, tree, int)
    n_cat = int(d.get("num_cat", "0") or 0)
    cat_b = _nums(d, "cat_boundaries", n_cat + 1, tree, int) if n_cat else np.zeros(1, np.int64)
    cat_t = np.array([int(x) for x in d.get("cat_threshold", "").split()], np.int64) \
        if n_cat else np.zeros(0, np.int64)
    bad = np.flatnonzero((feat < 0) | (feat >= n_features))
    if bad.size:
        raise ModelError(f"tree {tree} node {int(bad[0])}: feature {int(feat[bad[0]])} is "
                         f"outside the model's {n_features} features (max_feature_idx)")
    bad = np.flatnonzero(np.isnan(thr))
    if bad.size:
        raise ModelError(f"tree {tree} node {int(bad[0])} (feature {int(feat[bad[0]])}): "
                         f"NaN threshold")
    # one index space: splits 0..m-1, leaf j (child ~j) at m + j
    ch = lambda c: int(c) if c >= 0 else m + int(~c)  # noqa: E731
    left = np.array([ch(c) for c in lc])
    right = np.array([ch(c) for c in rc])
    if np.any((lc >= m) | (rc >= m) | (lc < -n_leaves) | (rc < -n_leaves)):
        j = int(np.flatnonzero((lc >= m) | (rc >= m) | (lc < -n_leaves) | (rc < -n_leaves))[0])
        raise ModelError(f"tree {tree} node {j} (feature {int(feat[j])}): child index "
                         f"{int(lc[j])}/{int(rc[j])} is outside the tree's {m} splits and "
                         f"{n_leaves} leaves")
    inner = np.r_[np.ones(m, bool), np.zeros(n_leaves, bool)]
    check_shape(tree, np.r_[left, np.zeros(n_leaves, int)],
                np.r_[right, np.zeros(n_leaves, int)], inner)
    nodes = [_node(d, tree, i, int(feat[i]), float(thr[i]), int(dt[i]), int(left[i]),
                   int(right[i]), cat_b, cat_t, n_features) for i in range(m)]
    nodes += [Leaf([(klass, float(v) * scale)]) for v in lv]
    return nodes


def _objective(head: dict, k: int) -> tuple:
    """(post transform, classifier, n_targets, leaf scale) for the header's objective."""
    words = head.get("objective", "regression").split()
    name = words[0] if words else "regression"
    params = dict(w.split(":", 1) for w in words[1:] if ":" in w)
    if name in _IDENTITY:
        if k != 1:
            raise ModelError(f"objective {name} with {k} trees per iteration is not supported")
        return "NONE", False, 1, 1.0
    if name == "binary":
        s = float(params.get("sigmoid", "1"))
        if not (np.isfinite(s) and s > 0):
            raise ModelError(f"objective binary: sigmoid {s!r} must be a positive number")
        return "LOGISTIC", True, 2, s
    if name in ("multiclass", "softmax"):
        return "SOFTMAX", True, k, 1.0
    if name in ("multiclassova", "multiclass_ova", "ova", "ovr"):
        s = float(params.get("sigmoid", "1"))
        return "LOGISTIC", True, k, s
    raise ModelError(f"objective {name!r}: its output transform is not one fastpath's tree "
                     f"stage has (supported: regression objectives, binary, multiclass, "
                     f"multiclassova)")


def lightgbm_ensemble(src, max_nodes: int = MAX_NODES):
    """(TreeEnsemble, name) from a LightGBM booster, model file or model text."""
    text, name = _text(src)
    try:
        head, trees = _parse(text)
        k = int(head.get("num_tree_per_iteration", "1"))
        n_features = int(head["max_feature_idx"]) + 1
        if k < 1 or n_features < 1:
            raise ModelError(f"num_tree_per_iteration {k} / max_feature_idx "
                             f"{n_features - 1} out of range")
        if "tree_sizes" in head and len(head["tree_sizes"].split()) != len(trees):
            raise ModelError(f"the header lists {len(head['tree_sizes'].split())} trees "
                             f"(tree_sizes), the file holds {len(trees)}")
        if not trees or len(trees) % k:
            raise ModelError(f"{len(trees)} trees is not a whole number of iterations of {k} "
                             f"trees")
        post, classifier, n_targets, scale = _objective(head, k)
        if "average_output" in head:
            scale /= len(trees) // k
        src_trees = []
        for t, d in enumerate(trees):
            if d["_index"] != str(t):
                raise ModelError(f"tree {t} is labelled Tree={d['_index']}")
            klass = t % k if k > 1 else 0
            src_trees.append(_tree(d, t, n_features, klass, scale))
        te = build_ensemble(src_trees, n_features, n_targets, post_transform=post,
                            classifier=classifier, max_nodes=max_nodes)
    except (KeyError, ValueError) as exc:
        if isinstance(exc, ModelError):
            raise ModelError(f"{name}: {exc}") from None
        raise ModelError(f"{name}: a malformed LightGBM model: {exc!r}") from None
    return te, name


def model_from_lightgbm(cls, src, head=None, max_nodes: int = MAX_NODES):
    """See Model.from_lightgbm."""
    te, name = lightgbm_ensemble(src, max_nodes)
    return tree_model(cls, te, name, "lightgbm", head)


register_format(from_lightgbm=model_from_lightgbm)
