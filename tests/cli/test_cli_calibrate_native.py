"""`fastpath calibrate --model model.txt | model.json`: a LightGBM or XGBoost model is loaded
natively, its parity with the library's own predict is printed, and the bundle written holds
the tree ensemble."""
import numpy as np
import pytest

from fastpath import Model

F32 = np.float32


def _ticks(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 4)).astype(F32)
    np.save(tmp_path / "t.npy", X)
    return X, (X[:, 0] + X[:, 1] > 0).astype(int)


def _run(tmp_path, model_path):
    from fastpath.cli import main
    return main(["calibrate", "--ticks", str(tmp_path / "t.npy"), "--model", str(model_path),
                 "--out", str(tmp_path / "c.fpm"), "--z-fields", "0-3", "--window-fields",
                 "none", "--features", "raw"])


def test_calibrate_prints_lightgbm_parity(tmp_path, capsys):
    lgb = pytest.importorskip("lightgbm")
    X, y = _ticks(tmp_path)
    b = lgb.train({"objective": "binary", "verbose": -1}, lgb.Dataset(X, y), 5)
    b.save_model(str(tmp_path / "model.txt"))
    assert _run(tmp_path, tmp_path / "model.txt") == 0
    out = capsys.readouterr().out
    assert "parity with lightgbm's own predict" in out and "threshold" in out
    assert Model.load(tmp_path / "c.fpm").trees == Model.from_lightgbm(b).trees


def test_calibrate_prints_xgboost_parity(tmp_path, capsys):
    xgb = pytest.importorskip("xgboost")
    X, y = _ticks(tmp_path)
    b = xgb.train({"objective": "binary:logistic", "max_depth": 3}, xgb.DMatrix(X, y), 5)
    b.save_model(str(tmp_path / "model.json"))
    assert _run(tmp_path, tmp_path / "model.json") == 0
    out = capsys.readouterr().out
    assert "parity with xgboost's own predict" in out and "raw" in out
    assert Model.load(tmp_path / "c.fpm").trees == Model.from_xgboost(b).trees


def test_a_damaged_native_model_is_a_usage_error(tmp_path, capsys):
    pytest.importorskip("lightgbm")
    _ticks(tmp_path)
    (tmp_path / "model.txt").write_text("tree\nversion=v4\n")
    assert _run(tmp_path, tmp_path / "model.txt") != 0
    assert "end of trees" in capsys.readouterr().err
    assert not (tmp_path / "c.fpm").exists()
