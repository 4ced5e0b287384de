"""Heads and outputs: models with 1..k outputs, the head that maps them to (signal,
confidence) in the engine (every kernel set) against the numpy reference, the regression
scale fitted by calibrate, and bundles old and new."""
import numpy as np
import pytest

import fastpath
from fastpath import Engine, InputError, Model, ModelError
from fastpath.model import FeatureSpec, Head, Layer
from helpers.builders import engine_cfg


def _layers(rng, dims):
    return tuple(Layer(rng.standard_normal((dims[i + 1], dims[i])).astype(np.float32) / np.sqrt(dims[i]),
                       rng.standard_normal(dims[i + 1]).astype(np.float32) * 0.1,
                       "relu" if i < len(dims) - 2 else "identity") for i in range(len(dims) - 1))


def _model(rng, n_out, post="none", head=None, n_in=12):
    return Model(_layers(rng, [n_in, 16, n_out if post != "logistic2" else 1]), post=post,
                 head_spec=head)


@pytest.mark.parametrize("n_out,post,head,kind", [
    (1, "none", None, "regression"),
    (2, "none", None, "tanh_sigmoid"),
    (2, "softmax", None, "classifier2"),
    (2, "logistic2", None, "classifier2"),
    (3, "softmax", None, "classifier3"),
    (5, "none", Head("regression", 0.5, (3,)), "regression"),
    (4, "softmax", Head("classifier3", outputs=(3, 0, 1)), "classifier3"),
    (6, "none", Head("tanh_sigmoid", outputs=(5, 2)), "tanh_sigmoid"),
])
def test_heads_match_the_reference(isa, n_out, post, head, kind):
    rng = np.random.default_rng(n_out)
    m = _model(rng, n_out, post, head)
    assert m.head_spec.kind == kind and m.n_outputs == n_out
    eng = Engine(m, config=engine_cfg(isa, enabled=False))
    assert eng.n_outputs == n_out
    X = rng.standard_normal((30, 12)).astype(np.float32) * 2
    ref = m.forward(X)
    got = np.stack([eng.predict(x) for x in X])
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    if post != "none":
        np.testing.assert_allclose(got.sum(1), 1.0, atol=1e-6)
    sig, conf = m.signal(ref)
    for i, x in enumerate(X):
        r = eng.step(x, ts_ns=i)
        assert r.signal == pytest.approx(sig[i], abs=2e-6)
        assert r.confidence == pytest.approx(conf[i], abs=2e-6)


def test_bad_heads_are_model_errors():
    rng = np.random.default_rng(0)
    with pytest.raises(ModelError, match="head kind 'sign' not supported"):
        Head("sign")
    with pytest.raises(ModelError, match="scale must be a finite number > 0"):
        Head("regression", 0.0)
    with pytest.raises(ModelError, match="reads 3 output indices"):
        Head("classifier3", outputs=(0, 1))
    with pytest.raises(ModelError, match=r"reads output\(s\) \[4\] but the model has 3"):
        _model(rng, 3, "softmax", Head("classifier3", outputs=(0, 1, 4)))
    with pytest.raises(ModelError, match="reads the same output twice"):
        _model(rng, 3, "none", Head("tanh_sigmoid", outputs=(1, 1)))
    with pytest.raises(ModelError, match="'logistic2' turns one logit into two"):
        Model(_layers(rng, [4, 3]), post="logistic2")
    with pytest.raises(ModelError, match="post transform 'relu'"):
        Model(_layers(rng, [4, 2]), post="relu")
    with pytest.raises(ModelError, match="no head was given"):
        _model(rng, 4)


def test_old_bundles_load_with_the_two_output_head(tmp_path):
    """The demo bundle predates heads: no "post" or "head" in its header. It loads with no
    post transform and tanh / sigmoid, and its signals are what they were (the numpy head)."""
    m = Model.load(fastpath._build.DEMO_MODEL)
    assert m.post == "none" and m.head_spec == Head("tanh_sigmoid")
    rng = np.random.default_rng(0)
    eng = Engine(m, config=engine_cfg("scalar", enabled=False))
    x = rng.standard_normal(m.raw_len).astype(np.float32)
    f = eng.features(x)
    sig, conf = Model.head(m.forward(f))
    r = eng.step(x, ts_ns=0)
    assert r.signal == pytest.approx(sig, abs=2e-6) and r.confidence == pytest.approx(conf, abs=2e-6)
    np.testing.assert_allclose(eng.predict(f), m.forward(f), rtol=1e-5, atol=1e-6)


def test_calibrate_fits_the_regression_scale(tmp_path):
    from fastpath.tuning import HEAD_QUANTILE, HEAD_TARGET, calibrate
    rng = np.random.default_rng(5)
    raws = (rng.standard_normal((400, 10)) * 3 + 7).astype(np.float32)
    m = _model(rng, 1, n_in=10)
    assert m.head_spec.scale == 1.0
    out = calibrate(m, raws, range(10))
    pred = out.forward(out.feature_spec.apply(raws))[:, 0]
    want = np.quantile(np.abs(pred.astype(np.float64)), HEAD_QUANTILE) / HEAD_TARGET
    assert out.head_spec.kind == "regression"
    assert out.head_spec.scale == pytest.approx(want, rel=1e-6)
    eng = Engine(out, config=engine_cfg("scalar", enabled=False))
    sigs = eng.step_batch(raws, np.zeros(len(raws), np.int32), np.arange(len(raws))).signal
    frac = np.mean(np.abs(sigs) >= np.tanh(HEAD_TARGET) - 1e-6)
    assert 0.03 <= frac <= 0.07            # the top 5% of |prediction| land past tanh(2)
    # a two-output model keeps its head untouched
    m2 = _model(rng, 2, n_in=10)
    assert calibrate(m2, raws, range(10)).head_spec == m2.head_spec


def test_fit_head_scale_refuses_what_it_cannot_fit():
    from fastpath.tuning import fit_head_scale
    rng = np.random.default_rng(1)
    with pytest.raises(ModelError, match="this model's head is 'tanh_sigmoid'"):
        fit_head_scale(_model(rng, 2), rng.standard_normal((10, 12)))
    zero = Model((Layer(np.zeros((1, 12)), np.zeros(1)),))
    with pytest.raises(ModelError, match="predicts 0"):
        fit_head_scale(zero, rng.standard_normal((10, 12)))
    with pytest.raises(InputError, match=r"shape \(n, 12\)"):
        fit_head_scale(_model(rng, 1), rng.standard_normal((10, 5)))


def test_cli_calibrate_writes_the_fitted_head(tmp_path, capsys):
    from fastpath.cli import main
    rng = np.random.default_rng(2)
    raws = (rng.standard_normal((300, 8)) * 2).astype(np.float32)
    m = _model(rng, 1, n_in=8)
    src = tmp_path / "m.fpm"
    m.save(src)
    np.save(tmp_path / "t.npy", raws)
    rc = main(["calibrate", "--ticks", str(tmp_path / "t.npy"), "--model", str(src),
               "--out", str(tmp_path / "o.fpm"), "--z-fields", "0-7"])
    assert rc == 0
    out = Model.load(tmp_path / "o.fpm")
    assert out.head_spec.kind == "regression" and out.head_spec.scale != 1.0
    assert "signal = tanh(out / " in capsys.readouterr().out
    assert isinstance(out.feature_spec, FeatureSpec) and out.meta["head_fit"]["ticks"] == 300


def test_predict_takes_every_layout_alike(isa):
    """predict's in-place path (contiguous float32 of the right length) and its numpy path
    (other dtypes, strides, lists) give the same outputs; a NaN or Inf is refused on both,
    by the kernel set's own finiteness check on the fast path."""
    from fastpath import InputError
    rng = np.random.default_rng(9)
    m = Model(_layers(rng, [12, 8, 3]), post="softmax")
    eng = Engine(m, config=engine_cfg(isa, enabled=False))
    x = rng.standard_normal(12).astype(np.float32)
    ref = m.forward(x[None, :])[0]
    wide = np.zeros(24, np.float32)
    wide[::2] = x
    for v in (x, x.astype(np.float64), list(map(float, x)), wide[::2], x.reshape(1, 12)[0]):
        np.testing.assert_allclose(eng.predict(v), ref, rtol=1e-5, atol=1e-6)
    for bad in (np.nan, np.inf, -np.inf):
        for pos in (0, 7, 11):
            y = x.copy()
            y[pos] = bad
            with pytest.raises(InputError, match=f"first at index {pos}"):
                eng.predict(y)
            with pytest.raises(InputError, match=f"first at index {pos}"):
                eng.predict(y.astype(np.float64))
    with pytest.raises(InputError, match="12 values"):
        eng.predict(np.zeros(13, np.float32))
    with pytest.raises(InputError, match="12 values"):
        eng.predict(np.zeros((2, 12), np.float32))
