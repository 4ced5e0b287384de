"""Model.from_sklearn (fastpath.model.native_sklearn): the scikit-learn tree estimators answer
as their own predict / predict_proba on random, on-threshold, missing and zero rows on every
kernel set, and survive the bundle; what the tree stage cannot run exactly is refused."""
import numpy as np
import pytest

from fastpath import Model
from fastpath.errors import ModelError
from helpers.native_trees import assert_parity, labels, mixed_data

sk_ensemble = pytest.importorskip("sklearn.ensemble")
sk_tree = pytest.importorskip("sklearn.tree")


def _data():
    X, score = mixed_data(np.random.default_rng(0), n=600)
    return X, np.nan_to_num(X), score


def _est(name):
    E, T = sk_ensemble, sk_tree
    return {
        "tree_reg": (T.DecisionTreeRegressor(max_depth=6), True, None),
        "tree_clf3": (T.DecisionTreeClassifier(max_depth=6), True, 3),
        "forest_reg": (E.RandomForestRegressor(15, max_depth=6, random_state=0), True, None),
        "forest_clf2": (E.RandomForestClassifier(15, max_depth=6, random_state=0), True, 2),
        "extra_clf3": (E.ExtraTreesClassifier(10, max_depth=6, random_state=0), False, 3),
        "extra_reg": (E.ExtraTreesRegressor(10, max_depth=6, random_state=0), False, None),
        "gb_reg": (E.GradientBoostingRegressor(n_estimators=20, random_state=0), False, None),
        "gb_clf2": (E.GradientBoostingClassifier(n_estimators=20, random_state=0), False, 2),
        "gb_clf3": (E.GradientBoostingClassifier(n_estimators=10, random_state=0), False, 3),
        "gb_exp": (E.GradientBoostingClassifier(n_estimators=10, loss="exponential",
                                                random_state=0), False, 2),
        "hgb_reg": (E.HistGradientBoostingRegressor(max_iter=20), True, None),
        "hgb_clf2": (E.HistGradientBoostingClassifier(max_iter=20), True, 2),
        "hgb_clf3": (E.HistGradientBoostingClassifier(max_iter=15), True, 3),
    }[name]


CASES = ["tree_reg", "tree_clf3", "forest_reg", "forest_clf2", "extra_clf3", "extra_reg",
         "gb_reg", "gb_clf2", "gb_clf3", "gb_exp", "hgb_reg", "hgb_clf2", "hgb_clf3"]


@pytest.fixture(scope="module")
def fitted():
    Xn, X0, score = _data()
    out = {}
    for name in CASES:
        est, nan_ok, k = _est(name)
        out[name] = est.fit(Xn if nan_ok else X0, score if k is None else labels(score, k))
    return out


@pytest.mark.parametrize("case", CASES)
def test_sklearn_estimators_answer_as_sklearn_predicts(fitted, case, isa):
    est = fitted[case]
    assert_parity(Model.from_sklearn(est), est, isa)


def test_the_bundle_keeps_a_boosted_classifier(fitted, tmp_path, isa):
    m = Model.from_sklearn(fitted["hgb_clf3"])
    m.save(tmp_path / "m.fpm")
    back = Model.load(tmp_path / "m.fpm")
    assert back.trees == m.trees
    assert_parity(back, fitted["hgb_clf3"], isa)


def test_unfitted_and_unsupported_estimators_are_refused():
    with pytest.raises(ModelError, match="not a fitted"):
        Model.from_sklearn(sk_ensemble.RandomForestRegressor())
    from sklearn.linear_model import LinearRegression
    with pytest.raises(ModelError, match="LinearRegression: not supported"):
        Model.from_sklearn(LinearRegression().fit(np.zeros((4, 2)), np.arange(4.0)))


def test_a_log_link_is_refused():
    X, _, score = _data()
    est = sk_ensemble.HistGradientBoostingRegressor(loss="poisson", max_iter=3)
    est.fit(X, np.exp(np.clip(score, -3, 3)))
    with pytest.raises(ModelError, match="LogLink"):
        Model.from_sklearn(est)


def test_categorical_hist_splits_are_refused_naming_the_node():
    rng = np.random.default_rng(4)
    X = rng.integers(0, 6, size=(400, 2)).astype(np.float64)
    est = sk_ensemble.HistGradientBoostingRegressor(max_iter=3, categorical_features=[0])
    est.fit(X, (X[:, 0] % 2 == 0) * 1.0 + X[:, 1])
    with pytest.raises(ModelError, match=r"tree \d+ node \d+ \(feature 0\): categorical"):
        Model.from_sklearn(est)


def test_a_cycle_in_a_tree_is_refused():
    X, _, score = _data()
    est = sk_tree.DecisionTreeRegressor(max_depth=3).fit(X, score)
    left = est.tree_.children_left
    left[left[0]] = 0          # the arrays are the tree's own: a corrupted estimator
    with pytest.raises(ModelError, match="tree 0: node 0 is reached twice"):
        Model.from_sklearn(est)
