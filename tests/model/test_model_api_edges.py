"""Edges of the public model API: forward() and heads at huge logits without numpy warnings,
paths given as bytes or non-paths, writes into missing folders, FeatureSpec field names,
to_onnx of activated last layers read back by onnxruntime, CachePolicy from numpy numbers,
truncated bundles. Answers are compared with numpy references and onnxruntime."""
import os
import warnings

import numpy as np
import pytest

import fastpath
from fastpath import FeatureSpec, InputError, Layer, Model, ModelError
from fastpath.model import Head
from helpers.builders import strip_fastpath_record
from helpers.oracle import ort_runner


def _mlp(acts=("relu", "identity"), dims=(3, 4, 2), post="none", seed=0):
    rng = np.random.default_rng(seed)
    return Model(tuple(Layer(rng.normal(size=(dims[i + 1], dims[i])),
                             rng.normal(size=dims[i + 1]), acts[i])
                       for i in range(len(dims) - 1)), post=post)


# ---- numpy references: no overflow warning where the engine answers ------------------------

def test_forward_sigmoid_layer_far_below_zero_answers_without_a_warning():
    """A sigmoid layer's pre-activation below -88 overflowed np.exp(-x) in float32: numpy's
    "overflow encountered in exp" RuntimeWarning, an exception under -W error, where the
    engine answers sigmoid = 0. The reference must answer what the engine does."""
    m = Model((Layer(np.array([[1.0], [-1.0]]), np.zeros(2), "sigmoid"),))
    x = np.array([-100.0], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = m.forward(x)
        ref = m.outputs(x[None, :])[0]
    np.testing.assert_allclose(out, [0.0, 1.0], atol=1e-30)
    np.testing.assert_array_equal(out, ref)
    np.testing.assert_allclose(fastpath.Engine(m).predict(x), out, atol=1e-30)


def test_forward_logistic2_of_a_huge_logit_answers_without_a_warning():
    """logistic2's p = 1 / (1 + exp(-z)) in float64 overflowed for z < -709 (a float32 logit
    reaches -3e38): a RuntimeWarning where the engine answers [1, 0]."""
    m = Model((Layer(np.array([[1e30]]), np.zeros(1)),), post="logistic2")
    x = np.array([-1.0], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = m.forward(x)
    np.testing.assert_array_equal(out, [1.0, 0.0])
    np.testing.assert_array_equal(fastpath.Engine(m).predict(x), out)


@pytest.mark.parametrize("via", ["head_spec", "Model.head", "signal"])
def test_tanh_sigmoid_head_of_a_huge_negative_output_answers_without_a_warning(via):
    """The tanh / sigmoid head's confidence 1 / (1 + exp(-out1)) overflowed np.exp for
    out1 < -709: a RuntimeWarning (an exception under -W error) instead of confidence 0."""
    m = _mlp()
    out = np.array([0.5, -1000.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        if via == "head_spec":
            sig, conf = m.head_spec.apply(out)
        elif via == "Model.head":
            sig, conf = Model.head(out)
        else:
            sig, conf = m.signal(out)
    assert float(conf) == 0.0
    assert float(sig) == pytest.approx(np.tanh(0.5))


# ---- file paths: what is not a path, a bytes path, a folder that does not exist -------------

@pytest.mark.parametrize("bad", [None, 3, 2.5])
def test_from_onnx_and_to_onnx_refuse_a_non_path_as_load_and_save_do(bad, tmp_path):
    """Model.load(None) / save(None) are ModelErrors naming what a path is; from_onnx(None)
    and to_onnx(None) were os.fspath's TypeError ("expected str, bytes or os.PathLike")."""
    pytest.importorskip("onnx")
    with pytest.raises(ModelError, match="file path"):
        Model.from_onnx(bad)
    with pytest.raises(ModelError, match="file path"):
        _mlp().to_onnx(bad)


def test_from_onnx_of_a_bytes_path_gives_a_model_that_saves(tmp_path):
    """A bytes path (which onnx.load and Model.load take) put b'model.onnx' in meta["source"]:
    the model then could not be saved ("meta must hold JSON values ... bytes")."""
    pytest.importorskip("onnx")
    m = _mlp()
    p = str(tmp_path / "model.onnx")
    m.to_onnx(p)
    # as another exporter writes it: without to_onnx's record, whose meta would be read instead
    strip_fastpath_record(p)
    a = Model.from_onnx(os.fsencode(p))
    assert a.meta["source"] == "model.onnx"
    a.save(str(tmp_path / "model.fpm"))
    assert Model.load(str(tmp_path / "model.fpm")) == a == Model.from_onnx(p)


@pytest.mark.parametrize("how", ["save", "to_onnx", "to_onnx external data"])
def test_writing_into_a_missing_folder_names_the_callers_path(how, tmp_path, monkeypatch):
    """Model.save / to_onnx into a folder that does not exist raised FileNotFoundError naming
    the temp file beside the target ('.../m.fpm.tmp2536.140200458029952'; for weights past
    1 GiB, written as external data, the temp folder '.../m.onnx.tmp2536.1402....d'), a name
    the caller never gave; the error names the path asked for (still a FileNotFoundError)."""
    if how != "save":
        pytest.importorskip("onnx")
        # the external-data path without a GiB of weights
        monkeypatch.setattr("fastpath.model.onnx_export._EXTERNAL_BYTES",
                            10 if "external" in how else 1 << 30)
    dest = str(tmp_path / "nodir" / ("m.fpm" if how == "save" else "m.onnx"))
    with pytest.raises(FileNotFoundError) as e:
        getattr(_mlp(), how.split()[0])(dest)
    assert e.value.filename == dest
    assert ".tmp" not in str(e.value)
    assert not os.path.exists(tmp_path / "nodir")


@pytest.mark.parametrize("names", [None, 5])
def test_feature_spec_field_names_not_a_sequence_is_a_model_error(names):
    """field_names=None (the default is ()) or an int was the generator's TypeError "'NoneType'
    object is not iterable"; None now means no names, as () does."""
    if names is None:
        fs = FeatureSpec(3, [0], [], 1, [0.0], [1.0], None)
        assert fs.field_names == () and fs == FeatureSpec(3, [0], [], 1, [0.0], [1.0])
        raws = np.arange(12, dtype=np.float32).reshape(4, 3)
        assert FeatureSpec.fit(raws, [0, 2], field_names=None) == FeatureSpec.fit(raws, [0, 2])
    else:
        with pytest.raises(ModelError, match="field_names"):
            FeatureSpec(3, [0], [], 1, [0.0], [1.0], names)


# ---- ONNX round trip: an activation on the last layer before the post transform ------------

@pytest.mark.parametrize("post,act,dims", [("softmax", "relu", (3, 5, 3)),
                                           ("softmax", "tanh", (3, 4, 2)),
                                           ("softmax", "sigmoid", (3, 4, 3)),
                                           ("logistic2", "tanh", (3, 4, 1)),
                                           ("logistic2", "relu", (3, 4, 1)),
                                           ("logistic2", "sigmoid", (3, 4, 1))])
def test_to_onnx_of_an_activated_last_layer_reads_back(post, act, dims, tmp_path):
    """Model accepts an activation on the last layer before a softmax / logistic2 (the engine
    runs the activation, then the post transform), and to_onnx writes it as onnxruntime runs
    it (Relu then Softmax, as torch exports Linear -> ReLU -> Softmax); from_onnx refused the
    file ("Softmax ... must come right after the last dense layer", "Sigmoid ... only one
    activation per layer"). Read back, the model is the one written."""
    pytest.importorskip("onnxruntime")
    m = _mlp(acts=("tanh", act), dims=dims, post=post, seed=3)
    p = str(tmp_path / "m.onnx")
    m.to_onnx(p)
    x = (np.random.default_rng(4).normal(size=(16, dims[0])) * 2).astype(np.float32)
    s = ort_runner(p)
    want = s.run(None, {"features": x})[0]
    np.testing.assert_allclose(m.forward(x), want, rtol=1e-5, atol=1e-6)
    back = Model.from_onnx(p)
    assert back.layers == m.layers and back.post == post and back.head_spec == m.head_spec
    np.testing.assert_array_equal(back.forward(x), m.forward(x))
    e = fastpath.Engine(back)
    np.testing.assert_allclose(np.stack([e.predict(r) for r in x]), want, rtol=1e-5, atol=1e-6)


def test_sigmoid_after_an_activation_is_logistic2_only_with_its_tail(tmp_path):
    """Tanh -> Sigmoid -> 1 - p -> Concat (a hand-written graph of the same shape as
    to_onnx's) reads as a tanh layer and a logistic2 post, answering what onnxruntime
    answers; a bare second activation (Tanh -> Sigmoid) is still refused."""
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper
    inits = [numpy_helper.from_array(np.array([[0.5, -1.0, 2.0]], np.float32), "W"),
             numpy_helper.from_array(np.array([0.25], np.float32), "B"),
             numpy_helper.from_array(np.ones(1, np.float32), "one")]
    head = [helper.make_node("Gemm", ["x", "W", "B"], ["h"], transB=1),
            helper.make_node("Tanh", ["h"], ["t"]), helper.make_node("Sigmoid", ["t"], ["p"])]
    tail = [helper.make_node("Sub", ["one", "p"], ["q"]),
            helper.make_node("Concat", ["q", "p"], ["y"], axis=1)]

    def save(nodes, width, out, fname):
        g = helper.make_graph(nodes, "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT,
                                                             ["N", width])], inits)
        p = str(tmp_path / fname)
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), p)
        return p

    p = save(head + tail, 2, "y", "l2.onnx")
    m = Model.from_onnx(p)
    assert m.post == "logistic2" and [l.activation for l in m.layers] == ["tanh"]
    x = np.random.default_rng(5).normal(size=(8, 3)).astype(np.float32)
    want = ort_runner(p).run(None, {"x": x})[0]
    np.testing.assert_allclose(m.forward(x), want, rtol=1e-6, atol=1e-7)
    with pytest.raises(ModelError, match="only one activation per layer"):
        Model.from_onnx(save(head, 1, "p", "two.onnx"))


# ---- CachePolicy takes numpy numbers, as the config's [cache] section does ------------------

def test_cache_policy_takes_numpy_numbers_as_the_config_does(tmp_path):
    """CachePolicy(max_age_ns=np.int64(...)) was "cache.max_age_ns must be int, got int64"
    and cos_threshold=np.float32(...) "must be float, got float32", where the config's
    [cache] section takes the same numbers for the same keys (and a numpy computation such
    as 10 * np.diff(ts).max() gives them). The policy holds plain Python numbers."""
    from fastpath.model import CachePolicy
    p = CachePolicy(enabled=np.bool_(True), cos_threshold=np.float32(0.5),
                    norm_tol=np.float64(0.25), max_age_ns=np.int64(10) * 5,
                    max_run=np.uint32(3), fitted_max_error=np.float32(0.5))
    want = CachePolicy(True, 0.5, 0.25, 50, 3, 0.5)
    assert p == want
    for k in ("enabled", "cos_threshold", "norm_tol", "max_age_ns", "max_run"):
        assert type(getattr(p, k)) is type(getattr(want, k)), k
    m = _mlp().with_cache_policy(p)
    m.save(str(tmp_path / "m.fpm"))
    assert Model.load(str(tmp_path / "m.fpm")).cache_policy == want
    # what the config refuses, the policy still refuses
    for bad in ({"max_run": np.float64(3.0)}, {"max_age_ns": np.bool_(True)},
                {"cos_threshold": np.bool_(True)}, {"enabled": np.int64(1)},
                {"cos_threshold": np.float32("nan")}, {"max_run": np.int64(-1)}):
        with pytest.raises(fastpath.ConfigError):
            CachePolicy(**bad)


def test_to_onnx_refuses_a_bundle_name_as_save_refuses_an_onnx_name(tmp_path):
    """Model.save refuses "m.onnx" (Engine(path) and load_model read a path by its suffix);
    to_onnx wrote ONNX into "m.fpm", which Engine("m.fpm") then read as a bundle: "not a
    fastpath model bundle (.fpm): bad magic b'\\x08\\x08...'". Nothing is written."""
    pytest.importorskip("onnx")
    dest = tmp_path / "m.FPM"
    with pytest.raises(ModelError, match=r"writes ONNX.*Model.save"):
        _mlp().to_onnx(str(dest))
    assert not dest.exists() and os.listdir(tmp_path) == []


@pytest.mark.parametrize("head,out", [(Head("tanh_sigmoid"), [0.5]),
                                      (Head("classifier3"), [[0.2, 0.8]]),
                                      (Head("regression", 1.0, (2,)), [0.1, 0.2]),
                                      (Head("regression"), 0.5),
                                      (Head("tanh_sigmoid"), ["a", "b"])])
def test_head_apply_of_too_few_outputs_is_an_input_error(head, out):
    """Head.apply (documented as the way to run a model's own head) and Model.head read the
    outputs by index: too few outputs was numpy's IndexError ("index 1 is out of bounds"),
    and text numpy's ValueError; an InputError names the head and the shape it needs."""
    with pytest.raises(InputError, match=r"outputs"):
        head.apply(out)
    if head.kind == "tanh_sigmoid":
        with pytest.raises(InputError, match=r"outputs"):
            Model.head(out)


@pytest.mark.parametrize("bad", [np.array([1 + 5j, 2.0]), np.array(["1", "2"]),
                                 np.array(["2020-01-01", "2020-01-02"], "datetime64[D]")],
                         ids=["complex", "text", "datetime"])
def test_numpy_references_refuse_what_predict_refuses(bad):
    """Defect guarded: the numpy references cast complex, text and datetime input that
    Engine.predict refuses (dropping the imaginary part, parsing text, reading datetime64 as
    days) and answered as if it were numbers; they refuse it as predict does."""
    m = Model((Layer(np.eye(2), np.zeros(2)),), input_scaler=fastpath.model.InputScaler(
        [0.0, 0.0], [1.0, 1.0]))
    with pytest.raises(InputError):
        fastpath.Engine(m).predict(bad)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for call in (lambda: m.forward(bad), lambda: m.features(bad[None, :]),
                     lambda: m.outputs(bad[None, :]), lambda: m.signal(bad),
                     lambda: m.head_spec.apply(bad), lambda: m.input_scaler.apply(bad),
                     lambda: m.feature_spec.apply(bad[None, :])):
            with pytest.raises(InputError, match="numbers"):
                call()
        # the calibration's ticks, given as a list (an array of them was refused already)
        with pytest.raises(ModelError, match="numbers"):
            FeatureSpec.fit([list(bad), list(bad)], [0, 1])


@pytest.mark.parametrize("keep", [1, 5, 7])
def test_load_of_a_bundle_cut_within_its_magic_says_truncated(keep, tmp_path):
    """A bundle cut to its first bytes (a copy that stopped early) is "truncated" to
    Model.from_bytes, but Model.load checked the first 7 bytes itself and called it "not a
    fastpath model bundle (.fpm): bad magic b'FPMOD'", a file of another kind."""
    p = tmp_path / "m.fpm"
    p.write_bytes(_mlp().to_bytes()[:keep])
    with pytest.raises(ModelError, match="truncated") as e:
        Model.load(str(p))
    assert "bad magic" not in str(e.value)
    with pytest.raises(ModelError, match="truncated"):
        Model.from_bytes(p.read_bytes())


def test_save_to_a_directory_is_a_model_error(tmp_path):
    """Model.save(a directory) raised a bare IsADirectoryError about a temp file name."""
    from fastpath.model import Model
    from fastpath._build import DEMO_MODEL
    m = Model.load(DEMO_MODEL)
    with pytest.raises(fastpath.ModelError, match="is a directory; give the bundle's file name"):
        m.save(tmp_path)
    assert os.listdir(tmp_path) == []
