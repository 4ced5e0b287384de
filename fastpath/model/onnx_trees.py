"""ONNX tree ensembles (TreeEnsembleRegressor / TreeEnsembleClassifier, ai.onnx.ml opsets 1-3)
read into a fastpath.model.TreeEnsemble, with the no-ops and the input map around them."""
from __future__ import annotations

import itertools
import re
from typing import NamedTuple

import numpy as np

from fastpath.errors import ModelError
from fastpath.model.onnx_fold import _Lead, _flat_elementwise, _lead_step
from fastpath.model.onnx_graph import (_FLOAT, _INSTEAD, _TREE_OPS, _attrs, _n_features, _no_twice,
                                       _num, _reshape_noop, _s, _scaler_attrs, _tensor)
from fastpath.model.trees import TreeEnsemble

# what may stand before or after a tree ensemble without changing a float: the exporters
# write these around it
_TREE_NOOPS = ("Cast", "Identity", "Reshape", "Flatten")
_MODES = {"BRANCH_LEQ": 0, "BRANCH_LT": 1, "BRANCH_GTE": 2, "BRANCH_GT": 3, "BRANCH_EQ": 4,
          "BRANCH_NEQ": 5, "LEAF": 6}


def _inexact_before_trees(op: str, step: tuple, lead: "_Lead") -> str:
    """Why the step (offset, scale) of an op before a tree ensemble, taken into the input map
    lead, would not give the very float32 values onnxruntime's ops give, or "". The feature
    stage runs one (x - offset) * scale; onnxruntime rounds after each op. One shift then one
    scale is the same pair of roundings (c - x is (x - c) * -1: negation is exact), but two
    nonzero shifts (or two scales other than +-1) are summed (multiplied) here and rounded
    once, and x / c is x * (1 / c), where 1 / c is rounded unless c is a power of 2. Before
    dense layers such an ulp is noise; before a tree it decides a branch at a threshold."""
    off, sc = step
    if op == "Div":
        recip = np.asarray(sc, np.float64)          # 1 / c, as _lead_step took it
        c = 1.0 / recip
        if not (np.all(recip.astype(np.float32).astype(np.float64) == recip)
                and np.all(c * recip == 1.0)):
            return (f"x / c by a constant whose reciprocal is not exact in float32 (c = "
                    f"{float(np.ravel(c)[0]):g}...) is run as x * (1 / c)")
    if off is not None and np.any(np.asarray(off) != 0) and lead.stage \
            and np.any(np.asarray(lead.offset) != 0):
        return "a second shift of the input is added to the first and run as one"
    if sc is not None and np.any(np.abs(np.asarray(sc)) != 1) and lead.stage == 2 \
            and np.any(np.abs(np.asarray(lead.scale)) != 1):
        return "a second scale of the input is multiplied into the first and run as one"
    return ""


class _EnsembleAttrs(NamedTuple):
    """A tree ensemble node's attributes as arrays, checked against each other."""
    treeids: object
    nodeids: object
    feats: object
    tids: object
    fids: object
    modes: object
    vals: object
    miss: object
    agg: object
    post: object
    clf: object
    wt_tree: object
    wt_node: object
    wt_id: object
    wv: object
    n_targets: object
    base: object


def _read_trees(nodes: list, inp: str, target: str, name: str, n_in: int, consts: dict,
                rank: int = 2):
    """The chain input -> no-ops -> one tree ensemble -> no-ops -> target, read into a
    TreeEnsemble by onnxruntime's reading of the attributes: a tree is the nodes sharing a
    tree id, its root the first of them; children and leaf weights are (tree id, node id).
    Returns (the ensemble, its input map (offset, scale) or None): a Scaler or elementwise
    Sub / Add / Mul / Div by constants before the ensemble (skl2onnx writes a pipeline's
    StandardScaler so) is the model's input map, run by the feature stage in float32 with
    onnxruntime's ops, so the ensemble compares the values onnxruntime compares."""
    ens, lead, reshapes = _tree_chain(nodes, inp, target, name, consts, rank)
    what = f"{name}: {ens.op_type} node {ens.name!r}"
    at = _ensemble_attrs(ens, name, what)
    (treeids, nodeids, feats, tids, fids, modes, vals, miss, agg, post, clf, wt_tree, wt_node,
     wt_id, wv, n_targets, base) = at
    tree_list, perm, offsets, mode_a, tc, fc, w_node = _tree_layout(at, what)
    # a node two splits point to (onnxmltools' LightGBM categorical split) is copied per path
    offsets, mode_a, tc, fc, perm, w_node, w_src = _unshare(offsets, mode_a, tc, fc, perm, w_node,
                                                           what, tree_list, nodeids, feats, miss)
    wt_id, wv = wt_id[w_src], wv[w_src]
    if not n_in:
        # the input's width left open: a Reshape to (batch, k) before the ensemble says it
        # (rows of k features, checked below like a declared width); the ensemble's highest
        # feature index is only a lower bound
        n_in = next((int(s[1]) for s, _rn, after in reshapes
                     if not after and len(s) == 2 and s[0] in (-1, 0, 1) and s[1] > 0), 0)
    if not n_in and lead.stage and (np.ndim(lead.offset) or np.ndim(lead.scale)):
        # a per-feature scaler says the input's width (onnxruntime broadcasts it against
        # the rows, so they are that wide); the ensemble may split on fewer of them
        n_in = int(np.broadcast(lead.offset, lead.scale).shape[0])
    n_feat = n_in if n_in else _n_features(feats, mode_a, perm)
    for shape, rn, after in reshapes:
        w = n_targets if after else n_in
        if not _reshape_noop(shape, w):
            raise ModelError(f"{name}: Reshape node {rn.name!r} to {shape.tolist()} "
                             f"{'after' if after else 'before'} the tree ensemble is not a "
                             f"(batch, {'outputs' if after else 'features'}) no-op on a "
                             f"{w or '?'}-wide row; onnxruntime would change the rows")
    try:
        ens_out = TreeEnsemble(n_feat, n_targets, offsets, mode_a, feats[perm],
                               vals[perm].astype(np.float32),
                               tc, fc, (miss[perm] == 1).astype(np.uint8), w_node, wt_id,
                               wv.astype(np.float32), base.astype(np.float32), agg, post, clf)
        return ens_out, lead.result(ens_out.n_features, name)
    except ModelError as exc:
        raise ModelError(f"{what}: {_file_ids(str(exc), tree_list, offsets, nodeids, perm)}") \
            from None



def _tree_chain(nodes: list, inp: str, target: str, name: str, consts: dict, rank: int):
    """(the ensemble node, the input map before it (_Lead), the Reshapes around it as (shape,
    node, after the ensemble)) of the chain input -> no-ops -> one tree ensemble -> no-ops ->
    target; anything else on it is refused."""
    cur, ens = inp, None
    lead = _Lead()
    reshapes: list = []     # (shape, node, after the ensemble): checked once widths are known
    for node in nodes:
        op = node.op_type
        if op in _TREE_OPS:
            if ens is not None:
                raise ModelError(f"{name}: more than one tree ensemble on the output's path; "
                                 f"fastpath serves one ensemble per model")
            if not node.input or node.input[0] != cur:
                raise ModelError(f"{name}: {op} node {node.name!r} does not read the model input")
            if rank > 2 and not any(n.op_type in ("Flatten", "Reshape") for n in
                                    nodes[:nodes.index(node)]):
                # onnxruntime's ensemble reads rows of a 2-d input and refuses others: the
                # features of a (batch, a, b) input are a * b values only once flattened
                raise ModelError(f"{name}: {op} node {node.name!r} reads the rank-{rank} model "
                                 f"input; a tree ensemble reads (batch, features): flatten the "
                                 f"input first")
            ens = node
            cur = node.output[-1] if op == "TreeEnsembleClassifier" else node.output[0]
            if op == "TreeEnsembleClassifier" and len(node.output) < 2:
                raise ModelError(f"{name}: {op} node {node.name!r} has no probabilities output")
            continue
        if op in ("Mul", "Div") and len(node.input) == 2 and cur in node.input and ens is not None:
            # onnxmltools multiplies LightGBM's probabilities by a constant 1
            other = node.input[1] if node.input[0] == cur else node.input[0]
            c = consts.get(other)
            if op == "Div" and other != node.input[1]:
                c = None
            if c is not None and np.asarray(c).size and np.all(np.asarray(c, np.float64) == 1.0):
                cur = node.output[0]
                continue
        if ens is None and op in ("Scaler", "Sub", "Add", "Mul", "Div") and node.input \
                and cur in node.input and (op != "Scaler" or node.input[0] == cur):
            _no_twice(node, name)
            if op == "Scaler":
                try:
                    a = _attrs(node)
                except ModelError as exc:
                    raise ModelError(f"{name}: {exc}") from None
                step = _scaler_attrs(a, node, name)
            else:
                first = node.input[0] == cur
                other = node.input[1] if first else node.input[0]
                if len(node.input) != 2 or other not in consts:
                    raise ModelError(f"{name}: node {node.name!r} ({op}) before the tree "
                                     f"ensemble needs a constant operand")
                c = np.asarray(consts[other])
                if c.dtype != np.float32:
                    raise ModelError(f"{name}: node {node.name!r} ({op}) constant {other!r} is "
                                     f"{c.dtype}; fastpath reads a float32 graph (onnxruntime "
                                     f"refuses mixed element types)")
                c = c.astype(np.float64)
                if op == "Div" and (not first or np.any(c == 0)):
                    raise ModelError(f"{name}: Div node {node.name!r} is not x / nonzero constant")
                step = _lead_step(op, first, c)
            s, o = _flat_elementwise(1.0 if step[1] is None else step[1],
                                     0.0 if step[0] is None else step[0], node, name)
            why = _inexact_before_trees(op, step, lead)
            if why:
                raise ModelError(f"{name}: {op} node {node.name!r} before the tree ensemble: "
                                 f"{why}, which rounds otherwise than onnxruntime's ops one by "
                                 f"one, and a value that lands on the other side of a split's "
                                 f"threshold takes the other branch; export the scaler as one "
                                 f"Scaler (or one Sub / Add then one Mul, or Div by a power of "
                                 f"2)")
            if not lead.take(None if step[0] is None else o, None if step[1] is None else s):
                raise ModelError(f"{name}: {op} node {node.name!r} before the tree ensemble "
                                 f"shifts the input after scaling it (or does not match the "
                                 f"width of the ops before it); fastpath reads the ensemble's "
                                 f"input map as (x - offset) * scale: export the scaler alone "
                                 f"(a Scaler, or Sub then Mul / Div)")
            cur = node.output[0]
            continue
        if op not in _TREE_NOOPS or not node.input or node.input[0] != cur:
            hint = f"; {_INSTEAD[op]}" if op in _INSTEAD else ""
            raise ModelError(f"{name}: op {op} (node {node.name!r}) next to a tree ensemble is "
                             f"not supported; fastpath reads a tree ensemble with only Cast / "
                             f"Identity / Reshape / Flatten around it{hint}")
        if op == "Cast":
            to = _attrs(node).get("to")
            if to not in (_FLOAT, 11):      # float, double: the values pass unchanged
                raise ModelError(f"{name}: Cast node {node.name!r} to type {to} next to a tree "
                                 f"ensemble; only casts to float / double are no-ops")
        if op == "Reshape":
            if len(node.input) != 2 or node.input[1] not in consts:
                raise ModelError(f"{name}: Reshape node {node.name!r} needs a constant shape")
            shape = np.asarray(consts[node.input[1]])
            if shape.dtype.kind not in "iu":
                raise ModelError(f"{name}: Reshape node {node.name!r} shape is {shape.dtype}, "
                                 f"expected int64")
            shape = shape.astype(np.int64).reshape(-1)
            if _attrs(node).get("allowzero") and 0 in shape.tolist():
                raise ModelError(f"{name}: Reshape node {node.name!r} with allowzero=1 to "
                                 f"{shape.tolist()} makes an empty tensor")
            reshapes.append((shape, node, ens is not None))
        cur = node.output[0]
    if ens is None or cur != target:
        raise ModelError(f"{name}: the tree ensemble's chain ends at {cur!r}, not at the graph "
                         f"output {target!r}")
    return ens, lead, reshapes


def _ensemble_attrs(ens, name: str, what: str) -> _EnsembleAttrs:
    """The ensemble node's attributes read as onnxruntime reads them; a ModelError naming the
    node for any that is missing, damaged, or inconsistent with the others."""
    # an attribute given twice (nodes_values twice: onnxruntime refuses the node; the reader
    # kept the last copy)
    _no_twice(ens, name)
    try:
        a = _attrs(ens)
    except ModelError as exc:
        raise ModelError(f"{name}: {exc}") from None

    def seq(key, kind):
        # a damaged file can hold an attribute of another type under a known name (one
        # float for a list of ints, a tensor for a list of strings): name it, not TypeError
        v = a[key]
        ok = isinstance(v, (list, tuple)) and all(
            isinstance(x, kind) and not isinstance(x, bool) for x in v)
        if not ok:
            raise ModelError(f"{what}: attribute {key} is {type(v).__name__} "
                             f"{str(v)[:60]}, expected a list of "
                             f"{'/'.join(k.__name__ for k in kind)}")
        return list(v)

    def ints(key, required=True):
        if a.get(key) is None:
            if required:
                raise ModelError(f"{what} has no {key} attribute")
            return None
        return np.asarray(seq(key, (int,)), dtype=np.int64)

    def floats(key):
        if key in a and key + "_as_tensor" in a:
            # two sources of one list: onnxruntime refuses the node; reading either one would
            # serve a model it never ran
            raise ModelError(f"{what} has both {key} and {key}_as_tensor; a node gives one of "
                             f"them (as onnxruntime requires)")
        if key in a:
            return np.asarray(seq(key, (int, float)), dtype=np.float64)
        tkey = key + "_as_tensor"
        if tkey in a:
            t = _tensor(a[tkey], f"{what} attribute {tkey}")
            if t.dtype != np.float32:
                # onnxruntime refuses a double tensor here for a float input, and rounding one
                # to float would move splits: the thresholds must be what the runtime reads
                raise ModelError(f"{what}: {tkey} holds {t.dtype}; fastpath serves float32 "
                                 f"models, export the ensemble for float inputs")
            return np.asarray(t, np.float64).reshape(-1)
        return None

    treeids, nodeids = ints("nodes_treeids"), ints("nodes_nodeids")
    feats, tids, fids = ints("nodes_featureids"), ints("nodes_truenodeids"), ints("nodes_falsenodeids")
    try:
        modes = [_s(m) for m in seq("nodes_modes", (bytes, str))] if "nodes_modes" in a else []
        agg = _s(a.get("aggregate_function", "SUM"))
        post = _s(a.get("post_transform", "NONE"))
    except ModelError as exc:
        raise ModelError(f"{what}: {exc}") from None
    vals = floats("nodes_values")
    n = treeids.size
    if vals is None:
        # onnxruntime refuses a node without thresholds (even one of leaves only); zeros in
        # their place would split every node at 0
        raise ModelError(f"{what} has no nodes_values (or nodes_values_as_tensor): the split "
                         f"thresholds are missing")
    # onnxruntime tracks a missing value to the true branch where this is exactly 1 (not any
    # nonzero value): 2 or -1 send a NaN down the comparison like 0
    miss = ints("nodes_missing_value_tracks_true", required=False)
    if miss is None or miss.size == 0:
        miss = np.zeros(n, np.int64)
    for k, arr in (("nodes_nodeids", nodeids), ("nodes_featureids", feats),
                   ("nodes_truenodeids", tids), ("nodes_falsenodeids", fids),
                   ("nodes_modes", modes), ("nodes_values", vals),
                   ("nodes_missing_value_tracks_true", miss)):
        if len(arr) != n:
            raise ModelError(f"{what}: {k} has {len(arr)} values, nodes_treeids {n}")
    bad = [m for m in modes if m not in _MODES]
    if bad:
        raise ModelError(f"{what}: node mode {bad[0]!r} unknown; expected one of {tuple(_MODES)}")
    clf = ens.op_type == "TreeEnsembleClassifier"
    pre = "class" if clf else "target"
    wt_tree, wt_node, wt_id = ints(f"{pre}_treeids"), ints(f"{pre}_nodeids"), ints(f"{pre}_ids")
    wv = floats(f"{pre}_weights")
    if wv is None or not (wt_tree.size == wt_node.size == wt_id.size == wv.size):
        raise ModelError(f"{what}: the {pre}_treeids / _nodeids / _ids / _weights attributes "
                         f"are missing or of different lengths")
    if clf:
        labels = [seq(k, (int, bytes, str)) for k in ("classlabels_int64s", "classlabels_strings")
                  if a.get(k)]
        if len(labels) > 1:
            # the spec allows one of the two; with both, the class count is two numbers
            raise ModelError(f"{what} has both classlabels_int64s ({len(labels[0])}) and "
                             f"classlabels_strings ({len(labels[1])}); a classifier gives one")
        labels = labels[0] if labels else None
        if not labels:
            raise ModelError(f"{what} has no class labels")
        n_targets = len(labels)
    else:
        n_targets = _num(a, "n_targets", 1, ens, name)
        if not isinstance(n_targets, (int, np.integer)):
            # an int attribute: 2.5 is damage (onnxruntime refuses it), not a count to round
            raise ModelError(f"{what}: attribute n_targets is {n_targets!r}, expected an integer")
        n_targets = int(n_targets)
    base = floats("base_values")
    base = np.zeros(0) if base is None else base
    return _EnsembleAttrs(treeids, nodeids, feats, tids, fids, modes, vals, miss, agg, post, clf, wt_tree, wt_node, wt_id, wv, n_targets, base)


def _tree_layout(at: _EnsembleAttrs, what: str) -> tuple:
    """(tree ids in order, the permutation of the node list into tree order, each tree's first
    node, node modes, true and false children, each leaf weight's node), nodes re-indexed per
    tree as onnxruntime reads them: a tree is the nodes sharing a tree id, its root the first."""
    (treeids, nodeids, feats, tids, fids, modes, vals, miss, agg, post, clf, wt_tree, wt_node,
     wt_id, wv, n_targets, base) = at
    n = treeids.size
    # trees in order of first appearance, nodes re-indexed per tree
    order: dict = {}
    for i, t in enumerate(treeids.tolist()):
        order.setdefault(t, []).append(i)
    tree_list = list(order)
    if n and int(np.count_nonzero(treeids[1:] != treeids[:-1])) + 1 != len(tree_list):
        # onnxruntime starts a new tree wherever the tree id changes: a tree whose nodes come
        # back after another tree's is two trees there (two interleaved stumps whose leaves
        # add to 11 answered 44), one here. Refused rather than read either way.
        runs = np.flatnonzero(np.r_[True, treeids[1:] != treeids[:-1]])
        seen: set = set()
        for r in runs.tolist():
            t = int(treeids[r])
            if t in seen:
                raise ModelError(f"{what}: the nodes of tree id {t} are not listed together "
                                 f"(node {r} of the list returns to it after another tree's "
                                 f"nodes); onnxruntime reads each run of one tree id as a tree "
                                 f"of its own: list each tree's nodes together")
            seen.add(t)
    perm = np.concatenate([np.asarray(order[t], np.int64) for t in tree_list]) if n else \
        np.zeros(0, np.int64)
    offsets = np.zeros(len(tree_list) + 1, np.int64)
    local: dict = {}
    for k, t in enumerate(tree_list):
        idx = order[t]
        offsets[k + 1] = offsets[k] + len(idx)
        loc = {}
        for j, i in enumerate(idx):
            nid = int(nodeids[i])
            if nid in loc:
                raise ModelError(f"{what}: tree {t} has node id {nid} twice")
            loc[nid] = j
        local[t] = loc
    mode_a = np.asarray([_MODES[modes[i]] for i in perm], np.int32)
    tc = np.zeros(n, np.int64)
    fc = np.zeros(n, np.int64)
    for g, i in enumerate(perm.tolist()):
        if mode_a[g] == 6:
            tc[g] = fc[g] = -1
            continue
        loc = local[int(treeids[i])]
        for arr, ref, which in ((tc, tids, "true"), (fc, fids, "false")):
            r = int(ref[i])
            if r not in loc:
                raise ModelError(f"{what}: tree {int(treeids[i])} node {int(nodeids[i])} has "
                                 f"{which} child {r}, which is not a node of that tree")
            arr[g] = loc[r]
    gidx = {}
    for k, t in enumerate(tree_list):
        for nid, j in local[t].items():
            gidx[(t, nid)] = int(offsets[k]) + j
    w_node = np.zeros(wv.size, np.int64)
    for k, (t, nid) in enumerate(zip(wt_tree.tolist(), wt_node.tolist())):
        g = gidx.get((t, nid))
        if g is None:
            raise ModelError(f"{what}: a leaf weight names tree {t} node {nid}, which does not "
                             f"exist")
        w_node[k] = g
    return tree_list, perm, offsets, mode_a, tc, fc, w_node



# how many nodes the trees of one ensemble may unfold into (_unshare): a real export's shared
# subtrees copy to a few times its size; a crafted chain of splits whose two children are the
# same node doubles the paths at each one. The leaf weights copied with them are capped the
# same: a leaf carries any number of weights, so a 1.6 KB file (20 such splits above one leaf
# of 64 weights: 2^20 paths, 67 M weight copies) passed the node cap and ran Model.from_onnx
# out of memory (MemoryError at 3.7 GB), where it is refused now before anything is copied
_MAX_UNFOLDED_NODES = 1 << 22
_MAX_UNFOLDED_WEIGHTS = 1 << 22


def _unshare(offsets, mode_a, tc, fc, perm, w_node, what: str, tree_list: list, nodeids,
             feats, miss):
    """Trees whose nodes are reached by more than one split, unfolded into trees. onnxmltools
    writes a LightGBM categorical split as a chain of BRANCH_EQ nodes (one per category sent
    left) whose true children are all one node; onnxruntime follows node ids, so every path
    into that node runs its subtree. A copy of the subtree per path (its leaf weights with it,
    in their listed order) runs the same comparisons and adds the same leaves. A tree with a
    cycle or an unreachable node is left as it is, for TreeEnsemble to refuse and name.
    onnxruntime 1.32 runs such a chain (BRANCH_EQ on one feature, one true child, each next
    one the false child of the one before) as one set-membership test whose missing-value
    track is the first node's: a later node tracking NaN to the true branch is ignored
    there (nodes 0, 1, 2 on categories 1, 2, 5 with only node 2's track true sent a NaN
    false, where the nodes one by one send it true). Such a chain is refused.
    Returns the new (offsets, mode, tc, fc, perm, w_node) and, per new weight, the index of
    the weight it copies."""
    n = int(offsets[-1])
    w_src = np.arange(w_node.size)
    start = np.repeat(offsets[:-1], np.diff(offsets))
    inner = mode_a != 6
    indeg = np.bincount(np.concatenate([(start + tc)[inner], (start + fc)[inner]]), minlength=n)
    if not np.any(indeg > 1):
        return offsets, mode_a, tc, fc, perm, w_node, w_src
    tree_of = np.searchsorted(offsets, np.flatnonzero(indeg > 1), side="right") - 1
    shared = set(tree_of.tolist())
    new_off, srcs, ntcs, nfcs = [0], [], [], []
    copies: list = [[] for _ in range(n)]       # old global node -> its new global nodes
    n_w = np.bincount(w_node, minlength=n).tolist()     # weights on each node
    total = total_w = 0
    for t in range(offsets.size - 1):
        lo, hi = int(offsets[t]), int(offsets[t + 1])
        sizes = _unfolded_size(lo, hi, mode_a, tc, fc, n_w) if t in shared else None
        size = None if sizes is None else sizes[0]
        if size is None:
            # untouched (or left for TreeEnsemble to refuse): the same nodes, in order
            src = list(range(lo, hi))
            ltc, lfc = tc[lo:hi].tolist(), fc[lo:hi].tolist()
        else:
            for i in range(hi - lo):
                p = lo + i
                if mode_a[p] != 4 or mode_a[lo + int(fc[p])] != 4:
                    continue
                q = lo + int(fc[p])
                if tc[q] == tc[p] and feats[perm[q]] == feats[perm[p]] and miss[perm[q]] == 1 \
                        and miss[perm[p]] != 1:
                    raise ModelError(f"{what}: tree id {tree_list[t]} node id "
                                     f"{int(nodeids[perm[q]])} continues a chain of BRANCH_EQ "
                                     f"splits with one true child (node id "
                                     f"{int(nodeids[perm[p]])} before it) and tracks a missing "
                                     f"value to the true branch where the node before it does "
                                     f"not; onnxruntime reads the chain as one set-membership "
                                     f"test with the first node's missing-value track, which "
                                     f"fastpath does not reproduce: give the chain's nodes one "
                                     f"missing-value track")
            total += size
            total_w += sizes[1]
            if total > _MAX_UNFOLDED_NODES or total_w > _MAX_UNFOLDED_WEIGHTS:
                top = lo + int(np.argmax(indeg[lo:hi]))
                raise ModelError(f"{what}: tree id {tree_list[t]} has nodes shared by several "
                                 f"splits (node id {int(nodeids[perm[top]])} "
                                 f"has {int(indeg[lo:hi].max())} parents); fastpath copies such a "
                                 f"node per path, and the ensemble would unfold into more than "
                                 f"{_MAX_UNFOLDED_NODES} nodes or leaf weights; export fewer "
                                 f"categories per split or smaller trees")
            src, ltc, lfc = [], [], []
            stack = [(0, -1, True)]             # (old local node, new parent, true side)
            while stack:
                i, parent, side = stack.pop()
                j = len(src)
                src.append(lo + i)
                ltc.append(-1)
                lfc.append(-1)
                if parent >= 0:
                    (ltc if side else lfc)[parent] = j
                if mode_a[lo + i] != 6:
                    stack.append((int(fc[lo + i]), j, False))
                    stack.append((int(tc[lo + i]), j, True))
        base = new_off[-1]
        for j, g in enumerate(src):
            copies[g].append(base + j)
        srcs += src
        ntcs += ltc
        nfcs += lfc
        new_off.append(base + len(src))
    src_a = np.asarray(srcs, np.int64)
    # weight k (on old node g) once per copy of g, in the listed order: no tuple per copy
    per = [copies[g] for g in w_node.tolist()]
    w_src = np.repeat(np.arange(w_node.size, dtype=np.int64), [len(c) for c in per])
    w_new = np.fromiter(itertools.chain.from_iterable(per), np.int64, count=w_src.size)
    return (np.asarray(new_off, np.int64), mode_a[src_a], np.asarray(ntcs, np.int64),
            np.asarray(nfcs, np.int64), perm[src_a], w_new, w_src)


def _unfolded_size(lo: int, hi: int, mode_a, tc, fc, n_w):
    """(nodes, leaf weights) of tree [lo, hi) once every node has one parent (a node and its
    n_w[node] weights counted once per path into it), or None when the tree has a cycle or a
    node the root does not reach. Python ints: a crafted tree's counts pass 2^64."""
    m = hi - lo
    size = [0] * m
    wsize = [0] * m
    state = [0] * m             # 0: not seen, 1: on the current path, 2: done
    stack = [(0, False)]
    while stack:
        i, done = stack.pop()
        if done:
            g = lo + i
            if mode_a[g] == 6:
                size[i], wsize[i] = 1, n_w[g]
            else:
                a, b = int(tc[g]), int(fc[g])
                size[i] = 1 + size[a] + size[b]
                wsize[i] = n_w[g] + wsize[a] + wsize[b]
            state[i] = 2
            continue
        if state[i] == 1:
            return None
        if state[i] == 2:
            continue
        state[i] = 1
        stack.append((i, True))
        if mode_a[lo + i] != 6:
            for c in (int(fc[lo + i]), int(tc[lo + i])):
                if state[c] == 1:
                    return None
                if state[c] == 0:
                    stack.append((c, False))
    if 0 in state:
        return None
    return size[0], wsize[0]


def _file_ids(msg: str, tree_list: list, offsets: np.ndarray, nodeids: np.ndarray,
              perm: np.ndarray) -> str:
    """A TreeEnsemble message names trees by position and nodes by index within their tree;
    the file names them by tree id and node id (what its author can look up), and its root is
    the tree's first listed node, which an unreachable node usually means is not the real one."""

    def sub(m):
        t = int(m.group(1))
        if t >= len(tree_list):
            return m.group(0)
        out = f"tree id {tree_list[t]}"
        if m.group(3) is not None:
            g = int(offsets[t]) + int(m.group(3))
            nid = int(nodeids[perm[g]]) if g < int(offsets[t + 1]) else m.group(3)
            out += f"{m.group(2)} node id {nid}"
        return out
    msg2 = re.sub(r"\btree (\d+)(?:(:?) node (\d+))?", sub, msg)
    if "cannot be reached from the root" in msg:
        t = re.search(r"\btree (\d+)", msg)
        if t and int(t.group(1)) < len(tree_list):
            root = int(nodeids[perm[int(offsets[int(t.group(1))])]])
            msg2 += (f" (a tree's root is its first listed node, here node id {root}: list "
                     f"each tree's root first)")
    return msg2
