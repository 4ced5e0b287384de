"""Tree ensembles end to end (csrc/fp_trees.c, the tree kernel sets, fastpath.model.trees):
packing, walking and aggregation give the numpy reference's answer on every kernel set, and
inputs and layouts the packer cannot take are refused."""
import numpy as np
import pytest

from fastpath import Engine, InputError, Model, TreeEnsemble
from fastpath._kernels import PackedTrees
from fastpath.model.trees import packed_layout
from helpers.builders import engine_cfg
from helpers.mxcsr import flush_to_zero

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


def _random_forest(rng, n_trees, depth, n_features=4, n_targets=1):
    """n_trees full trees of `depth` LEQ / LT / GT / GTE splits on the first n_features - 1
    features (the last is never split on) with float32 leaves of mixed magnitude."""
    off, mode, feat, thr, tc, fc, wn, wt, wv = [0], [], [], [], [], [], [], [], []
    for t in range(n_trees):
        d = int(rng.integers(0, depth + 1))
        inner, leaves = 2 ** d - 1, 2 ** d
        for i in range(inner + leaves):
            leaf = i >= inner
            mode.append(6 if leaf else int(rng.integers(4)))
            feat.append(0 if leaf else int(rng.integers(n_features - 1)))
            thr.append(0.0 if leaf else float(F(rng.standard_normal())))
            tc.append(-1 if leaf else 2 * i + 1)
            fc.append(-1 if leaf else 2 * i + 2)
            if leaf:
                wn.append(off[-1] + i)
                wt.append(t % n_targets)
                wv.append(float(F(rng.standard_normal() * 10.0 ** rng.integers(-3, 3))))
        off.append(off[-1] + inner + leaves)
    return TreeEnsemble(n_features, n_targets, off, mode, feat, thr, tc, fc, np.zeros(len(mode)),
                        wn, wt, wv)


@pytest.mark.parametrize("n_trees", [7, 16, 17, 40])
def test_kernel_sets_agree_bit_for_bit_with_the_reference(n_trees, isa):
    """With the group sums in float every kernel set was a last bit or so off the numpy
    reference (and off the compact walk an input with a NaN takes) on ordinary ensembles:
    every one of 80 random ensembles differed on some input. Now the perfect part, the
    compact walk and the reference add the same leaves in double: equal to the bit."""
    rng = np.random.default_rng(n_trees)
    for n_targets in (1, 3):
        te = _random_forest(rng, n_trees, 5, n_targets=n_targets)
        X = rng.standard_normal((400, 4)).astype(F)
        X[::7, :3] = te.threshold[rng.integers(te.n_nodes, size=(len(X[::7]), 3))]
        Xn = X.copy()
        Xn[:, 3] = np.nan                   # a feature no split reads: the compact walk
        want = te.forward(X)
        p = PackedTrees(te, isa)
        assert p.layout["groups"] >= 1 and p.layout["compact"] == 0
        np.testing.assert_array_equal(p.eval(X), want)
        np.testing.assert_array_equal(p.eval(Xn), want)


def test_softmax_zero_of_all_zero_scores_is_nan_without_a_numpy_warning(isa):
    """SOFTMAX_ZERO of scores that are all 0 is 0 / 0 (onnxruntime answers NaN): the numpy
    reference raised numpy's RuntimeWarning from inside fastpath (an exception under -W
    error); it now answers NaN quietly like the kernels, and Engine.predict refuses it."""
    te = TreeEnsemble(2, 2, [0, 3], [0, 6, 6], [0, 0, 0], [0.0, 0, 0], [1, -1, -1], [2, -1, -1],
                      [0, 0, 0], [1, 1, 2, 2], [0, 1, 0, 1], [0.3, 0.1, 0.0, 0.0],
                      post_transform="SOFTMAX_ZERO")
    x = np.array([1.0, 0.0], F)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = te.forward(x)
        assert np.isnan(got).all()
        assert np.isnan(PackedTrees(te, isa).eval(x)).all()
        ok = te.forward(np.array([-1.0, 0.0], F))
    np.testing.assert_allclose(ok, PackedTrees(te, isa).eval(np.array([-1.0, 0.0], F)))
    with pytest.raises(InputError, match="NaN/Inf"):
        Engine(Model((), trees=te), config=engine_cfg(isa)).predict(x)


# ------------------------------------------- LT / GTE at 0 under denormals-are-zero

@pytest.mark.parametrize("mode", [1, 2])
@pytest.mark.parametrize("thr", [0.0, -0.0, float(np.finfo(F).tiny), -float(np.finfo(F).tiny),
                                 1e-45])
def test_lt_and_gte_near_zero_hold_under_denormals_are_zero(mode, thr, isa):
    """x < 0 was evaluated as x <= -2^-149 (the float below 0), a subnormal that a thread with
    MXCSR's denormals-are-zero reads as 0: an XGBoost-style BRANCH_LT split at 0 sent x = 0.0
    to its true leaf (signal tanh(1) = 0.76 instead of tanh(2) = 0.96), on every kernel set
    and in step(). Such a split now keeps its strict comparison: x = 0 and every normal x go
    where x < t sends them, with and without flushing (a subnormal x reads as 0 under DAZ,
    in onnxruntime too)."""
    # 17 stumps (a full group of 16 and a partial one) and a lone stump
    stumps = _stumps([1.0] * 17, n_features=1, thr=thr, mode=mode)
    deep = _stumps([1.0], n_features=1, thr=thr, mode=mode)
    t = F(thr)
    xs = np.array([0.0, -0.0, 1.0, -1.0, np.finfo(F).tiny, -np.finfo(F).tiny, 2 * np.finfo(F).tiny,
                   -2 * np.finfo(F).tiny], F)
    xs = xs[:, None]
    lt = xs[:, 0] < t
    # what x < t means when both sides are read with subnormals as 0 (DAZ)
    flush = lambda v: np.where(np.abs(v) < np.finfo(F).tiny, F(0), v)
    lt_daz = flush(xs[:, 0]) < flush(np.array([t]))[0]
    true_when = lt if mode == 1 else ~lt
    true_daz = lt_daz if mode == 1 else ~lt_daz
    for te, n in ((stumps, 17), (deep, 1)):
        want = np.where(true_when, F(n), F(0))
        np.testing.assert_array_equal(te.forward(xs)[:, 0], want)
        p = PackedTrees(te, isa)
        np.testing.assert_array_equal(p.eval(xs)[:, 0], want)
        # the strict split is walked compactly, and the Python size check plans as the packer
        assert p.layout["groups"] == 0 and p.layout["compact"] == n
        need, _ = packed_layout(te.tree_offsets, te.mode, te.weight_node, te.weight_target,
                                te.depths(), te.n_targets, te.base_values.size, te.aggregate,
                                te.threshold)
        assert need == p.layout["arena_bytes"]
        with flush_to_zero():
            got = p.eval(xs)[:, 0]
        np.testing.assert_array_equal(got, np.where(true_daz, F(n), F(0)))
    eng = Engine(Model((), trees=_stumps([1.0, 1.0], n_features=1, thr=thr, mode=mode)),
                 config=engine_cfg(isa, enabled=False))
    assert eng.step(np.zeros(1, F)).signal == pytest.approx(np.tanh(2.0 if true_when[0] else 0.0))
    with flush_to_zero():
        assert eng.step(np.zeros(1, F)).signal == pytest.approx(
            np.tanh(2.0 if true_daz[0] else 0.0))
        assert eng.step(np.full(1, -1.0, F)).signal == pytest.approx(
            np.tanh(2.0 if true_daz[3] else 0.0))
