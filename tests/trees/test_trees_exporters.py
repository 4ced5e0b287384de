"""Tree ensembles as the real exporters write them (skl2onnx: GradientBoosting, RandomForest,
ExtraTrees, HistGradientBoosting; onnxmltools: LightGBM, XGBoost) and as hand-built graphs
for each split mode, missing-value track, aggregate and post transform: Engine.predict,
every tree kernel set (PackedTrees) and the numpy reference (Model.forward) must equal
onnxruntime on random inputs, order-book inputs and inputs placed exactly on the split
thresholds; step() maps the outputs through the model's head; bad graphs are refused."""
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
sklearn = pytest.importorskip("sklearn")
skl2onnx = pytest.importorskip("skl2onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from sklearn.ensemble import (ExtraTreesRegressor, GradientBoostingClassifier,  # noqa: E402
                              GradientBoostingRegressor, HistGradientBoostingClassifier,
                              HistGradientBoostingRegressor, RandomForestClassifier,
                              RandomForestRegressor)

from fastpath import Engine, InputError, Model, ModelError, TreeEnsemble, lob  # noqa: E402
from fastpath._kernels import PackedTrees, tree_isas  # noqa: E402
from fastpath.model import CachePolicy, FeatureSpec, Head  # noqa: E402
from helpers.builders import engine_cfg  # noqa: E402
from helpers.models import _skl
from helpers.oracle import assert_close, ort_run  # noqa: E402

N_FEAT = 12
TREE_ISAS = tree_isas()


def _book_rows():
    raws = lob.raw_from_book(lob.generate_stream(1200, 2, seed=5))
    return np.ascontiguousarray(raws[:, 40:40 + N_FEAT])


BOOK = _book_rows()


def _data(kind):
    rng = np.random.default_rng(2)
    X = np.vstack([BOOK[::2], rng.standard_normal((300, N_FEAT)).astype(np.float32)])
    z = (X - X.mean(0)) / (X.std(0) + 1e-6)
    y = np.tanh(z @ rng.standard_normal(N_FEAT) * 0.4) + 0.3 * np.sin(2 * z[:, 0])
    if kind == "reg":
        return X, y
    if kind == "cls2":
        return X, (y > 0).astype(int)
    return X, np.digitize(y, np.quantile(y, [1 / 3, 2 / 3]))


def _mltools(est, path, kind):
    import onnxmltools
    from onnxmltools.convert.common.data_types import FloatTensorType
    it = [("x", FloatTensorType([None, N_FEAT]))]
    if kind == "lgb":
        m = onnxmltools.convert_lightgbm(est, initial_types=it, zipmap=False)
    else:
        m = onnxmltools.convert_xgboost(est, initial_types=it)
    path.write_bytes(m.SerializeToString())
    return str(path)


def _on_thresholds(trees, rng, n=120):
    """Rows with features placed exactly on split thresholds (one split per row, plus rows
    with every feature on one of its thresholds), and the float on either side."""
    splits = trees.split_thresholds()
    rng.shuffle(splits)
    base = rng.standard_normal((n, trees.n_features)).astype(np.float32)
    rows = []
    for i, (f, t) in enumerate(splits[:n]):
        for v in (np.float32(t), np.nextafter(np.float32(t), np.float32(-np.inf)),
                  np.nextafter(np.float32(t), np.float32(np.inf))):
            r = base[i % n].copy()
            r[f] = v
            rows.append(r)
    by_f = {}
    for f, t in splits:
        by_f.setdefault(f, []).append(t)
    for i in range(20):
        r = base[i].copy()
        for f, ts in by_f.items():
            r[f] = ts[rng.integers(len(ts))]
        rows.append(r)
    out = np.asarray(rows, np.float32)
    return out[np.all(np.isfinite(out), axis=1)]


def _inputs(trees):
    rng = np.random.default_rng(11)
    rnd = rng.standard_normal((40, N_FEAT)).astype(np.float32) * 2.0
    return np.vstack([rnd, BOOK[1::29][:40], _on_thresholds(trees, rng)]).astype(np.float32)


def _skl_models():
    return {
        "GradientBoostingRegressor": ("reg", lambda: GradientBoostingRegressor(
            n_estimators=25, max_depth=3, random_state=0)),
        "GradientBoostingClassifier-2": ("cls2", lambda: GradientBoostingClassifier(
            n_estimators=15, max_depth=3, random_state=0)),
        "GradientBoostingClassifier-3": ("cls3", lambda: GradientBoostingClassifier(
            n_estimators=10, max_depth=3, random_state=0)),
        "RandomForestRegressor": ("reg", lambda: RandomForestRegressor(
            n_estimators=8, max_depth=6, random_state=0)),
        "RandomForestClassifier-2": ("cls2", lambda: RandomForestClassifier(
            n_estimators=8, max_depth=5, random_state=0)),
        "RandomForestClassifier-3": ("cls3", lambda: RandomForestClassifier(
            n_estimators=8, max_depth=5, random_state=0)),
        "ExtraTreesRegressor": ("reg", lambda: ExtraTreesRegressor(
            n_estimators=8, max_depth=6, random_state=0)),
        "HistGradientBoostingRegressor": ("reg", lambda: HistGradientBoostingRegressor(
            max_iter=20, max_depth=5, random_state=0)),
        "HistGradientBoostingClassifier-2": ("cls2", lambda: HistGradientBoostingClassifier(
            max_iter=15, max_depth=4, random_state=0)),
        "HistGradientBoostingClassifier-3": ("cls3", lambda: HistGradientBoostingClassifier(
            max_iter=10, max_depth=4, random_state=0)),
        # deeper than the perfect-tree limit: the compact walk
        "RandomForestRegressor-deep": ("reg", lambda: RandomForestRegressor(
            n_estimators=3, max_depth=None, min_samples_leaf=1, random_state=0)),
    }


def _boost_models():
    out = {}
    try:
        import lightgbm
        out["LGBMRegressor"] = ("reg", "lgb", lambda: lightgbm.LGBMRegressor(
            n_estimators=20, num_leaves=15, verbose=-1))
        out["LGBMClassifier-2"] = ("cls2", "lgb", lambda: lightgbm.LGBMClassifier(
            n_estimators=15, num_leaves=15, verbose=-1))
        out["LGBMClassifier-3"] = ("cls3", "lgb", lambda: lightgbm.LGBMClassifier(
            n_estimators=10, num_leaves=15, verbose=-1))
    except ImportError:
        pass
    try:
        import xgboost
        out["XGBRegressor"] = ("reg", "xgb", lambda: xgboost.XGBRegressor(
            n_estimators=20, max_depth=4))
        out["XGBClassifier-2"] = ("cls2", "xgb", lambda: xgboost.XGBClassifier(
            n_estimators=15, max_depth=3))
        out["XGBClassifier-3"] = ("cls3", "xgb", lambda: xgboost.XGBClassifier(
            n_estimators=10, max_depth=3))
    except ImportError:
        pass
    return out


SKL = _skl_models()
BOOST = _boost_models()
ALL = list(SKL) + list(BOOST)
EXPECTED_HEAD = {"reg": "regression", "cls2": "classifier2", "cls3": "classifier3"}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    d = tmp_path_factory.mktemp("trees")
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, (kind, make) in SKL.items():
            X, y = _data(kind)
            out[name] = (kind, _skl(make().fit(X, y), X.astype(np.float32), d / f"{name}.onnx"))
        for name, (kind, tool, make) in BOOST.items():
            X, y = _data(kind)
            out[name] = (kind, _mltools(make().fit(X, y), d / f"{name}.onnx", tool))
    return out


@pytest.mark.parametrize("name", ALL)
def test_exported_ensemble_matches_onnxruntime_on_every_path(exported, name, isa):
    kind, path = exported[name]
    m = Model.from_onnx(path)
    assert m.kind == "trees" and m.head_spec.kind == EXPECTED_HEAD[kind]
    X = _inputs(m.trees)
    ref = ort_run(path, X, fallback=-1)
    assert ref.shape[1] == m.n_outputs
    assert_close(m.forward(X), ref)
    eng = Engine(m, config=engine_cfg(isa))
    got = np.stack([eng.predict(x) for x in X])
    assert_close(got, ref)
    # step: identity features, cache off; the head of the same outputs
    for x, r in zip(X[:10], ref[:10]):
        res = eng.step(x)
        sig, conf = m.head_spec.apply(r)
        assert res.signal == pytest.approx(float(sig), abs=1e-5)
        assert res.confidence == pytest.approx(float(conf), abs=1e-5)


@pytest.mark.parametrize("name", ALL)
def test_every_tree_kernel_set_matches_onnxruntime(exported, name):
    _, path = exported[name]
    m = Model.from_onnx(path)
    X = _inputs(m.trees)
    ref = ort_run(path, X, fallback=-1)
    for k in TREE_ISAS:
        assert_close(PackedTrees(m.trees, k).eval(X), ref)


def test_deep_forest_takes_the_compact_walk(exported):
    m = Model.from_onnx(exported["RandomForestRegressor-deep"][1])
    assert m.trees.depths().max() >= 15
    lay = PackedTrees(m.trees, "scalar").layout
    assert lay["compact"] == m.trees.n_trees and lay["groups"] == 0
    shallow = Model.from_onnx(exported["GradientBoostingRegressor"][1])
    lay = PackedTrees(shallow.trees, "scalar").layout
    assert lay["compact"] == 0 and lay["groups"] >= 1 and lay["depth"] == 3


@pytest.mark.parametrize("name", ["HistGradientBoostingRegressor", "HistGradientBoostingClassifier-3",
                                  "LGBMRegressor", "XGBRegressor", "GradientBoostingRegressor"])
def test_missing_values_follow_onnxruntime(exported, name, isa):
    if name not in exported:
        pytest.skip(f"{name}'s library is not installed")
    _, path = exported[name]
    m = Model.from_onnx(path)
    rng = np.random.default_rng(4)
    X = rng.standard_normal((60, N_FEAT)).astype(np.float32)
    X[rng.random(X.shape) < 0.3] = np.nan
    X[0, :] = np.nan
    ref = ort_run(path, X, fallback=-1)
    eng = Engine(m, config=engine_cfg(isa))
    assert_close(np.stack([eng.predict(x) for x in X]), ref)
    assert_close(m.forward(X), ref)
    for k in TREE_ISAS:
        assert_close(PackedTrees(m.trees, k).eval(X), ref)


def test_skl2onnx_ml_opset3_export_matches(tmp_path):
    X, y = _data("reg")
    est = GradientBoostingRegressor(n_estimators=10, max_depth=3, random_state=0).fit(X, y)
    path = _skl(est, X.astype(np.float32), tmp_path / "gb3.onnx", {"": 17, "ai.onnx.ml": 3})
    m = Model.from_onnx(path)
    X2 = _inputs(m.trees)
    assert_close(Engine(m).predict(X2[0])[None, :], ort_run(path, X2[:1], fallback=-1))


# ------------------------------------------------------------ hand-built graphs

def _graph(path, op, attrs, n_feat, n_out, opset_ml=3):
    outs = ["label", "probabilities"] if op == "TreeEnsembleClassifier" else ["y"]
    node = helper.make_node(op, ["x"], outs, domain="ai.onnx.ml", **attrs)
    vi = [helper.make_tensor_value_info("probabilities" if len(outs) == 2 else "y",
                                       TensorProto.FLOAT, [None, n_out])]
    if len(outs) == 2:
        vi.insert(0, helper.make_tensor_value_info("label", TensorProto.INT64, [None]))
    g = helper.make_graph([node], "trees", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [None, n_feat])], vi)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("ai.onnx.ml", opset_ml)])
    path.write_bytes(m.SerializeToString())
    return str(path)


def _two_level(mode, miss=(0, 0)):
    """One tree: node 0 splits feature 0 at 0.5, node 1 (its true child) feature 1 at -0.25,
    in `mode`; leaves 2, 3, 4 with distinct values."""
    return dict(
        nodes_treeids=[0] * 5, nodes_nodeids=[0, 1, 2, 3, 4], nodes_featureids=[0, 1, 0, 0, 0],
        nodes_modes=[mode, mode, "LEAF", "LEAF", "LEAF"], nodes_values=[0.5, -0.25, 0, 0, 0],
        nodes_truenodeids=[1, 2, 0, 0, 0], nodes_falsenodeids=[4, 3, 0, 0, 0],
        nodes_missing_value_tracks_true=[miss[0], miss[1], 0, 0, 0],
        target_ids=[0, 0, 0], target_nodeids=[2, 3, 4], target_treeids=[0, 0, 0],
        target_weights=[1.0, 2.0, 4.0], n_targets=1)


def _grid():
    vals = []
    for t in (0.5, -0.25):
        t = np.float32(t)
        vals += [t, np.nextafter(t, np.float32(-1)), np.nextafter(t, np.float32(1))]
    vals += [np.float32(0), np.float32(3), np.float32(-3), np.float32(np.nan),
             np.float32(np.inf), np.float32(-np.inf)]
    return np.array([[a, b] for a in vals for b in vals], np.float32)


def _check_graph(path, X, isa="scalar", head=None):
    m = Model.from_onnx(path, head=head)
    ref = ort_run(path, X, fallback=-1)
    # onnxruntime's PROBIT (an erfinv approximation with a cancellation near p = 0.5) turns
    # the last-ulp difference of a sum added in another order into up to ~5e-5
    tol = 1e-4 if m.trees.post_transform == "PROBIT" else 1e-5

    def close(got, want):
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(1.0, float(
            np.nanmax(np.abs(np.where(np.isfinite(want), want, 0))))))
    close(m.forward(X), ref)
    for k in TREE_ISAS:
        close(PackedTrees(m.trees, k).eval(X), ref)
    eng = Engine(m, config=engine_cfg(isa))
    ok = np.all(np.isfinite(ref), axis=1)
    for x, r, good in zip(X, ref, ok):
        if good:
            close(eng.predict(x)[None, :], r[None, :])
        else:
            # where onnxruntime answers NaN/Inf (a probit of a value outside (0, 1)), the
            # engine refuses instead of returning it
            with pytest.raises(InputError, match="NaN/Inf"):
                eng.predict(x)
    return m


@pytest.mark.parametrize("mode", ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT",
                                  "BRANCH_EQ", "BRANCH_NEQ"])
@pytest.mark.parametrize("miss", [(0, 0), (1, 0), (0, 1)])
def test_each_split_mode_and_missing_track(tmp_path, mode, miss, isa):
    path = _graph(tmp_path / "t.onnx", "TreeEnsembleRegressor", _two_level(mode, miss), 2, 1)
    _check_graph(path, _grid(), isa)


@pytest.mark.parametrize("depth", [0, 1, 2, 3, 4])
def test_perfect_trees_of_each_small_depth(tmp_path, depth):
    """Each depth the vector kernels special-case (levels 0-2 by blends) and one past it;
    trees of mixed depth in one ensemble (the short ones padded)."""
    rng = np.random.default_rng(depth)
    a = {k: [] for k in ("nodes_treeids", "nodes_nodeids", "nodes_featureids", "nodes_modes",
                         "nodes_values", "nodes_truenodeids", "nodes_falsenodeids", "target_ids",
                         "target_nodeids", "target_treeids", "target_weights")}
    for t in range(21):                         # two groups of 16 lanes, the second partial
        d = depth if t % 3 else max(depth - 1, 0)
        inner, leaves = 2 ** d - 1, 2 ** d
        for i in range(inner + leaves):
            a["nodes_treeids"].append(t)
            a["nodes_nodeids"].append(i)
            leaf = i >= inner
            a["nodes_featureids"].append(0 if leaf else int(rng.integers(3)))
            a["nodes_modes"].append("LEAF" if leaf else ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GT",
                                                         "BRANCH_GTE"][int(rng.integers(4))])
            a["nodes_values"].append(0.0 if leaf else float(rng.standard_normal()))
            a["nodes_truenodeids"].append(0 if leaf else 2 * i + 1)
            a["nodes_falsenodeids"].append(0 if leaf else 2 * i + 2)
            if leaf:
                a["target_ids"].append(0)
                a["target_nodeids"].append(i)
                a["target_treeids"].append(t)
                a["target_weights"].append(float(rng.standard_normal()))
    a["n_targets"] = 1
    path = _graph(tmp_path / "d.onnx", "TreeEnsembleRegressor", a, 3, 1)
    m = Model.from_onnx(path)
    lay = PackedTrees(m.trees, "scalar").layout
    assert lay["depth"] == depth and lay["groups"] == 2 and lay["compact"] == 0
    X = rng.standard_normal((80, 3)).astype(np.float32)
    X[::4, :] = np.asarray(m.trees.threshold[:3], np.float32)     # on the first thresholds
    _check_graph(path, X)


def test_thresholds_at_infinity_split_as_onnxruntime(tmp_path):
    for mode in ("BRANCH_LT", "BRANCH_GTE", "BRANCH_LEQ", "BRANCH_GT"):
        a = _two_level(mode)
        a["nodes_values"] = [-np.inf, np.inf, 0, 0, 0]
        _check_graph(_graph(tmp_path / f"{mode}.onnx", "TreeEnsembleRegressor", a, 2, 1), _grid())


def _forest(n_targets=2, n_trees=3, seed=0, lo=0.01, hi=0.3, zero_some=False, base=None,
            agg="SUM", post="NONE", classifier=False):
    """n_trees depth-2 trees over 3 features; every leaf carries a weight for every target
    (some of them 0 with zero_some)."""
    rng = np.random.default_rng(seed)
    a = {k: [] for k in ("nodes_treeids", "nodes_nodeids", "nodes_featureids", "nodes_modes",
                         "nodes_values", "nodes_truenodeids", "nodes_falsenodeids")}
    pre = "class" if classifier else "target"
    w = {f"{pre}_ids": [], f"{pre}_nodeids": [], f"{pre}_treeids": [], f"{pre}_weights": []}
    for t in range(n_trees):
        a["nodes_treeids"] += [t] * 7
        a["nodes_nodeids"] += list(range(7))
        a["nodes_featureids"] += [int(rng.integers(3)), int(rng.integers(3)), int(rng.integers(3)), 0, 0, 0, 0]
        a["nodes_modes"] += ["BRANCH_LEQ"] * 3 + ["LEAF"] * 4
        a["nodes_values"] += rng.standard_normal(3).astype(np.float32).tolist() + [0.0] * 4
        a["nodes_truenodeids"] += [1, 3, 5, 0, 0, 0, 0]
        a["nodes_falsenodeids"] += [2, 4, 6, 0, 0, 0, 0]
        for leaf in (3, 4, 5, 6):
            for j in range(n_targets):
                v = float(rng.uniform(lo, hi))
                if zero_some and rng.random() < 0.4:
                    v = 0.0
                w[f"{pre}_ids"].append(j)
                w[f"{pre}_nodeids"].append(leaf)
                w[f"{pre}_treeids"].append(t)
                w[f"{pre}_weights"].append(v)
    a.update(w)
    if classifier:
        a["classlabels_int64s"] = list(range(n_targets))
    else:
        a["n_targets"] = n_targets
        a["aggregate_function"] = agg
    a["post_transform"] = post
    if base is not None:
        a["base_values"] = list(base)
    return a


@pytest.mark.parametrize("agg", ["SUM", "AVERAGE", "MIN", "MAX"])
@pytest.mark.parametrize("post", ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT"])
@pytest.mark.parametrize("n_targets", [1, 3])
def test_aggregates_and_post_transforms(tmp_path, agg, post, n_targets):
    X = np.random.default_rng(3).standard_normal((50, 3)).astype(np.float32)
    for base in (None, [0.05] * n_targets):
        a = _forest(n_targets, 3, zero_some=post == "SOFTMAX_ZERO", base=base, agg=agg, post=post)
        path = _graph(tmp_path / "f.onnx", "TreeEnsembleRegressor", a, 3, n_targets)
        _check_graph(path, X, head=Head("regression") if n_targets == 3 else None)


@pytest.mark.parametrize("post", ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT"])
@pytest.mark.parametrize("n_classes", [2, 3])
def test_classifier_post_transforms(tmp_path, post, n_classes):
    X = np.random.default_rng(5).standard_normal((50, 3)).astype(np.float32)
    for base in (None, [0.05] * n_classes):
        # PROBIT reads probabilities: sums kept inside (0, 1)
        a = _forest(n_classes, 4, seed=1, hi=0.2 if post == "PROBIT" else 0.3, base=base,
                    post=post, classifier=True, zero_some=post == "SOFTMAX_ZERO")
        path = _graph(tmp_path / "c.onnx", "TreeEnsembleClassifier", a, 3, n_classes)
        # NONE sums past 1 and PROBIT's z-scores are not probabilities: no classifier head,
        # by default or given (tests/heads/test_heads_classifier_range.py), so another is
        _check_graph(path, X, head=Head("regression", outputs=(n_classes - 1,))
                     if post in ("NONE", "PROBIT") else None)
    with pytest.raises(ModelError, match="4 outputs .classes. and no head"):
        Model.from_onnx(_graph(tmp_path / "c4.onnx", "TreeEnsembleClassifier",
                               _forest(4, 2, classifier=True, post=post), 3, 4))


@pytest.mark.parametrize("post", ["NONE", "LOGISTIC", "SOFTMAX"])
@pytest.mark.parametrize("base", [None, [0.3], [0.1, 0.2]])
@pytest.mark.parametrize("signs", ["positive", "mixed"])
@pytest.mark.parametrize("cls", [0, 1])
def test_binary_classifier_with_one_score(tmp_path, post, base, signs, cls):
    """Weights for one class only: onnxruntime's binary rules (second column 1 - p, -s, or a
    logistic pair, by the weights' signs and the base values)."""
    X = np.random.default_rng(6).standard_normal((60, 3)).astype(np.float32)
    a = _forest(1, 4, seed=2, lo=-0.4 if signs == "mixed" else 0.05, hi=0.4, base=None,
                post=post, classifier=True)
    a["class_ids"] = [cls] * len(a["class_ids"])
    a["classlabels_int64s"] = [0, 1]
    if base is not None:
        a["base_values"] = base
    path = _graph(tmp_path / "b.onnx", "TreeEnsembleClassifier", a, 3, 2)
    # NONE scores here may pass 1 or go negative: not probabilities, so no classifier head,
    # by default or given (tests/heads/test_heads_classifier_range.py); the rules are checked
    # with a regression head on the second column
    m = _check_graph(path, X, head=Head("regression", outputs=(1,)) if post == "NONE" else None)
    assert m.head_spec.kind == ("regression" if post == "NONE" else "classifier2")


def test_base_values_count_is_checked(tmp_path):
    # onnxruntime takes 0 or one per target; one for several targets is refused by both
    a = _forest(3, 2, base=[0.5])
    with pytest.raises(ModelError, match="1 base values; expected 0 or one per target"):
        Model.from_onnx(_graph(tmp_path / "b.onnx", "TreeEnsembleRegressor", a, 3, 3))
    a = _forest(3, 2, base=[0.5, 0.1], classifier=True)
    with pytest.raises(ModelError, match="2 base values"):
        Model.from_onnx(_graph(tmp_path / "c.onnx", "TreeEnsembleClassifier", a, 3, 3))


def test_float_tensor_attributes_read_as_the_float_lists(tmp_path):
    a = _two_level("BRANCH_LT")
    a["nodes_values_as_tensor"] = numpy_helper.from_array(np.array([0.5, -0.25, 0, 0, 0], np.float32))
    a["target_weights_as_tensor"] = numpy_helper.from_array(np.array([1.0, 2.0, 4.0], np.float32))
    a["base_values_as_tensor"] = numpy_helper.from_array(np.array([0.5], np.float32))
    del a["nodes_values"], a["target_weights"]
    _check_graph(_graph(tmp_path / "t.onnx", "TreeEnsembleRegressor", a, 2, 1), _grid())
    a["nodes_values_as_tensor"] = numpy_helper.from_array(np.array([0.5, -0.25, 0, 0, 0], np.float64))
    with pytest.raises(ModelError, match="float64"):
        Model.from_onnx(_graph(tmp_path / "d.onnx", "TreeEnsembleRegressor", a, 2, 1))


# ------------------------------------------------------------ refused graphs

def _bad(tmp_path, **change):
    a = _two_level("BRANCH_LEQ")
    a.update(change)
    return _graph(tmp_path / "bad.onnx", "TreeEnsembleRegressor", a, 2, 1)


def test_out_of_range_feature_is_refused(tmp_path):
    with pytest.raises(ModelError, match="feature 7, outside the model's 2 inputs"):
        Model.from_onnx(_bad(tmp_path, nodes_featureids=[7, 1, 0, 0, 0]))


def test_a_cycle_in_a_tree_is_refused(tmp_path):
    # node 1's true child is the root
    with pytest.raises(ModelError, match="reached twice"):
        Model.from_onnx(_bad(tmp_path, nodes_truenodeids=[1, 0, 0, 0, 0]))


def test_missing_child_is_refused(tmp_path):
    with pytest.raises(ModelError, match="child 9, which is not a node"):
        Model.from_onnx(_bad(tmp_path, nodes_falsenodeids=[9, 3, 0, 0, 0]))


def test_weight_on_missing_leaf_is_refused(tmp_path):
    with pytest.raises(ModelError, match="tree 0 node 8, which does not exist"):
        Model.from_onnx(_bad(tmp_path, target_nodeids=[2, 3, 8]))


def test_weight_on_a_split_is_refused(tmp_path):
    with pytest.raises(ModelError, match="is a split but carries a leaf weight"):
        Model.from_onnx(_bad(tmp_path, target_nodeids=[2, 3, 1]))


def test_unreachable_node_and_bad_mode_are_refused(tmp_path):
    # node 4 becomes unreachable when the root's false child is node 3 (shared with node 1)
    with pytest.raises(ModelError, match="reached twice"):
        Model.from_onnx(_bad(tmp_path, nodes_falsenodeids=[3, 3, 0, 0, 0]))
    with pytest.raises(ModelError, match="mode 'BRANCH_XX' unknown"):
        Model.from_onnx(_bad(tmp_path, nodes_modes=["BRANCH_XX", "BRANCH_LEQ", "LEAF", "LEAF", "LEAF"]))


def test_nan_threshold_and_weight_are_refused(tmp_path):
    with pytest.raises(ModelError, match="NaN threshold"):
        Model.from_onnx(_bad(tmp_path, nodes_values=[np.nan, 0, 0, 0, 0]))
    with pytest.raises(ModelError, match="leaf weights contain NaN"):
        Model.from_onnx(_bad(tmp_path, target_weights=[1.0, np.nan, 2.0]))


def test_unsupported_op_after_ensemble_is_named(tmp_path):
    a = _two_level("BRANCH_LEQ")
    node = helper.make_node("TreeEnsembleRegressor", ["x"], ["t"], domain="ai.onnx.ml", **a)
    relu = helper.make_node("Relu", ["t"], ["y"])
    g = helper.make_graph([node, relu], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("ai.onnx.ml", 3)])
    p = tmp_path / "relu.onnx"
    p.write_bytes(m.SerializeToString())
    with pytest.raises(ModelError, match="op Relu"):
        Model.from_onnx(str(p))


def test_tree_ensemble_refuses_bad_arrays_directly():
    ok = dict(n_features=2, n_targets=1, tree_offsets=[0, 3], mode=[0, 6, 6],
              feature=[0, 0, 0], threshold=[0.5, 0, 0], true_child=[1, -1, -1],
              false_child=[2, -1, -1], nan_true=[0, 0, 0], weight_node=[1, 2],
              weight_target=[0, 0], weight_value=[1.0, 2.0])
    TreeEnsemble(**ok)
    for change, msg in ((dict(weight_target=[0, 1]), "target/class 1"),
                        (dict(tree_offsets=[0, 0, 3]), "grow by at least one node"),
                        (dict(feature=[-1, 0, 0]), "feature -1"),
                        (dict(mode=[0, 6, 9]), "node modes"),
                        (dict(true_child=[5, -1, -1]), "outside the tree"),
                        (dict(base_values=[1.0, 2.0]), "2 base values"),
                        (dict(aggregate="MEDIAN"), "aggregate 'MEDIAN'")):
        with pytest.raises(ModelError, match=msg):
            TreeEnsemble(**{**ok, **change})
    with pytest.raises(ModelError, match="either layers or a tree ensemble"):
        Model((object(),), trees=TreeEnsemble(**ok))
    with pytest.raises(ModelError, match="3 features but the tree ensemble takes 2"):
        Model((), FeatureSpec.identity(3), trees=TreeEnsemble(**ok))


def test_reduced_precision_weights_are_refused_for_trees():
    # bf16/int8 apply to an MLP's layers; a tree model asked for them says so instead of
    # silently running float32 (or, worse, something else)
    from fastpath import ConfigError
    ok = dict(n_features=2, n_targets=1, tree_offsets=[0, 3], mode=[0, 6, 6],
              feature=[0, 0, 0], threshold=[0.5, 0, 0], true_child=[1, -1, -1],
              false_child=[2, -1, -1], nan_true=[0, 0, 0], weight_node=[1, 2],
              weight_target=[0, 0], weight_value=[1.0, 2.0])
    m = Model((), trees=TreeEnsemble(**ok))
    with pytest.raises(ModelError, match="tree ensemble keeps its float32"):
        m.with_weights("int8")
    with pytest.raises(ConfigError, match="engine.weights = 'bf16'"):
        Engine(m, config={"engine": {"weights": "bf16"}})
    e = Engine(m, config={"engine": {"weights": "fp32"}})
    assert e.predict(np.array([0.0, 0.0], np.float32))[0] == 1.0


# ------------------------------------------------------------ bundle, engine, calibrate

def test_exported_ensembles_survive_the_bundle(exported, tmp_path):
    for name in ("GradientBoostingClassifier-3", "RandomForestRegressor-deep"):
        m = Model.from_onnx(exported[name][1])
        p = tmp_path / f"{name}.fpm"
        m.save(p)
        m2 = Model.load(p)
        assert m2.kind == "trees" and m2.head_spec == m.head_spec
        X = _inputs(m.trees)
        np.testing.assert_array_equal(m2.forward(X), m.forward(X))
        e1, e2 = Engine(m), Engine(m2)
        for x in X[:20]:
            np.testing.assert_array_equal(e1.predict(x), e2.predict(x))
        blob = bytearray(m.to_bytes())
        blob[len(blob) // 2] ^= 0xFF
        with pytest.raises(ModelError, match="CRC32"):
            Model.from_bytes(bytes(blob))


def test_engine_refuses_overflowed_features_for_trees(exported):
    """A finite raw whose z-score overflows must be refused, not read as a missing value (a
    tree maps NaN/Inf to a leaf with a finite, plausible-looking output)."""
    m = Model.from_onnx(exported["GradientBoostingRegressor"][1])
    fs = FeatureSpec(N_FEAT, np.arange(N_FEAT), np.zeros(0, np.int32), 1,
                     np.zeros(N_FEAT, np.float32), np.full(N_FEAT, 1e30, np.float32))
    eng = Engine(m.with_feature_spec(fs), config={"engine": {"n_symbols": 2}})
    raw = np.full(N_FEAT, 1e10, np.float32)
    with pytest.raises(InputError):
        eng.step(raw)
    assert eng.ticks == 0
    eng.step(np.zeros(N_FEAT, np.float32))
    assert eng.ticks == 1


def test_predict_shape_and_classifier_head(exported):
    m = Model.from_onnx(exported["LGBMClassifier-3" if "LGBMClassifier-3" in exported
                                 else "GradientBoostingClassifier-3"][1])
    eng = Engine(m)
    assert eng.n_outputs == 3
    x = BOOK[7]
    p = eng.predict(x)
    assert p.shape == (3,) and abs(float(p.sum()) - 1.0) < 1e-5
    r = eng.step(x)
    assert r.signal == pytest.approx(float(p[2] - p[0]), abs=1e-6)
    assert r.confidence == pytest.approx(float(p.max()), abs=1e-6)
    m2 = m.with_head(Head("classifier3", outputs=(2, 1, 0)))
    assert Engine(m2).step(x).signal == pytest.approx(float(p[0] - p[2]), abs=1e-6)
    with pytest.raises(InputError):
        eng.predict(np.zeros(N_FEAT + 1, np.float32))


def test_calibrate_a_tree_model(exported, tmp_path):
    from fastpath.cli import main
    m = Model.from_onnx(exported["LGBMRegressor" if "LGBMRegressor" in exported
                                 else "GradientBoostingRegressor"][1])
    raws = np.ascontiguousarray(lob.raw_from_book(lob.generate_stream(600, 2, seed=9)))
    ticks = tmp_path / "ticks.npy"
    np.save(ticks, raws)
    src = tmp_path / "m.fpm"
    m.save(src)
    out = tmp_path / "cal.fpm"
    # a tree must say what its features are (--features); sklearn's were raw
    rc = main(["calibrate", "--ticks", str(ticks), "--model", str(src), "--out", str(out),
               "--z-fields", "40-51", "--window-fields", "none", "--features", "raw"])
    assert rc == 0
    cal = Model.load(out)
    assert cal.kind == "trees" and cal.feature_spec.raw_len == raws.shape[1]
    assert cal.head_spec.kind == "regression" and cal.head_spec.scale != 1.0
    eng = Engine(cal, config={"engine": {"n_symbols": 1}})
    feats = cal.feature_spec.apply(raws[:30])
    ref = cal.forward(feats)
    for raw, r in zip(raws[:30], ref):
        res = eng.step(raw)
        sig, _ = cal.head_spec.apply(r)
        assert res.signal == pytest.approx(float(sig), abs=1e-5)


def test_tree_model_cannot_be_written_as_onnx(exported, tmp_path):
    m = Model.from_onnx(exported["GradientBoostingRegressor"][1])
    with pytest.raises(ModelError, match="tree ensemble as ONNX"):
        m.to_onnx(tmp_path / "x.onnx")


def test_arena_in_the_control_plane_region_and_cache(exported):
    """The packed ensemble in the control plane's memory region answers as the heap copy; with
    the cache on, a repeated tick is a hit carrying the fresh answer."""
    m = Model.from_onnx(exported["HistGradientBoostingRegressor"][1])
    m = m.with_cache_policy(CachePolicy(enabled=True, cos_threshold=0.9999, norm_tol=0.01))
    a = Engine(m, config={"engine": {"n_symbols": 4}})
    b = Engine(m, config={"engine": {"n_symbols": 4}, "memory": {"huge_pages": "none"}})
    assert b.memory is not None
    X = _inputs(m.trees)[:60]
    s = np.arange(len(X)) % 4
    ra, rb = a.step_batch(X, s), b.step_batch(X, s)
    np.testing.assert_array_equal(ra.signal, rb.signal)
    r1 = a.step(X[0], 3)
    r2 = a.step(X[0], 3)
    assert not r1.cached and r2.cached and r2.signal == r1.signal


def test_served_tree_model_equals_local_engine(exported):
    import os
    import uuid

    import fastpath
    m = Model.from_onnx(exported["GradientBoostingClassifier-3"][1])
    cfg = {"engine": {"n_symbols": 2}, "serve": {"place": False, "idle": "yield",
                                                 "idle_spin_ns": 50_000}}
    X = _inputs(m.trees)[:40]
    local = Engine(m, config=cfg)
    want = [local.step(x, 1, 1000 * (i + 1)) for i, x in enumerate(X)]
    name = f"test-trees-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    with fastpath.serve(name, m, cfg), fastpath.connect(name) as c:
        got = [c.step(x, 1, 1000 * (i + 1)) for i, x in enumerate(X)]
    assert [g.signal for g in got] == [w.signal for w in want]
    assert [g.confidence for g in got] == [w.confidence for w in want]


def test_c_packer_refuses_what_validation_would(exported):
    """The C packer re-checks the description (a model whose arrays were swapped after
    validation must be refused, not walked out of bounds or in a loop)."""
    import dataclasses

    from fastpath import FastpathError
    m = Model.from_onnx(exported["GradientBoostingRegressor"][1])
    t = m.trees
    with pytest.raises(ValueError):
        t.feature[0] = 99                      # validated arrays are read-only
    for field, edit in (("feature", lambda a: a.__setitem__(0, t.n_features + 5)),
                        ("true_child", lambda a: a.__setitem__(0, 0)),       # a cycle
                        ("false_child", lambda a: a.__setitem__(0, 10**6)),
                        ("weight_target", lambda a: a.__setitem__(0, 7)),
                        ("weight_node", lambda a: a.__setitem__(0, 0))):    # weight on a split
        bad = dataclasses.replace(t)
        arr = np.array(getattr(t, field))
        edit(arr)
        object.__setattr__(bad, field, arr)
        with pytest.raises(InputError, match="refused"):
            PackedTrees(bad, "scalar")
        mm = dataclasses.replace(m)
        object.__setattr__(mm, "trees", bad)
        with pytest.raises(FastpathError, match="rejected by the C core"):
            Engine(mm)
