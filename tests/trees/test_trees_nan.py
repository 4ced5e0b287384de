"""A NaN that changes no decision changes no bit of a tree ensemble's output, on every kernel
set: the NaN path walks the same 16-lane groups (fp_trees_sum16) and adds them in the same
order as the path without one (a double sum of float leaves 1e20, 1, -1e20 depends on the
order)."""

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastpath
from fastpath import Engine, Model, TreeEnsemble
from fastpath._kernels import PackedTrees, tree_isas
from fastpath.model import FeatureSpec, Head

F32 = np.float32
FMAX = float(np.finfo(np.float32).max)
ALL_SETS = ("scalar", "avx2", "avx512")
RUNS = tree_isas()
LEAVES = [1e20, -1e20, 3e19, -7e18, 1e10, -1e10, 1.0, -1.0, 0.5, 3e-8, -2e-9, 0.0, -0.0, 1e-30]
THRS = [-2.0, -0.5, 0.0, 0.25, 1.0, 3.0]


def _need(isa):
    if isa not in RUNS:
        pytest.skip(f"tree kernel set {isa} is not supported by this CPU (runs {RUNS})")


def _stumps(leaves, n_feat=2, aggregate="SUM"):
    """len(leaves) one-split trees (LEQ on feature 0 at 0), both leaves of tree i leaves[i]:
    16 of them are one group of the perfect layout, tree i in lane i; feature 1 is read by no
    split."""
    n = len(leaves)
    wn = np.concatenate([[3 * i + 1, 3 * i + 2] for i in range(n)])
    return TreeEnsemble(n_feat, 1, np.arange(0, 3 * n + 1, 3), np.tile([0, 6, 6], n),
                        np.zeros(3 * n, np.int32), np.zeros(3 * n), np.tile([1, 0, 0], n),
                        np.tile([2, 0, 0], n), np.zeros(3 * n, np.uint8), wn,
                        np.zeros(2 * n, np.int32), np.repeat(np.asarray(leaves, float), 2),
                        aggregate=aggregate)


@pytest.mark.parametrize("isa", ALL_SETS)
@pytest.mark.parametrize("aggregate", ["SUM", "AVERAGE"])
def test_nan_in_an_unread_feature_keeps_the_group_order(isa, aggregate):
    # lanes 0, 1, 8: fp_trees_sum16 adds lane 0 with lane 8 first (exactly 0), then 1: 1;
    # index order gave 1e20 + 1 = 1e20, then 0
    _need(isa)
    lv = [0.0] * 16
    lv[0], lv[1], lv[8] = 1e20, 1.0, -1e20
    p = PackedTrees(_stumps(lv, aggregate=aggregate), isa)
    assert p.layout["groups"] == 1 and p.layout["compact"] == 0
    clean = p.eval(np.array([0.0, 5.0], F32))
    nan = p.eval(np.array([0.0, np.nan], F32))
    assert clean[0] == (1.0 if aggregate == "SUM" else F32(1.0) / F32(16))
    assert nan.tobytes() == clean.tobytes(), (clean, nan)


# ------------------------------------------------------------------ random ensembles


@st.composite
def _ensembles(draw):
    """(ensemble, free, miss, miss_dir): trees over features [0, n_used) and `miss`; feature
    `free` is read by no split; every split on `miss` is LEQ with the missing-value track
    miss_dir (a NaN there goes where -FLT_MAX goes when miss_dir, +FLT_MAX otherwise). Some
    trees take the compact walk (an EQ split, weights for two targets, depth past the perfect
    layout's), the rest are perfect; leaves span 1e-30 .. 1e20 of both signs."""
    n_used = draw(st.integers(1, 3))
    miss, free = n_used, n_used + 1
    n_feat = n_used + 2
    n_targets = draw(st.integers(1, 3))
    aggregate = draw(st.sampled_from(["SUM", "SUM", "AVERAGE", "MIN", "MAX"]))
    miss_dir = draw(st.booleans())
    # the trees from a drawn seed: a draw per node made most of the test's time
    r = random.Random(draw(st.integers(0, 2**32 - 1)))
    n_trees = r.randint(1, 40)
    off, mode, feat, thr, tc, fc, nt = [0], [], [], [], [], [], []
    wn, wt, wv = [], [], []
    for _ in range(n_trees):
        base = len(mode)
        depth = r.choice([0, 1, 1, 2, 2, 3, 11])
        wide = n_targets > 1 and r.randint(0, 5) == 0
        target = r.randint(0, n_targets - 1)

        def node(level):
            i = len(mode) - base
            if level == depth or (level > 0 and depth < 11 and r.randint(0, 3) == 0):
                mode.append(6); feat.append(0); thr.append(0.0); tc.append(0); fc.append(0)
                nt.append(0)
                for j in (range(n_targets) if wide else [target]):
                    wn.append(base + i); wt.append(j); wv.append(r.choice(LEAVES))
                return i
            f = r.randint(0, n_used)
            m = 0 if f == miss else r.choice([0, 0, 0, 1, 2, 3, 4, 5])
            mode.append(m); feat.append(f); thr.append(r.choice(THRS))
            nt.append(int(miss_dir) if f == miss else r.randint(0, 1))
            tc.append(0); fc.append(0)
            if depth == 11:       # a chain down the true side: deep, few nodes
                tc[base + i] = node(level + 1)
                fc[base + i] = node(depth)
            else:
                tc[base + i] = node(level + 1)
                fc[base + i] = node(level + 1)
            return i

        node(0)
        off.append(len(mode))
    ens = TreeEnsemble(n_feat, n_targets, np.array(off), np.array(mode), np.array(feat, np.int32),
                       np.array(thr), np.array(tc), np.array(fc), np.array(nt, np.uint8),
                       np.array(wn), np.array(wt, np.int32), np.array(wv), aggregate=aggregate)
    return ens, free, miss, miss_dir


_x = st.lists(st.sampled_from([-3.0, -1.0, -0.5, -0.0, 0.0, 0.1, 0.25, 0.5, 1.0, 2.0, 7.0]),
              min_size=3, max_size=3)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_ensembles(), _x, st.sampled_from([0.0, -1.0, 1e30, -FMAX]))
def test_a_nan_that_decides_nothing_changes_no_bit(case, xs, filler):
    ens, free, miss, miss_dir = case
    x = np.zeros(ens.n_features, F32)
    for i in range(miss):
        x[i] = xs[i % len(xs)]
    x[miss] = -FMAX if miss_dir else FMAX
    x[free] = filler
    nan_free = x.copy()
    nan_free[free] = np.nan
    nan_miss = x.copy()
    nan_miss[miss] = np.nan
    both = nan_free.copy()
    both[miss] = np.nan
    want = PackedTrees(ens, "scalar").eval(x).tobytes()
    for isa in RUNS:
        p = PackedTrees(ens, isa)
        for y in (x, nan_free, nan_miss, both):
            assert p.eval(y).tobytes() == want, (isa, y, p.layout, p.eval(y),
                                                  np.frombuffer(want, F32))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_ensembles(), _x)
def test_engine_predict_with_a_nan_matches_without(case, xs):
    # Engine.predict takes NaN for trees (a missing value); the same rule holds there
    ens, free, miss, miss_dir = case
    x = np.zeros(ens.n_features, F32)
    for i in range(miss):
        x[i] = xs[i % len(xs)]
    x[miss] = -FMAX if miss_dir else FMAX
    y = x.copy()
    y[free] = np.nan
    y[miss] = np.nan
    head = Head("regression", outputs=(0,)) if ens.n_targets > 1 else None
    m = Model((), FeatureSpec.identity(ens.n_features), head_spec=head, trees=ens)
    want = None
    for isa in RUNS:
        e = Engine(m, config={"engine": {"simd": isa, "n_symbols": 1}})
        if e.simd != isa:
            continue
        got = (e.predict(x).tobytes(), e.predict(y).tobytes())
        want = want or got
        assert got[0] == got[1] == want[0], (isa, got, want)


@pytest.mark.parametrize("isa", ALL_SETS)
def test_engine_predict_keeps_the_group_order(isa):
    _need(isa)
    lv = [0.0] * 16
    lv[0], lv[1], lv[8] = 1e20, 1.0, -1e20
    m = Model((), FeatureSpec.identity(2), trees=_stumps(lv))
    e = Engine(m, config={"engine": {"simd": isa, "n_symbols": 1}})
    assert e.simd == isa
    clean, nan = e.predict(np.array([0.0, 5.0], F32)), e.predict(np.array([0.0, np.nan], F32))
    assert clean[0] == 1.0 and nan.tobytes() == clean.tobytes(), (clean, nan)


def test_step_refuses_a_nan_tick_for_trees():
    # the tick path refuses NaN on a tree model as on an MLP: only predict takes it
    lv = [1.0] * 4
    m = Model((), FeatureSpec.identity(2), trees=_stumps(lv))
    e = Engine(m, config={"engine": {"n_symbols": 1}})
    with pytest.raises(fastpath.InputError):
        e.step(np.array([0.0, np.nan], F32), 0)
    assert e.step(np.array([0.0, 1.0], F32), 0).signal == e.step(np.array([0.0, 2.0], F32), 0).signal
