"""Writes stop22_scaler_*.{onnx,fpm} and stop22_scaler.npz: bundles of scaler pipelines
(skl2onnx StandardScaler + MLPRegressor / GradientBoostingRegressor) written by stop 22's
bundle writer (85d304d), whose feature spec arrays held the spec with the input scaler
composed in. Run with stop 22's fastpath first on sys.path (a worktree of 85d304d):
    PYTHONPATH=<worktree of 85d304d> python tests/data/make_stop22_scaler_bundles.py
tests/test_review23_review.py reads them with today's reader."""
import os
import warnings

import numpy as np
from sklearn.ensemble import GradientBoostingRegressor
from sklearn.neural_network import MLPRegressor
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from skl2onnx import to_onnx

from fastpath.model import FeatureSpec, Head, Model
from fastpath.tuning import calibrate

HERE = os.path.dirname(os.path.abspath(__file__))
WHERE = np.array([7, 2, 9, 0, 4, 5])      # the graph's six inputs in a 10-field tick


def ticks(n, seed):
    """10-field ticks: two price-like fields (6.5e4 +- 0.5), four 1e-2-scale ones at WHERE,
    noise elsewhere; and the regression target of the six."""
    rng = np.random.default_rng(seed)
    X = np.empty((n, 6), np.float32)
    X[:, 0] = 65000 + rng.uniform(-0.5, 0.5, n)
    X[:, 1] = 65000.25 + rng.uniform(-0.5, 0.5, n)
    X[:, 2:] = rng.normal(0, 1e-2, (n, 4))
    y = (X[:, 0] - 65000.0) * 2 - (X[:, 1] - 65000.25) + X[:, 2] * 50 + np.sin(X[:, 3] * 100)
    raws = rng.standard_normal((n, 10)).astype(np.float32)
    raws[:, WHERE] = X
    return raws, y


def main():
    import fastpath
    assert not hasattr(Model, "layer_spec"), f"run with stop 22's fastpath, got {fastpath.__file__}"
    raws, y = ticks(400, 0)
    select = FeatureSpec(10, WHERE, np.zeros(0, np.int32), 1, np.zeros(6, np.float32),
                         np.ones(6, np.float32))
    est = {"mlp": MLPRegressor(hidden_layer_sizes=(16,), max_iter=400, random_state=0),
           "gbr": GradientBoostingRegressor(n_estimators=20, max_depth=3, random_state=0)}
    for name, e in est.items():
        # "select": trained on the six fields as they are, the spec picks them from the tick;
        # "zscored": trained on the calibrated spec's features (what calibrate makes)
        for spec_name in ("select", "zscored"):
            fs = select if spec_name == "select" else FeatureSpec.fit(raws, WHERE)
            X = fs.apply(raws)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                pipe = make_pipeline(StandardScaler(), e).fit(X, y)
            onx = to_onnx(pipe, X[:1], target_opset={"": 17, "ai.onnx.ml": 3})
            stem = os.path.join(HERE, f"stop22_scaler_{name}_{spec_name}")
            with open(stem + ".onnx", "wb") as f:
                f.write(onx.SerializeToString())
            m = Model.from_onnx(stem + ".onnx", head=Head("regression", 1.0, (0,)))
            m = m.with_feature_spec(select) if spec_name == "select" else \
                calibrate(m, raws, WHERE)
            m.save(stem + ".fpm")
    test_raws, _ = ticks(300, 1)
    np.savez(os.path.join(HERE, "stop22_scaler.npz"), fit_raws=raws, raws=test_raws,
             where=WHERE)


if __name__ == "__main__":
    main()
