"""Models as the real exporters write them (skl2onnx, on scikit-learn models), imported by
Model.from_onnx: Engine.predict must equal onnxruntime on the same file, on random and on
order-book inputs, on every kernel set; step() maps the outputs through the model's head."""
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
sklearn = pytest.importorskip("sklearn")
skl2onnx = pytest.importorskip("skl2onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from sklearn.linear_model import Lasso, LinearRegression, LogisticRegression, Ridge  # noqa: E402
from sklearn.neural_network import MLPClassifier, MLPRegressor  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import MinMaxScaler, StandardScaler  # noqa: E402

from fastpath import Engine, Model, ModelError, lob  # noqa: E402
from fastpath.model import Head  # noqa: E402
from helpers.builders import engine_cfg  # noqa: E402
from helpers.oracle import assert_close, ort_run  # noqa: E402

N_FEAT = 24


def _book_rows():
    """Order-book rows (generate_stream + raw_from_book), the first N_FEAT fields of each."""
    raws = lob.raw_from_book(lob.generate_stream(1500, 2, seed=3))
    return np.ascontiguousarray(raws[:, :N_FEAT])


BOOK = _book_rows()


def _data(kind):
    rng = np.random.default_rng(1)
    X = np.vstack([BOOK[::3], rng.standard_normal((300, N_FEAT)).astype(np.float32)])
    z = (X - X.mean(0)) / (X.std(0) + 1e-6)
    y = z @ rng.standard_normal(N_FEAT) * 0.3
    if kind == "reg":
        return X, y
    if kind == "cls2":
        return X, (y > 0).astype(int)
    return X, np.digitize(y, np.quantile(y, [1 / 3, 2 / 3]))


def _export(est, X, path):
    from skl2onnx import to_onnx
    opts = {id(est): {"zipmap": False}} if hasattr(est, "predict_proba") else None
    if opts is None and hasattr(est, "steps") and hasattr(est.steps[-1][1], "predict_proba"):
        opts = {id(est.steps[-1][1]): {"zipmap": False}}
    m = to_onnx(est, X[:1], options=opts, target_opset={"": 17, "ai.onnx.ml": 3})
    with open(path, "wb") as f:
        f.write(m.SerializeToString())
    return str(path)


def _inputs():
    rng = np.random.default_rng(7)
    rnd = rng.standard_normal((40, N_FEAT)).astype(np.float32) * 2.0
    return np.vstack([rnd, BOOK[1::37][:40]]).astype(np.float32)


MODELS = {
    "MLPRegressor": ("reg", lambda: MLPRegressor(hidden_layer_sizes=(32, 16), max_iter=60,
                                                 random_state=0)),
    "MLPRegressor-tanh": ("reg", lambda: MLPRegressor(hidden_layer_sizes=(16,), activation="tanh",
                                                      max_iter=60, random_state=0)),
    "MLPClassifier-3": ("cls3", lambda: MLPClassifier(hidden_layer_sizes=(16,), max_iter=60,
                                                      random_state=0)),
    "MLPClassifier-2": ("cls2", lambda: MLPClassifier(hidden_layer_sizes=(16,), max_iter=60,
                                                      random_state=0)),
    "LinearRegression": ("reg", LinearRegression),
    "Ridge": ("reg", lambda: Ridge(alpha=0.5)),
    "Lasso": ("reg", lambda: Lasso(alpha=0.01)),
    "LogisticRegression-3": ("cls3", lambda: LogisticRegression(max_iter=300)),
    "LogisticRegression-2": ("cls2", lambda: LogisticRegression(max_iter=300)),
    "StandardScaler+Ridge": ("reg", lambda: make_pipeline(StandardScaler(), Ridge())),
    "StandardScaler+MLPRegressor": ("reg", lambda: make_pipeline(
        StandardScaler(), MLPRegressor(hidden_layer_sizes=(16,), max_iter=60, random_state=0))),
    "MinMaxScaler+MLPClassifier-3": ("cls3", lambda: make_pipeline(
        MinMaxScaler(), MLPClassifier(hidden_layer_sizes=(16,), max_iter=60, random_state=0))),
    "MinMaxScaler+LogisticRegression-2": ("cls2", lambda: make_pipeline(
        MinMaxScaler(), LogisticRegression(max_iter=300))),
}

EXPECTED_HEAD = {"reg": "regression", "cls2": "classifier2", "cls3": "classifier3"}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    d = tmp_path_factory.mktemp("skl")
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")    # convergence warnings: the fit quality is not tested
        for name, (kind, make) in MODELS.items():
            X, y = _data(kind)
            est = make().fit(X, y)
            out[name] = (kind, _export(est, X.astype(np.float32), d / f"{name}.onnx"))
    return out


@pytest.mark.parametrize("name", list(MODELS))
def test_sklearn_export_predict_matches_onnxruntime(exported, name, isa):
    kind, path = exported[name]
    m = Model.from_onnx(path)
    assert m.head_spec.kind == EXPECTED_HEAD[kind]
    X = _inputs()
    ref = ort_run(path, X)
    eng = Engine(m, config=engine_cfg(isa, enabled=False))
    assert eng.n_outputs == ref.shape[1]
    got = np.stack([eng.predict(x) for x in X])
    assert_close(got, ref)
    # step() = predict() through the head (cache off: every tick runs the model)
    for i in range(0, len(X), 9):
        r = eng.step(X[i], ts_ns=i)
        sig, conf = m.head_spec.apply(ref[i])
        assert r.signal == pytest.approx(float(sig), abs=2e-5)
        assert r.confidence == pytest.approx(float(conf), abs=2e-5)
        assert -1.0 <= r.signal <= 1.0 and 0.0 <= r.confidence <= 1.0


def test_classifier_heads_read_probabilities(exported):
    """classifier3: signal = p(up) - p(down), confidence = max p; overridable to other indices."""
    _, path = exported["LogisticRegression-3"]
    X = _inputs()[:10]
    ref = ort_run(path, X)
    eng = Engine(path, config=engine_cfg("scalar", enabled=False))
    for i, x in enumerate(X):
        r = eng.step(x, ts_ns=i)
        assert r.signal == pytest.approx(ref[i, 2] - ref[i, 0], abs=2e-6)
        assert r.confidence == pytest.approx(ref[i].max(), abs=2e-6)
    # a model whose classes are (up, flat, down): the head names them
    flipped = Model.from_onnx(path, head=Head("classifier3", outputs=(2, 1, 0)))
    eng = Engine(flipped, config=engine_cfg("scalar", enabled=False))
    r = eng.step(X[0], ts_ns=0)
    assert r.signal == pytest.approx(ref[0, 0] - ref[0, 2], abs=2e-6)


def test_regression_head_scale_and_bundle_roundtrip(exported, tmp_path):
    _, path = exported["Ridge"]
    m = Model.from_onnx(path).with_head(Head("regression", scale=0.25))
    p = tmp_path / "r.fpm"
    m.save(p)
    back = Model.load(p)
    assert back.head_spec == Head("regression", scale=0.25, outputs=(0,))
    assert back.post == "none" and back.n_outputs == 1
    x = _inputs()[3]
    out = ort_run(path, x[None])[0, 0]
    r = Engine(back, config=engine_cfg("scalar", enabled=False)).step(x, ts_ns=0)
    assert r.signal == pytest.approx(np.tanh(out / 0.25), abs=2e-5)
    assert r.confidence == pytest.approx(abs(np.tanh(out / 0.25)), abs=2e-5)
    # a classifier bundle keeps its post transform and head
    _, cpath = exported["MLPClassifier-2"]
    c = Model.from_onnx(cpath)
    c.save(tmp_path / "c.fpm")
    cb = Model.load(tmp_path / "c.fpm")
    assert cb.post == "logistic2" and cb.head_spec.kind == "classifier2"
    xs = _inputs()[:5]
    e1 = Engine(c, config=engine_cfg("scalar", enabled=False))
    e2 = Engine(cb, config=engine_cfg("scalar", enabled=False))
    for x in xs:
        np.testing.assert_array_equal(e1.predict(x), e2.predict(x))


def test_predict_refuses_bad_input_and_leaves_state(exported):
    from fastpath import InputError
    _, path = exported["MLPRegressor"]
    eng = Engine(path, config=engine_cfg("scalar", enabled=False))
    x = _inputs()[0].copy()
    before = eng.ticks
    with pytest.raises(InputError, match=f"{N_FEAT} values"):
        eng.predict(x[:-1])
    x[3] = np.nan
    with pytest.raises(InputError, match="non-finite values, first at index 3"):
        eng.predict(x)
    assert eng.ticks == before


def test_nonfinite_output_refused_on_every_kernel_set(tmp_path, isa):
    """A finite input that overflows the model is refused by predict() and step(), for every
    head (the head must not turn Inf into a finite-looking signal)."""
    from fastpath import InputError
    from fastpath.model import Layer
    w = np.full((1, 4), 3e38, np.float32)
    for head, post in ((Head("regression"), "none"), (Head("classifier2"), "logistic2")):
        m = Model((Layer(w, np.zeros(1)),), post=post, head_spec=head)
        eng = Engine(m, config=engine_cfg(isa, enabled=False))
        x = np.full(4, 10.0, np.float32)
        with pytest.raises(InputError, match="NaN/Inf"):
            eng.predict(x)
        with pytest.raises(InputError, match="NaN/Inf"):
            eng.step(x, ts_ns=0)
        assert eng.ticks == 0


def test_unsupported_ops_say_what_to_do(tmp_path):
    """A ZipMap classifier output and a tree ensemble are named with what to export instead."""
    from skl2onnx import to_onnx
    X, y = _data("cls2")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = LogisticRegression(max_iter=200).fit(X, y)
    p = str(tmp_path / "zip.onnx")
    with open(p, "wb") as f:
        f.write(to_onnx(est, X[:1].astype(np.float32)).SerializeToString())
    with pytest.raises(ModelError, match="zipmap=False"):
        Model.from_onnx(p)


def _gemm_bn(path, eps=1e-5):
    """Gemm -> BatchNormalization -> Relu -> Gemm, as torch's TorchScript exporter writes a
    Linear + BatchNorm1d in eval mode."""
    rng = np.random.default_rng(4)
    W0 = rng.standard_normal((8, 6)).astype(np.float32)
    B0 = rng.standard_normal(8).astype(np.float32)
    gamma, beta = rng.random(8).astype(np.float32) + 0.5, rng.standard_normal(8).astype(np.float32)
    mean, var = rng.standard_normal(8).astype(np.float32), rng.random(8).astype(np.float32) + 0.1
    W1 = rng.standard_normal((2, 8)).astype(np.float32)
    inits = [numpy_helper.from_array(a, n) for a, n in ((W0, "W0"), (B0, "B0"), (gamma, "g"),
                                                        (beta, "b"), (mean, "m"), (var, "v"),
                                                        (W1, "W1"))]
    nodes = [helper.make_node("Gemm", ["x", "W0", "B0"], ["h"], transB=1),
             helper.make_node("BatchNormalization", ["h", "g", "b", "m", "v"], ["bn"], epsilon=eps),
             helper.make_node("Relu", ["bn"], ["r"]),
             helper.make_node("Gemm", ["r", "W1"], ["y"], transB=1)]
    g = helper.make_graph(nodes, "bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 2])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, str(path))
    return str(path)


def test_batchnorm_folds_into_the_preceding_gemm(tmp_path, isa):
    p = _gemm_bn(tmp_path / "bn.onnx")
    m = Model.from_onnx(p)
    assert len(m.layers) == 2
    X = np.random.default_rng(0).standard_normal((30, 6)).astype(np.float32)
    ref = ort_run(p, X)
    eng = Engine(m, config=engine_cfg(isa, enabled=False))
    assert_close(np.stack([eng.predict(x) for x in X]), ref)
