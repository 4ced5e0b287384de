"""Booster trees -> TreeEnsemble nodes, for the native loaders (LightGBM, XGBoost,
scikit-learn).

Design: a loader describes each source node as a leaf, a plain split (one comparison and a
missing-value side, as TreeEnsemble stores it) or a *region split*: a rule dest(x) that the
library applies to one float32 value, piecewise constant between a few float32 breakpoints.
A region split becomes a chain of `x < p` nodes, one per change of side, the subtree of each
piece copied under it; the rule is evaluated at each piece's left end, so the chain decides
every float32 input as the library does. That is how LightGBM's zero band, its
missing_type Zero and its categorical bitsets are kept exact with the engine's comparisons.
Copies are counted against max_nodes before anything is built. Each source tree is checked
first (children in range, every node reached once from the root), so a cycle or a shared
child is a ModelError naming the tree and node, never an endless copy.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from fastpath.errors import ModelError
from fastpath.model.policy import CachePolicy
from fastpath.model.trees import TreeEnsemble

LEQ, LT, LEAF = 0, 1, 6
F32 = np.float32
# the default cap on the nodes of a loaded ensemble, copies included (a 1,000 x 256-leaf
# booster has ~511K); Model.from_* take max_nodes to change it
MAX_NODES = 1 << 23


@dataclass
class Leaf:
    values: list            # (target, value) pairs


@dataclass
class Split:
    mode: int               # LEQ or LT
    feature: int
    threshold: float        # float64; TreeEnsemble rounds it so every float32 decides alike
    left: int               # source child taken when the comparison holds
    right: int
    nan_left: bool


@dataclass
class Region:
    feature: int
    points: list            # float32 breakpoints, ascending: pieces (-inf, p0), [p0, p1), ...
    dest: Callable          # float32 value (a Python float) -> source child
    nan_dest: int


def next_up(v: float) -> float:
    return float(np.nextafter(F32(v), F32(np.inf)))


def f32_below(t: float) -> float:
    """The largest float32 <= t (t a float64)."""
    f = F32(t)
    return float(np.nextafter(f, F32(-np.inf))) if float(f) > t else float(f)


def check_shape(tree: int, left: np.ndarray, right: np.ndarray, inner: np.ndarray,
                what: str = "node") -> None:
    """Every node of a source tree reached exactly once from node 0, children in range."""
    n = left.size
    seen = np.zeros(n, bool)
    stack = [0]
    while stack:
        i = stack.pop()
        if seen[i]:
            raise ModelError(f"tree {tree}: {what} {i} is reached twice (a cycle or a shared "
                             f"child); a tree needs one path to each node")
        seen[i] = True
        if inner[i]:
            for c in (int(left[i]), int(right[i])):
                if c < 0 or c >= n:
                    raise ModelError(f"tree {tree} {what} {i}: child index {c} is outside the "
                                     f"tree's {n} nodes")
                stack.append(c)
    if not seen.all():
        raise ModelError(f"tree {tree}: {what} {int(np.flatnonzero(~seen)[0])} is not reached "
                         f"from the root")


def _pieces(r: Region) -> tuple:
    """(breakpoints, dests) with adjacent pieces of one side merged."""
    pts = sorted(set(float(p) for p in r.points if np.isfinite(p)))
    dests = [r.dest(-np.inf)] + [r.dest(p) for p in pts]
    keep_p, keep_d = [], [dests[0]]
    for p, d in zip(pts, dests[1:]):
        if d != keep_d[-1]:
            keep_p.append(p)
            keep_d.append(d)
    return keep_p, keep_d


class _Out:
    """The nodes of one output tree, appended as the walk creates them."""

    def __init__(self, budget: int, cap: int):
        self.cap = cap
        self.mode, self.feat, self.thr, self.tc, self.fc, self.nan = [], [], [], [], [], []
        self.weights = []           # (local node, target, value)
        self.budget = budget

    def add(self, mode, feat, thr, nan) -> int:
        if len(self.mode) >= self.budget:
            raise ModelError(f"the model expands past max_nodes={self.cap} nodes (categorical "
                             f"and zero-as-missing splits copy their subtrees): raise "
                             f"max_nodes or train with fewer such splits")
        self.mode.append(mode)
        self.feat.append(feat)
        self.thr.append(thr)
        self.tc.append(0)
        self.fc.append(0)
        self.nan.append(1 if nan else 0)
        return len(self.mode) - 1

    def link(self, parent: int | None, slot: str, child: int) -> None:
        if parent is not None:
            (self.tc if slot == "t" else self.fc)[parent] = child


def _emit(nodes: list, out: _Out) -> None:
    """Walk one source tree (node 0 the root) into out, copying subtrees a region split
    names more than once."""
    stack = [(0, None, "t")]
    while stack:
        src, parent, slot = stack.pop()
        nd = nodes[src]
        if isinstance(nd, Leaf):
            i = out.add(LEAF, 0, 0.0, False)
            out.link(parent, slot, i)
            out.weights.extend((i, t, v) for t, v in nd.values)
        elif isinstance(nd, Split):
            i = out.add(nd.mode, nd.feature, nd.threshold, nd.nan_left)
            out.link(parent, slot, i)
            stack.append((nd.left, i, "t"))
            stack.append((nd.right, i, "f"))
        else:
            pts, dests = _pieces(nd)
            if not pts and nd.nan_dest == dests[0]:
                stack.append((dests[0], parent, slot))
                continue
            if nd.nan_dest not in (dests[0], dests[-1]):
                # a node no number satisfies (x < -inf) whose missing track takes NaN
                i = out.add(LT, nd.feature, -np.inf, True)
                out.link(parent, slot, i)
                stack.append((nd.nan_dest, i, "t"))
                parent, slot = i, "f"
            first_nan = nd.nan_dest == dests[0] and nd.nan_dest != dests[-1]
            for k, p in enumerate(pts):
                i = out.add(LT, nd.feature, p, first_nan and k == 0)
                out.link(parent, slot, i)
                stack.append((dests[k], i, "t"))
                parent, slot = i, "f"
            stack.append((dests[-1], parent, slot))


def build_ensemble(trees: list, n_features: int, n_targets: int, *, base_values=(),
                   post_transform: str = "NONE", classifier: bool = False,
                   aggregate: str = "SUM", max_nodes: int = MAX_NODES) -> TreeEnsemble:
    """A TreeEnsemble from source trees (each a list of Leaf / Split / Region, node 0 the
    root, already checked with check_shape)."""
    if isinstance(max_nodes, bool) or not isinstance(max_nodes, (int, np.integer)) \
            or max_nodes < 1:
        raise ModelError(f"max_nodes must be an int >= 1, got {max_nodes!r}")
    cols = {k: [] for k in ("mode", "feat", "thr", "tc", "fc", "nan")}
    wn, wt, wv = [], [], []
    off = [0]
    for t, nodes in enumerate(trees):
        out = _Out(int(max_nodes) - off[-1], int(max_nodes))
        try:
            _emit(nodes, out)
        except ModelError as exc:
            raise ModelError(f"tree {t}: {exc}") from None
        for k, v in zip(cols, (out.mode, out.feat, out.thr, out.tc, out.fc, out.nan)):
            cols[k].extend(v)
        for i, tg, v in out.weights:
            wn.append(off[-1] + i)
            wt.append(tg)
            wv.append(v)
        off.append(off[-1] + len(out.mode))
    return TreeEnsemble(n_features=n_features, n_targets=n_targets, tree_offsets=np.array(off),
                        mode=np.array(cols["mode"], np.int32),
                        feature=np.array(cols["feat"], np.int64),
                        threshold=np.array(cols["thr"], np.float64),
                        true_child=np.array(cols["tc"], np.int64),
                        false_child=np.array(cols["fc"], np.int64),
                        nan_true=np.array(cols["nan"], np.uint8),
                        weight_node=np.array(wn, np.int64), weight_target=np.array(wt, np.int64),
                        weight_value=np.array(wv, np.float64),
                        base_values=np.asarray(base_values, np.float64).reshape(-1),
                        aggregate=aggregate, post_transform=post_transform,
                        classifier=classifier)


def tree_model(cls, te: TreeEnsemble, name: str, library: str, head):
    """The Model around a loaded ensemble, its source and library in meta (no feature spec,
    no cache); a refusal names the source."""
    try:
        return cls((), None, CachePolicy(enabled=False),
                   {"source": name, "native": library}, "none", head, trees=te)
    except ModelError as exc:
        raise ModelError(f"{name}: {exc}") from None
