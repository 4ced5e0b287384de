"""Review of the lead's change that keeps Model.feature_spec (raw tick -> the model's input)
and Model.input_scaler apart, with Model.layer_spec (the two as one spec) what the engine
runs. Scaler pipelines (skl2onnx StandardScaler + MLPRegressor / GradientBoostingRegressor)
are stepped as raw ticks after every way of setting the spec and compared with onnxruntime on
fs.apply(raws), the graph's input for a model whose feature_spec is fs.

- Stop 22 wrote a scaler model's bundle with the scaler composed into its feature spec
  arrays ("input_scaler": true). Today's reader took those arrays as the user's spec and
  composed the scaler again: the scaler ran twice and the signal saturated (-1 / +1 on every
  tick of tests/data/stop22_scaler_*.fpm, written by 85d304d's writer; see
  tests/data/make_stop22_scaler_bundles.py). Today's writer kept "input_scaler": true for the
  other layout, so stop 22's reader read a new bundle without its scaler (outputs 4e3 off
  on a spread of 5). The new layout is "input_scaler": "after_feature_spec", and a stop-22
  bundle is read by taking the scaler back out of its spec.
- xfail (strict): a spec that centres price-like fields followed by a scaler with an offset
  (a pipeline trained on calibrated features, calibrate's own case) cannot be one float32
  spec: the composed mean m1 + m2 / s1 ~ 6.5e4 rounds to 0.004 and the features move by
  that times the scales. The MLP's outputs are 3e-4 of their spread off onnxruntime on every
  tick, and the tree ensemble takes the other branch on a tick near a threshold. Needs a
  second affine step in the C feature stage (not changed here)."""
import json
import os
from dataclasses import replace

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")

import fastpath  # noqa: E402
from fastpath import Engine  # noqa: E402
from fastpath.model import FeatureSpec, Head, Model  # noqa: E402
from fastpath.tuning import calibrate  # noqa: E402
from conftest import engine_cfg  # noqa: E402

DATA = os.path.join(os.path.dirname(__file__), "data")
NPZ = np.load(os.path.join(DATA, "stop22_scaler.npz"))
RAWS, FIT_RAWS, WHERE = NPZ["raws"], NPZ["fit_raws"], NPZ["where"]
SELECT = FeatureSpec(10, WHERE, np.zeros(0, np.int32), 1, np.zeros(6, np.float32),
                     np.ones(6, np.float32))
TOL = 1e-5      # of onnxruntime's output spread


def _path(kind, spec, ext):
    return os.path.join(DATA, f"stop22_scaler_{kind}_{spec}.{ext}")


def _spec(spec):
    """The spec each pipeline was trained behind: the six fields as they are, or z-scored by
    a spec fitted on FIT_RAWS (FeatureSpec.fit, what calibrate fits)."""
    return SELECT if spec == "select" else FeatureSpec.fit(FIT_RAWS, WHERE)


def _ort(kind, spec, fs):
    s = ort.InferenceSession(_path(kind, spec, "onnx"), providers=["CPUExecutionProvider"])
    return s.run(None, {s.get_inputs()[0].name: fs.apply(RAWS)})[0].reshape(-1).astype(np.float64)


def _stepped(m, ref, isa):
    """The model's output 0 for RAWS stepped one by one (a regression head 1e3 times wider
    than the outputs: atanh gives them back to float32's precision)."""
    scale = 1e3 * max(float(np.abs(ref).max()), 1e-3)
    e = Engine(m.with_head(Head("regression", scale, (0,))), config=engine_cfg(isa))
    return np.arctanh(np.array([e.step(r, 0).signal for r in RAWS], np.float64)) * scale


def _rel(a, ref):
    return float(np.abs(a - ref).max() / np.ptp(ref))


# ------------------------------------------------------------------ stop-22 bundles

@pytest.mark.parametrize("kind", ["mlp", "gbr"])
@pytest.mark.parametrize("spec", ["select", "zscored"])
def test_a_stop22_scaler_bundle_answers_as_it_did(kind, spec, isa):
    """Read as today's layout, the scaler ran twice: every signal -1 or +1."""
    m = Model.load(_path(kind, spec, "fpm"))
    fs = _spec(spec)
    sc = m.input_scaler
    assert sc is not None
    # the user's spec comes back bit for bit, and the engine runs what stop 22 stored
    assert m.feature_spec == fs
    assert m.layer_spec == sc.compose(fs)
    # the same model as today's import with the same spec, so it writes today's layout
    fresh = Model.from_onnx(_path(kind, spec, "onnx"), head=m.head_spec)
    want = fresh.with_feature_spec(fs) if spec == "select" else calibrate(fresh, FIT_RAWS, WHERE)
    assert m == want
    back = Model.from_bytes(m.to_bytes())
    assert back == m and back.layer_spec == m.layer_spec
    # its answers against the engine on today's import (and onnxruntime where one float32
    # spec can run the pair: the select spec; see the xfail below for the other)
    ref = _ort(kind, spec, fs)
    got = _stepped(m, ref, isa)
    np.testing.assert_array_equal(got, _stepped(want, ref, isa))
    if spec == "select":
        assert _rel(got, ref) <= TOL, _rel(got, ref)


def test_the_new_layout_is_not_stop22s():
    """Today's writer wrote "input_scaler": true over the user's spec: stop 22's reader (which
    accepts true and nothing else) read it as the composed spec, without the scaler."""
    m = Model.from_onnx(_path("mlp", "select", "onnx")).with_feature_spec(SELECT)
    blob = m.to_bytes()
    hlen = int.from_bytes(blob[12:16], "little")
    header = json.loads(blob[16:16 + hlen])
    assert header["input_scaler"] == "after_feature_spec"
    back = Model.from_bytes(blob)
    assert back == m and back.feature_spec == SELECT


def test_an_unknown_scaler_layout_is_refused(tmp_path):
    from fastpath.model import bundle
    m = Model.from_onnx(_path("mlp", "select", "onnx"))
    blob = m.to_bytes()
    hlen = int.from_bytes(blob[12:16], "little")
    bad = blob[16:16 + hlen].replace(b'"after_feature_spec"', b'"after_feature_spex"')
    body = blob[:12] + len(bad).to_bytes(4, "little") + bad
    # same header length, so the arrays stay where they were; the CRC is made again
    assert len(bad) == hlen
    import struct
    import zlib
    body = body + blob[16 + hlen:-len(bundle.END) - 4]
    blob2 = body + struct.pack("<I", zlib.crc32(body)) + bundle.END
    with pytest.raises(fastpath.ModelError, match="input_scaler must be 'after_feature_spec'"):
        Model.from_bytes(blob2)


# ----------------------------------------- every way of setting the spec vs onnxruntime

def _ways(kind, spec):
    path = _path(kind, spec, "onnx")
    m = Model.from_onnx(path, head=Head("regression", 1.0, (0,)))
    fs = _spec(spec)
    ways = {"with_feature_spec": m.with_feature_spec(fs),
            "replace": replace(m, feature_spec=fs),
            "constructor": Model(m.layers, fs, m.cache_policy, m.meta, m.post, m.head_spec,
                                 trees=m.trees, input_scaler=m.input_scaler)}
    if spec == "zscored":
        ways["calibrate"] = calibrate(m, FIT_RAWS, WHERE)
    ways["bundle"] = Model.from_bytes(ways["with_feature_spec"].to_bytes())
    for name, w in ways.items():
        assert w.feature_spec == fs and w.input_scaler == m.input_scaler, name
    return fs, ways


@pytest.mark.parametrize("kind", ["mlp", "gbr"])
def test_every_way_of_setting_the_spec_answers_as_onnxruntime(kind, isa):
    fs, ways = _ways(kind, "select")
    ref = _ort(kind, "select", fs)
    for name, w in ways.items():
        got = _stepped(w, ref, isa)
        assert _rel(got, ref) <= TOL, (name, _rel(got, ref))
        # the numpy reference of raw ticks, and forward() of the graph's input
        assert _rel(w.outputs(RAWS)[:, 0].astype(np.float64), ref) <= TOL, name
        assert _rel(w.forward(fs.apply(RAWS))[:, 0].astype(np.float64), ref) <= TOL, name


@pytest.mark.xfail(strict=True, reason="one float32 spec cannot run a centring spec then a "
                   "scaler with an offset on price-like fields: the composed mean rounds to "
                   "0.004 (needs a second affine step in the C feature stage)")
@pytest.mark.parametrize("kind", ["mlp", "gbr"])
def test_a_calibrated_spec_then_the_scaler_answers_as_onnxruntime(kind):
    fs, ways = _ways(kind, "zscored")
    ref = _ort(kind, "zscored", fs)
    for name, w in ways.items():
        got = _stepped(w, ref, "scalar")
        assert _rel(got, ref) <= TOL, (name, _rel(got, ref))


def test_the_serving_worker_runs_the_spec_then_the_scaler():
    import uuid
    fs, ways = _ways("mlp", "select")
    m = ways["replace"]
    ref = _ort("mlp", "select", fs)
    scale = 1e3 * float(np.abs(ref).max())
    m = m.with_head(Head("regression", scale, (0,)))
    cfg = {"engine": {"n_symbols": 1},
           "serve": {"place": False, "idle": "yield", "idle_spin_ns": 50_000}}
    name = f"test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    with fastpath.serve(name, m, cfg), fastpath.connect(name) as c:
        sig = np.array([c.step(r, 0).signal for r in RAWS[:100]], np.float64)
    assert _rel(np.arctanh(sig) * scale, ref[:100]) <= TOL


def _stop22_bytes(m, monkeypatch):
    """m's bundle as stop 22's writer wrote it: the spec arrays hold layer_spec (the scaler
    composed in), the header "input_scaler": true."""
    from types import SimpleNamespace

    from fastpath.model import bundle
    like = SimpleNamespace(**{f: getattr(m, f) for f in Model._FIELDS}, meta=m.meta)
    like.feature_spec = m.layer_spec
    with monkeypatch.context() as mp:
        mp.setattr(bundle, "SCALER_AFTER_SPEC", True)
        return bundle.to_bytes(like)


def test_stop22_writer_stand_in_makes_the_fixtures_bytes(monkeypatch):
    m = Model.from_onnx(_path("mlp", "select", "onnx"), head=Head("regression", 1.0, (0,)))
    with open(_path("mlp", "select", "fpm"), "rb") as f:
        assert _stop22_bytes(m.with_feature_spec(SELECT), monkeypatch) == f.read()


def test_a_stop22_bundle_with_constant_features_is_read_as_it_ran(monkeypatch):
    """inv_std 0 in the spec (a constant feature; the scaler's offset 0 there) and a scale of
    0 in the scaler: the spec taken back out composes to the stored bits."""
    from fastpath.model.types import InputScaler
    rng = np.random.default_rng(3)
    layers = Model.from_onnx(_path("mlp", "select", "onnx")).layers
    sc = InputScaler(np.array([65000.0, 0.0, 3.5, -1.0, 0.25, 7.0], np.float32),
                     np.array([3.0, 2.0, 0.0, 1e-3, 5.0, 0.5], np.float32))
    fs = FeatureSpec(10, WHERE, np.zeros(0, np.int32), 1,
                     np.array([64999.0, 4.0, 1.0, 0.0, -2.0, 0.125], np.float32),
                     np.array([1.5, 0.0, 2.0, 1.0, 0.1, 3.0], np.float32))
    m = Model(layers, fs, input_scaler=sc)
    back = Model.from_bytes(_stop22_bytes(m, monkeypatch))
    assert back.layer_spec == m.layer_spec and back.input_scaler == sc
    raws = RAWS + rng.standard_normal(RAWS.shape).astype(np.float32)
    e1 = Engine(m, config={"engine": {"n_symbols": 1}})
    e2 = Engine(back, config={"engine": {"n_symbols": 1}})
    np.testing.assert_array_equal([e1.step(r, 0).signal for r in raws],
                                  [e2.step(r, 0).signal for r in raws])
