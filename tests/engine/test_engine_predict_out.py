"""Engine.predict(x, out): the outputs written into the caller's float32 array (no new array a
call), the same bits as predict(x) on every kernel set; a bad out, or an input predict
refuses, is an InputError with out as it was."""
import numpy as np
import pytest

from fastpath import Engine, InputError
from fastpath.model import CachePolicy, Head, Layer, Model, TreeEnsemble
from helpers.builders import engine_cfg
from helpers.scalers import F, scaler_mlp


def _stumps(leaves, n_targets=1):
    """One stump per row of leaves (left, right) on x[0] <= 0.5, each leaf scoring every
    target with its value."""
    n = len(leaves)
    tgt = np.tile(np.arange(n_targets), 2 * n)
    nodes = np.repeat(np.arange(n) * 3, 2) + np.tile([1, 2], n)
    return TreeEnsemble(n_features=1, n_targets=n_targets, tree_offsets=np.arange(n + 1) * 3,
                        mode=np.tile([0, 6, 6], n), feature=np.zeros(3 * n, int),
                        threshold=np.tile([0.5, 0.0, 0.0], n), true_child=np.tile([1, 0, 0], n),
                        false_child=np.tile([2, 0, 0], n), nan_true=np.zeros(3 * n, int),
                        weight_node=np.repeat(nodes, n_targets), weight_target=tgt,
                        weight_value=np.repeat(np.asarray(leaves, float).ravel(), n_targets))


def _tree_model(leaves, n_targets=1):
    return Model((), None, CachePolicy(enabled=False),
                 head_spec=Head("regression", 1.0, (0,)), trees=_stumps(leaves, n_targets))


def _mlp(n_out):
    rng = np.random.default_rng(3)
    layers = (Layer(rng.standard_normal((8, 4)).astype(F), np.zeros(8, F), "relu"),
              Layer(rng.standard_normal((n_out, 8)).astype(F), np.zeros(n_out, F), "identity"))
    return Model(layers, None, CachePolicy(enabled=False),
                 head_spec=None if n_out == 2 else Head("regression", 1.0, (0,)))


@pytest.mark.parametrize("kind,n_out", [("mlp", 2), ("mlp", 256), ("mlp", 257), ("mlp", 300),
                                        ("trees", 1), ("trees", 256), ("trees", 257)])
def test_predict_into_out_returns_out_with_the_bits_of_a_new_array(kind, n_out, isa):
    model = _mlp(n_out) if kind == "mlp" else _tree_model([[1.0, -2.0], [0.25, 3.0]], n_out)
    eng = Engine(model, config=engine_cfg(isa))
    out = np.full(n_out, np.nan, F)
    rng = np.random.default_rng(0)
    for _ in range(20):
        x = rng.standard_normal(eng.n_features).astype(F)
        got = eng.predict(x, out)
        assert got is out
        np.testing.assert_array_equal(out, eng.predict(x))
        # positional or by name, the same call
        assert eng.predict(x, out=out) is out


@pytest.mark.parametrize("bad,why", [
    (np.zeros(2, np.float64), "float64"),
    (np.zeros(3, F), "3 values"),
    (np.zeros((1, 2), F), "2-d"),
    (np.zeros(4, F)[::2], "strided"),
    (np.zeros(2, F).astype(">f4"), "big-endian"),
    ([0.0, 0.0], "a list"),
])
def test_a_bad_out_is_refused_naming_what_it_must_be(bad, why):
    """a wrong dtype, shape, layout or byte order is an InputError before anything runs"""
    eng = Engine(_mlp(2))
    before = np.array(bad, copy=True)
    with pytest.raises(InputError, match=r"out must be a writeable, C-contiguous float32 "
                                         r"numpy.ndarray \(not a subclass, native byte order\) "
                                         r"of shape \(2,\)"):
        eng.predict(np.ones(4, F), bad)
    np.testing.assert_array_equal(np.asarray(bad), before)


def test_a_read_only_out_or_a_subclass_is_refused_and_says_why(tmp_path):
    eng = Engine(_mlp(2))
    out = np.zeros(2, F)
    out.flags.writeable = False
    with pytest.raises(InputError, match=r"\(read-only\)"):
        eng.predict(np.ones(4, F), out)
    mm = np.memmap(tmp_path / "out.f32", F, "w+", shape=(2,))
    with pytest.raises(InputError, match=r"not a subclass.*\(a memmap, a subclass\)"):
        eng.predict(np.ones(4, F), mm)
    assert not mm.any()


class _Shrinks:
    """an x whose conversion (the caller's code, run inside predict) makes out read-only"""

    def __init__(self, out):
        self.out = out

    def __array__(self, dtype=None, copy=None):
        self.out.flags.writeable = False
        return np.ones(4, F)


def test_out_is_checked_after_the_callers_code_has_run():
    """out was checked before x's conversion, which runs the caller's __array__: an out made
    read-only there was written all the same"""
    eng = Engine(_mlp(2))
    out = np.full(2, 7.0, F)
    with pytest.raises(InputError, match=r"\(read-only\)"):
        eng.predict(_Shrinks(out), out)
    np.testing.assert_array_equal(out, [7.0, 7.0])


def test_a_refused_input_leaves_out_as_it_was(isa):
    """a layer that overflows (fp_predict writes NaN outputs), leaves summing past float32
    (trees), x not finite, a scaler overflow: the error, and the caller's out untouched (the
    outputs land in a scratch first)"""
    sentinel = np.asarray([7.0, -7.0], F)
    eng = Engine(_mlp(2), config=engine_cfg(isa))
    out = sentinel.copy()
    with pytest.raises(InputError, match="a layer overflowed"):
        eng.predict(np.full(4, 3e38, F), out)
    np.testing.assert_array_equal(out, sentinel)
    with pytest.raises(InputError, match="non-finite"):
        eng.predict(np.asarray([1.0, np.inf, 0.0, 0.0], F), out)
    np.testing.assert_array_equal(out, sentinel)

    big = _tree_model([[3e38, 3e38], [3e38, 3e38]])
    eng = Engine(big, config=engine_cfg(isa))
    out = sentinel[:1].copy()
    with pytest.raises(InputError, match="summed past float32's range"):
        eng.predict(np.asarray([0.0], F), out)
    np.testing.assert_array_equal(out, sentinel[:1])

    eng = Engine(scaler_mlp(offset=0.0, scale=1e30, n=6), config=engine_cfg(isa))
    out = sentinel.copy()
    with pytest.raises(InputError, match="input scaler"):
        eng.predict(np.full(6, 1e10, F), out)
    np.testing.assert_array_equal(out, sentinel)


def test_out_may_be_the_input_array_itself():
    """x and out one array: the answer for x (the engine reads x into its own copy before any
    output is written), as the docstring allows"""
    eng = Engine(_mlp(4))
    x = np.asarray([0.5, -1.0, 2.0, 0.25], F)
    want = eng.predict(x)
    assert eng.predict(x, x) is x
    np.testing.assert_array_equal(x, want)
