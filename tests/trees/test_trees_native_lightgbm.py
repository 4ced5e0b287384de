"""Model.from_lightgbm (fastpath.model.native_lightgbm): models LightGBM trains answer as its
own predict on random, on-threshold, missing and zero rows on every kernel set, from a Booster,
its model.txt, the model text and the saved bundle; damaged or unsupported models are refused
with a ModelError naming the tree, node and feature."""
import re

import numpy as np
import pytest

from fastpath import Model
from fastpath.errors import ModelError
from helpers.native_trees import assert_parity, labels, mixed_data

lgb = pytest.importorskip("lightgbm")

CASES = {
    "binary": dict(objective="binary"),
    "binary_sigmoid": dict(objective="binary", sigmoid=0.7),
    "regression_zero_as_missing": dict(objective="regression", zero_as_missing=True),
    "regression_no_missing": dict(objective="regression", use_missing=False),
    "multiclass": dict(objective="multiclass", num_class=3),
    "multiclassova": dict(objective="multiclassova", num_class=3),
}


def _train(params, rounds=25, seed=0, **kw):
    X, score = mixed_data(np.random.default_rng(seed))
    obj = params["objective"]
    y = labels(score, params["num_class"]) if obj.startswith("multiclass") else \
        labels(score, 2) if obj == "binary" else score
    ds = lgb.Dataset(X, y, categorical_feature=[X.shape[1] - 1], **kw)
    return lgb.train(dict(params, verbose=-1, num_leaves=15, min_data_in_leaf=5), ds, rounds)


@pytest.fixture(scope="module")
def boosters():
    return {k: _train(p) for k, p in CASES.items()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_lightgbm_models_answer_as_lightgbm_predicts(boosters, case, isa):
    b = boosters[case]
    assert_parity(Model.from_lightgbm(b), b, isa)


def test_the_model_text_file_and_bundle_give_the_same_model(boosters, tmp_path, isa):
    b = boosters["binary"]
    path = tmp_path / "model.txt"
    b.save_model(str(path))
    m = Model.from_lightgbm(b)
    assert Model.from_lightgbm(str(path)).trees == m.trees
    assert Model.from_lightgbm(b.model_to_string()).trees == m.trees
    m.save(tmp_path / "m.fpm")
    back = Model.load(tmp_path / "m.fpm")
    assert back.trees == m.trees
    assert_parity(back, b, isa)


@pytest.mark.parametrize("est", ["LGBMRegressor", "LGBMClassifier"])
def test_the_scikit_learn_estimators_load_and_score_as_their_booster(est, isa):
    """Model.from_lightgbm(LGBMRegressor) was a ModelError (it took the Booster only) and
    parity(model, LGBMRegressor) an AttributeError (dump_model): both now read est.booster_."""
    X, score = mixed_data(np.random.default_rng(3))
    y = labels(score, 3) if est == "LGBMClassifier" else score
    e = getattr(lgb, est)(n_estimators=15, num_leaves=15, min_child_samples=5, verbose=-1,
                          n_jobs=1).fit(X, y)
    m = Model.from_lightgbm(e)
    assert m.trees == Model.from_lightgbm(e.booster_).trees
    assert_parity(m, e, isa)
    with pytest.raises(ModelError, match=f"the {est} has no booster: fit it before loading it"):
        Model.from_lightgbm(getattr(lgb, est)())


def test_a_split_of_missing_values_from_every_number_loads(isa):
    """LightGBM splits NaN from every number with the threshold inf (missing type NaN): such
    a model, trained on any data with missing values, was refused ("threshold inf is not a
    finite number")."""
    X, score = mixed_data(np.random.default_rng(3))
    b = lgb.train(dict(objective="multiclass", num_class=3, num_leaves=15, min_data_in_leaf=5,
                       verbose=-1), lgb.Dataset(X, labels(score, 3)), 15)
    assert re.search(r"^threshold=.*\binf\b", b.model_to_string(), re.M), \
        "no inf threshold: the test would not exercise it"
    assert_parity(Model.from_lightgbm(b), b, isa)


def test_rows_that_nearest_float32_thresholds_would_flip_decide_as_lightgbm(boosters):
    """onnxmltools rounds LightGBM's double thresholds to the nearest float32, which sends
    x = that float32 left where LightGBM (x <= t, t below it) sends it right."""
    b = boosters["regression_no_missing"]
    text = b.model_to_string()
    feats = [int(v) for line in re.findall(r"^split_feature=(.*)$", text, re.M)
             for v in line.split()]
    thrs = [float(v) for line in re.findall(r"^threshold=(.*)$", text, re.M)
            for v in line.split()]
    m = Model.from_lightgbm(b)
    rows = []
    for f, t in zip(feats, thrs):
        near = np.float32(t)
        if f < 5 and float(near) > t:          # a numeric feature whose t rounds up
            r = np.zeros(6, np.float32)
            r[f] = near
            rows.append(r)
    assert rows, "no threshold rounds up: the test would not exercise rounding"
    R = np.stack(rows)
    np.testing.assert_allclose(m.trees.forward(R)[:, 0], b.predict(R), rtol=1e-6, atol=1e-7)


def test_values_in_the_zero_band_are_zero_as_lightgbm_reads_them():
    """A dense row's |x| <= 1e-35 is read by LightGBM as 0: with a threshold at -1e-35 the
    input -1e-35 goes right (0 > t), where a plain x <= t would send it left."""
    rng = np.random.default_rng(3)
    X = rng.choice(np.array([-1e-35, -2.0, 0.0, 2.0], np.float32), size=(400, 1))
    y = (X[:, 0] < -1.0).astype(float) + rng.normal(0, 0.01, 400)
    b = lgb.train(dict(objective="regression", verbose=-1, min_data_in_leaf=2,
                       min_data_in_bin=1), lgb.Dataset(X, y), 3)
    assert "threshold=-1.0000000180025095e-35" in b.model_to_string()
    m = Model.from_lightgbm(b)
    R = np.array([[-1e-35], [1e-35], [-1e-36], [0.0], [-2.0], [2.0]], np.float32)
    np.testing.assert_allclose(m.trees.forward(R)[:, 0], b.predict(R), rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------------ refusals

def _text(boosters):
    return boosters["multiclass"].model_to_string()


def _tree_line(text, tree, key):
    block = text.split(f"Tree={tree}\n", 1)[1]
    return re.search(rf"^{key}=(.*)$", block, re.M).group(1)


def _set(text, tree, key, value):
    head, rest = text.split(f"Tree={tree}\n", 1)
    rest = re.sub(rf"^{key}=.*$", f"{key}={value}", rest, count=1, flags=re.M)
    return f"{head}Tree={tree}\n{rest}"


def test_a_truncated_model_file_is_refused(boosters):
    text = _text(boosters)
    with pytest.raises(ModelError, match="truncated"):
        Model.from_lightgbm(text[:len(text) // 2])


def test_a_wrong_tree_count_is_refused(boosters):
    text = re.sub(r"^tree_sizes=(\S+) ", "tree_sizes=", _text(boosters), count=1, flags=re.M)
    with pytest.raises(ModelError, match="tree_sizes"):
        Model.from_lightgbm(text)


def test_a_nan_threshold_names_tree_node_and_feature(boosters):
    text = _text(boosters)
    thr = _tree_line(text, 4, "threshold").split()
    thr[1] = "nan"
    with pytest.raises(ModelError, match=r"tree 4 node 1 \(feature \d+\): NaN threshold"):
        Model.from_lightgbm(_set(text, 4, "threshold", " ".join(thr)))


def test_a_child_index_out_of_range_is_refused(boosters):
    text = _text(boosters)
    lc = _tree_line(text, 2, "left_child").split()
    lc[0] = "99"
    with pytest.raises(ModelError, match=r"tree 2 node 0 \(feature \d+\): child index"):
        Model.from_lightgbm(_set(text, 2, "left_child", " ".join(lc)))


def test_a_cycle_is_refused(boosters):
    text = _text(boosters)
    lc = _tree_line(text, 1, "left_child").split()
    lc[1] = "0"
    with pytest.raises(ModelError, match="tree 1: node 0 is reached twice"):
        Model.from_lightgbm(_set(text, 1, "left_child", " ".join(lc)))


def _categorical_tree(text):
    for t in range(200):
        if f"Tree={t}\n" not in text:
            break
        if int(_tree_line(text, t, "num_cat")) > 0:
            return t
    raise AssertionError("no categorical split in the model")


def test_a_categorical_bitset_past_the_model_is_refused(boosters):
    text = _text(boosters)
    t = _categorical_tree(text)
    b = _tree_line(text, t, "cat_boundaries").split()
    b[-1] = str(int(b[-1]) + 50)
    with pytest.raises(ModelError, match=rf"tree {t} node \d+ \(feature \d+\): categorical "
                                         rf"bitset"):
        Model.from_lightgbm(_set(text, t, "cat_boundaries", " ".join(b)))


def test_a_model_past_the_node_cap_is_refused(boosters):
    with pytest.raises(ModelError, match="max_nodes"):
        Model.from_lightgbm(boosters["multiclass"], max_nodes=100)


def test_linear_tree_leaves_are_refused():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(300, 3)).astype(np.float32)
    b = lgb.train(dict(objective="regression", linear_tree=True, verbose=-1),
                  lgb.Dataset(X, X[:, 0] * 2 + X[:, 1]), 3)
    with pytest.raises(ModelError, match=r"tree 0: linear_tree"):
        Model.from_lightgbm(b)


def test_an_objective_without_a_transform_is_refused():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(300, 3)).astype(np.float32)
    b = lgb.train(dict(objective="poisson", verbose=-1),
                  lgb.Dataset(X, np.exp(X[:, 0]).round()), 3)
    with pytest.raises(ModelError, match="objective 'poisson'"):
        Model.from_lightgbm(b)
