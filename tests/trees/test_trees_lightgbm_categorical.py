"""LightGBM's categorical splits through onnxmltools, against onnxruntime.

onnxmltools writes a categorical split as a chain of BRANCH_EQ nodes (one per category of the
left side) whose true children are all the same node, so a tree is a DAG there; onnxruntime
follows node ids, so every path reaches that shared subtree. The importer copies a shared node
(and its subtree and leaf weights) per path; cycles, unreachable nodes and an unfolding past
the cap are refused."""
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper  # noqa: E402

from fastpath import Engine, Model, ModelError  # noqa: E402
from fastpath._kernels import PackedTrees, tree_isas  # noqa: E402
from fastpath.model import Head  # noqa: E402
from helpers.builders import engine_cfg  # noqa: E402
from helpers.oracle import assert_close, ort_run  # noqa: E402

N_FEAT = 6


def _cat_inputs(rng, n=300):
    X = rng.standard_normal((n, N_FEAT)).astype(np.float32)
    # the categorical feature: every category, its neighbours, values no category has
    X[:, 2] = rng.choice(np.array([0, 1, 2, 3, 4, 5, 6, 7, -1, 2.5, 1e9, -0.0, np.nan,
                                   np.nextafter(np.float32(3), np.float32(4))], np.float32), n)
    X[rng.random(X.shape) < 0.1] = np.nan
    return X


def _compare(path, X, isa):
    m = Model.from_onnx(path)
    ref = ort_run(path, X, fallback=-1)
    eng = Engine(m, config=engine_cfg(isa))
    assert_close(np.stack([eng.predict(x) for x in X]), ref)
    assert_close(m.forward(X), ref)
    for k in tree_isas():
        assert_close(PackedTrees(m.trees, k).eval(X), ref)
    return m


@pytest.mark.parametrize("kind", ["reg", "cls2", "cls3"])
def test_lightgbm_categorical_feature_matches_onnxruntime(tmp_path, kind, isa):
    lightgbm = pytest.importorskip("lightgbm")
    onnxmltools = pytest.importorskip("onnxmltools")
    from onnxmltools.convert.common.data_types import FloatTensorType
    rng = np.random.default_rng(7)
    X = rng.standard_normal((800, N_FEAT)).astype(np.float32)
    X[:, 2] = rng.integers(0, 8, 800)
    X[rng.random(X.shape) < 0.05] = np.nan
    y = np.tanh(np.nan_to_num(X[:, 0])) + np.isin(X[:, 2], [1, 4, 6]) - 0.5 * (X[:, 2] == 3)
    est = {"reg": lambda: lightgbm.LGBMRegressor(n_estimators=12, num_leaves=8, verbose=-1,
                                                 min_data_per_group=5, cat_smooth=1),
           "cls2": lambda: lightgbm.LGBMClassifier(n_estimators=10, num_leaves=8, verbose=-1,
                                                   min_data_per_group=5, cat_smooth=1),
           "cls3": lambda: lightgbm.LGBMClassifier(n_estimators=6, num_leaves=8, verbose=-1,
                                                   min_data_per_group=5, cat_smooth=1)}[kind]()
    target = {"reg": y, "cls2": (y > 0.5).astype(int),
              "cls3": np.digitize(y, np.quantile(y, [1 / 3, 2 / 3]))}[kind]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(X, target, categorical_feature=[2])
        om = onnxmltools.convert_lightgbm(est, initial_types=[("x", FloatTensorType([None, N_FEAT]))],
                                          zipmap=False)
    modes = [a for a in om.graph.node[0].attribute if a.name == "nodes_modes"]
    assert b"BRANCH_EQ" in modes[0].strings       # the export does hold categorical chains
    path = tmp_path / "lgb_cat.onnx"
    path.write_bytes(om.SerializeToString())
    _compare(path, _cat_inputs(np.random.default_rng(3)), isa)


def _dag(path, n_targets=2, **change):
    """One tree: node 0 x0 == 1 ? 3 : 1 (NaN: 3); node 1 x0 == 2 ? 3 : 2; node 2 x0 == 5 ? 3 : 6
    (an EQ chain whose true children are all node 3); node 3 x1 <= 0.5 ? 4 : 5 (a shared
    subtree); leaves 4, 5, 6 with a weight per target (several on leaf 4)."""
    a = dict(nodes_treeids=[0] * 7, nodes_nodeids=list(range(7)),
             nodes_featureids=[0, 0, 0, 1, 0, 0, 0],
             nodes_modes=["BRANCH_EQ", "BRANCH_EQ", "BRANCH_EQ", "BRANCH_LEQ", "LEAF", "LEAF",
                          "LEAF"],
             nodes_values=[1.0, 2.0, 5.0, 0.5, 0, 0, 0],
             nodes_truenodeids=[3, 3, 3, 4, 0, 0, 0], nodes_falsenodeids=[1, 2, 6, 5, 0, 0, 0],
             nodes_missing_value_tracks_true=[1, 1, 1, 1, 0, 0, 0],
             target_treeids=[0] * 7, target_nodeids=[4, 4, 5, 5, 6, 6, 4],
             target_ids=[0, 1, 0, 1, 0, 1, 0], target_weights=[1.5, -2.0, 3.0, 0.25, -7.0, 4.0, 0.5],
             n_targets=n_targets, base_values=[0.1, -0.2])
    a.update(change)
    node = helper.make_node("TreeEnsembleRegressor", ["x"], ["y"], domain="ai.onnx.ml", **a)
    g = helper.make_graph([node], "dag", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, n_targets])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("ai.onnx.ml", 3)])
    path.write_bytes(m.SerializeToString())
    return path


def test_a_subtree_shared_by_an_eq_chain_matches_onnxruntime(tmp_path, isa):
    path = _dag(tmp_path / "dag.onnx")
    vals = np.array([0, 1, 2, 5, 3, 0.5, -0.0, np.nan, 1e30, np.nextafter(np.float32(1), np.float32(2))],
                    np.float32)
    X = np.array([[a, b] for a in vals for b in vals], np.float32)
    m = Model.from_onnx(path, head=Head("regression", 1.0, (0,)))
    # the chain (3 nodes), node 3's subtree (3 nodes) once per path into it (3), leaf 6
    assert m.trees.n_nodes == 3 + 3 * 3 + 1
    ref = ort_run(path, X, fallback=-1)
    eng = Engine(m, config=engine_cfg(isa))
    assert_close(np.stack([eng.predict(x) for x in X]), ref)
    assert_close(m.forward(X), ref)


def test_cycles_and_unreachable_nodes_are_still_refused(tmp_path):
    # node 3's true child is node 0: a cycle through the chain
    with pytest.raises(ModelError, match="reached twice"):
        Model.from_onnx(_dag(tmp_path / "c.onnx", nodes_truenodeids=[3, 3, 3, 0, 0, 0, 0]))
    # node 2's false child is node 3 too: node 6 cannot be reached (the wrong root?)
    with pytest.raises(ModelError, match="reached twice|cannot be reached"):
        Model.from_onnx(_dag(tmp_path / "u.onnx", nodes_falsenodeids=[1, 2, 3, 5, 0, 0, 0],
                             target_nodeids=[4, 4, 5, 5, 5, 5, 4]))


def _doubling_chain(path, k, w):
    # k splits whose two children are both the next one: 2^k paths to the last node, a leaf
    # of w weights
    n = k + 1
    a = dict(nodes_treeids=[0] * n, nodes_nodeids=list(range(n)), nodes_featureids=[0] * n,
             nodes_modes=["BRANCH_LEQ"] * (n - 1) + ["LEAF"], nodes_values=[0.0] * n,
             nodes_truenodeids=list(range(1, n)) + [0], nodes_falsenodeids=list(range(1, n)) + [0],
             target_treeids=[0] * w, target_nodeids=[n - 1] * w, target_ids=[0] * w,
             target_weights=[1.0 / w] * w, n_targets=1)
    node = helper.make_node("TreeEnsembleRegressor", ["x"], ["y"], domain="ai.onnx.ml", **a)
    g = helper.make_graph([node], "blow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("ai.onnx.ml", 3)])
    path.write_bytes(m.SerializeToString())
    return path


def test_an_unfolding_past_the_cap_is_refused_before_it_is_built(tmp_path):
    path = _doubling_chain(tmp_path / "blow.onnx", 40, 1)
    with pytest.raises(ModelError, match="shared by several splits.*unfold"):
        Model.from_onnx(path)


def test_leaf_weights_copied_past_the_cap_are_refused_before_they_are_built(tmp_path):
    # 2^20 paths to one leaf of 64 weights: under the node cap (2^21 nodes) but 67 M weight
    # copies, which ran Model.from_onnx out of memory (a 1.6 KB file, MemoryError at 3.7 GB);
    # 16 weights (16.7 M copies) took 17 s and 1.85 GB and was accepted
    import resource
    for w in (64, 16):
        path = _doubling_chain(tmp_path / f"w{w}.onnx", 20, w)
        assert path.stat().st_size < 2000
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        with pytest.raises(ModelError, match="more than 4194304 nodes or leaf weights"):
            Model.from_onnx(path)
        # refused from the counts, before anything is copied (the peak RSS barely moves)
        assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000
    # a shared leaf of several weights still unfolds and matches onnxruntime
    path = _doubling_chain(tmp_path / "ok.onnx", 6, 3)
    x = np.array([[-1.0], [0.0], [1.0], [np.nan]], np.float32)
    e = Engine(Model.from_onnx(path, head=Head("regression", 1.0, (0,))))
    got = np.array([e.predict(r) for r in x], np.float32).reshape(len(x), -1)
    assert_close(got, ort_run(path, x, fallback=-1))


@pytest.mark.parametrize("miss", [[0, 0, 1, 1, 0, 0, 0], [0, 1, 0, 1, 0, 0, 0]])
def test_an_eq_chain_whose_later_node_tracks_nan_true_is_refused(tmp_path, miss):
    # onnxruntime 1.32 reads the chain as one set-membership test with node 0's missing-value
    # track: a NaN at x0 goes false (leaf 6: -6.9) there, true (into node 3) node by node
    path = _dag(tmp_path / "m.onnx", nodes_missing_value_tracks_true=miss)
    ref = ort_run(path, np.array([[np.nan, 0.0]], np.float32), fallback=-1)
    np.testing.assert_allclose(ref[0], [-6.9, 3.8], rtol=1e-6)
    with pytest.raises(ModelError, match="one set-membership test"):
        Model.from_onnx(path)
    # the same chain with one track (all true from its first node, or all false) is served
    for same in ([1, 1, 1, 1, 0, 0, 0], [0, 0, 0, 1, 0, 0, 0]):
        p2 = _dag(tmp_path / "ok.onnx", nodes_missing_value_tracks_true=same)
        X = np.array([[np.nan, 0.0], [np.nan, 1.0], [5.0, np.nan], [2.0, 1.0]], np.float32)
        assert_close(Model.from_onnx(p2, head=Head("regression", 1.0, (0,))).forward(X), ort_run(p2, X, fallback=-1))
