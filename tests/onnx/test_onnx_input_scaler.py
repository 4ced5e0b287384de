"""An ONNX model's leading scaler (skl2onnx's StandardScaler / MinMaxScaler, a hand-written
Sub + Div) runs in the feature stage, in float32 as onnxruntime runs it, not folded into the
first layer (folded, W * scale and b - W * scale * offset are both large for price-like inputs,
x ~ 6.5e4 +- 0.5, and the first layer's sum cancels them). Each pipeline is compared with
onnxruntime on such inputs, on every kernel set; the scaler survives a feature spec set later
(composed after it), the bundle, to_onnx and bundles written by the folding code; a Div by 0
is refused, and the cache policy follows the features."""
import json
import os
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("skl2onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from fastpath import Engine, ModelError  # noqa: E402
from fastpath.model import CachePolicy, FeatureSpec, Head, Model  # noqa: E402
from fastpath.tuning import calibrate, weights_error  # noqa: E402
from helpers.builders import engine_cfg  # noqa: E402
from helpers.models import _prices
from helpers.oracle import ort_first, ort_run  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
OLD = os.path.join(DATA, "onnx_scaler_folded_v1")     # written by the folding code
TOL = 1e-5      # of the output's spread (onnxruntime's outputs, max - min)


def _sk_onnx(est, X, path, clf=False):
    from skl2onnx import to_onnx
    opts = {id(est): {"zipmap": False}} if clf else None
    onx = to_onnx(est, X[:1], options=opts, target_opset={"": 17, "ai.onnx.ml": 3})
    with open(path, "wb") as f:
        f.write(onx.SerializeToString())
    return str(path)


@pytest.fixture(scope="module")
def pipes(tmp_path_factory):
    """name -> (onnx path, fitted sklearn pipeline): each a scaler in front of a model."""
    from sklearn.ensemble import GradientBoostingRegressor
    from sklearn.linear_model import LinearRegression, LogisticRegression, Ridge
    from sklearn.neural_network import MLPRegressor
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import MinMaxScaler, StandardScaler
    d = tmp_path_factory.mktemp("pipes")
    X, y = _prices(400)
    yc = (y > np.median(y)).astype(np.int64)
    mlp = dict(hidden_layer_sizes=(16,), max_iter=400, random_state=0)
    specs = {
        "std_mlp": (make_pipeline(StandardScaler(), MLPRegressor(**mlp)), y, False),
        "minmax_mlp": (make_pipeline(MinMaxScaler(), MLPRegressor(**mlp)), y, False),
        "std_ridge": (make_pipeline(StandardScaler(), Ridge()), y, False),
        "std_linreg": (make_pipeline(StandardScaler(), LinearRegression()), y, False),
        "std_logreg": (make_pipeline(StandardScaler(), LogisticRegression()), yc, True),
        "std_gbr": (make_pipeline(StandardScaler(),
                                  GradientBoostingRegressor(n_estimators=20, max_depth=3,
                                                            random_state=0)), y, False),
    }
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, (est, target, clf) in specs.items():
            est.fit(X, target)
            out[name] = (_sk_onnx(est, X, d / f"{name}.onnx", clf), est)
    return out


def _engine_outputs(m, X, isa):
    """(the engine's outputs for rows X stepped as raw ticks, its signals under m's head).
    The outputs are read through step() with a regression head 1e3 times wider than they
    are (signal = tanh(out / scale) is then linear to 3e-7, and atanh gives them back to
    float32's precision): step runs the feature stage, which holds the input scaler
    (Engine.predict starts at the first layer)."""
    e = Engine(m, config=engine_cfg(isa))
    sig = np.array([e.step(x, 0).signal for x in X], np.float64)
    feats = np.stack([e.features(x, 0) for x in X])
    np.testing.assert_array_equal(feats, m.features(X))
    ref = m.outputs(X).astype(np.float64)
    cols = []
    for j in range(ref.shape[1]):
        scale = 1e3 * max(float(np.abs(ref[:, j]).max()), 1e-3)
        ej = Engine(m.with_head(Head("regression", scale, (j,))), config=engine_cfg(isa))
        s = np.array([ej.step(x, 0).signal for x in X], np.float64)
        cols.append(np.arctanh(s) * scale)
    return np.stack(cols, axis=1), sig


def _rel(a, ref):
    return float(np.abs(np.asarray(a, np.float64) - ref).max() / max(float(np.ptp(ref)), 1e-12))


EXACT = ("std_mlp", "std_ridge", "std_linreg", "std_logreg", "std_gbr")


@pytest.mark.parametrize("name", EXACT)
def test_scaler_pipeline_matches_onnxruntime(pipes, name, isa):
    # folded: 2.5e-3 (MLP), 1.2e-3 (Ridge) of the spread, 6e-3 of a probability (logistic);
    # the tree pipeline was refused (a Scaler next to an ensemble)
    path, _ = pipes[name]
    X, _ = _prices(200, seed=1)
    ref = ort_run(path, X, "last_float")
    m = Model.from_onnx(path)
    pred, sig = _engine_outputs(m, X, isa)
    assert _rel(pred, ref) <= TOL, _rel(pred, ref)
    want = m.head_spec.apply(ref)[0]
    assert np.abs(sig - want).max() <= max(TOL * 4, TOL * np.ptp(want) * 4)
    # the numpy reference: forward() takes what onnxruntime takes, outputs() raw ticks
    assert _rel(m.forward(X), ref) <= TOL
    assert _rel(m.outputs(X), ref) <= TOL
    sc = m.input_scaler
    assert sc is not None
    # the feature spec makes the graph's input (the identity); the feature stage runs it,
    # then the scaler's two float32 ops: onnxruntime's
    assert m.feature_spec == FeatureSpec.identity(sc.n)
    np.testing.assert_array_equal(m.features(X), sc.apply(X))
    # forward() of the feature spec's output is outputs(): one meaning of "the model's input"
    np.testing.assert_array_equal(m.forward(m.feature_spec.apply(X)), m.outputs(X))


def test_minmax_pipeline_closer_to_float64_than_the_fold(pipes, isa):
    # skl2onnx writes MinMaxScaler as x * scale + min: onnxruntime rounds x * scale (~6.5e4)
    # and is itself ~1e-3 of the spread off the float64 pipeline; one (x - o) * s cannot
    # repeat that rounding. The map it is read as must be no further from the float64
    # pipeline than onnxruntime is (the fold into the first layer was 2.4x as far)
    path, est = pipes["minmax_mlp"]
    X, _ = _prices(400, seed=0)
    sk = est.predict(X.astype(np.float64))[:, None]
    ref = ort_run(path, X, "last_float")
    m = Model.from_onnx(path)
    pred, _ = _engine_outputs(m, X, isa)
    assert _rel(pred, sk) <= _rel(ref, sk)
    assert _rel(pred, ref) <= 3e-3
    assert m.input_scaler is not None


def _hand(path, lead_nodes, inits, W, b, n=6):
    nodes = lead_nodes + [helper.make_node("Gemm", [lead_nodes[-1].output[0], "W", "b"], ["h"],
                                           transB=1),
                          helper.make_node("Tanh", ["h"], ["t"]),
                          helper.make_node("Gemm", ["t", "W2", "b2"], ["y"], transB=1)]
    rng = np.random.default_rng(3)
    inits = dict(inits, W=W, b=b, W2=rng.standard_normal((1, W.shape[0])).astype(np.float32),
                 b2=np.zeros(1, np.float32))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                     ["N", n])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    mo = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    mo.ir_version = 8
    onnx.save(mo, str(path))
    return str(path)


MU = np.array([65000.0, 65000.25, 0, 0, 0, 0], np.float32)
SD = np.array([0.29, 0.29, 0.01, 0.01, 0.01, 0.01], np.float32)


@pytest.mark.parametrize("form", ["sub_div", "sub_mul", "add_mul", "rsub_div", "sub_only"])
def test_hand_built_leading_ops_match_onnxruntime(tmp_path, form, isa):
    rng = np.random.default_rng(7)
    W = rng.standard_normal((8, 6)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    sub = {"sub_div": ("Sub", "Div", MU, SD), "sub_mul": ("Sub", "Mul", MU, 1 / SD),
           "add_mul": ("Add", "Mul", -MU, 1 / SD), "rsub_div": ("Sub", "Div", MU, SD),
           "sub_only": ("Sub", None, MU, None)}[form]
    a_in = ["c", "x"] if form == "rsub_div" else ["x", "c"]
    nodes = [helper.make_node(sub[0], a_in, ["s"])]
    inits = {"c": sub[2].astype(np.float32)}
    if sub[1]:
        nodes.append(helper.make_node(sub[1], ["s", "d"], ["z"]))
        inits["d"] = sub[3].astype(np.float32)
    if form == "sub_only":
        W = (W / SD[None, :]).astype(np.float32)
    p = _hand(tmp_path / "h.onnx", nodes, inits, W, b)
    X, _ = _prices(100, seed=2)
    ref = ort_run(p, X, "last_float")
    m = Model.from_onnx(p, head=Head("regression", 1.0, (0,)))
    pred, _ = _engine_outputs(m, X, isa)
    assert _rel(pred, ref) <= TOL, _rel(pred, ref)
    assert m.input_scaler is not None
    # the first layer keeps the file's weights: nothing is folded into them
    np.testing.assert_array_equal(m.layers[0].weight, W)


def test_div_by_zero_and_constant_over_input_still_refused(tmp_path):
    W = np.ones((2, 6), np.float32)
    b = np.zeros(2, np.float32)
    for nodes, c in (([helper.make_node("Div", ["x", "c"], ["z"])], np.zeros(6, np.float32)),
                     ([helper.make_node("Div", ["c", "x"], ["z"])], np.ones(6, np.float32))):
        p = _hand(tmp_path / "d.onnx", nodes, {"c": c}, W, b)
        with pytest.raises(ModelError, match="not x / nonzero constant"):
            Model.from_onnx(p)


def test_shift_after_scale_before_a_tree_is_refused(tmp_path):
    from sklearn.ensemble import GradientBoostingRegressor
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import MinMaxScaler
    X, y = _prices(200)
    est = make_pipeline(MinMaxScaler(), GradientBoostingRegressor(n_estimators=3, random_state=0))
    est.fit(X, y)
    p = _sk_onnx(est, X, tmp_path / "t.onnx")
    # onnxruntime rounds x * scale before adding: near a threshold another branch than the
    # one (x - o) * s takes; a tree cannot absorb the difference smoothly as a layer does
    with pytest.raises(ModelError, match="shifts the input after scaling it"):
        Model.from_onnx(p)


def test_bundle_round_trip_keeps_the_scaler(pipes, tmp_path, isa):
    for name in ("std_mlp", "std_gbr"):
        m = Model.from_onnx(pipes[name][0])
        p = str(tmp_path / f"{name}.fpm")
        m.save(p)
        back = Model.load(p)
        assert back == m and hash(back) == hash(m)
        assert back.input_scaler == m.input_scaler
        X, _ = _prices(50, seed=4)
        a = _engine_outputs(m, X, isa)
        b = _engine_outputs(back, X, isa)
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])
        # the record is part of what a model is: without it, another model
        from dataclasses import replace
        assert replace(m, input_scaler=None) != m


def test_old_bundle_loads_and_answers_as_before(isa):
    """A bundle the folding code wrote (StandardScaler + MLP imported, scaler folded into the
    first layer): no scaler, the same bytes written back, the same answers."""
    with open(OLD + ".fpm", "rb") as f:
        blob = f.read()
    m = Model.from_bytes(blob)
    assert m.input_scaler is None
    assert m.to_bytes() == blob          # a model without a scaler is written as before
    ref = np.load(OLD + ".npz")
    e = Engine(m, config=engine_cfg(isa))
    pred = np.stack([e.predict(x) for x in ref["x"]])
    sig = np.array([e.step(x, 0).signal for x in ref["x"]], np.float32)
    # per kernel set, as the folding code answered on it: the folded layer's cancellation
    # makes the sets' summation orders differ by 1e-2
    assert f"predict_{isa}" in ref.files, f"no answers of the folding code recorded for {isa}"
    np.testing.assert_array_equal(pred, ref[f"predict_{isa}"])
    np.testing.assert_array_equal(sig, ref[f"signal_{isa}"])
    # and importing the same file now lands closer to onnxruntime than the old bundle did
    X = ref["x"]
    ort_out = ort_run(OLD + ".onnx", X, "last_float")
    new = Model.from_onnx(OLD + ".onnx")
    pred_new, _ = _engine_outputs(new, X, isa)
    assert _rel(pred_new, ort_out) <= TOL < _rel(pred, ort_out)


def test_bundle_header_names_the_scaler_only_when_there_is_one(pipes):
    m = Model.from_onnx(pipes["std_mlp"][0])
    blob = m.to_bytes()
    hlen = int.from_bytes(blob[12:16], "little")
    header = json.loads(blob[16:16 + hlen])
    assert header["input_scaler"] == "after_feature_spec"     # stop 22 wrote true (spec composed)
    assert {"scaler.offset", "scaler.scale"} <= {a["name"] for a in header["arrays"]}
    plain = Model(m.layers, FeatureSpec.identity(6), m.cache_policy, {}, m.post, m.head_spec)
    assert b"input_scaler" not in plain.to_bytes()


def test_to_onnx_writes_the_scaler_and_reads_back(pipes, tmp_path):
    # the folding code wrote the folded first layer: onnxruntime on its file was 2.5e-3 of
    # the spread off the original
    path, _ = pipes["std_mlp"]
    m = Model.from_onnx(path)
    out = str(tmp_path / "rt.onnx")
    m.to_onnx(out)
    X, _ = _prices(200, seed=5)
    rel = _rel(ort_run(out, X, "last_float"), ort_run(path, X, "last_float"))
    assert rel <= TOL, rel
    back = Model.from_onnx(out)
    assert back.input_scaler == m.input_scaler and back.layers == m.layers
    assert back.feature_spec == m.feature_spec


def _spec_then_scaler_f64(fs, sc, raws):
    pre = raws[:, fs.z_idx].astype(np.float64)
    f = (pre - fs.mean.astype(np.float64)) * fs.inv_std.astype(np.float64)
    return (f - sc.offset.astype(np.float64)) * sc.scale.astype(np.float64)


def test_with_feature_spec_composes_after_the_users_spec(pipes, isa):
    """A spec set on an imported model makes the model's input; the scaler follows it, as it
    did when folded, now without the fold's cancellation."""
    path, _ = pipes["std_mlp"]
    m = Model.from_onnx(path)
    X, _ = _prices(200, seed=6)
    rng = np.random.default_rng(8)
    # ticks of another layout: 10 fields, the model's six at these places
    where = np.array([7, 2, 9, 0, 4, 5])
    raws = rng.standard_normal((200, 10)).astype(np.float32)
    raws[:, where] = X
    fs = FeatureSpec(10, where, np.zeros(0, np.int32), 1, np.zeros(6, np.float32),
                     np.ones(6, np.float32))
    m2 = m.with_feature_spec(fs)
    # the identity part composes exactly: the model reads what onnxruntime reads
    ref = ort_run(path, X, "last_float")
    e = Engine(m2, config=engine_cfg(isa))
    sig = np.array([e.step(r, 0).signal for r in raws], np.float64)
    assert np.abs(sig - m.head_spec.apply(ref)[0]).max() <= 1e-5
    assert _rel(m2.outputs(raws), ref) <= TOL
    sc = m.input_scaler
    assert m2.input_scaler == sc
    # a spec that scales too: the spec's float32 features, then the scaler's float32 ops,
    # bit for bit under every kernel set; within float32's rounding of the float64 pair
    fs3 = FeatureSpec(10, where, np.zeros(0, np.int32), 1,
                      np.array([1.0, -2.0, 0.5, 0.0, 0.001, 0.0], np.float32),
                      np.array([1.0, 1.0, 1.0, 3.0, 0.5, 2.0], np.float32))
    m3 = m.with_feature_spec(fs3)
    e3 = Engine(m3, config=engine_cfg(isa))
    feat = np.stack([e3.features(r, 0) for r in raws])
    assert m3.feature_spec == fs3
    np.testing.assert_array_equal(feat, sc.apply(fs3.apply(raws)))
    np.testing.assert_array_equal(feat, m3.features(raws))
    want = _spec_then_scaler_f64(fs3, sc, raws)
    f1 = np.abs(fs3.apply(raws)).astype(np.float64)
    bound = 4 * np.finfo(np.float32).eps * (f1 + np.abs(sc.offset)) * np.abs(sc.scale) + 1e-6
    assert np.all(np.abs(feat - want) <= bound)
    # and the model reads what onnxruntime reads given the spec's output
    assert _rel(m3.outputs(raws), ort_run(path, fs3.apply(raws), "last_float")) <= TOL
    # the spec it has is taken as it is (not composed a second time)
    assert m.with_feature_spec(m.feature_spec) == m
    assert m3.with_feature_spec(m3.feature_spec) == m3
    # every way of setting the spec keeps the scaler: dataclasses.replace and the constructor
    # (stop 22 stored the spec with the scaler composed in, so replace() silently dropped it
    # and the layers read unscaled prices)
    from dataclasses import replace
    for other in (replace(m, feature_spec=fs3),
                  Model(m.layers, fs3, m.cache_policy, m.meta, m.post, m.head_spec,
                        input_scaler=sc)):
        assert other == m3
        eo = Engine(other, config=engine_cfg(isa))
        np.testing.assert_array_equal(np.stack([eo.features(r, 0) for r in raws]), feat)


def test_calibrate_keeps_the_scaler_after_the_fitted_spec(pipes):
    path, _ = pipes["std_mlp"]
    m = Model.from_onnx(path, head=Head("regression", 1.0, (0,)))
    X, _ = _prices(300, seed=9)
    out = calibrate(m, X, range(6), features="zscore")     # (a scaler model must say)
    fitted = FeatureSpec.fit(X, range(6))
    assert out.input_scaler == m.input_scaler
    assert out.feature_spec == fitted
    # the engine runs spec, then scaler, then layers: the spec's float32 features through
    # the scaler's float32 ops, as onnxruntime runs the graph on the spec's output
    e = Engine(out, config={"engine": {"n_symbols": 1}})
    feat = np.stack([e.features(x, 0) for x in X])
    np.testing.assert_array_equal(feat, m.input_scaler.apply(fitted.apply(X)))
    # (the layers' outputs, ~-4.6e4 with a spread of ~500, differ from onnxruntime's by the
    # summation order alone: 1.4e-5 of the spread)
    assert _rel(out.outputs(X), ort_run(path, fitted.apply(X), "last_float")) <= 5e-5
    # the head scale was fitted on the model that runs, not on forward(spec(...)), which
    # would apply the scaler twice
    assert out.head_spec.scale == pytest.approx(
        np.quantile(np.abs(out.outputs(X)[:, 0]), 0.95) / 2.0)


def test_specs_one_composed_spec_could_not_run(pipes, isa):
    """Composed into one spec, an inv_std 0 feature (a constant 0, which the scaler maps to
    -offset * scale) had no (pre - m) * s form and was a ModelError, and a tiny inv_std made
    a composed mean past float32's range; run as two steps, both are what onnxruntime
    computes on the spec's output."""
    path = pipes["std_mlp"][0]
    m = Model.from_onnx(path)
    sc = m.input_scaler
    n = sc.n
    z = np.arange(n)
    X, _ = _prices(50, seed=12)
    inv = np.ones(n, np.float32)
    inv[1] = 0.0
    tiny = np.ones(n, np.float32)
    tiny[0] = 1e-38
    for fs in (FeatureSpec(n, z, [], 1, np.zeros(n, np.float32), inv),
               FeatureSpec(n, z, [], 1, np.zeros(n, np.float32), tiny)):
        m2 = m.with_feature_spec(fs)
        e = Engine(m2, config=engine_cfg(isa))
        feat = np.stack([e.features(x, 0) for x in X])
        np.testing.assert_array_equal(feat, sc.apply(fs.apply(X)))
        # (a constant feature of -2.3e5 makes outputs ~8.7e4 with a spread of 2: relative to
        # their size, the layers' summation order is all that differs)
        np.testing.assert_allclose(m2.outputs(X), ort_run(path, fs.apply(X), "last_float"), rtol=1e-6)
    with pytest.raises(ModelError, match="the feature spec makes 3 features but the first "
                                         "layer takes 6"):
        m.with_feature_spec(FeatureSpec.identity(3))


def test_cache_policy_follows_the_features(pipes):
    path, _ = pipes["std_mlp"]
    m = Model.from_onnx(path)
    assert not m.cache_policy.enabled            # an import runs with the cache off
    fitted = m.with_cache_policy(CachePolicy(enabled=True, fitted_max_error=0.01))
    # the same features (the identity spec composes to the spec it has): the fit holds
    same = fitted.with_feature_spec(FeatureSpec.identity(6))
    assert same.cache_policy == fitted.cache_policy
    other = fitted.with_feature_spec(FeatureSpec(6, np.arange(6), [], 1,
                                                 np.ones(6, np.float32), np.ones(6, np.float32)))
    assert not other.cache_policy.enabled and other.cache_policy.fitted_max_error is None


def test_reduced_weights_keep_small_inputs(pipes):
    """bf16 / int8 hidden layers on a price-like pipeline: folded, the first layer's weights
    carried the scale (1 / 1e-2) and its bias the offset (~6.5e4 * W / 0.29), and the
    reduced weights lost the inputs: the signal moved by 2.0, half the signs flipped. Now
    the layer keeps the file's weights and reads centred features."""
    path, _ = pipes["std_mlp"]
    m = Model.from_onnx(path)
    X, _ = _prices(300, seed=10)
    for w, bound in (("bf16", 0.05), ("int8", 0.1)):
        e = weights_error(m, X, w)
        assert e["max_abs"] <= bound, e
        assert e["sign_flips"] <= 0.02 * e["n"], e


def test_flatten_axis_0_of_a_rank_1_input(tmp_path, isa):
    # onnxruntime: Flatten(axis 0 or -1) of (n,) is (1, n), one row; it was refused
    rng = np.random.default_rng(11)
    W = rng.standard_normal((2, 4)).astype(np.float32)
    b = rng.standard_normal(2).astype(np.float32)
    X = rng.standard_normal((5, 4)).astype(np.float32)
    for ax in (0, -1):
        nodes = [helper.make_node("Flatten", ["x"], ["f"], axis=ax),
                 helper.make_node("Gemm", ["f", "W", "b"], ["y"], transB=1)]
        g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                         [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(W, "W"), numpy_helper.from_array(b, "b")])
        mo = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        mo.ir_version = 8
        p = str(tmp_path / f"f{ax}.onnx")
        onnx.save(mo, p)
        ref = np.stack([ort_first(p, x).reshape(-1) for x in X])
        assert ort_first(p, X[0]).shape == (1, 2)
        m = Model.from_onnx(p)
        e = Engine(m, config=engine_cfg(isa))
        np.testing.assert_allclose(np.stack([e.predict(x) for x in X]), ref, rtol=1e-5,
                                   atol=1e-6)
    # axis 1 of a rank-1 input makes each feature a row: still refused
    nodes = [helper.make_node("Flatten", ["x"], ["f"], axis=1),
             helper.make_node("Gemm", ["f", "W", "b"], ["y"], transB=1)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(W, "W"), numpy_helper.from_array(b, "b")])
    mo = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    mo.ir_version = 8
    p = str(tmp_path / "f1.onnx")
    onnx.save(mo, p)
    with pytest.raises(ModelError, match="each feature a row"):
        Model.from_onnx(p)


def test_a_model_built_with_a_scaler_and_no_spec_runs_the_scaler(pipes):
    # the identity alone would have dropped the scaler: the engine runs feature_spec
    m = Model.from_onnx(pipes["std_mlp"][0])
    built = Model(m.layers, None, m.cache_policy, m.meta, m.post, m.head_spec,
                  input_scaler=m.input_scaler)
    assert built == m
    with pytest.raises(ModelError, match="input_scaler must be"):
        Model(m.layers, input_scaler=(m.input_scaler.offset, m.input_scaler.scale))
    from fastpath.model.types import InputScaler
    with pytest.raises(ModelError, match="input scaler takes 3 inputs"):
        Model(m.layers, m.feature_spec, input_scaler=InputScaler(np.zeros(3), np.ones(3)))


def test_layers_from_onnx_refuses_a_graph_with_a_scaler(pipes):
    # it returned the layers with the scaler folded in; the layers alone now lack it
    from fastpath.model.onnx_import import layers_from_onnx
    with pytest.raises(ModelError, match="through a scaler"):
        layers_from_onnx(pipes["std_mlp"][0])


@pytest.mark.parametrize("ops", [("Add", "Add"), ("Mul", "Add"), ("Add", "Mul"), ("Mul", "Mul"),
                                 ("Sub", "Div")])
def test_leading_constants_that_do_not_broadcast_are_a_model_error(tmp_path, ops):
    # found by the fuzzer (CI, stop 22): Add (6,) then Add (2,) before the first layer raised
    # numpy's broadcast ValueError out of Model.from_onnx instead of a ModelError
    W = np.ones((2, 6), np.float32)
    b = np.zeros(2, np.float32)
    nodes = [helper.make_node(ops[0], ["x", "c"], ["s"]),
             helper.make_node(ops[1], ["s", "d"], ["z"])]
    inits = {"c": np.full(6, 2.0, np.float32), "d": np.array([1.0, 0.75], np.float32)}
    p = _hand(tmp_path / "m.onnx", nodes, inits, W, b)
    with pytest.raises(ModelError):
        Model.from_onnx(p)
    # the same graph with matching widths loads
    inits["d"] = np.full(6, 0.75, np.float32)
    Model.from_onnx(_hand(tmp_path / "ok.onnx", nodes, inits, W, b))
