"""Model.from_xgboost (fastpath.model.native_xgboost): models XGBoost trains (depthwise and
lossguide) answer as its own predict on random, on-threshold, missing and zero rows on every
kernel set, from a Booster, an XGBModel, its .json and .ubj and the saved bundle; damaged or
unsupported models are refused with a ModelError naming the tree, node and feature."""
import json

import numpy as np
import pytest

from fastpath import Model
from fastpath.errors import ModelError
from helpers.native_trees import assert_parity, labels, mixed_data

xgb = pytest.importorskip("xgboost")

CASES = {
    "binary_depthwise": dict(objective="binary:logistic"),
    "binary_lossguide": dict(objective="binary:logistic", grow_policy="lossguide",
                             max_leaves=24, max_depth=0),
    "regression": dict(objective="reg:squarederror"),
    "logitraw": dict(objective="binary:logitraw"),
    "softprob": dict(objective="multi:softprob", num_class=3),
    "softmax": dict(objective="multi:softmax", num_class=3),
}


def _train(params, rounds=20, seed=0):
    X, score = mixed_data(np.random.default_rng(seed))
    obj = params["objective"]
    y = labels(score, params["num_class"]) if obj.startswith("multi") else \
        labels(score, 2) if obj.startswith("binary") else score
    p = dict({"max_depth": 5, "tree_method": "hist"}, **params)
    return xgb.train(p, xgb.DMatrix(X, y, missing=np.nan), rounds)


@pytest.fixture(scope="module")
def boosters():
    return {k: _train(p) for k, p in CASES.items()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_xgboost_models_answer_as_xgboost_predicts(boosters, case, isa):
    b = boosters[case]
    assert_parity(Model.from_xgboost(b), b, isa)


def test_files_the_sklearn_wrapper_and_bundle_give_the_same_model(boosters, tmp_path, isa):
    b = boosters["softprob"]
    m = Model.from_xgboost(b)
    for ext in ("json", "ubj"):
        b.save_model(str(tmp_path / f"m.{ext}"))
        assert Model.from_xgboost(str(tmp_path / f"m.{ext}")).trees == m.trees
    m.save(tmp_path / "m.fpm")
    back = Model.load(tmp_path / "m.fpm")
    assert back.trees == m.trees
    assert_parity(back, b, isa)
    X, score = mixed_data(np.random.default_rng(1), n=400)
    clf = xgb.XGBClassifier(n_estimators=10, max_depth=3).fit(X, labels(score, 2))
    assert_parity(Model.from_xgboost(clf), clf, isa)


# ------------------------------------------------------------------ refusals

def _doc(boosters):
    return json.loads(bytes(boosters["binary_depthwise"].save_raw("json")))


def _tree(doc, t):
    return doc["learner"]["gradient_booster"]["model"]["trees"][t]


def test_a_nan_threshold_names_tree_node_and_feature(boosters):
    doc = _doc(boosters)
    tr = _tree(doc, 3)
    tr["split_conditions"][0] = float("nan")
    with pytest.raises(ModelError, match=r"tree 3 node 0 \(feature \d+\): threshold"):
        Model.from_xgboost(doc)


def test_a_child_index_out_of_range_is_refused(boosters):
    doc = _doc(boosters)
    _tree(doc, 2)["right_children"][0] = 10 ** 6
    with pytest.raises(ModelError, match="tree 2 node 0: child index 1000000"):
        Model.from_xgboost(doc)


def test_a_cycle_is_refused(boosters):
    doc = _doc(boosters)
    tr = _tree(doc, 1)
    tr["left_children"][tr["left_children"][0]] = 0
    with pytest.raises(ModelError, match="tree 1: node 0 is reached twice"):
        Model.from_xgboost(doc)


def test_a_truncated_tree_is_refused(boosters):
    doc = _doc(boosters)
    del _tree(doc, 0)["split_conditions"][-3:]
    with pytest.raises(ModelError, match="tree 0: its node arrays differ"):
        Model.from_xgboost(doc)


def test_a_wrong_tree_count_is_refused(boosters):
    doc = _doc(boosters)
    del doc["learner"]["gradient_booster"]["model"]["trees"][-1]
    with pytest.raises(ModelError, match="trees"):
        Model.from_xgboost(doc)


def test_a_truncated_json_file_is_refused(boosters, tmp_path):
    p = tmp_path / "m.json"
    p.write_text(json.dumps(_doc(boosters))[:5000])
    with pytest.raises(ModelError, match="cannot read the XGBoost model"):
        Model.from_xgboost(str(p))


def test_a_model_past_the_node_cap_is_refused(boosters):
    with pytest.raises(ModelError, match="max_nodes"):
        Model.from_xgboost(boosters["regression"], max_nodes=50)


def test_categorical_splits_are_refused_naming_the_node():
    rng = np.random.default_rng(2)
    X = rng.integers(0, 5, size=(300, 2)).astype(np.float32)
    dm = xgb.DMatrix(X, (X[:, 0] == 2).astype(float), feature_types=["c", "q"],
                     enable_categorical=True)
    b = xgb.train({"objective": "reg:squarederror", "tree_method": "hist",
                   "max_cat_to_onehot": 1}, dm, 2)
    with pytest.raises(ModelError, match=r"tree 0 node \d+ \(feature 0\): categorical"):
        Model.from_xgboost(b)


def test_an_objective_without_a_transform_is_refused():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(200, 3)).astype(np.float32)
    b = xgb.train({"objective": "count:poisson"},
                  xgb.DMatrix(X, np.exp(X[:, 0]).round()), 2)
    with pytest.raises(ModelError, match="objective 'count:poisson'"):
        Model.from_xgboost(b)
