"""The lane walk (csrc/fp_trees_lanes.c, fp_trees_lanes_* in the tree kernel sets): deep
(leaf-wise) and large ensembles walked 16 trees at a time give the compact walk's output bit
for bit on every kernel set and every walk, and onnxruntime's answer on LightGBM leaf-wise and
XGBoost lossguide models, on random rows, rows on the split thresholds and rows with NaN."""
import warnings

import numpy as np
import pytest

from fastpath import Engine, InputError, Model
from fastpath._kernels import PackedTrees, tree_isas
from fastpath.model.trees import packed_layout
from helpers.builders import engine_cfg
from helpers.native_trees import (WALKS, chain_ensemble, regression_data, threshold_rows,
                                  with_eq_root)
from helpers.oracle import assert_close, ort_run

F = np.float32
N_FEAT = 16


def _export(est, path, tool):
    import onnxmltools
    from onnxmltools.convert.common.data_types import FloatTensorType
    it = [("x", FloatTensorType([None, N_FEAT]))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if tool == "lgb":
            m = onnxmltools.convert_lightgbm(est, initial_types=it, zipmap=False)
        else:
            m = onnxmltools.convert_xgboost(est, initial_types=it)
    path.write_bytes(m.SerializeToString())
    return str(path)


def _lgb_leafwise():
    lightgbm = pytest.importorskip("lightgbm")
    return "lgb", lightgbm.LGBMRegressor(n_estimators=40, num_leaves=64, max_depth=-1,
                                         min_child_samples=3, verbose=-1)


def _xgb_lossguide():
    xgboost = pytest.importorskip("xgboost")
    return "xgb", xgboost.XGBRegressor(n_estimators=30, tree_method="hist", grow_policy="lossguide",
                                       max_leaves=64, max_depth=0, learning_rate=0.2)


MODELS = {"lightgbm-leafwise": _lgb_leafwise, "xgboost-lossguide": _xgb_lossguide}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    pytest.importorskip("onnxmltools")
    pytest.importorskip("onnxruntime")
    d = tmp_path_factory.mktemp("lanes")
    X, y = regression_data(3000, N_FEAT, 3)
    out = {}
    for name, make in MODELS.items():
        tool, est = make()
        out[name] = _export(est.fit(X, y), d / f"{name}.onnx", tool)
    return out


def _all_walks(trees, X):
    """{(isa, walk, perfect walk): outputs} over every kernel set this CPU runs, every walk
    and both walks of the perfect groups."""
    out = {}
    for isa in tree_isas():
        pk = PackedTrees(trees, isa)
        assert pk.layout["lane_walk"]
        for w in WALKS:
            for pw in ("gather", "steps"):
                pk.walk = w
                pk.perfect_walk = pw
                out[isa, w, pw] = pk.eval(X)
    return out


@pytest.mark.parametrize("name", list(MODELS))
def test_lane_walk_matches_compact_walk_bit_for_bit_and_onnxruntime(exported, name):
    path = exported[name]
    m = Model.from_onnx(path)
    X = threshold_rows(m.trees)
    got = _all_walks(m.trees, X)
    ref = got["scalar", "compact", "steps"]
    for key, v in got.items():
        assert np.array_equal(v, ref, equal_nan=True), key
    assert_close(ref, ort_run(path, X, fallback=-1))


@pytest.mark.parametrize("name", list(MODELS))
def test_engine_predict_with_the_walk_chosen_at_load(exported, name, isa):
    path = exported[name]
    m = Model.from_onnx(path)
    X = threshold_rows(m.trees, seed=1)
    eng = Engine(m, config=engine_cfg(isa))
    got = np.stack([eng.predict(x) for x in X])
    want = PackedTrees(m.trees, "scalar")
    want.walk = "compact"
    assert np.array_equal(got.reshape(len(X), -1), want.eval(X).reshape(len(X), -1))


def test_lane_walk_adds_leaves_in_the_compact_order():
    """A lane walk that added its trees in batch (depth-sorted) order instead of the compact
    walk's would change the double sum where leaves 1e20, 1 and -1e20 meet: mixed shallow
    (perfect) and deep (rest) chains, every walk and kernel set, the same bits as compact."""
    specs = []
    for i in range(40):
        depth = 3 if i % 3 == 0 else 14 + i % 5
        vals = np.full(depth + 1, 1.0)
        vals[:: 2] = 1e20 if i % 2 else -1e20
        specs.append((depth, vals))
    te = chain_ensemble(specs)
    X = np.array([[x, 0.0] for x in np.arange(-1.0, 20.0, 0.5)] + [[np.nan, 0.0], [3.0, np.nan]], F)
    pk = PackedTrees(te, "scalar")
    assert pk.layout["groups"] > 0 and pk.layout["compact"] > 0
    got = _all_walks(te, X)
    ref = got["scalar", "compact", "steps"]
    for key, v in got.items():
        assert np.array_equal(v, ref), key
    assert_close(ref, Model((), trees=te).forward(X))


def test_walk_without_the_lane_layout_is_refused():
    """An ensemble with an EQ split has no lane layout: asking for a lane walk is an
    InputError naming why, and the model keeps the compact walk."""
    te = chain_ensemble([(12, np.arange(13.0))])
    pk = PackedTrees(with_eq_root(te, 0), "scalar")
    assert not pk.layout["lane_walk"] and pk.walk == "compact"
    with pytest.raises(InputError, match="lane layout"):
        pk.walk = "lanes-all"
    assert pk.walk == "compact"
    with pytest.raises(InputError, match="unknown walk"):
        PackedTrees(te, "scalar").walk = "fast"


def test_packed_layout_counts_the_lane_walk():
    """The Python plan of the arena (MAX_PACKED_BYTES is checked on it) equals the C packer's
    with the lane walk's nodes and batches."""
    te = chain_ensemble([(d, np.arange(d + 1.0)) for d in (2, 5, 12, 30, 13, 11, 3)] * 5)
    need, parts = packed_layout(te.tree_offsets, te.mode, te.weight_node, te.weight_target,
                                np.array([2, 5, 12, 30, 13, 11, 3] * 5), 1, 0, "SUM",
                                te.threshold, te.n_features)
    assert parts["lane walk"] > 0
    assert need == PackedTrees(te, "scalar").layout["arena_bytes"]
