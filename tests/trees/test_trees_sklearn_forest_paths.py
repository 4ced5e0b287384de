"""A scikit-learn forest (gradient-boosted classifier, random-forest regressor) exported to ONNX
answers alike through step, step_batch and the serving client, and as onnxruntime does on the
engine's own features."""


import numpy as np
import pytest

import fastpath
from fastpath import Engine, Model
from helpers.oracle import ort_runner
from helpers.paths import (assert_same, batch_greedy, cfg, F, _fs, good_rows, make_stream, POLICY,
                           run_ticks, SERVE, unique_name)


@pytest.mark.parametrize("est", ["gb3", "rf_reg"])
def test_sklearn_forest_through_every_path(est, tmp_path):
    pytest.importorskip("skl2onnx")
    pytest.importorskip("onnxruntime")
    from sklearn.ensemble import GradientBoostingClassifier, RandomForestRegressor
    from helpers.models import _skl
    rng = np.random.default_rng(18)
    fs = _fs(rng)
    raws, syms, ts, bad = make_stream(19)
    R, S, T = good_rows(raws, syms, ts, bad)
    X = fs.apply(R, S)
    Xt = rng.standard_normal((300, fs.n_feat)).astype(F)
    if est == "gb3":
        skl = GradientBoostingClassifier(n_estimators=12, max_depth=3, random_state=0)
        skl.fit(Xt, np.digitize(Xt[:, 0] + Xt[:, 3], [-0.5, 0.5]))
    else:
        skl = RandomForestRegressor(n_estimators=8, max_depth=4, random_state=0)
        skl.fit(Xt, Xt[:, 1] - Xt[:, 12])
    path = _skl(skl, Xt, tmp_path / "m.onnx")
    m = Model.from_onnx(path).with_feature_spec(fs).with_cache_policy(POLICY)
    assert m.trees is not None
    c = {"engine": {"n_symbols": 8}, "serve": SERVE}
    eng = Engine(m, config=c)
    want = run_ticks(eng.step, raws, syms, ts)
    assert sum(o[2] for o in want if o != "refused") > 10
    assert_same(batch_greedy(Engine(m, config=c), raws, syms, ts),
                [o if o == "refused" else o[:3] for o in want], "step_batch")
    name = unique_name()
    with fastpath.serve(name, m, c), fastpath.connect(name) as cl:
        assert_same(run_ticks(cl.step, raws, syms, ts), want, "served")
    # onnxruntime through the model's head, on the engine's own features (a feature a last
    # bit off the numpy reference's may cross a split threshold)
    nocache = Engine(m, config=cfg(cache={"enabled": False}))
    Xe = np.empty_like(X)
    sig_e, conf_e = [], []
    for i in range(len(R)):
        Xe[i] = nocache.features(R[i], int(S[i]))
        r = nocache.step(R[i], int(S[i]), int(T[i]))
        sig_e.append(r.signal)
        conf_e.append(r.confidence)
    np.testing.assert_allclose(Xe, X, rtol=1e-5, atol=1e-5)
    s = ort_runner(path)
    outs = s.run(None, {s.get_inputs()[0].name: Xe})
    names = [o.name for o in s.get_outputs()]
    ref = np.asarray(outs[names.index("probabilities") if "probabilities" in names else -1],
                     np.float32).reshape(len(X), -1)
    got = np.array([nocache.predict(x) for x in Xe])
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    b = (np.array(sig_e), np.array(conf_e))
    sig, conf = m.head_spec.apply(ref)
    np.testing.assert_allclose(b[0], sig, atol=1e-5)
    np.testing.assert_allclose(b[1], conf, atol=1e-5)
    b = Engine(m, config=cfg(cache={"enabled": False})).step_batch(R, S, T)
    assert list(b.signal) == sig_e and list(b.confidence) == conf_e
