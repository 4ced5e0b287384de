"""Whole models against onnxruntime: random MLPs built with onnx.helper in the shapes that
torch.onnx.export (Gemm, transB=1) and skl2onnx (MatMul + Add) produce."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from fastpath import Engine, Model, ModelError  # noqa: E402
from helpers.builders import engine_cfg  # noqa: E402
from helpers.oracle import ort_first  # noqa: E402

OPS = {"relu": "Relu", "tanh": "Tanh", "sigmoid": "Sigmoid", "identity": None}


def build_mlp(path, dims, acts, style="gemm", seed=0, flatten=False, identity=False):
    rng = np.random.default_rng(seed)
    nodes, inits, cur = [], [], "x"
    if flatten:
        nodes.append(helper.make_node("Flatten", [cur], ["flat"], axis=1))
        cur = "flat"
    for i in range(len(dims) - 1):
        w = (rng.standard_normal((dims[i + 1], dims[i])) / np.sqrt(dims[i])).astype(np.float32)
        b = (rng.standard_normal(dims[i + 1]) * 0.1).astype(np.float32)
        if style == "gemm":
            inits += [numpy_helper.from_array(w, f"W{i}"), numpy_helper.from_array(b, f"B{i}")]
            nodes.append(helper.make_node("Gemm", [cur, f"W{i}", f"B{i}"], [f"g{i}"], transB=1))
            cur = f"g{i}"
        else:
            inits += [numpy_helper.from_array(w.T.copy(), f"W{i}"), numpy_helper.from_array(b, f"B{i}")]
            nodes.append(helper.make_node("MatMul", [cur, f"W{i}"], [f"m{i}"]))
            nodes.append(helper.make_node("Add", [f"m{i}", f"B{i}"], [f"g{i}"]))
            cur = f"g{i}"
        if OPS[acts[i]]:
            nodes.append(helper.make_node(OPS[acts[i]], [cur], [f"a{i}"]))
            cur = f"a{i}"
    if identity:
        nodes.append(helper.make_node("Identity", [cur], ["y"]))
    else:
        nodes[-1].output[0] = "y"
    g = helper.make_graph(nodes, "mlp",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, dims[0]])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, dims[-1]])],
                          inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, str(path))
    return str(path)


CASES = [
    ([128, 64, 32, 2], ["relu", "relu", "identity"], "gemm", False, False),
    ([7, 2], ["identity"], "matmul", False, False),
    ([37, 129, 2], ["tanh", "identity"], "gemm", True, True),
    ([300, 37, 9, 2], ["sigmoid", "relu", "tanh"], "matmul", False, True),
    ([16, 33, 2], ["relu", "sigmoid"], "gemm", False, False),
]


@pytest.mark.parametrize("dims,acts,style,flatten,identity", CASES)
def test_onnx_model_matches_onnxruntime(tmp_path, isa, dims, acts, style, flatten, identity):
    path = build_mlp(tmp_path / "m.onnx", dims, acts, style, seed=len(dims), flatten=flatten,
                     identity=identity)
    eng = Engine(Model.from_onnx(path), config=engine_cfg(isa, enabled=False))
    x = np.random.default_rng(1).standard_normal((50, dims[0])).astype(np.float32)
    out = ort_first(path, x).astype(np.float64)
    sig, conf = np.tanh(out[:, 0]), 1 / (1 + np.exp(-out[:, 1]))
    for i in range(50):
        r = eng.step(x[i])
        assert r.signal == pytest.approx(sig[i], abs=2e-5)
        assert r.confidence == pytest.approx(conf[i], abs=2e-5)
    # and the engine path string works too
    assert Engine(path, config=engine_cfg(isa)).step(x[0]).signal == pytest.approx(sig[0], abs=2e-5)


def test_gemm_alpha_beta_and_untransposed(tmp_path):
    rng = np.random.default_rng(4)
    w = rng.standard_normal((5, 2)).astype(np.float32)        # (in, out): transB = 0
    b = rng.standard_normal(2).astype(np.float32)
    node = helper.make_node("Gemm", ["x", "W", "B"], ["y"], alpha=0.5, beta=2.0)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 5])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
                          [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    p = str(tmp_path / "g.onnx")
    onnx.save(m, p)
    x = rng.standard_normal((1, 5)).astype(np.float32)
    out = ort_first(p, x)[0]
    r = Engine(p).step(x[0])
    assert r.signal == pytest.approx(np.tanh(out[0]), abs=2e-5)


def test_unsupported_op_names_it(tmp_path):
    p = build_mlp(tmp_path / "m.onnx", [4, 3, 2], ["relu", "identity"])
    m = onnx.load(p)
    m.graph.node.insert(1, helper.make_node("Softmax", ["g0"], ["sm"]))
    m.graph.node[2].input[0] = "sm"
    onnx.save(m, p)
    with pytest.raises(ModelError, match="unsupported ONNX op 'Softmax'"):
        Model.from_onnx(p)


def test_outputs_without_a_default_head_are_refused(tmp_path):
    p = build_mlp(tmp_path / "m.onnx", [4, 3], ["identity"])
    with pytest.raises(ModelError, match="2 outputs"):
        Model.from_onnx(p)


def test_not_onnx_and_truncated(tmp_path):
    p = tmp_path / "bad.onnx"
    p.write_bytes(b"this is not protobuf at all \xff\xfe")
    with pytest.raises(ModelError):
        Model.from_onnx(str(p))
    good = build_mlp(tmp_path / "m.onnx", [8, 4, 2], ["relu", "identity"])
    data = open(good, "rb").read()
    (tmp_path / "t.onnx").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelError):
        Model.from_onnx(str(tmp_path / "t.onnx"))
    with pytest.raises(ModelError, match="not found"):
        Model.from_onnx(str(tmp_path / "missing.onnx"))


def test_to_onnx_roundtrip_matches_onnxruntime(tmp_path, isa):
    import fastpath
    m = Model.load(fastpath._build.DEMO_MODEL)
    p = str(tmp_path / "demo.onnx")
    m.to_onnx(p)
    back = Model.from_onnx(p)
    assert back.dims == m.dims
    # the file records the demo's feature spec: the model read back takes raw ticks, and
    # onnxruntime takes their features
    raws = np.random.default_rng(0).standard_normal((20, m.raw_len)).astype(np.float32)
    x = m.features(raws)
    out = ort_first(p, x)
    np.testing.assert_allclose(out, m.forward(x), rtol=1e-4, atol=1e-5)
    eng = Engine(back, config=engine_cfg(isa, enabled=False))
    for i in range(20):
        assert eng.step(raws[i]).signal == pytest.approx(np.tanh(out[i, 0]), abs=2e-5)


def _save(tmp_path, nodes, inits, out="y"):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
                          [helper.make_tensor_value_info(out, TensorProto.FLOAT, [1, 2])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    p = str(tmp_path / "f.onnx")
    with open(p, "wb") as f:
        f.write(m.SerializeToString())     # no checker: these graphs are malformed on purpose
    return p


def test_fuzz_findings_are_model_errors(tmp_path):
    """Graphs the fuzzer found that once escaped as ValueError / TypeError / IndexError."""
    w = numpy_helper.from_array(np.ones((2, 3), np.float32), "W")
    # a Constant whose value is a graph, not a tensor
    const = helper.make_node("Constant", [], ["c"])
    const.attribute.append(helper.make_attribute("value", helper.make_graph([], "sub", [], [])))
    p = _save(tmp_path, [const, helper.make_node("Gemm", ["x", "W"], ["y"], transB=1)], [w])
    with pytest.raises(ModelError, match="Constant node .* expected a tensor"):
        Model.from_onnx(p)
    # a Gemm whose alpha is a string
    p = _save(tmp_path, [helper.make_node("Gemm", ["x", "W"], ["y"], transB=1, alpha="big")], [w])
    with pytest.raises(ModelError, match="attribute alpha is .*expected a number"):
        Model.from_onnx(p)
    # a node without outputs
    p = _save(tmp_path, [helper.make_node("Gemm", ["x", "W"], [], transB=1)], [w])
    with pytest.raises(ModelError, match="0 outputs"):
        Model.from_onnx(p)
    # a MatMul with one input
    p = _save(tmp_path, [helper.make_node("MatMul", ["x"], ["y"])], [w])
    with pytest.raises(ModelError, match="1 inputs"):
        Model.from_onnx(p)


def test_bad_weights_are_named_once_with_the_file(tmp_path):
    """onnx_import returns plain arrays and Model.from_onnx builds the layers: a layer the
    model refuses is still reported with the file's name, once."""
    p = build_mlp(tmp_path / "m.onnx", [4, 3, 2], ["relu", "identity"])
    m = onnx.load(p)
    w = numpy_helper.to_array(m.graph.initializer[0]).copy()
    w[1, 2] = np.nan
    m.graph.initializer[0].CopyFrom(numpy_helper.from_array(w, m.graph.initializer[0].name))
    onnx.save(m, p)
    with pytest.raises(ModelError, match="contains NaN/Inf") as exc:
        Model.from_onnx(p)
    assert str(exc.value).count(p) == 1
    imported = Model.from_onnx(build_mlp(tmp_path / "ok.onnx", [4, 3, 2], ["relu", "identity"]))
    assert not imported.cache_policy.enabled and imported.meta["source"] == "ok.onnx"
