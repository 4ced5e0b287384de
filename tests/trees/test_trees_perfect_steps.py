"""The perfect groups walked by scalar steps (fp_trees_perfect_steps, 16 lanes interleaved
level by level), which the vector sets choose at load where it beats their gathers, and the
lane walk reading each leaf's value beside its node: on boosters trained by LightGBM (depth
limited, and its default leaf-wise growth) and XGBoost (depthwise, lossguide), loaded
natively, every kernel set, walk and perfect walk gives the compact walk's bits and the
library's own predict, on random rows, rows on every split threshold and rows with NaN."""
import numpy as np
import pytest

from fastpath import InputError, Model
from fastpath._kernels import PackedTrees, tree_isas
from fastpath.model import parity
from helpers.native_trees import BOUND, assert_parity, WALKS, regression_data, threshold_rows

F = np.float32
N_FEAT = 12


def _lgb(**kw):
    lightgbm = pytest.importorskip("lightgbm")
    X, y = regression_data(2500, N_FEAT, 5)
    est = lightgbm.LGBMRegressor(min_child_samples=3, learning_rate=0.1, verbose=-1, n_jobs=1, **kw)
    return Model.from_lightgbm(est.fit(X, y).booster_), est.booster_


def _xgb(**kw):
    xgboost = pytest.importorskip("xgboost")
    X, y = regression_data(2500, N_FEAT, 5)
    est = xgboost.XGBRegressor(tree_method="hist", learning_rate=0.2, n_jobs=1, **kw)
    return Model.from_xgboost(est.fit(X, y).get_booster()), est.get_booster()


MODELS = {
    # 40 trees of depth 6: three perfect groups, no rest
    "lightgbm-depth6": lambda: _lgb(n_estimators=40, max_depth=6, num_leaves=63),
    # leaf-wise: shallow trees in perfect groups, deep ones in the rest
    "lightgbm-leafwise": lambda: _lgb(n_estimators=40, max_depth=-1, num_leaves=64),
    "xgboost-depthwise": lambda: _xgb(n_estimators=35, max_depth=5),
    "xgboost-lossguide": lambda: _xgb(n_estimators=30, grow_policy="lossguide", max_leaves=64,
                                      max_depth=0),
}


@pytest.fixture(scope="module")
def models():
    return {}


def _model(models, name):
    if name not in models:
        models[name] = MODELS[name]()
    return models[name]


@pytest.mark.parametrize("name", list(MODELS))
def test_every_walk_and_perfect_walk_gives_the_compact_bits_and_the_library_answer(models, name):
    m, native = _model(models, name)
    X = threshold_rows(m.trees, seed=2)
    ref = PackedTrees(m.trees, "scalar")
    ref.walk = "compact"
    want = ref.eval(X)
    for isa in tree_isas():
        pk = PackedTrees(m.trees, isa)
        assert pk.layout["groups"] > 0, "the model must have perfect groups to test their walks"
        for w in WALKS:
            for pw in ("gather", "steps"):
                pk.walk = w
                pk.perfect_walk = pw
                got = pk.eval(X)
                assert np.array_equal(got.view(np.int32), want.view(np.int32)), (isa, w, pw)
    # the compact walk (which every walk above equals) against the library, on parity()'s
    # rows and these
    rep = parity(m, native, X=X, predict=ref.eval)
    for kind, k in rep.kinds.items():
        assert k["max_rel"] <= BOUND, (kind, str(rep))


@pytest.mark.parametrize("name", ["lightgbm-depth6", "xgboost-lossguide"])
def test_engine_with_the_walks_chosen_at_load_matches_the_library(models, name, isa):
    m, native = _model(models, name)
    assert_parity(m, native, isa)


def test_perfect_walk_is_settable_and_refuses_unknown_names(models):
    m, _ = _model(models, "lightgbm-depth6")
    pk = PackedTrees(m.trees, tree_isas()[-1])
    assert pk.perfect_walk in ("gather", "steps")
    assert pk.layout["perfect_walk"] == pk.perfect_walk
    pk.perfect_walk = "steps"
    assert pk.perfect_walk == "steps"
    with pytest.raises(InputError, match="unknown perfect walk 'fast'"):
        pk.perfect_walk = "fast"
    assert pk.perfect_walk == "steps"


def test_time_rows_times_each_row_once_and_refuses_a_vector(models):
    m, _ = _model(models, "lightgbm-leafwise")
    pk = PackedTrees(m.trees, "scalar")
    X = np.random.default_rng(0).standard_normal((7, N_FEAT)).astype(F)
    ns = pk.time_rows(X)
    assert ns.dtype == np.int64 and ns.shape == (7,) and (ns >= 0).all()
    with pytest.raises(InputError, match=f"rows of {N_FEAT} features"):
        pk.time_rows(X[0])
    with pytest.raises(InputError, match=f"rows of {N_FEAT} features"):
        pk.time_rows(X[:, :3])
