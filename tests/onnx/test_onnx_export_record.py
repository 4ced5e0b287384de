"""The record Model.to_onnx writes into metadata_props ("fastpath.model", with its sha256
in "fastpath.model.sha256"): the feature spec, head, weight format, cache policy and meta the
graph does not hold. Model.from_onnx gives the exported model back, serving bit-identical
signals with the same hits and misses.

A damaged record (or one whose digest does not match) is a ModelError naming the file and what
was wrong, never another model; a graph changed after it was written (its digest differs)
reads the cache as off, with a UserWarning; a file from another exporter, or a record without
a digest, is read as before."""
import hashlib
import json
import os
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from fastpath import Engine, Model, ModelError
from fastpath.lob.adapter import raw_from_book
from fastpath.lob.generator import generate_stream
from fastpath.model import CachePolicy, Head
from fastpath.tuning import calibrate
from helpers.models import F, _mlp

onnx = pytest.importorskip("onnx")

from helpers.oracle import ort_first  # noqa: E402

KEY = "fastpath.model"
CFG = {"engine": {"n_symbols": 4}, "memory": {"huge_pages": "none", "mlock": False}}
DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")


# ------------------------------------------------------------------ the model under test

@pytest.fixture(scope="module")
def stream():
    """8 varying fields of a generated order book stream (4 symbols): raw_len 8, and the spec
    below makes 8 features from them (4 z-scored, 2 windowed: mean and std), so a raw tick
    fits the identity spec too: the case that was served silently wrong."""
    bs = generate_stream(3000, 4, seed=30)
    raw = raw_from_book(bs)
    cols = [j for j in range(raw.shape[1]) if np.std(raw[:, j]) > 1e-6][:8]
    return (np.ascontiguousarray(raw[:, cols], dtype=F), bs.symbols.astype(np.int64),
            bs.ts_ns.astype(np.int64))


@pytest.fixture(scope="module", params=["fp32", "bf16", "int8"])
def model(request, stream):
    raws, syms, ts = stream
    m = calibrate(_mlp(), raws, z_idx=[0, 1, 2, 3], w_idx=[4, 5], window=6, symbols=syms,
                  field_names=[f"f{i}" for i in range(8)]).with_weights(request.param)
    m, rep = m.fit_cache_policy(raws, syms, max_error=0.05, ts_ns=ts)
    assert m.cache_policy.fitted and m.cache_policy.enabled, rep
    meta = dict(m.meta, desk="rates", n=np.int64(3), xs=np.arange(3, dtype=F), nested={"a": [1]})
    m = Model(m.layers, m.feature_spec, m.cache_policy, meta, m.post, m.head_spec,
              weights=m.weights)
    assert m.feature_spec.n_feat == m.raw_len == 8 and m.feature_spec.window == 6
    assert m.head_spec.scale != 1.0        # fitted by calibrate
    return m


def _answers(eng, raws, syms, ts):
    out = []
    for r, s, t in zip(raws, syms, ts):
        res = eng.step(r, int(s), int(t))
        out.append((F(res.signal).tobytes(), F(res.confidence).tobytes(), bool(res.cached),
                    res.miss_reason))
    return out


def _record(path) -> dict:
    props = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    return json.loads(props[KEY])


def _rewrite(src, dst, text=None, edit=None):
    """The ONNX file src with its record replaced by `text` (or edited by edit(record)),
    written to dst; text None and edit None: the record removed."""
    m = onnx.load(str(src))
    old = {p.key: p.value for p in m.metadata_props}
    del m.metadata_props[:]
    if edit is not None:
        rec = json.loads(old[KEY])
        edit(rec)
        text = json.dumps(rec)
    if text is not None:
        onnx.helper.set_model_props(m, {KEY: text})
    onnx.save(m, str(dst))
    return dst


# ------------------------------------------------------------------ round trip

def test_round_trip_is_the_same_model_and_serves_the_same_signals(model, stream, tmp_path):
    raws, syms, ts = stream
    p = tmp_path / "m.onnx"
    model.to_onnx(p)
    back = Model.from_onnx(p)
    assert back == model
    assert back.feature_spec == model.feature_spec and back.head_spec == model.head_spec
    assert back.weights == model.weights and back.cache_policy == model.cache_policy
    assert json.dumps(back.meta, sort_keys=True) == \
        json.dumps(json.loads(json.dumps(model.meta, default=lambda o: o.tolist())),
                   sort_keys=True)
    # float32 arrays bit for bit (== compares bytes too; said here for the reader)
    for k in ("mean", "inv_std"):
        assert getattr(back.feature_spec, k).tobytes() == getattr(model.feature_spec, k).tobytes()
    want = _answers(Engine(model, config=CFG), raws, syms, ts)
    assert sum(c for _, _, c, _ in want) > 100        # the fitted cache hits: compared too
    assert _answers(Engine(back, config=CFG), raws, syms, ts) == want
    # Engine(path) reads the file the same way (fastpath._build -> Model.from_onnx)
    assert _answers(Engine(str(p), config=CFG), raws, syms, ts) == want
    # written again from what was read, the record is the same: nothing drifts
    q = tmp_path / "again.onnx"
    back.to_onnx(q)
    assert _record(q) == _record(p)


def test_onnxruntime_loads_the_file_and_matches_forward(model, stream, tmp_path):
    pytest.importorskip("onnxruntime")
    raws, syms, _ = stream
    p = tmp_path / "m.onnx"
    model.to_onnx(p)
    rec = _record(p)
    assert rec["weights"] == model.weights and rec["feature_spec"]["window"] == 6
    x = model.features(raws[:200], syms[:200])
    out = ort_first(p, x)
    np.testing.assert_allclose(out, model.forward(x), rtol=1e-5, atol=1e-6)
    onnx.checker.check_model(str(p))


def test_explicit_head_wins_as_with_head(model, tmp_path):
    p = tmp_path / "m.onnx"
    model.to_onnx(p)
    h = Head("tanh_sigmoid", 1.0, (0, 1))
    got = Model.from_onnx(p, head=h)
    assert got == model.with_head(h)
    assert got.feature_spec == model.feature_spec and got.weights == model.weights
    assert not got.cache_policy.enabled and "cache_policy_fit" not in got.meta
    # the same head as stored keeps the fitted policy, as with_head does
    assert Model.from_onnx(p, head=model.head_spec) == model


def test_an_input_scaler_round_trips_with_the_record(tmp_path):
    from fastpath.model.types import InputScaler
    m = _mlp(1)
    rng = np.random.default_rng(2)
    sc = InputScaler(rng.standard_normal(8).astype(F), (0.5 + rng.random(8)).astype(F))
    spec = calibrate(m, rng.standard_normal((50, 9)), range(4), [4, 5], window=3,
                     features="raw").feature_spec
    m = Model(m.layers, spec, CachePolicy(True, 0.9, 0.5, 10**6, 3, 0.5), {"k": 1}, "none",
              m.head_spec, weights="int8", input_scaler=sc)
    m.to_onnx(tmp_path / "s.onnx")
    assert Model.from_onnx(tmp_path / "s.onnx") == m


# ------------------------------------------------------------------ the graph changed

def test_a_changed_graph_reads_the_cache_as_off_and_warns(model, tmp_path):
    p = tmp_path / "m.onnx"
    model.to_onnx(p)
    g = onnx.load(str(p))
    for t in g.graph.initializer:
        if t.name == "W0":
            w = onnx.numpy_helper.to_array(t).copy()
            w[0, 0] = np.nextafter(w[0, 0], F(np.inf))    # one ulp: "retrained"
            t.CopyFrom(onnx.numpy_helper.from_array(w, "W0"))
    onnx.save(g, str(tmp_path / "edited.onnx"))
    with pytest.warns(UserWarning, match=r"edited\.onnx.*digest differs.*cache is read as off"):
        got = Model.from_onnx(tmp_path / "edited.onnx")
    assert not got.cache_policy.enabled and not got.cache_policy.fitted
    assert "cache_policy_fit" not in got.meta and got.meta["desk"] == "rates"
    assert got.feature_spec == model.feature_spec and got.head_spec == model.head_spec
    assert got.weights == model.weights
    assert got.layers[0].weight[0, 0] != model.layers[0].weight[0, 0]
    # the file as written reads without a warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Model.from_onnx(p) == model


# ------------------------------------------------------------------ damage is refused

@pytest.fixture(scope="module")
def written(tmp_path_factory):
    m = calibrate(_mlp(), np.random.default_rng(3).standard_normal((60, 8)), [0, 1, 2, 3],
                  [4, 5], window=4)
    m = Model(m.layers, m.feature_spec, CachePolicy(True, 0.99, 0.1, 10**6, 4, 0.05),
              {"a": 1}, "none", m.head_spec, weights="bf16")
    p = tmp_path_factory.mktemp("om") / "m.onnx"
    m.to_onnx(p)
    return p, _record(p)


def _refused(src, dst, match, **kw):
    _rewrite(src, dst, **kw)
    with pytest.raises(ModelError) as ei:
        Model.from_onnx(dst)
    msg = str(ei.value)
    assert str(dst) in msg and "fastpath record" in msg, msg
    assert match in msg, msg
    return msg


def _paths(obj, path=()):
    """Every (path, value) in the record but meta's contents (meta holds any JSON)."""
    yield path, obj
    if path == ("meta",):
        return
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, path + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, path + (i,))


def _other_kind(v):
    """Values of another JSON kind than v's: what no field of the record takes for v's."""
    if isinstance(v, bool):
        return ["true", 1.5, None, [], {}]
    if isinstance(v, (int, float)):
        return ["1", True, None, [1], {"x": 1}]
    if isinstance(v, str):
        return [1, False, None, [v], {"x": v}]
    if isinstance(v, list):
        return ["[]", 3, None, {"x": 1}]
    if isinstance(v, dict):
        return ["{}", 2, None, [1]]
    return ["null?", 0, [], {}]      # a null (fitted_max_error None): not in this record


# the record's fields whose value may be null as well as what this record holds
NULLABLE = ("fitted_max_error",)


def _set(rec, path, value):
    obj = rec
    for k in path[:-1]:
        obj = obj[k]
    obj[path[-1]] = value


SLOW = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@SLOW
@given(data=st.data())
def test_any_value_of_another_kind_is_refused(written, data, tmp_path):
    p, rec = written
    paths = [(pa, v) for pa, v in _paths(rec) if pa]
    path, v = data.draw(st.sampled_from(paths))
    # fitted_max_error also takes null (a policy set, not fitted): a record that says so is
    # a model, not damage (drawn, it failed this test: 2 of 12 --hypothesis-seed runs)
    kinds = [k for k in _other_kind(v) if not (k is None and path[-1] in NULLABLE)]
    new = data.draw(st.sampled_from(kinds))
    _refused(p, tmp_path / "bad.onnx", "", edit=lambda r: _set(r, path, new))


@SLOW
@given(data=st.data())
def test_a_key_missing_or_unknown_anywhere_is_refused(written, data, tmp_path):
    p, rec = written
    objs = [pa for pa, v in _paths(rec) if isinstance(v, dict) and pa != ("meta",)]
    path = data.draw(st.sampled_from(objs))
    drop = data.draw(st.booleans())

    def edit(r):
        obj = r
        for k in path:
            obj = obj[k]
        if drop:
            del obj[data.draw(st.sampled_from(sorted(obj)))]
        else:
            obj[data.draw(st.sampled_from(["clip", "extra", "encoding"]))] = 0.5
    _refused(p, tmp_path / "bad.onnx", "", edit=edit)


@SLOW
@given(cut=st.integers(0, 10**6))
def test_a_truncated_record_is_refused(written, cut, tmp_path):
    p, rec = written
    text = json.dumps(rec)
    _refused(p, tmp_path / "bad.onnx", "malformed", text=text[:cut % len(text)])


def _with_spec_arrays(rec, **arrays):
    """rec with its array table and data rebuilt from these arrays (name -> array)."""
    import base64

    from fastpath.model.bundle import pack_arrays
    table, payload = pack_arrays(list(arrays.items()))
    rec["arrays"], rec["data"] = table, base64.b64encode(bytes(payload)).decode()


def _spec(rec):
    import base64
    raw = base64.b64decode(rec["data"])
    return {e["name"]: np.frombuffer(raw, e["dtype"], e["shape"][0], e["offset"])
            for e in rec["arrays"]}


@pytest.mark.parametrize("case,match", [
    ("mean one short", "mean/inv_std need 8 values"),
    ("mean float64", "expected <f4"),
    ("z_idx int64", "expected <i4"),
    ("z_idx 2-d", "of one dimension"),
    ("array missing", "expected ['fs.inv_std'"),
    ("array twice", "listed twice"),
    ("trailing data", "the arrays end at"),
    ("not base64", "not base64"),
    ("index past raw_len", "indexes outside raw[0:8]"),
    ("feature count", "the feature spec makes 6 features but the first layer takes 8"),
    ("version 2", "version 1 (a file from a newer fastpath?)"),
    ("a list", "a JSON list, expected an object"),
    ("unknown weights", "weights 'fp16' not supported"),
    ("digest not hex", "64 lowercase hex digits"),
    ("fitted error out of range", "fitted_max_error"),
    ("head past the outputs", "reads output(s) [5]"),
])
def test_each_kind_of_damage_is_named(written, tmp_path, case, match):
    p, rec = written
    rec = json.loads(json.dumps(rec))       # the module's record stays as written
    a = {k: v.copy() for k, v in _spec(rec).items()}
    text = None
    if case == "mean one short":
        a["fs.mean"] = a["fs.mean"][:-1]
        _with_spec_arrays(rec, **a)
    elif case == "mean float64":
        a["fs.mean"] = a["fs.mean"].astype("<f8")
        _with_spec_arrays(rec, **a)
    elif case == "z_idx int64":
        a["fs.z_idx"] = a["fs.z_idx"].astype("<i8")
        _with_spec_arrays(rec, **a)
    elif case == "z_idx 2-d":
        a["fs.z_idx"] = a["fs.z_idx"].reshape(2, 2)
        _with_spec_arrays(rec, **a)
    elif case == "array missing":
        del a["fs.inv_std"]
        _with_spec_arrays(rec, **a)
    elif case == "array twice":
        rec["arrays"].append(dict(rec["arrays"][-1], offset=rec["arrays"][-1]["offset"] + 64))
    elif case == "trailing data":
        import base64
        rec["data"] = base64.b64encode(base64.b64decode(rec["data"]) + b"\0" * 4).decode()
    elif case == "not base64":
        rec["data"] = rec["data"][:-4] + "!!!!"
    elif case == "index past raw_len":
        a["fs.z_idx"][0] = 8
        _with_spec_arrays(rec, **a)
    elif case == "feature count":
        # one z-scored field fewer and one windowed field fewer: 2 + 2 * 1 + ... = 6
        a = {"fs.z_idx": a["fs.z_idx"][:2], "fs.w_idx": a["fs.w_idx"][:2],
             "fs.mean": a["fs.mean"][:6], "fs.inv_std": a["fs.inv_std"][:6]}
        _with_spec_arrays(rec, **a)
    elif case == "version 2":
        rec["version"] = 2
    elif case == "a list":
        text = json.dumps([rec])
    elif case == "unknown weights":
        rec["weights"] = "fp16"
    elif case == "digest not hex":
        rec["graph_sha256"] = rec["graph_sha256"].upper()
    elif case == "fitted error out of range":
        rec["cache_policy"]["fitted_max_error"] = 3.0
    elif case == "head past the outputs":
        rec["head"]["outputs"] = [5]
    _refused(p, tmp_path / "bad.onnx", match, text=text if text is not None else json.dumps(rec))


def test_a_record_given_twice_is_refused(written, tmp_path):
    p, rec = written
    m = onnx.load(str(p))
    m.metadata_props.add(key=KEY, value=json.dumps(rec))
    onnx.save(m, str(tmp_path / "twice.onnx"))
    with pytest.raises(ModelError, match=r"twice\.onnx: metadata_props holds 'fastpath.model' 2 "
                                         r"times"):
        Model.from_onnx(tmp_path / "twice.onnx")


def test_a_tree_graph_with_a_record_is_refused(written, tmp_path):
    """to_onnx writes the record for MLPs only: on a tree ensemble's graph it was copied
    there by hand, and which model the file describes is not known."""
    from onnx import TensorProto, helper
    p, rec = written
    attrs = dict(nodes_treeids=[0] * 3, nodes_nodeids=[0, 1, 2], nodes_featureids=[0, 0, 0],
                 nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"], nodes_values=[0.5, 0, 0],
                 nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[2, 0, 0],
                 target_ids=[0, 0], target_nodeids=[1, 2], target_treeids=[0, 0],
                 target_weights=[1.0, 2.0], n_targets=1)
    node = helper.make_node("TreeEnsembleRegressor", ["x"], ["y"], domain="ai.onnx.ml", **attrs)
    g = helper.make_graph([node], "trees",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("ai.onnx.ml", 3)])
    onnx.save(m, str(tmp_path / "t.onnx"))
    assert Model.from_onnx(tmp_path / "t.onnx").trees is not None      # without: read
    onnx.helper.set_model_props(m, {KEY: json.dumps(rec)})
    onnx.save(m, str(tmp_path / "t.onnx"))
    with pytest.raises(ModelError, match="tree ensemble but its metadata_props"):
        Model.from_onnx(tmp_path / "t.onnx")


# ------------------------------------------------------------------ other exporters

@pytest.mark.parametrize("name", ["torch/regression-torchscript.onnx",
                                  "torch/softmax3-dynamo.onnx", "onnx_scaler_folded_v1.onnx"])
def test_files_from_other_exporters_read_as_before(name):
    """A regression guard (it passes on the code before the record too): no record, the
    identity spec, fp32, the cache off, meta naming the file and the output served."""
    path = os.path.join(DATA, name)
    assert KEY not in {p.key for p in onnx.load(path).metadata_props}
    m = Model.from_onnx(path)
    assert m.weights == "fp32" and m.cache_policy == CachePolicy(enabled=False)
    assert set(m.meta) == {"source", "onnx_output"}
    assert m.meta["source"] == os.path.basename(name)
    assert m.raw_len == m.feature_spec.n_feat == m.dims[0]


def test_a_file_without_the_record_reads_as_the_graph_alone(model, tmp_path):
    """to_onnx's file with the record taken out is what the reader made of every file
    before: the graph, the identity spec, the default (or given) head, fp32, cache off."""
    p = tmp_path / "m.onnx"
    model.to_onnx(p)
    bare = _rewrite(p, tmp_path / "bare.onnx")
    got = Model.from_onnx(bare, head=model.head_spec)
    assert got.layers == model.layers and got.weights == "fp32"
    assert got.feature_spec.raw_len == 8 and got.feature_spec != model.feature_spec
    assert got.cache_policy == CachePolicy(enabled=False)
    assert got.meta == {"source": "bare.onnx", "onnx_output": "out"}


SUM = "fastpath.model.sha256"


def _props(path) -> dict:
    return {p.key: p.value for p in onnx.load(str(path)).metadata_props}


def _write(src, dst, props: list):
    m = onnx.load(str(src))
    del m.metadata_props[:]
    for k, v in props:
        m.metadata_props.add(key=k, value=v)
    onnx.save(m, str(dst))
    return dst


def test_to_onnx_writes_the_records_sha256_beside_it(fp32_written):
    p, m = fp32_written
    props = _props(p)
    assert set(props) == {KEY, SUM}
    assert props[SUM] == hashlib.sha256(props[KEY].encode("utf-8")).hexdigest()
    assert Model.from_onnx(p) == m


@pytest.mark.parametrize("edit", ["cos_threshold", "mean", "head_scale"])
def test_a_value_changed_inside_a_valid_record_is_refused(fp32_written, tmp_path, edit):
    """Each edit keeps the record valid JSON of the right kinds; the digest written with it
    no longer matches."""
    p, m = fp32_written
    props = _props(p)
    text = props[KEY]
    rec = json.loads(text)
    if edit == "cos_threshold":
        old = json.dumps(rec["cache_policy"]["cos_threshold"])
        assert old == "0.999" and text.count(old) == 1
        text2 = text.replace(old, "0.9")                 # a far looser cache
    elif edit == "mean":
        # the z-score means are base64 float32 bytes: flip one bit of one mean's mantissa
        import base64
        data = bytearray(base64.b64decode(rec["data"]))
        off = next(e for e in rec["arrays"] if e["name"] == "fs.mean")["offset"]
        data[off + 1] ^= 0x04
        text2 = text.replace(rec["data"], base64.b64encode(bytes(data)).decode("ascii"))
    else:
        old = json.dumps(rec["head"]["scale"])
        text2 = text.replace(f'"scale": {old}', f'"scale": {json.loads(old) * 2!r}')
    assert text2 != text
    bad = _write(p, tmp_path / "edited.onnx", [(KEY, text2), (SUM, props[SUM])])
    # without the digest the same record is read as written (a file from before it existed)
    plain = Model.from_onnx(_write(p, tmp_path / "plain.onnx", [(KEY, text2)]))
    assert plain != m
    with pytest.raises(ModelError, match=r"edited\.onnx: fastpath's record .* does not match "
                                         r"its sha256 \('fastpath\.model\.sha256'\)"):
        Model.from_onnx(bad)


def test_a_digest_without_its_record_is_refused(fp32_written, tmp_path):
    p, _ = fp32_written
    props = _props(p)
    bad = _write(p, tmp_path / "stripped.onnx", [(SUM, props[SUM])])
    with pytest.raises(ModelError, match=r"stripped\.onnx: .*digest of fastpath's record .* "
                                         r"but not the record"):
        Model.from_onnx(bad)


def test_a_digest_given_twice_is_refused(fp32_written, tmp_path):
    p, _ = fp32_written
    props = _props(p)
    bad = _write(p, tmp_path / "twice.onnx",
                 [(KEY, props[KEY]), (SUM, props[SUM]), (SUM, props[SUM])])
    with pytest.raises(ModelError, match=r"'fastpath\.model\.sha256' 2 times"):
        Model.from_onnx(bad)


def test_a_record_without_a_digest_reads_as_before(fp32_written, tmp_path):
    p, m = fp32_written
    props = _props(p)
    assert Model.from_onnx(_write(p, tmp_path / "old.onnx", [(KEY, props[KEY])])) == m


@pytest.fixture(scope="module")
def fp32_written(tmp_path_factory):
    """An fp32 calibrated MLP with a set cache policy, exported: (path, model)."""
    m = calibrate(_mlp(), np.random.default_rng(3).standard_normal((60, 8)), [0, 1, 2, 3],
                  [4, 5], window=4)
    m = Model(m.layers, m.feature_spec, CachePolicy(True, 0.999, 0.1, 10**6, 4, 0.05),
              {"a": 1}, "none", m.head_spec, weights="fp32")
    p = tmp_path_factory.mktemp("digest") / "m.onnx"
    m.to_onnx(p)
    return p, m
