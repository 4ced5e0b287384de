"""Tree ensembles whose leaf sums leave float32's range: the numpy reference, the kernels and the
engine agree on the refusal, which names the leaf sums; leaves combined in float32 as the
engine adds them."""

import warnings

import numpy as np
import pytest

from fastpath import CachePolicy, Engine, InputError, Model
from fastpath._kernels import PackedTrees, tree_isas
from fastpath.model.trees import TreeEnsemble


F32 = np.float32


# ------------------------------------------------------------------ trees past float32
def _stumps(n, leaves, n_targets=1, post="NONE", agg="SUM", classifier=False):
    off = np.arange(n + 1) * 3
    wn, wt, wv = [], [], []
    for i in range(n):
        for j in range(n_targets):
            wn += [3 * i + 1, 3 * i + 2]
            wt += [j, j]
            wv += [leaves[0] * (1 if j == 0 else -1), leaves[1]]
    return TreeEnsemble(1, n_targets, off, [0, 6, 6] * n, [0, 0, 0] * n, [0.0, 0, 0] * n,
                        [1, 0, 0] * n, [2, 0, 0] * n, [0, 0, 0] * n, wn, wt, wv, (), agg, post,
                        classifier)


@pytest.mark.parametrize("n_targets,classifier,post,agg", [
    (1, False, "NONE", "SUM"), (1, False, "NONE", "AVERAGE"), (2, False, "NONE", "SUM"),
    (2, False, "SOFTMAX", "SUM"), (3, False, "SOFTMAX_ZERO", "AVERAGE"),
    (2, True, "SOFTMAX", "SUM"), (3, True, "SOFTMAX", "SUM"), (2, True, "LOGISTIC", "SUM")])
def test_tree_leaf_sums_past_float32_match_the_kernels_without_a_warning(n_targets, classifier,
                                                                         post, agg):
    """forward() (the numpy reference) raised numpy's RuntimeWarning ("overflow encountered
    in cast", "invalid value encountered in subtract") where the leaf sums pass FLT_MAX, an
    exception under -W error; the C kernels answer Inf / NaN there."""
    t = _stumps(3, (3e38, -3e38), n_targets, post, agg, classifier)
    X = np.array([[-1.0], [1.0]], F32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ref = t.forward(X)
    if post != "LOGISTIC":                          # a logistic of +-Inf is 0 or 1
        assert not np.all(np.isfinite(ref))
    for isa in tree_isas():
        np.testing.assert_array_equal(PackedTrees(t, isa).eval(X), ref)


def test_engine_refuses_tree_sums_past_float32(isa):
    t = _stumps(3, (3e38, -3e38))
    e = Engine(Model((), None, CachePolicy(enabled=False), {}, "none", None, trees=t), "cpu",
               {"engine": {"simd": isa, "n_symbols": 1}})
    for x in (1.0, -1.0):
        with pytest.raises(InputError):
            e.predict(np.array([x], F32))
        with pytest.raises(InputError):
            e.step(np.array([x], F32))
    assert e.ticks == 0


def test_tree_overflow_error_names_the_leaf_sums():
    t = _stumps(3, (3e38, -3e38))
    e = Engine(Model((), None, CachePolicy(enabled=False), {}, "none", None, trees=t))
    with pytest.raises(InputError, match="leaf values"):
        e.step(np.array([1.0], F32))
    with pytest.raises(InputError, match="leaf values"):
        e.predict(np.array([1.0], F32))


def test_packed_trees_refuses_bad_features_with_an_input_error():
    t = TreeEnsemble(2, 1, [0, 3], [0, 6, 6], [0, 0, 0], [0.5, 0, 0], [1, 0, 0], [2, 0, 0],
                     [0, 0, 0], [1, 2], [0, 0], [1.0, 2.0])
    p = PackedTrees(t, "scalar")
    with pytest.raises(InputError, match="numbers"):
        p.eval("ab")                               # was numpy's ValueError
    with pytest.raises(InputError, match="beyond float32"):
        p.eval(np.array([[1e300, 0.0]]))           # was cast to Inf and walked, with a warning
    with pytest.raises(InputError, match="TreeEnsemble"):
        PackedTrees("trees", "scalar")             # was AttributeError
    np.testing.assert_array_equal(p.eval(np.array([[0.5, 0.0], [0.6, 0.0]])), [[1.0], [2.0]])


@pytest.mark.parametrize("agg", ["SUM", "AVERAGE"])
def test_weights_combined_on_one_leaf_add_in_float32_as_the_engine_does(agg):
    """Several weights for one target on one leaf (1e8, 1, -1e8): the engine's packer and
    onnxruntime add them in float32 (0); forward() added them in float64 (1)."""
    t = TreeEnsemble(1, 2, [0, 3], [0, 6, 6], [0, 0, 0], [0.0, 0, 0], [1, 0, 0], [2, 0, 0],
                     [0, 0, 0], [1, 1, 1, 2, 1, 2], [0, 0, 0, 0, 1, 1],
                     [1e8, 1.0, -1e8, 5.0, 1.0, 1.0], (), agg)
    X = np.array([[-1.0], [1.0]], F32)
    ref = t.forward(X)
    np.testing.assert_array_equal(ref, [[0.0, 1.0], [5.0, 1.0]])
    for isa in tree_isas():
        np.testing.assert_array_equal(PackedTrees(t, isa).eval(X), ref)


def test_tree_model_wider_than_a_tick_names_the_ensemble():
    from fastpath import ModelError
    t = TreeEnsemble(70000, 1, [0, 3], [0, 6, 6], [69999, 0, 0], [0.5, 0, 0], [1, 0, 0],
                     [2, 0, 0], [0, 0, 0], [1, 2], [0, 0], [1.0, 2.0])
    with pytest.raises(ModelError, match="tree ensemble.*70000"):
        Model((), None, CachePolicy(enabled=False), {}, "none", None, trees=t)


@pytest.mark.parametrize("mode", [0, 1])
def test_thresholds_rounded_next_to_float32s_ends_raise_no_warning(mode):
    """A float64 threshold rounded to +-FLT_MAX stepped to the float past it (+-inf) inside
    numpy's nextafter, which printed an overflow RuntimeWarning at every load of such a model."""
    big = float(np.finfo(F32).max)
    thr = [3.0e38, 1e39, -1e39, big, -big]
    n = len(thr)
    te_args = (1, 1, np.arange(n + 1) * 3, [mode, 6, 6] * n, [0, 0, 0] * n,
               [v for t in thr for v in (t, 0.0, 0.0)], [1, 0, 0] * n, [2, 0, 0] * n,
               [0, 0, 0] * n, [k for i in range(n) for k in (3 * i + 1, 3 * i + 2)],
               [0] * (2 * n), [1.0, 2.0] * n)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        te = TreeEnsemble(*te_args)
    x = np.array([[3.0e38], [big], [-big], [np.inf], [-np.inf], [0.0]], F32)
    for isa in tree_isas():
        np.testing.assert_array_equal(PackedTrees(te, isa).eval(x), te.forward(x))
