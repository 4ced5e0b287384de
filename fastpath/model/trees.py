"""TreeEnsemble: a tree-ensemble model (what ONNX's ai.onnx.ml TreeEnsembleRegressor and
TreeEnsembleClassifier describe), validated completely when built, with a numpy reference of
what onnxruntime computes from it.

Design: the arrays keep the ONNX meaning (split modes as named, children as indices local to
each tree, leaf weights as (node, target, value) triples), so an import is a re-indexing and
the reference below reads the spec directly; the C packer (csrc/fp_trees.c) does the
normalization to one comparison per node. Everything the C side would refuse is refused here
first, with a ModelError that names the tree and node, and so is an ensemble whose packed
arena would pass MAX_PACKED_BYTES (its size computed by the packer's plan from O(nodes)
arrays, before anything of that size exists; nothing here builds a nodes x targets
table). The finishing stage (base values, aggregate, post transform, the two-class rules)
follows onnxruntime's tree_ensemble_aggregator.h and ml_common.h, in float32 as it computes
them.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from fastpath._checks import one_of
from fastpath.errors import ModelError
from fastpath.model._arrays import _feature_rows

MODES = ("BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ", "LEAF")
LEAF = 6
AGGREGATES = ("SUM", "AVERAGE", "MIN", "MAX")
POST_TRANSFORMS = ("NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT")
MAX_TARGETS = 4096
MAX_DEPTH = 4096
# The packed arena (csrc/fp_trees.c) may not exceed this; FP_TREES_MAX_ARENA_BYTES there is the
# same number. A large real export (5,000 trees of 255 leaves, three classes, depth <= 10:
# ~100 MB packed) fits ten times over; a crafted file of a few MB that names thousands of
# targets on every leaf (n_leaves x n_targets floats) does not, and is refused before
# anything of that size is allocated.
MAX_PACKED_BYTES = 1 << 30
# the packer's layout constants (csrc/fp_trees.h)
_PERFECT_DEPTH = 10
_LANES = 16
_ALIGN = 64
_WALK_MAX_TREES = 8192     # FP_TREES_WALK_MAX_TREES
_WBATCH = 4 + 2 * 4 * 16   # sizeof(fp_wbatch): iters, 16 roots, 16 slots


def _arr(a, dtype, what: str, n: int | None = None) -> np.ndarray:
    try:
        x = np.asarray(a)
    except Exception as exc:  # noqa: BLE001 - any conversion failure is a model error
        raise ModelError(f"tree ensemble {what} is not an array: {exc}") from None
    if x.ndim != 1 or (x.size and x.dtype.kind not in "fiub"):
        raise ModelError(f"tree ensemble {what} must be a 1-d numeric array, got {x.dtype} "
                         f"shape {x.shape}")
    if n is not None and x.shape[0] != n:
        raise ModelError(f"tree ensemble {what} has {x.shape[0]} values, expected {n}")
    if np.dtype(dtype).kind in "iu" and x.size:
        if x.dtype.kind == "f" and (not np.all(np.isfinite(x)) or np.any(x != np.round(x))):
            raise ModelError(f"tree ensemble {what} must hold integers")
        # the cast below wraps silently: a feature id 2**32 + 1 would become feature 1, a
        # class id 2**32 class 0 (onnxruntime refuses such ids)
        info = np.iinfo(dtype)
        lo, hi = x.min(), x.max()
        if lo < info.min or hi > info.max:
            raise ModelError(f"tree ensemble {what} holds {int(lo) if lo < info.min else int(hi)}, "
                             f"outside the range {info.min}..{info.max} of its {np.dtype(dtype)} "
                             f"storage")
    # a copy: the ensemble freezes its arrays, and the caller's must stay writable
    return np.array(x, dtype=dtype, order="C", copy=True)


def _f32_values(v: np.ndarray, what: str) -> np.ndarray:
    big = np.isfinite(v) & (np.abs(v) > np.finfo(np.float32).max)
    if big.any():
        raise ModelError(f"tree ensemble {what} hold {float(v[big][0])!r}, beyond float32's "
                         f"range (fastpath adds them in float32, as onnxruntime does)")
    return v.astype(np.float32)


def _split_thresholds(t64: np.ndarray, mode: np.ndarray, off: np.ndarray) -> np.ndarray:
    """float32 thresholds that split every float32 input as the given ones do. A float64
    threshold (sklearn's tree_.threshold, a midpoint of two float32 values) rounded to the
    nearest float32 can land on an input value and send it the other way: x <= t needs the
    float32 at or below t, x < t the one at or above it (GT / GTE alike); one beyond the
    float32 range becomes +-FLT_MAX or +-inf the same way. An EQ / NEQ threshold no float32
    equals is refused: no rounding keeps x == t false for every x."""
    with np.errstate(over="ignore", invalid="ignore"):
        t = t64.astype(np.float32)
    back = t.astype(np.float64)
    inexact = (back != t64) & ~np.isnan(t64)
    if not inexact.any():
        return t
    with np.errstate(over="ignore"):    # +-FLT_MAX's neighbour past it is +-inf, as meant
        down = np.where(back > t64, np.nextafter(t, np.float32(-np.inf)), t)
        up = np.where(back < t64, np.nextafter(t, np.float32(np.inf)), t)
    out = np.where((mode == 1) | (mode == 2), up, down).astype(np.float32)
    bad = np.flatnonzero(inexact & ((mode == 4) | (mode == 5)))
    if bad.size:
        t_ = int(np.searchsorted(off, bad[0], side="right") - 1)
        raise ModelError(f"tree {t_} node {int(bad[0] - off[t_])} is an {MODES[mode[bad[0]]]} "
                         f"split at {float(t64[bad[0]])!r}, which no float32 input equals; give "
                         f"a float32 threshold")
    return out


def _tree_depths(off: np.ndarray, inner: np.ndarray, tc: np.ndarray, fc: np.ndarray) -> np.ndarray:
    """Each tree's depth, once its shape is known good: from each root every node exactly
    once, children inside the tree, no deeper than MAX_DEPTH. All trees at once, one numpy
    pass per level; a bad shape is named by the walk of _shape_error."""
    n_trees = off.size - 1
    tree = np.repeat(np.arange(n_trees), np.diff(off))
    size = np.diff(off)[tree]
    ok = True
    kids = []
    for c in (tc, fc):
        ci = c[inner].astype(np.int64)
        ok &= bool(np.all((ci >= 0) & (ci < size[inner])))
        kids.append(ci)
    if ok:
        parents = np.concatenate(kids) + np.concatenate([off[:-1][tree[inner]]] * 2)
        indeg = np.bincount(parents, minlength=int(off[-1]))
        roots = off[:-1]
        # a root no one points at and one parent for every other node: then the walk from
        # the roots meets each node at most once, and it meets them all iff no cycle is left
        ok = not indeg[roots].any() and int(np.count_nonzero(indeg == 1)) == int(off[-1]) - n_trees
    if ok:
        level = np.full(int(off[-1]), -1, np.int64)
        front, d = roots.astype(np.int64), 0
        tcg = np.where(inner, tc.astype(np.int64) + off[:-1][tree], -1)
        fcg = np.where(inner, fc.astype(np.int64) + off[:-1][tree], -1)
        while front.size and d <= MAX_DEPTH:
            level[front] = d
            front = front[inner[front]]
            front = np.concatenate([tcg[front], fcg[front]])
            d += 1
        ok = not front.size and bool(np.all(level >= 0))
    if not ok:
        _shape_error(off, inner, tc, fc)
    return np.maximum.reduceat(level, off[:-1].astype(np.int64))


def _shape_error(off: np.ndarray, inner: np.ndarray, tc: np.ndarray, fc: np.ndarray) -> None:
    """Walk each tree from its root and raise a ModelError naming the first tree and node
    whose shape is wrong."""
    for t in range(off.size - 1):
        lo, hi = int(off[t]), int(off[t + 1])
        seen = np.zeros(hi - lo, bool)
        stack = [(0, 0)]
        while stack:
            i, d = stack.pop()
            if i < 0 or i >= hi - lo:
                raise ModelError(f"tree {t}: a child index {i} is outside the tree's "
                                 f"{hi - lo} nodes (a missing node)")
            if seen[i]:
                raise ModelError(f"tree {t}: node {i} is reached twice (a cycle or a shared "
                                 f"child); a tree needs one path to each node")
            seen[i] = True
            if d > MAX_DEPTH:
                raise ModelError(f"tree {t} is deeper than {MAX_DEPTH}")
            if inner[lo + i]:
                stack.append((int(fc[lo + i]), d + 1))
                stack.append((int(tc[lo + i]), d + 1))
        if not seen.all():
            raise ModelError(f"tree {t}: node {int(np.flatnonzero(~seen)[0])} cannot be "
                             f"reached from the root")
    raise AssertionError("_shape_error found no defect in a shape the level pass refused")


@dataclass(frozen=True, eq=False)
class TreeEnsemble:
    """A tree ensemble over n_features inputs with n_targets outputs (regressor targets or
    classifier classes).

    Tree t owns nodes [tree_offsets[t], tree_offsets[t+1]); its first node is its root.
    Per node: mode (index into MODES; LEAF = 6), feature, threshold, true_child /
    false_child (indices local to the tree, ignored on leaves) and nan_true (the
    missing-value track: a NaN feature takes the true branch). A split sends x to the true
    child when x[feature] <mode> threshold holds; thresholds are stored as float32, and one
    given in float64 is rounded so that every float32 x still goes the way it would. Leaf weights: weight_node (global node
    index, a leaf), weight_target, weight_value. Outputs are what onnxruntime returns:
    regressor values, or the class probabilities of a classifier."""
    n_features: int
    n_targets: int
    tree_offsets: np.ndarray
    mode: np.ndarray
    feature: np.ndarray
    threshold: np.ndarray
    true_child: np.ndarray
    false_child: np.ndarray
    nan_true: np.ndarray
    weight_node: np.ndarray
    weight_target: np.ndarray
    weight_value: np.ndarray
    base_values: Any = ()
    aggregate: str = "SUM"
    post_transform: str = "NONE"
    classifier: bool = False

    def _key(self) -> tuple:
        # arrays by dtype, shape and bytes: the generated __eq__ compared them with == and
        # raised numpy's "truth value is ambiguous" on any copy (a model read back from its
        # bundle), and the generated hash raised TypeError on them; the arrays are frozen,
        # so a hash of their bytes stays valid
        return tuple((v.dtype.str, v.shape, v.tobytes()) if isinstance(v, np.ndarray) else v
                     for v in (getattr(self, f.name) for f in fields(self)))

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        # computed once: the arrays are frozen
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash(self._key())
            object.__setattr__(self, "_hash", h)
        return h

    def __reduce__(self):
        # copy.deepcopy and pickle rebuild through the constructor (validated, arrays frozen);
        # restored as plain state, the arrays came back writable
        return (self.__class__, tuple(getattr(self, f.name) for f in fields(self)))

    def __post_init__(self) -> None:
        for k in ("n_features", "n_targets"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ModelError(f"tree ensemble {k} must be an int >= 1, got {v!r}")
            object.__setattr__(self, k, int(v))
        if not isinstance(self.classifier, (bool, np.bool_)) and self.classifier not in (0, 1):
            # bool("false") is True: a flag of another type would switch the finishing rules
            raise ModelError(f"tree ensemble classifier must be True or False, got "
                             f"{self.classifier!r}")
        if self.n_targets > MAX_TARGETS:
            raise ModelError(f"tree ensemble has {self.n_targets} targets, at most {MAX_TARGETS}")
        # strings, kept as str (numpy strings included; see one_of)
        if not one_of(self.aggregate, AGGREGATES):
            raise ModelError(f"tree ensemble aggregate {self.aggregate!r} not supported; "
                             f"expected one of {AGGREGATES}")
        if not one_of(self.post_transform, POST_TRANSFORMS):
            raise ModelError(f"tree ensemble post transform {self.post_transform!r} not "
                             f"supported; expected one of {POST_TRANSFORMS}")
        object.__setattr__(self, "aggregate", str(self.aggregate))
        object.__setattr__(self, "post_transform", str(self.post_transform))
        off = _arr(self.tree_offsets, np.int32, "tree_offsets")
        if off.size < 2 or off[0] != 0 or np.any(np.diff(off) < 1):
            raise ModelError("tree ensemble tree_offsets must start at 0 and grow by at least "
                             "one node per tree")
        n = int(off[-1])
        mode = _arr(self.mode, np.int32, "mode", n)
        feat = _arr(self.feature, np.int32, "feature", n)
        thr = _split_thresholds(_arr(self.threshold, np.float64, "threshold", n), mode, off)
        tc = _arr(self.true_child, np.int32, "true_child", n)
        fc = _arr(self.false_child, np.int32, "false_child", n)
        nt = np.asarray(self.nan_true)
        if nt.size and (nt.ndim != 1 or nt.dtype.kind not in "biuf" or
                        not np.all((nt == 0) | (nt == 1))):
            # the C packer reads any nonzero byte as true, the reference only 1 (and a -1
            # would wrap to 255 in uint8): one meaning, 0 or 1, for both
            raise ModelError("tree ensemble nan_true must hold 0 or 1 per node")
        nt = _arr(self.nan_true, np.uint8, "nan_true", n)
        wn = _arr(self.weight_node, np.int32, "weight_node")
        wt = _arr(self.weight_target, np.int32, "weight_target", wn.size)
        # read in float64 first: a value beyond float32 (1e39) is named as such, not as the
        # Inf the cast would make of it
        wv = _f32_values(_arr(self.weight_value, np.float64, "weight_value", wn.size),
                         "leaf weights")
        base = _f32_values(_arr(self.base_values, np.float64, "base_values"), "base values")
        if np.any((mode < 0) | (mode > LEAF)):
            raise ModelError(f"tree ensemble node modes must be indices into {MODES}")
        inner = mode != LEAF
        bad = np.flatnonzero(inner & ((feat < 0) | (feat >= self.n_features)))
        if bad.size:
            t, i = self._where(off, bad[0])
            raise ModelError(f"tree {t} node {i} splits on feature {feat[bad[0]]}, outside the "
                             f"model's {self.n_features} inputs")
        bad = np.flatnonzero(inner & np.isnan(thr))
        if bad.size:
            t, i = self._where(off, bad[0])
            raise ModelError(f"tree {t} node {i} has a NaN threshold")
        if not np.all(np.isfinite(wv)):
            raise ModelError("tree ensemble leaf weights contain NaN/Inf")
        if not np.all(np.isfinite(base)):
            raise ModelError("tree ensemble base values contain NaN/Inf")
        two = bool(self.classifier) and self.n_targets == 2
        if base.size not in ((0, 1, 2) if two else (0, self.n_targets)):
            # what onnxruntime accepts: 0 or one per target, and for two classes also one
            raise ModelError(f"tree ensemble has {base.size} base values; expected 0 or one "
                             f"per target ({self.n_targets})")
        if wn.size and (wn.min() < 0 or wn.max() >= n):
            raise ModelError(f"a leaf weight names node {int(wn.max()) if wn.max() >= n else int(wn.min())}, "
                             f"outside the ensemble's {n} nodes")
        if wt.size and (wt.min() < 0 or wt.max() >= self.n_targets):
            raise ModelError(f"a leaf weight names target/class {int(wt.max())}, the model has "
                             f"{self.n_targets}")
        if wn.size and np.any(inner[wn]):
            t, i = self._where(off, int(wn[np.flatnonzero(inner[wn])[0]]))
            raise ModelError(f"tree {t} node {i} is a split but carries a leaf weight")
        depth = _tree_depths(off, inner, tc, fc)
        if self.classifier:
            if self.n_targets < 2:
                raise ModelError("a tree classifier needs at least 2 classes")
            if self.aggregate != "SUM":
                raise ModelError("a tree classifier adds its trees (aggregate SUM)")
        self._check_packed_size(off, mode, wn, wt, depth, base.size, thr)
        tc = np.where(inner, tc, -1).astype(np.int32)
        fc = np.where(inner, fc, -1).astype(np.int32)
        feat = np.where(inner, feat, 0).astype(np.int32)
        thr = np.where(inner, thr, 0).astype(np.float32)
        for k, v in (("tree_offsets", off), ("mode", mode), ("feature", feat), ("threshold", thr),
                     ("true_child", tc), ("false_child", fc), ("nan_true", nt),
                     ("weight_node", wn), ("weight_target", wt), ("weight_value", wv),
                     ("base_values", base)):
            v.setflags(write=False)     # validated once: no later write may bypass it
            object.__setattr__(self, k, v)
        object.__setattr__(self, "classifier", bool(self.classifier))
        self._binary_rule()

    def _check_packed_size(self, off, mode, wn, wt, depth, n_base, thr) -> None:
        """Refuse, before anything of that size exists, an ensemble whose packed arena would
        pass MAX_PACKED_BYTES. The size is the packer's own (fp_plan_make in csrc/fp_trees.c),
        computed from O(nodes + weights) arrays."""
        need, parts = packed_layout(off, mode, wn, wt, depth, self.n_targets, n_base,
                                    self.aggregate, thr, self.n_features)
        if need <= MAX_PACKED_BYTES:
            return
        mb = 1 << 20
        big = max(parts, key=parts.get)
        fix = {"leaf values": "this ensemble's trees carry weights for several targets on "
                              "their leaves, so each leaf stores one value per target "
                              f"({self.n_targets}): export one tree per target (as LightGBM and "
                              "XGBoost do), or fewer targets, trees or leaves",
               "nodes": "export fewer trees or leaves",
               "perfect trees": "the shallow trees are laid out as perfect trees of the "
                                "deepest one's depth: export fewer trees, or a smaller maximum "
                                "depth"}.get(big, "export a smaller ensemble")
        raise ModelError(f"tree ensemble would pack into {need / mb:.0f} MB ({need} B; "
                         f"{self.n_trees} trees, {int(off[-1])} nodes, {self.n_targets} "
                         f"targets; {big}: {parts[big] / mb:.0f} MB), more than the limit of "
                         f"{MAX_PACKED_BYTES / mb:.0f} MB fastpath packs a model into: {fix}")

    @staticmethod
    def _where(off: np.ndarray, g: int) -> tuple:
        t = int(np.searchsorted(off, g, side="right") - 1)
        return t, int(g - off[t])

    # ------------------------------------------------------------- shapes
    @property
    def n_trees(self) -> int:
        return self.tree_offsets.size - 1

    @property
    def n_nodes(self) -> int:
        return int(self.tree_offsets[-1])

    @property
    def n_outputs(self) -> int:
        return self.n_targets

    def depths(self) -> np.ndarray:
        """Depth of each tree (a lone leaf: 0)."""
        out = np.zeros(self.n_trees, np.int64)
        for t in range(self.n_trees):
            lo = int(self.tree_offsets[t])
            stack, best = [(0, 0)], 0
            while stack:
                i, d = stack.pop()
                best = max(best, d)
                if self.mode[lo + i] != LEAF:
                    stack += [(int(self.true_child[lo + i]), d + 1),
                              (int(self.false_child[lo + i]), d + 1)]
            out[t] = best
        return out

    def split_thresholds(self) -> list:
        """[(feature, threshold)] of every split: inputs placed on them test the boundaries."""
        inner = np.flatnonzero(self.mode != LEAF)
        return list(zip(self.feature[inner].tolist(), self.threshold[inner].tolist()))

    def _scored(self) -> tuple:
        """(named, always) per target: whether any leaf weight names it, and whether some
        tree names it on every leaf (then every input path gives it a score)."""
        # sparse: distinct (tree, target, leaf) triples counted per (tree, target) against the
        # tree's leaf count; a dense n_nodes x n_targets table would be GBs for a crafted file
        T = self.n_targets
        named = np.zeros(T, bool)
        named[self.weight_target] = True
        always = np.zeros(T, bool)
        if not self.weight_node.size:
            return named, always
        off = self.tree_offsets
        pairs = np.unique(self.weight_node.astype(np.int64) * T + self.weight_target)
        pnode, ptarget = pairs // T, pairs % T
        ptree = np.searchsorted(off, pnode, side="right") - 1
        tt, cnt = np.unique(ptree * T + ptarget, return_counts=True)
        leaves = np.add.reduceat((self.mode == LEAF).astype(np.int64), off[:-1])
        full = cnt == leaves[tt // T]
        always[(tt % T)[full]] = True
        return named, always

    def _binary_rule(self) -> dict:
        """What onnxruntime decides once for a model: which targets are scored on every path
        (it tracks 'has a score' per target and writes an unscored output as 0, base value or
        not), whether the weights name one class only and whether they are all >= 0. A target
        scored on some paths only is refused where that changes an output (sums with a base
        value per target; the two-class rules)."""
        named, always = self._scored()
        sums = self.aggregate in ("SUM", "AVERAGE")
        T = self.n_targets
        matters = T == 2 if self.classifier else (T >= 2 and sums and self.base_values.size == T)
        if matters and np.any(named & ~always):
            j = int(np.flatnonzero(named & ~always)[0])
            raise ModelError(f"{'class' if self.classifier else 'target'} {j} has leaf weights on "
                             f"some paths only: onnxruntime's output then depends on the path "
                             f"in a way fastpath does not reproduce; export a weight for it on "
                             f"every leaf of a tree")
        if self.classifier and T == 2 and not always[1] and self.base_values.size != 2 \
                and self.post_transform == "PROBIT":
            raise ModelError("a two-class tree classifier with one score and a PROBIT post "
                             "transform: onnxruntime writes one of the two probability columns; "
                             "export both classes' weights")
        return {"single": int(named.sum()) == 1, "positive": bool(np.all(self.weight_value >= 0))}

    def gives_probabilities(self) -> bool:
        """Whether a classifier's outputs are class probabilities, each in [0, 1], on every
        input: a LOGISTIC / SOFTMAX post transform makes them so; without one (NONE) the
        leaf sums are, when no weight or base value is negative and the largest leaf sum of
        each tree, added over the trees, stays within 1 (a random forest's averaged votes).
        XGBoost's multi:softmax is exported with raw margins and NONE: read as probabilities
        by a classifier head, they made signals of +-2.3 and confidences of 1.4. PROBIT maps
        to z-scores, and a two-class NONE model with two base values writes [-s, s]."""
        if not self.classifier or self.post_transform == "PROBIT":
            return False
        if self.post_transform != "NONE":
            return True
        if np.any(self.weight_value < 0) or np.any(self.base_values < 0) or \
                (self.n_targets == 2 and self.base_values.size == 2):
            return False
        sums = np.bincount(self.weight_node, weights=self.weight_value.astype(np.float64),
                           minlength=self.n_nodes)
        most = np.maximum.reduceat(sums, self.tree_offsets[:-1].astype(np.int64)).sum()
        return bool(most + float(self.base_values.astype(np.float64).sum()) <= 1.0 + 1e-5)

    # --------------------------------------------------- numpy reference
    def forward(self, x: np.ndarray) -> np.ndarray:
        """Outputs for x (n_features,) or (n, n_features), float32, by the ONNX spec read
        directly (NaN is a missing value)."""
        x = _feature_rows(x, self.n_features, "TreeEnsemble.forward")
        one = x.ndim == 1
        X = x[None, :] if one else x
        n = X.shape[0]
        minmax = self.aggregate in ("MIN", "MAX")
        T = self.n_targets
        acc = np.full((n, T), np.nan if minmax else 0.0, np.float64)
        # per-tree leaf tables over the targets that tree names (a dense n_nodes x n_targets
        # table is GBs for a large ensemble): weights summed (SUM / AVERAGE), or combined by
        # min / max; a target a tree does not name is untouched by it either way
        one_target = not self.classifier and T == 1
        wtree = np.searchsorted(self.tree_offsets, self.weight_node, side="right") - 1
        worder = np.argsort(wtree, kind="stable")       # listing order kept within a tree
        wcut = np.searchsorted(wtree[worder], np.arange(self.n_trees + 1))
        has = np.zeros((n, T), bool)
        rows = np.arange(n)
        for t in range(self.n_trees):
            lo, hi = int(self.tree_offsets[t]), int(self.tree_offsets[t + 1])
            ks = worder[wcut[t]:wcut[t + 1]]
            gs, js, vs = self.weight_node[ks] - lo, self.weight_target[ks], self.weight_value[ks]
            cols = np.zeros(1, np.int64) if one_target else np.unique(js)
            if not cols.size:
                continue
            vals = np.full((hi - lo, cols.size), np.nan if minmax and not one_target else 0.0,
                           np.float64)
            leafhas = np.zeros((hi - lo, cols.size), bool)
            if one_target:
                # onnxruntime's one-target regressor reads one value per leaf: the first
                # weight listed for it, 0 (a real 0 under MIN / MAX) for a leaf without one
                first = np.unique(gs, return_index=True)[1]
                vals[gs[first], 0] = vs[first]
            else:
                cj = np.searchsorted(cols, js)
                for g, j, v in zip(gs.tolist(), cj.tolist(), vs.tolist()):
                    if self.aggregate == "MIN":
                        vals[g, j] = np.fmin(vals[g, j], v)
                    elif self.aggregate == "MAX":
                        vals[g, j] = np.fmax(vals[g, j], v)
                    else:
                        # in float32, one weight at a time, as the C packer combines a leaf's
                        # weights (and onnxruntime adds them): in float64, weights 1e8, 1, -1e8
                        # on one leaf came to 1 here and 0 in the engine
                        vals[g, j] = np.float32(vals[g, j]) + np.float32(v)
            leafhas[gs, np.searchsorted(cols, js)] = True
            idx = np.full(n, lo, np.int64)
            while True:
                m = self.mode[idx]
                live = m != LEAF
                if not live.any():
                    break
                xv = X[rows, self.feature[idx]]
                th = self.threshold[idx]
                with np.errstate(invalid="ignore"):
                    res = np.select([m == 0, m == 1, m == 2, m == 3, m == 4, m == 5],
                                    [xv <= th, xv < th, xv >= th, xv > th, xv == th, xv != th],
                                    False)
                res |= (self.nan_true[idx] == 1) & np.isnan(xv)
                nxt = lo + np.where(res, self.true_child[idx], self.false_child[idx])
                idx = np.where(live, nxt, idx)
            lv = vals[idx - lo]
            has[:, cols] |= leafhas[idx - lo]
            if self.aggregate == "MIN":
                acc[:, cols] = np.fmin(acc[:, cols], lv)
            elif self.aggregate == "MAX":
                acc[:, cols] = np.fmax(acc[:, cols], lv)
            else:
                acc[:, cols] += lv
        rule = self._binary_rule()
        # leaf sums past float32's range are Inf in float32, as the C finishing stage casts
        # them (and as onnxruntime adds them), and a softmax of Inf scores is NaN: numpy's
        # "overflow encountered in cast" / "invalid value encountered in subtract" warnings
        # made the reference an exception under -W error, where the engine answers Inf / NaN
        # (and refuses the tick)
        with np.errstate(over="ignore", invalid="ignore"):
            if not n:
                out = np.zeros((0, T), np.float32)
            elif not self.classifier and self.post_transform in ("NONE", "SOFTMAX", "SOFTMAX_ZERO") \
                    or (not self.classifier and T == 1):
                out = self._finalize_regressor(acc, has)
            else:
                out = np.stack([self._finalize(a, h, rule) for a, h in zip(acc, has)])
        return out[0] if one else out

    def _finalize_regressor(self, acc: np.ndarray, has: np.ndarray) -> np.ndarray:
        """_finalize for every row of a regressor at once (the calibration path runs the
        reference over many ticks); the per-row element functions are the same."""
        f = np.float32
        T = self.n_targets
        base = self.base_values
        nt = f(self.n_trees)
        minmax = self.aggregate in ("MIN", "MAX")
        s = np.where(np.isnan(acc), 0.0, acc).astype(f)
        if not minmax and self.aggregate == "AVERAGE":
            s = (s / nt).astype(f)
        if T == 1:
            s = (s + (base[0] if base.size == 1 else f(0))).astype(f)
            if self.post_transform == "PROBIT":
                return np.array([[_probit(v)] for v in s[:, 0]], f).reshape(-1, 1)
            return s
        if base.size == T:
            s = (s + base).astype(f)
        s = np.where(has, s, f(0)).astype(f)
        return np.stack([_write_scores(r, self.post_transform) for r in s]) \
            if self.post_transform != "NONE" else s

    def _finalize(self, acc: np.ndarray, has: np.ndarray, rule: dict) -> np.ndarray:
        """onnxruntime's finishing stage for one row: per-target sums (or min / max), which
        targets were scored on the path, the model's two-class rule."""
        f = np.float32
        T = self.n_targets
        base = self.base_values
        nt = f(self.n_trees)
        minmax = self.aggregate in ("MIN", "MAX")
        if not self.classifier:
            if T == 1:
                s = f(0.0) if np.isnan(acc[0]) else f(acc[0])
                if self.aggregate == "AVERAGE":
                    s = f(s / nt)
                s = f(s + (base[0] if base.size == 1 else f(0)))
                return np.array([_probit(s) if self.post_transform == "PROBIT" else s], f)
            use = base.size == T
            s = np.where(np.isnan(acc), 0.0, acc).astype(f)
            if not minmax and self.aggregate == "AVERAGE":
                s = (s / nt).astype(f)
            if use:
                s = (s + base).astype(f)
            return _write_scores(np.where(has, s, f(0)).astype(f), self.post_transform)
        s = acc.astype(f)
        if T > 2:
            s[:base.size] += base
            return _write_scores(s, self.post_transform)
        has0, has1 = bool(has[0]), bool(has[1])
        size, w = 2, -1
        if base.size == 2:
            if has1:
                s[1] = f(base[1] + s[0])
                s[0] = -s[1]
            else:
                s[1] += base[1]
                s[0] += base[0]
        elif base.size == 1:
            s[0] += base[0]
            size = 2 if has1 else 1
        else:
            w = 3
            size = 2 if has1 else 1
        if rule["single"]:
            pos = s[1] if has1 else (s[0] if has0 else f(0))
            w = (0 if pos > 0.5 else 1) if rule["positive"] else (2 if pos > 0 else 3)
        if size == 2:
            return _write_scores(np.array([s[0] if has0 else 0, s[1] if has1 else 0], f),
                                 self.post_transform)
        v = s[0] if has0 else f(0)
        if w in (0, 1):
            p = _logistic(v) if self.post_transform == "LOGISTIC" else v
            return np.array([f(1) - p, p], f)
        if self.post_transform == "LOGISTIC":
            return np.array([_logistic(-v), _logistic(v)], f)
        return np.array([-v, v], f)


def packed_layout(off, mode, wn, wt, depth, n_targets: int, n_base: int,
                  aggregate: str, thr=None, n_features=None) -> tuple:
    """(bytes, {part: bytes}) of the arena csrc/fp_trees.c packs for these arrays, by its own
    plan: a tree is one value per leaf when its weights name one target, n_targets values per
    leaf otherwise; the trees of depth <= 10 with one target, ordered splits and a sum are
    also laid out as perfect trees of the largest such depth, 16 per group and target (with
    the tree index of each lane, for the compact walk of an input holding a NaN); ensembles
    of one-target trees with ordered splits also get the lane walk's 8-byte nodes, a leaf
    value per node and batches of 16 trees."""
    off = np.asarray(off, np.int64)
    mode = np.asarray(mode)
    n_trees, n_nodes = off.size - 1, int(off[-1])
    T = int(n_targets)
    wn = np.asarray(wn, np.int64)
    wt = np.asarray(wt, np.int64)
    tree = np.searchsorted(off, wn, side="right") - 1
    # distinct targets per tree: more than one makes the tree n_targets wide
    pairs = np.unique(tree * T + wt)
    ptree, ptarget = pairs // T, pairs % T
    ntarg = np.bincount(ptree, minlength=n_trees)
    width = np.where(ntarg > 1, T, 1).astype(np.int64)
    target = np.zeros(n_trees, np.int64)
    target[ptree[::-1]] = ptarget[::-1]     # width-1 trees: their one target; others unused
    leaves = np.add.reduceat((mode == LEAF).astype(np.int64), off[:-1])
    # EQ / NEQ splits, and LT / GTE splits at |t| <= FLT_MIN (kept strict: fp_normalize)
    thr = np.asarray(thr, np.float32) if thr is not None else np.ones(mode.shape, np.float32)
    strict = ((mode == 1) | (mode == 2)) & (np.abs(thr) <= np.finfo(np.float32).tiny)
    eqs = np.add.reduceat(((mode == 4) | (mode == 5) | strict).astype(np.int64), off[:-1])
    n_leafv = int(np.sum(leaves * width))
    perfect = (aggregate in ("SUM", "AVERAGE")) & (width == 1) & \
        (np.asarray(depth) <= _PERFECT_DEPTH) & (eqs == 0)
    D = int(np.max(np.asarray(depth)[perfect])) if perfect.any() else 0
    per_target = np.bincount(target[perfect], minlength=T)
    groups = int(np.sum((per_target + _LANES - 1) // _LANES))
    n_rest = int(n_trees - perfect.sum())
    inner, nleaf = (1 << D) - 1, 1 << D
    # the lane walk: one-target trees with x <= t splits only, each tree within 65535 nodes,
    # at most 8192 trees (the features within 16 bits: n_features, where the caller knows it)
    sizes = np.diff(off)
    walk = bool(aggregate in ("SUM", "AVERAGE") and n_trees <= _WALK_MAX_TREES
                and (n_features is None or n_features <= 65536)
                and np.all(width == 1) and np.all(eqs == 0) and np.all(sizes <= 65535))
    nb_rest = -(-n_rest // _LANES) if walk else 0
    nb_all = -(-n_trees // _LANES) if walk else 0

    def al(n: int) -> int:
        return -(-n // _ALIGN) * _ALIGN

    parts = {"nodes": al(16 * n_nodes) + al(16 * n_trees) + al(4 * (n_rest + 1)),
             "leaf values": al(4 * (n_leafv + 1)),
             "base values": al(4 * (n_base + 1)) + al(T),
             "perfect trees": al(4 * (groups + 1)) + al(4 * groups * _LANES)
             + 2 * al(4 * groups * inner * _LANES) + al(4 * groups * nleaf * _LANES),
             "lane walk": (al(8 * (n_nodes + 1)) + al(4 * (n_nodes + 1)) if walk else 0)
             + al(_WBATCH * nb_rest)
             + al(_WBATCH * nb_all)}
    return sum(parts.values()), parts


def _logistic(v) -> np.float32:
    v = np.float32(v)
    e = np.float32(1) / (np.float32(1) + np.exp(-np.abs(v)))
    return np.float32(1 - e) if v < 0 else np.float32(e)


def _probit(v) -> np.float32:
    f = np.float32
    x = f(2) * f(v) - f(1)
    sgn = f(-1) if x < 0 else f(1)
    x = (f(1) - x) * (f(1) + x)
    with np.errstate(invalid="ignore", divide="ignore"):   # outside (0, 1): NaN/Inf as in ORT
        lg = np.log(x)
    a = f(2) / (f(np.pi) * f(0.147)) + f(0.5) * lg
    b = f(1) / f(0.147) * lg
    with np.errstate(invalid="ignore"):
        return f(f(1.41421356) * sgn * np.sqrt(-a + np.sqrt(a * a - b)))


def _write_scores(s: np.ndarray, post: str) -> np.ndarray:
    f = np.float32
    s = s.astype(f)
    if post == "PROBIT":
        return np.array([_probit(v) for v in s], f)
    if post == "LOGISTIC":
        return np.array([_logistic(v) for v in s], f)
    if post == "SOFTMAX":
        e = np.exp(s - s.max())
        return (e / e.sum(dtype=f)).astype(f)
    if post == "SOFTMAX_ZERO":
        mx = s.max()
        nz = (s > f(1e-7)) | (s < f(-1e-7))
        e = np.where(nz, np.exp(s - mx), s * np.exp(-mx)).astype(f)
        # all scores zero: 0 / 0, NaN as onnxruntime answers, without numpy's warning (an
        # error under -W error, where the engine's refusal of the NaN is the answer)
        with np.errstate(invalid="ignore", divide="ignore"):
            return (e / e[nz].sum(dtype=f)).astype(f)
    return s
