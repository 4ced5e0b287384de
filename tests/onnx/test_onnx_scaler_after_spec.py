"""Model.feature_spec (raw tick -> the model's input) and Model.input_scaler stay apart: the
feature stage runs the spec, then the scaler's float32 ops, as onnxruntime runs the graph on
fs.apply(raws). Scaler pipelines (skl2onnx StandardScaler + MLPRegressor /
GradientBoostingRegressor, trained behind a spec that selects six fields of a 10-field tick,
or one that z-scores them as calibrate does) are stepped as raw ticks after every way of
setting the spec and compared with onnxruntime.

- A bundle's scaler layout is "input_scaler": "after_feature_spec"; true (the scaler composed
  into the spec arrays) is refused.
- A spec that centres price-like fields followed by a scaler with an offset stays two steps:
  composed into one float32 spec, the mean m1 + m2 / s1 ~ 6.5e4 rounds to 0.004."""
import json
import os
import struct
import zlib
from dataclasses import replace

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

import fastpath  # noqa: E402
from fastpath import Engine  # noqa: E402
from fastpath.model import FeatureSpec, Head, Layer, Model  # noqa: E402
from fastpath.model.types import InputScaler  # noqa: E402
from fastpath.tuning import calibrate  # noqa: E402
from helpers.builders import engine_cfg  # noqa: E402
from helpers.models import _prices  # noqa: E402
from helpers.oracle import ort_run  # noqa: E402

WHERE = np.array([7, 2, 9, 0, 4, 5])      # the graph's six inputs in a 10-field tick
SELECT = FeatureSpec(10, WHERE, np.zeros(0, np.int32), 1, np.zeros(6, np.float32),
                     np.ones(6, np.float32))
TOL = 1e-5      # of onnxruntime's output spread


def _ticks(n, seed):
    """10-field ticks: the six fields of helpers.models._prices' price-like rows (two at
    6.5e4 +- 0.5, four at 1e-2 scale) at WHERE, noise elsewhere; and their regression
    target."""
    X, y = _prices(n, seed)
    raws = np.random.default_rng(seed + 100).standard_normal((n, 10)).astype(np.float32)
    raws[:, WHERE] = X
    return raws, y


FIT_RAWS, _Y = _ticks(400, 0)
RAWS, _ = _ticks(300, 1)


def _spec(spec):
    """The spec each pipeline was trained behind: the six fields as they are, or z-scored by
    a spec fitted on FIT_RAWS (FeatureSpec.fit, what calibrate fits)."""
    return SELECT if spec == "select" else FeatureSpec.fit(FIT_RAWS, WHERE)


@pytest.fixture(scope="module")
def pipes(tmp_path_factory):
    """{(kind, spec): the ONNX file of a scaler pipeline trained behind that spec}."""
    import warnings
    pytest.importorskip("sklearn")
    skl2onnx = pytest.importorskip("skl2onnx")
    from sklearn.ensemble import GradientBoostingRegressor
    from sklearn.neural_network import MLPRegressor
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    d = tmp_path_factory.mktemp("scaler_pipes")
    makers = {"mlp": lambda: MLPRegressor(hidden_layer_sizes=(16,), max_iter=400,
                                          random_state=0),
              "gbr": lambda: GradientBoostingRegressor(n_estimators=20, max_depth=3,
                                                       random_state=0)}
    out = {}
    for kind, make in makers.items():
        for spec in ("select", "zscored"):
            X = _spec(spec).apply(FIT_RAWS)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                pipe = make_pipeline(StandardScaler(), make()).fit(X, _Y)
            onx = skl2onnx.to_onnx(pipe, X[:1], target_opset={"": 17, "ai.onnx.ml": 3})
            p = str(d / f"{kind}_{spec}.onnx")
            with open(p, "wb") as f:
                f.write(onx.SerializeToString())
            out[(kind, spec)] = p
    return out


def _stepped(m, ref, isa):
    """The model's output 0 for RAWS stepped one by one (a regression head 1e3 times wider
    than the outputs: atanh gives them back to float32's precision)."""
    scale = 1e3 * max(float(np.abs(ref).max()), 1e-3)
    e = Engine(m.with_head(Head("regression", scale, (0,))), config=engine_cfg(isa))
    return np.arctanh(np.array([e.step(r, 0).signal for r in RAWS], np.float64)) * scale


def _rel(a, ref):
    return float(np.abs(a - ref).max() / np.ptp(ref))


def _with_header_value(blob, old, new):
    """blob with one header value replaced by another of the same length (the arrays stay
    where they were; the CRC is made again)."""
    from fastpath.model import bundle
    hlen = int.from_bytes(blob[12:16], "little")
    head = blob[16:16 + hlen].replace(old, new)
    assert len(head) == hlen
    body = blob[:16] + head + blob[16 + hlen:-len(bundle.END) - 4]
    return body + struct.pack("<I", zlib.crc32(body)) + bundle.END


# ------------------------------------------------------------------ bundle layout

def test_the_bundle_names_its_scaler_layout(pipes):
    m = Model.from_onnx(pipes[("mlp", "select")]).with_feature_spec(SELECT)
    blob = m.to_bytes()
    hlen = int.from_bytes(blob[12:16], "little")
    header = json.loads(blob[16:16 + hlen])
    assert header["input_scaler"] == "after_feature_spec"
    back = Model.from_bytes(blob)
    assert back == m and back.feature_spec == SELECT


def test_an_unknown_or_unshipped_scaler_layout_is_refused(pipes):
    blob = Model.from_onnx(pipes[("mlp", "select")]).to_bytes()
    bad = _with_header_value(blob, b'"after_feature_spec"', b'"after_feature_spex"')
    with pytest.raises(fastpath.ModelError, match="input_scaler must be 'after_feature_spec'"):
        Model.from_bytes(bad)
    # true: the development build's layout, whose spec arrays hold the scaler too (read as
    # the user's spec, the scaler would run twice: a saturated signal on every tick)
    old = b'"input_scaler": "after_feature_spec"'
    dev = _with_header_value(blob, old, b'"input_scaler": true'.ljust(len(old)))
    with pytest.raises(fastpath.ModelError, match="never shipped.*import the model's ONNX"):
        Model.from_bytes(dev)


# ----------------------------------------- every way of setting the spec vs onnxruntime

def _ways(pipes, kind, spec):
    path = pipes[(kind, spec)]
    m = Model.from_onnx(path, head=Head("regression", 1.0, (0,)))
    fs = _spec(spec)
    ways = {"with_feature_spec": m.with_feature_spec(fs),
            "replace": replace(m, feature_spec=fs),
            "constructor": Model(m.layers, fs, m.cache_policy, m.meta, m.post, m.head_spec,
                                 trees=m.trees, input_scaler=m.input_scaler)}
    if spec == "zscored":
        # (a tree or a scaler model must say what its features are)
        ways["calibrate"] = calibrate(m, FIT_RAWS, WHERE, features="zscore")
    ways["bundle"] = Model.from_bytes(ways["with_feature_spec"].to_bytes())
    for name, w in ways.items():
        assert w.feature_spec == fs and w.input_scaler == m.input_scaler, name
    return path, fs, ways


@pytest.mark.parametrize("spec", ["select", "zscored"])
@pytest.mark.parametrize("kind", ["mlp", "gbr"])
def test_every_way_of_setting_the_spec_answers_as_onnxruntime(pipes, kind, spec, isa):
    """zscored: a spec that centres the price-like fields, then the pipeline's scaler with
    its offset; composed into one float32 spec it was 3e-4 of the spread off (MLP) and took
    the other branch of a threshold (trees: a jump of 2.2% of the spread, where TOL is
    1e-5)."""
    path, fs, ways = _ways(pipes, kind, spec)
    ref = ort_run(path, fs.apply(RAWS), 0).reshape(-1).astype(np.float64)
    for name, w in ways.items():
        got = _stepped(w, ref, isa)
        assert _rel(got, ref) <= TOL, (name, _rel(got, ref))
        # the numpy reference of raw ticks, and forward() of the graph's input
        assert _rel(w.outputs(RAWS)[:, 0].astype(np.float64), ref) <= TOL, name
        assert _rel(w.forward(fs.apply(RAWS))[:, 0].astype(np.float64), ref) <= TOL, name


def test_the_serving_worker_runs_the_spec_then_the_scaler(pipes):
    import uuid
    path, fs, ways = _ways(pipes, "mlp", "zscored")
    m = ways["replace"]
    ref = ort_run(path, fs.apply(RAWS), 0).reshape(-1).astype(np.float64)
    scale = 1e3 * float(np.abs(ref).max())
    m = m.with_head(Head("regression", scale, (0,)))
    cfg = {"engine": {"n_symbols": 1},
           "serve": {"place": False, "idle": "yield", "idle_spin_ns": 50_000}}
    name = f"test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    with fastpath.serve(name, m, cfg), fastpath.connect(name) as c:
        sig = np.array([c.step(r, 0).signal for r in RAWS[:100]], np.float64)
    assert _rel(np.arctanh(sig) * scale, ref[:100]) <= TOL


def _mlp(rng, n=3):
    return (Layer(rng.standard_normal((4, n)).astype(np.float32), np.zeros(4, np.float32),
                  "relu"),
            Layer(rng.standard_normal((2, 4)).astype(np.float32), np.zeros(2, np.float32),
                  "identity"))


def test_every_way_of_setting_the_spec_keeps_the_scaler(isa):
    rng = np.random.default_rng(0)
    sc = InputScaler(np.array([65000.0, 1.0, -2.0], np.float32),
                     np.array([3.0, 0.5, 10.0], np.float32))
    m = Model(_mlp(rng), input_scaler=sc)
    fs = FeatureSpec(5, np.array([4, 0, 2]), [], 1, np.array([1.0, 0.0, 0.5], np.float32),
                     np.array([1.0, 2.0, 1.0], np.float32))
    raws = rng.standard_normal((20, 5)).astype(np.float32) + \
        np.array([0, 0, 0, 0, 65000], np.float32)
    ref = sc.apply(fs.apply(raws))
    models = [m.with_feature_spec(fs), replace(m, feature_spec=fs),
              Model(m.layers, fs, input_scaler=sc)]
    for other in models:
        assert other.feature_spec == fs and other.input_scaler == sc
        e = Engine(other, config={"engine": {"n_symbols": 1, "simd": isa}})
        got = np.stack([e.features(r, 0) for r in raws])
        np.testing.assert_array_equal(got, ref)
        np.testing.assert_array_equal(other.features(raws), ref)
        # and outputs() of raw ticks is forward() of the spec's output (the model's input)
        np.testing.assert_allclose(other.outputs(raws), other.forward(fs.apply(raws)),
                                   rtol=1e-6, atol=1e-6)
    # without a scaler, the features are the spec's
    plain = replace(m, feature_spec=fs, input_scaler=None)
    np.testing.assert_array_equal(plain.features(raws), fs.apply(raws))


def test_the_scaler_runs_after_the_spec_in_the_window_features_too(isa):
    """Window features (rolling mean / std over W ticks) go through the scaler as the
    z-scores do; a scaler whose offset sits at the level of a centred price feature and a
    window field whose scale is large: the engine's features are the spec's then the
    scaler's float32 ops, tick by tick, for every kernel set."""
    rng = np.random.default_rng(2)
    n_feat = 2 + 2 * 2
    sc = InputScaler(np.array([0.5, -1.0, 65000.0, 0.01, 3.0, 0.0], np.float32),
                     np.array([2.0, 0.25, 1e3, 50.0, 1.0, 1e-3], np.float32))
    layers = (Layer(rng.standard_normal((4, n_feat)).astype(np.float32), np.zeros(4, np.float32),
                    "tanh"),
              Layer(rng.standard_normal((2, 4)).astype(np.float32), np.zeros(2, np.float32),
                    "identity"))
    fs = FeatureSpec(4, [0, 1], [2, 3], 8, np.array([65000.0, 0, 0, 0, 0, 0], np.float32),
                     np.array([1.0, 1.0, 1.0, 1.0, 1.0, 1.0], np.float32))
    m = Model(layers, fs, input_scaler=sc)
    raws = np.column_stack([65000 + rng.standard_normal(60), rng.standard_normal(60),
                            65000 + 0.01 * rng.standard_normal(60),
                            rng.standard_normal(60)]).astype(np.float32)
    syms = np.zeros(60, np.int64)
    cfg = {"engine": {"n_symbols": 1, "simd": isa}}
    e, e0 = Engine(m, config=cfg), Engine(replace(m, input_scaler=None), config=cfg)
    got, spec_only = [], []
    for r in raws:
        got.append(e.features(r, 0))
        spec_only.append(e0.features(r, 0))
        e.step(r, 0)
        e0.step(r, 0)
    # bit for bit: the scaler's float32 ops on the engine's own spec features
    np.testing.assert_array_equal(np.stack(got), sc.apply(np.stack(spec_only)))
    # and the numpy reference (its window std is the C one's to an ulp)
    np.testing.assert_allclose(np.stack(got), m.features(raws, syms), rtol=1e-6, atol=1e-9)
