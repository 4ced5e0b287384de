"""Review of the tree ensembles end to end (a hostile read of csrc/fp_trees.c, the tree kernel
sets and fastpath.model.trees): each test pins a defect found there, on every kernel set, and
fails on the code before its fix."""
import numpy as np
import pytest

from fastpath import Engine, InputError, Model, ModelError, TreeEnsemble
from fastpath._kernels import PackedTrees, tree_isas
from conftest import engine_cfg

F = np.float32


def _stumps(values, n_features=2, feature=0, thr=0.0, mode=0, miss=0):
    """One stump per value on `feature` at `thr`: its true leaf carries the value, its false
    leaf 0."""
    T = len(values)
    off = np.arange(0, 3 * T + 1, 3)
    wn = np.concatenate([[3 * t + 1, 3 * t + 2] for t in range(T)])
    wv = np.concatenate([[v, 0.0] for v in values])
    return TreeEnsemble(n_features=n_features, n_targets=1, tree_offsets=off,
                        mode=np.tile([mode, 6, 6], T), feature=np.full(3 * T, feature),
                        threshold=np.tile([thr, 0.0, 0.0], T), true_child=np.tile([1, 0, 0], T),
                        false_child=np.tile([2, 0, 0], T), nan_true=np.tile([miss, 0, 0], T),
                        weight_node=wn, weight_target=np.zeros(2 * T, int), weight_value=wv)


# ------------------------------------------- leaves of a perfect group added in float

@pytest.mark.parametrize("n_trees", [1, 7, 8, 9, 15, 16, 17, 33, 64])
def test_perfect_groups_add_their_leaves_in_double_like_the_compact_walk(n_trees, isa):
    """The perfect (lane-interleaved) part added a group's 16 leaves in float, the compact walk
    in double: 16 stumps with leaves 1e8, 1 x 14, -1e8 answered 0.5 for x = (-1, 0) and 14.5
    for x = (-1, NaN), though feature 1 is never split on (a NaN anywhere sends the input down
    the compact walk). Every kernel set now adds as the compact walk and the numpy reference
    do: the same answer whichever path the input takes."""
    rng = np.random.default_rng(n_trees)
    vals = rng.choice([1.0, 2.0, -3.0, 0.5], size=n_trees)
    vals[0] = 1e8
    if n_trees > 2:
        vals[n_trees // 2] = -1e8
    te = _stumps(vals.tolist())
    want = F(sum(float(v) for v in vals))      # exact in double: every partial sum is a float64
    x, xnan = np.array([-1.0, 0.0], F), np.array([-1.0, np.nan], F)
    assert te.forward(x)[0] == want and te.forward(xnan)[0] == want
    p = PackedTrees(te, isa)
    assert p.layout["compact"] == 0 and p.layout["groups"] == (n_trees + 15) // 16
    assert p.eval(x)[0] == want
    assert p.eval(xnan)[0] == want
    eng = Engine(Model((), trees=te), config=engine_cfg(isa))
    assert eng.predict(x)[0] == want and eng.predict(xnan)[0] == want
