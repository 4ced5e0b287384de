"""A model read back from its bundle (Model.save / load, to_bytes / from_bytes), from its ONNX
export (to_onnx / from_onnx) or rebuilt by with_head / with_weights / with_feature_spec /
calibrate serves what the original serves: an Engine built from each gives bit-identical
step() answers (signal, confidence, cached, miss reason) and predict() outputs on the same
tick stream, and what the bundle claims to record survives. Models of every kind are drawn
by Hypothesis: MLPs (every activation, post transform, head, input scaler or none, fp32 /
bf16 / int8), tree ensembles (SUM / AVERAGE / MIN / MAX, post transforms, base values),
fitted or set cache policies, feature specs with windows."""
import json
import struct
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from fastpath import Engine, InputError, Model, ModelError, TreeEnsemble
from fastpath.model import CachePolicy, FeatureSpec, Head, Layer
from fastpath.model.types import InputScaler

F = np.float32
CFG = {"engine": {"n_symbols": 3}, "memory": {"huge_pages": "none", "mlock": False}}
import os
N = int(os.environ.get("RT_N", "1"))
SET = settings(max_examples=40 * N, deadline=None,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

try:
    import onnx  # noqa: F401
    HAVE_ONNX = True
except ImportError:
    HAVE_ONNX = False


# ------------------------------------------------------------------ strategies

@st.composite
def feature_specs(draw, n_feat_max=6):
    raw_len = draw(st.integers(1, 6))
    n_w = draw(st.integers(0, min(2, raw_len)))
    n_z_min = 1 if n_w == 0 else 0
    n_z = draw(st.integers(n_z_min, max(n_z_min, min(raw_len, n_feat_max - 2 * n_w))))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    z = rng.choice(raw_len, n_z, replace=False)
    w = rng.choice(raw_len, n_w, replace=False)
    window = draw(st.integers(1, 5))
    nf = n_z + 2 * n_w
    names = tuple(draw(st.lists(st.text(max_size=4), min_size=0, max_size=raw_len)))
    return FeatureSpec(raw_len, z, w, window, rng.standard_normal(nf).astype(F) * 0.3,
                       (0.5 + rng.random(nf)).astype(F), names)


@st.composite
def policies(draw):
    fitted = draw(st.sampled_from([None, 0.01, 0.5, 2.0]))
    return CachePolicy(enabled=draw(st.booleans()),
                       cos_threshold=draw(st.sampled_from([0.5, 0.9, 0.999])),
                       norm_tol=draw(st.sampled_from([0.02, 0.5, 3.0])),
                       max_age_ns=draw(st.sampled_from([0, 1_000, 10**9])),
                       max_run=draw(st.sampled_from([0, 1, 3, 16])),
                       fitted_max_error=fitted)


def _head_for(draw, n_out, post, last_act):
    probs = post != "none" or last_act == "sigmoid"
    kinds = ["regression"]
    if n_out >= 2:
        kinds.append("tanh_sigmoid")
        if probs:
            kinds.append("classifier2")
    if n_out >= 3 and probs:
        kinds.append("classifier3")
    kind = draw(st.sampled_from(kinds))
    k = {"regression": 1, "tanh_sigmoid": 2, "classifier2": 2, "classifier3": 3}[kind]
    outs = draw(st.permutations(range(n_out)))[:k]
    scale = draw(st.sampled_from([1.0, 0.25, 3.0, 1e-3]))
    return Head(kind, scale, tuple(outs))


@st.composite
def mlps(draw):
    fs = draw(feature_specs())
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    post = draw(st.sampled_from(["none", "softmax", "logistic2"]))
    n_layers = draw(st.integers(1, 3))
    dims = [fs.n_feat] + [draw(st.integers(1, 5)) for _ in range(n_layers - 1)]
    last = 1 if post == "logistic2" else draw(st.integers(2 if post == "softmax" else 1, 4))
    dims.append(last)
    acts = [draw(st.sampled_from(["identity", "relu", "tanh", "sigmoid"]))
            for _ in range(n_layers)]
    layers = tuple(Layer(rng.standard_normal((dims[i + 1], dims[i])).astype(F),
                         rng.standard_normal(dims[i + 1]).astype(F) * 0.1, acts[i])
                   for i in range(n_layers))
    n_out = 2 if post == "logistic2" else last
    head = None if draw(st.booleans()) else _head_for(draw, n_out, post, acts[-1])
    try:
        Model(layers, fs, post=post, head_spec=head)
    except ModelError:
        head = _head_for(draw, n_out, post, acts[-1])
    sc = None
    if draw(st.booleans()):
        sc = InputScaler(rng.standard_normal(fs.n_feat).astype(F),
                         (0.5 + rng.random(fs.n_feat)).astype(F))
    weights = draw(st.sampled_from(["fp32", "bf16", "int8"]))
    meta = {"note": draw(st.text(max_size=5)), "n": [1, 2.5, None]}
    return Model(layers, fs, draw(policies()), meta, post, head, weights=weights,
                 input_scaler=sc)


def _forest(rng, n_features, n_targets, n_trees, classifier):
    off, mode, feat, thr, tc, fc, nt, wn, wt, wv = [0], [], [], [], [], [], [], [], [], []
    for t in range(n_trees):
        d = int(rng.integers(0, 3))
        inner, leaves = 2 ** d - 1, 2 ** d
        for i in range(inner + leaves):
            leaf = i >= inner
            mode.append(6 if leaf else int(rng.integers(6)))
            feat.append(0 if leaf else int(rng.integers(n_features)))
            # EQ / NEQ need float32 thresholds; others may be float64 (rounded by the ensemble)
            thr.append(0.0 if leaf else float(F(rng.standard_normal())) if mode[-1] >= 4
                       else float(rng.standard_normal()))
            tc.append(-1 if leaf else 2 * i + 1)
            fc.append(-1 if leaf else 2 * i + 2)
            nt.append(0 if leaf else int(rng.integers(2)))
            if leaf:
                for k in range(n_targets):
                    wn.append(off[-1] + i)
                    wt.append((t + k) % n_targets)
                    v = rng.random() if classifier else rng.standard_normal() * 3
                    wv.append(float(v))
        off.append(off[-1] + inner + leaves)
    return off, mode, feat, thr, tc, fc, nt, wn, wt, wv


@st.composite
def tree_models(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    classifier = draw(st.booleans())
    n_targets = draw(st.integers(2, 3)) if classifier else draw(st.integers(1, 3))
    fs = draw(feature_specs())
    n_features = fs.n_feat
    agg = "SUM" if classifier else draw(st.sampled_from(["SUM", "AVERAGE", "MIN", "MAX"]))
    post = draw(st.sampled_from(["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT"]))
    if n_targets == 1 and post in ("SOFTMAX", "SOFTMAX_ZERO"):
        post = "NONE"
    nb = draw(st.sampled_from([0, n_targets] + ([1] if classifier and n_targets == 2 else [])))
    base = (rng.standard_normal(nb) * 0.2).tolist()
    arrs = _forest(rng, n_features, n_targets, draw(st.integers(1, 5)), classifier)
    te = TreeEnsemble(n_features, n_targets, *arrs, base_values=base, aggregate=agg,
                      post_transform=post, classifier=classifier)
    n_out = te.n_outputs
    try:
        head = None
        Model((), fs, trees=te)
    except ModelError:
        outs = draw(st.permutations(range(n_out)))
        head = Head("regression", draw(st.sampled_from([1.0, 0.5])), (outs[0],))
    sc = None
    if draw(st.booleans()):
        sc = InputScaler(rng.standard_normal(n_features).astype(F),
                         (0.5 + rng.random(n_features)).astype(F))
    return Model((), fs, draw(policies()), {"kind": "trees"}, head_spec=head, trees=te,
                 input_scaler=sc)


def _ticks(draw, raw_len, n=24):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    base = rng.standard_normal(raw_len)
    walk = np.cumsum(rng.standard_normal((n, raw_len)) * 0.01, axis=0) + base
    # repeats so that the cache hits
    walk[5:9] = walk[5]
    return walk.astype(F), rng.integers(0, 3, n).astype(np.int64), \
        np.cumsum(rng.integers(0, 2000, n)).astype(np.int64)


def _answers(model, raws, syms, ts):
    eng = Engine(model, config=CFG)
    out = []
    for r, s, t in zip(raws, syms, ts):
        try:
            res = eng.step(r, int(s), int(t))
        except InputError as exc:       # a refused tick (NaN outputs) is an answer too
            out.append(str(exc))
            continue
        out.append((F(res.signal).tobytes(), F(res.confidence).tobytes(), bool(res.cached),
                    res.miss_reason))
    pred = []
    with np.errstate(all="ignore"):
        x = model.features(raws, syms)
    for row in x:
        try:
            pred.append(eng.predict(row).tobytes())
        except InputError as exc:
            pred.append(str(exc))
    return out, pred


def _same_serving(a, b, raws, syms, ts):
    sa, pa = _answers(a, raws, syms, ts)
    sb, pb = _answers(b, raws, syms, ts)
    assert sa == sb
    assert pa == pb


def _same_record(a, b):
    assert a == b
    assert a.weights == b.weights and a.cache_policy == b.cache_policy
    assert a.head_spec == b.head_spec and a.feature_spec == b.feature_spec
    assert json.dumps(a.meta, sort_keys=True) == json.dumps(b.meta, sort_keys=True)


models = st.one_of(mlps(), tree_models())


# ------------------------------------------------------------------ bundle round trips

@SET
@given(m=models, data=st.data())
def test_bundle_round_trip_serves_bit_identically(m, data):
    raws, syms, ts = _ticks(data.draw, m.raw_len)
    b = Model.from_bytes(m.to_bytes())
    _same_record(m, b)
    _same_serving(m, b, raws, syms, ts)
    # written again, the bundle is the same bytes: nothing drifts over many round trips
    assert b.to_bytes() == m.to_bytes()


@settings(max_examples=15 * N, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(m=models, data=st.data())
def test_save_load_round_trip_serves_bit_identically(m, data, tmp_path):
    raws, syms, ts = _ticks(data.draw, m.raw_len)
    p = tmp_path / "m.fpm"
    m.save(p)
    b = Model.load(p)
    _same_record(m, b)
    _same_serving(m, b, raws, syms, ts)


# ------------------------------------------------------------------ ONNX round trips

@pytest.mark.skipif(not HAVE_ONNX, reason="needs the onnx package")
@settings(max_examples=40 * N, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(m=mlps(), data=st.data(), opset=st.sampled_from([7, 9, 11, 13, 17]))
def test_onnx_round_trip_keeps_the_mlp_bit_for_bit(m, data, opset, tmp_path):
    """The graph holds the MLP (layers, post transform, input scaler), which comes back bit
    for bit at every opset; the file's fastpath record (Model.to_onnx's metadata_props) the
    spec, head, weights, policy and meta: the model read back is the model written and serves
    as it did."""
    raws, syms, ts = _ticks(data.draw, m.raw_len)
    p = tmp_path / "m.onnx"
    m.to_onnx(p, opset=opset)
    o = Model.from_onnx(p)
    assert o.post == m.post
    assert o.layers == m.layers
    assert o.input_scaler == m.input_scaler
    _same_record(m, o)
    _same_serving(m, o, raws, syms, ts)


# ------------------------------------------------------------------ with_* and calibrate

@SET
@given(m=models, data=st.data())
def test_with_the_same_spec_head_or_policy_changes_nothing(m, data):
    """with_feature_spec / with_head / with_cache_policy of what the model already has is the
    same model: the same record, the same answers (a fitted policy kept)."""
    raws, syms, ts = _ticks(data.draw, m.raw_len)
    for b in (m.with_feature_spec(m.feature_spec), m.with_head(m.head_spec),
              m.with_cache_policy(m.cache_policy), m.with_weights(m.weights)):
        _same_record(m, b)
    _same_serving(m, m.with_head(Head(m.head_spec.kind, m.head_spec.scale,
                                      m.head_spec.outputs)), raws, syms, ts)


@SET
@given(m=mlps(), w=st.sampled_from(["fp32", "bf16", "int8"]), data=st.data())
def test_with_weights_survives_the_bundle_and_a_one_layer_model_runs_the_same(m, w, data):
    raws, syms, ts = _ticks(data.draw, m.raw_len)
    b = m.with_weights(w)
    back = Model.from_bytes(b.to_bytes())
    assert back.weights == w
    _same_record(b, back)
    _same_serving(b, back, raws, syms, ts)
    if len(m.layers) == 1:
        # no hidden layer: the weights choice packs nothing reduced, the fit still holds
        assert b.cache_policy == m.cache_policy
        _same_serving(m, b, raws, syms, ts)


@SET
@given(m=models, h=st.data(), data=st.data())
def test_from_bytes_with_a_head_is_with_head(m, h, data):
    """Model.from_bytes(blob, head=h) is the bundle's model .with_head(h)."""
    n_out = m.n_outputs
    outs = h.draw(st.permutations(range(n_out)))
    head = Head("regression", h.draw(st.sampled_from([1.0, 0.5, 7.0])), (outs[0],))
    raws, syms, ts = _ticks(data.draw, m.raw_len)
    a = Model.from_bytes(m.to_bytes(), head=head)
    b = m.with_head(head)
    _same_record(a, b)
    _same_serving(a, b, raws, syms, ts)


@SET
@given(m=models, data=st.data(), features=st.sampled_from(["zscore", "raw"]))
def test_calibrated_model_round_trips_with_its_fit_records(m, data, features):
    raws, syms, ts = _ticks(data.draw, m.raw_len, n=40)
    R = m.raw_len
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    cal = rng.standard_normal((64, R)).astype(F)
    fs = m.feature_spec
    try:
        c = __import__("fastpath.tuning", fromlist=["calibrate"]).calibrate(
            m, cal, fs.z_idx.tolist(), fs.w_idx.tolist(), fs.window,
            field_names=fs.field_names[:R], features=features)
    except ModelError as exc:
        # a regression head whose model predicts 0 everywhere: refused, by name
        assert "predicts 0" in str(exc) or "NaN" in str(exc)
        return
    assert c.input_scaler == m.input_scaler
    assert not c.cache_policy.enabled and not c.cache_policy.fitted
    assert "cache_policy_fit" not in c.meta
    if c.head_spec.kind == "regression":
        assert c.meta["head_fit"]["ticks"] == 64
    back = Model.from_bytes(c.to_bytes())
    _same_record(c, back)
    assert back.meta.get("head_fit") == c.meta.get("head_fit")
    # calibrated again on the same ticks, the model read back is the model it was
    again = __import__("fastpath.tuning", fromlist=["calibrate"]).calibrate(
        back, cal, fs.z_idx.tolist(), fs.w_idx.tolist(), fs.window,
        field_names=fs.field_names[:R], features=features)
    _same_record(c, again)
    _same_serving(c, back, raws, syms, ts)


# ------------------------------------------------------------------ what saves, loads

def _nested(depth, leaf):
    x = leaf
    for i in range(depth):
        x = [x] if i % 2 else {"k": x}
    return x


def _on_a_deeper_stack(frames, fn):
    return fn() if frames == 0 else _on_a_deeper_stack(frames - 1, fn)


@pytest.mark.parametrize("frames", [0, 5, 50, 200])
@pytest.mark.parametrize("depth", [1, 50, 98, 99, 100, 150, 500, 960, 985, 1200])
def test_a_bundle_that_saves_loads_back_from_any_reasonable_stack(depth, frames):
    """A meta nested ~990 deep was written (to_bytes from a shallow stack), and the same bytes
    were then refused as "malformed bundle header (RecursionError)" by a Model.from_bytes
    five frames deeper (a server's handler, a test): a bundle that saved and never loaded
    back. Nesting is bounded where it is written (MAX_META_DEPTH), with a ModelError saying
    so, and whatever is written reads back."""
    base = Model((Layer(np.ones((2, 2), F), np.zeros(2, F)),))
    m = Model(base.layers, meta={"deep": _nested(depth, 1.5)})
    try:
        blob = m.to_bytes()
    except ModelError as exc:
        assert "nested more than" in str(exc)
        assert depth >= 90
        return
    back = _on_a_deeper_stack(frames, lambda: Model.from_bytes(blob))
    assert back == m


# ------------------------------------------------------------------ keys a reader does not know

def _rewrite(blob, edit):
    """blob with its JSON header edited by edit(header) and the CRC made good again: what a
    writer of another version could have written."""
    hlen = struct.unpack("<I", blob[12:16])[0]
    head = json.loads(blob[16:16 + hlen])
    edit(head)
    hb = json.dumps(head, sort_keys=True).encode()
    start = 16 + hlen + (-(16 + hlen)) % 64
    body = blob[:12] + struct.pack("<I", len(hb)) + hb
    body += b"\0" * ((-len(body)) % 64) + blob[start:-12]
    return body + struct.pack("<I", zlib.crc32(body)) + blob[-8:]


def _nested_objects(h):
    """(name, object) for every JSON object inside the header whose keys the reader reads."""
    out = [("feature_spec", h["feature_spec"]), ("cache_policy", h["cache_policy"]),
           ("head", h["head"])]
    out += [(f"layers[{i}]", l) for i, l in enumerate(h["layers"])]
    out += [(f"arrays[{i}]", a) for i, a in enumerate(h["arrays"])]
    if "trees" in h:
        out.append(("trees", h["trees"]))
    return out


@SET
@given(m=models, data=st.data())
def test_an_unknown_key_inside_a_header_object_is_refused_not_ignored(m, data):
    """The reader refuses a top-level header key it does not know ("a key this reader does not
    know may change what the model computes"), but a key inside one of the header's objects
    (a newer writer's "head": {..., "clip": 0.5}, "layers": [{"activation": ..., "gain": 2}],
    "feature_spec": {..., "ewm": true}, an array entry's "encoding") was dropped in silence
    and the model served without it. Each is now refused by name; the bundle as written still
    reads."""
    blob = m.to_bytes()
    assert Model.from_bytes(_rewrite(blob, lambda h: None)) == m
    names = [n for n, _ in _nested_objects(json.loads(blob[16:16 + struct.unpack(
        "<I", blob[12:16])[0]]))]
    which = data.draw(st.sampled_from(names))
    key = data.draw(st.sampled_from(["clip", "gain", "encoding", "ewm", "x"]))

    def edit(h):
        dict(_nested_objects(h))[which][key] = data.draw(st.sampled_from([0.5, True, "zstd"]))
    with pytest.raises(ModelError, match=f"unknown key.*{key}"):
        Model.from_bytes(_rewrite(blob, edit))


# ------------------------------------------------------------------ damage of any kind of bundle

@settings(max_examples=60 * N, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(m=models, data=st.data())
def test_every_cut_and_flip_of_any_model_kind_is_a_model_error(m, data, tmp_path):
    """tests/fuzz/fuzz.py damages one MLP bundle; a tree ensemble's, a scaler's and a fitted
    policy's bundles are damaged here: cut at any byte or any byte changed, through from_bytes
    and through Model.load / Engine(path), is a ModelError, never another exception or a
    model that differs."""
    blob = m.to_bytes()
    cut = data.draw(st.integers(0, len(blob) - 1))
    at = data.draw(st.integers(0, len(blob) - 1))
    flip = bytearray(blob)
    flip[at] ^= data.draw(st.integers(1, 255))
    p = tmp_path / "m.fpm"
    for bad in (blob[:cut], bytes(flip)):
        with pytest.raises(ModelError):
            Model.from_bytes(bad)
        p.write_bytes(bad)
        with pytest.raises(ModelError):
            Model.load(p)
        with pytest.raises(ModelError):
            Engine(str(p), config=CFG)


@pytest.mark.skipif(not HAVE_ONNX, reason="needs the onnx package")
@settings(max_examples=20 * N, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(off=st.lists(st.sampled_from([-0.0, 0.0, 1.5, -2.0]), min_size=1, max_size=4),
       sc=st.sampled_from([1.0, -0.0, 0.5]))
def test_onnx_round_trip_keeps_a_negative_zero_offset(off, sc, tmp_path):
    """An input scaler offset of -0.0 came back from to_onnx / from_onnx as +0.0 (the importer
    added the file's Sub constant to a 0.0): x - (-0.0) is +0.0 at x = -0.0, as onnxruntime's
    Sub computes it, x - 0.0 is -0.0, so the model read back was not the model written
    (model == fails) and its feature stage made another zero than the file's Sub and the
    original (Engine.features: -0.0 against +0.0)."""
    n = len(off)
    sc_ = InputScaler(np.array(off, F), np.full(n, sc, F))
    m = Model((Layer(np.ones((1, n), F), np.array([-0.0], F)),), input_scaler=sc_)
    p = tmp_path / "m.onnx"
    m.to_onnx(p)
    o = Model.from_onnx(p)
    x = np.full(n, -0.0, F)
    assert Engine(o, config=CFG).features(x).tobytes() == \
        Engine(m, config=CFG).features(x).tobytes()
    assert o.forward(x[None]).tobytes() == m.forward(x[None]).tobytes()
    assert o.input_scaler.offset.tobytes() == m.input_scaler.offset.tobytes()
    assert o == Model(m.layers, meta=o.meta, input_scaler=sc_)
