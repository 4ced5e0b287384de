"""TreeEnsemble's shape check (every node reached once from its tree's root, children inside
the tree, depth at most MAX_DEPTH) runs over all trees at once; on random ensembles, whole or
with one child pointer damaged, it accepts exactly the ensembles a plain walk accepts, names
the defect the walk finds first, and gives each tree the depth the walk measures."""
import numpy as np
import pytest

from fastpath.errors import ModelError
from fastpath.model.trees import LEAF, MAX_DEPTH, TreeEnsemble


def _tree(rng, n_leaves):
    """(mode, true_child, false_child) of a random binary tree in preorder."""
    nodes = []

    def grow(k):
        i = len(nodes)
        nodes.append(None)
        if k == 1:
            nodes[i] = (LEAF, -1, -1)
        else:
            left = int(rng.integers(1, k))
            nodes[i] = (0, grow(left), grow(k - left))
        return i

    grow(n_leaves)
    return nodes


def _ensemble(rng, n_trees):
    trees = [_tree(rng, int(rng.integers(1, 12))) for _ in range(n_trees)]
    off = np.cumsum([0] + [len(t) for t in trees])
    mode, tc, fc = (np.array([node[k] for t in trees for node in t]) for k in range(3))
    return off, mode, tc, fc


def _walk(off, mode, tc, fc):
    """The reference: each tree walked from its root; (None, depths) or (message, None)."""
    depths = []
    for t in range(off.size - 1):
        lo, size = int(off[t]), int(off[t + 1] - off[t])
        seen, stack, deepest = np.zeros(size, bool), [(0, 0)], 0
        while stack:
            i, d = stack.pop()
            deepest = max(deepest, d)
            if i < 0 or i >= size:
                return f"tree {t}: a child index {i} is outside", None
            if seen[i]:
                return f"tree {t}: node {i} is reached twice", None
            seen[i] = True
            if d > MAX_DEPTH:
                return f"tree {t} is deeper than", None
            if mode[lo + i] != LEAF:
                stack += [(int(fc[lo + i]), d + 1), (int(tc[lo + i]), d + 1)]
        if not seen.all():
            return f"tree {t}: node {int(np.flatnonzero(~seen)[0])} cannot be reached", None
        depths.append(deepest)
    return None, depths


def _build(off, mode, tc, fc):
    n = int(off[-1])
    leaves = np.flatnonzero(mode == LEAF)
    return TreeEnsemble(3, 1, off, mode, np.zeros(n, np.int64), np.zeros(n), tc, fc,
                        np.zeros(n, np.uint8), leaves, np.zeros(leaves.size, np.int64),
                        np.ones(leaves.size, np.float32))


@pytest.mark.parametrize("seed", range(4))
def test_shape_check_decides_and_names_as_a_walk(seed):
    rng = np.random.default_rng(seed)
    refused = 0
    for case in range(250):
        off, mode, tc, fc = _ensemble(rng, int(rng.integers(1, 6)))
        inner = np.flatnonzero(mode != LEAF)
        if case % 3 and inner.size:        # two in three: one child pointer moved anywhere
            (tc if rng.random() < 0.5 else fc)[int(rng.choice(inner))] = int(rng.integers(-2, 14))
        why, _ = _walk(off, mode, tc, fc)
        if why is None:
            assert _build(off, mode, tc, fc).n_nodes == off[-1]
        else:
            refused += 1
            with pytest.raises(ModelError, match="^" + why.replace("(", r"\(")):
                _build(off, mode, tc, fc)
    assert refused > 50


def test_depths_are_the_walks():
    from fastpath.model.trees import _tree_depths
    rng = np.random.default_rng(7)
    for _ in range(200):
        off, mode, tc, fc = _ensemble(rng, int(rng.integers(1, 8)))
        assert list(_tree_depths(off, mode != LEAF, tc, fc)) == _walk(off, mode, tc, fc)[1]


def test_a_chain_deeper_than_the_limit_is_named():
    k = MAX_DEPTH + 1            # splits 0..k-1 in a chain, node k the deepest leaf
    mode = np.array([0] * k + [LEAF] * (k + 1))
    tc = np.array(list(range(1, k + 1)) + [-1] * (k + 1))
    fc = np.array(list(range(k + 1, 2 * k + 1)) + [-1] * (k + 1))
    off = np.array([0, mode.size])
    assert "deeper than" in _walk(off, mode, tc, fc)[0]
    with pytest.raises(ModelError, match=f"tree 0 is deeper than {MAX_DEPTH}"):
        _build(off, mode, tc, fc)
    ok = np.array([0, mode.size - 2])          # one split less: exactly the limit
    mode2, tc2, fc2 = mode[:-2].copy(), tc[:-2].copy(), fc[:-2].copy()
    mode2[k - 1], tc2[k - 1], fc2[k - 1] = LEAF, -1, -1
    fc2[: k - 1] = np.arange(k, 2 * k - 1)
    mode2[k:] = LEAF
    assert _walk(ok, mode2, tc2, fc2)[1] == [MAX_DEPTH]
    assert _build(ok, mode2, tc2, fc2).n_nodes == mode2.size
