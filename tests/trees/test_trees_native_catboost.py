"""Model.from_catboost (fastpath.model.native_catboost): symmetric trees CatBoost trains answer
as its own predict on random, on-threshold, missing and zero rows on every kernel set (each NaN
treatment included), from the model, its .cbm and .json and the saved bundle; what the tree
stage cannot run exactly is refused with a ModelError naming the tree and node."""
import json

import numpy as np
import pytest

from fastpath import Model
from fastpath.errors import ModelError
from helpers.native_trees import assert_parity, labels, mixed_data

cb = pytest.importorskip("catboost")

CASES = {
    "binary": (dict(loss_function="Logloss"), 2),
    "multiclass": (dict(loss_function="MultiClass"), 3),
    "regression": (dict(loss_function="RMSE"), None),
    "regression_nan_max": (dict(loss_function="RMSE", nan_mode="Max"), None),
}


def _fit(params, k, seed=0):
    X, score = mixed_data(np.random.default_rng(seed), n=800)
    cls = cb.CatBoostRegressor if k is None else cb.CatBoostClassifier
    est = cls(iterations=20, depth=4, verbose=0, random_seed=0, thread_count=1,
                allow_writing_files=False, **params)
    return est.fit(X, score if k is None else labels(score, k))


@pytest.fixture(scope="module")
def models():
    return {k: _fit(*v) for k, v in CASES.items()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_catboost_models_answer_as_catboost_predicts(models, case, isa):
    est = models[case]
    assert_parity(Model.from_catboost(est), est, isa)


def test_files_and_bundle_give_the_same_model(models, tmp_path, isa):
    est = models["multiclass"]
    m = Model.from_catboost(est)
    est.save_model(str(tmp_path / "m.cbm"))
    est.save_model(str(tmp_path / "m.json"), format="json")
    assert Model.from_catboost(str(tmp_path / "m.cbm")).trees == m.trees
    assert Model.from_catboost(str(tmp_path / "m.json")).trees == m.trees
    m.save(tmp_path / "m.fpm")
    back = Model.load(tmp_path / "m.fpm")
    assert back.trees == m.trees
    assert_parity(back, est, isa)


def _doc(models, tmp_path):
    models["binary"].save_model(str(tmp_path / "m.json"), format="json")
    return json.loads((tmp_path / "m.json").read_text())


def test_a_nan_border_names_tree_node_and_feature(models, tmp_path):
    doc = _doc(models, tmp_path)
    doc["oblivious_trees"][3]["splits"][1]["border"] = float("nan")
    with pytest.raises(ModelError, match=r"tree 3 node 1 \(feature \d+\): border"):
        Model.from_catboost(doc)


def test_missing_leaf_values_are_refused(models, tmp_path):
    doc = _doc(models, tmp_path)
    del doc["oblivious_trees"][2]["leaf_values"][-1]
    with pytest.raises(ModelError, match="tree 2: 15 leaf values, expected 16"):
        Model.from_catboost(doc)


def test_a_model_past_the_node_cap_is_refused(models):
    with pytest.raises(ModelError, match="max_nodes"):
        Model.from_catboost(models["regression"], max_nodes=100)


def test_categorical_features_are_refused():
    rng = np.random.default_rng(2)
    X = np.stack([rng.integers(0, 4, 200).astype(str), rng.normal(size=200).astype(str)], 1)
    est = cb.CatBoostRegressor(iterations=3, depth=2, verbose=0, thread_count=1,
                               allow_writing_files=False)
    est.fit(X, (X[:, 0] == "1") * 1.0, cat_features=[0])
    with pytest.raises(ModelError, match="categorical features are not supported"):
        Model.from_catboost(est)


def test_a_loss_without_a_transform_is_refused():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(200, 3)).astype(np.float32)
    est = cb.CatBoostRegressor(iterations=3, depth=2, verbose=0, loss_function="Poisson",
                               thread_count=1, allow_writing_files=False)
    est.fit(X, np.exp(X[:, 0]).round())
    with pytest.raises(ModelError, match="loss 'Poisson'"):
        Model.from_catboost(est)
