"""Review 33, models: LightGBM's linear_tree through onnxmltools, and the ONNX that PyTorch's
dynamo exporter (torch.onnx.export(dynamo=True)) writes for a small MLP."""
import numpy as np
import pytest

from fastpath import Engine, Model

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

N_FEAT = 6


def _engine_outputs(model, X):
    eng = Engine(model, config={"engine": {"n_symbols": 1}})
    return np.stack([np.asarray(eng.predict(x), np.float64).ravel() for x in X])


def _ort_outputs(path, X):
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.asarray(s.run(None, {s.get_inputs()[0].name: X})[0], np.float64).reshape(len(X), -1)


def test_lightgbm_linear_tree_loses_its_leaf_models_in_onnxmltools(tmp_path):
    # The fact this records (README, Models): onnxmltools (1.16) writes a linear_tree
    # LightGBM model as a plain TreeEnsembleRegressor, its leaves' linear models dropped
    # without a word; onnxruntime and fastpath then agree with each other and not with
    # LightGBM. Nothing in the file marks it (no metadata, the same nodes and attributes as
    # a constant-leaf model), so fastpath cannot refuse it: check such a model against
    # LightGBM's own predict before serving it.
    lgb = pytest.importorskip("lightgbm")
    onnxmltools = pytest.importorskip("onnxmltools")
    from onnxmltools.convert.common.data_types import FloatTensorType
    rng = np.random.default_rng(0)
    X = rng.standard_normal((400, N_FEAT)).astype(np.float32)
    y = (3 * X[:, 0] + 2 * X[:, 1] * (X[:, 2] > 0) + 0.1 * rng.standard_normal(400))
    files, dropped = {}, False
    for linear in (False, True):
        est = lgb.LGBMRegressor(n_estimators=10, num_leaves=4, linear_tree=linear,
                                verbose=-1).fit(X, y.astype(np.float32))
        m = onnxmltools.convert_lightgbm(est, initial_types=[("x", FloatTensorType(
            [None, N_FEAT]))], zipmap=False)
        path = tmp_path / f"lgb_linear{int(linear)}.onnx"
        path.write_bytes(m.SerializeToString())
        files[linear] = m
        Xt = X[:40]
        ref = est.predict(Xt).astype(np.float64)
        theirs = _ort_outputs(path, Xt)[:, 0]
        ours = _engine_outputs(Model.from_onnx(str(path)), Xt)[:, 0]
        # fastpath runs what the file says, as onnxruntime does
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
        if not linear or np.allclose(theirs, ref, rtol=1e-4, atol=1e-4):
            # constant leaves (or an onnxmltools that exports the leaf models): LightGBM's own
            np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4)
            continue
        assert np.abs(theirs - ref).max() > 0.1          # the leaf models are gone
        dropped = True
    if not dropped:
        return
    # ... and nothing tells the two files apart but the numbers
    plain, linear = files[False], files[True]
    assert not plain.metadata_props and not linear.metadata_props
    assert [(n.op_type, sorted(a.name for a in n.attribute)) for n in plain.graph.node] == \
        [(n.op_type, sorted(a.name for a in n.attribute)) for n in linear.graph.node]


def _mlp_graph(path, hidden_ops, rng=None):
    """x[1, 8] -> Gemm(8 -> 16) -> hidden_ops (each a (op_type, attrs) applied to the
    hidden tensor; "SiLU" is Sigmoid then Mul, as torch writes nn.SiLU) -> Gemm(16 -> 2)."""
    from onnx import TensorProto, helper, numpy_helper
    rng = rng or np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b1"),
             numpy_helper.from_array(rng.standard_normal((2, 16)).astype(np.float32), "w2"),
             numpy_helper.from_array(rng.standard_normal(2).astype(np.float32), "b2")]
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h0"], name="fc1", transB=1)]
    cur = "h0"
    for i, (op, attrs) in enumerate(hidden_ops):
        if op == "SiLU":
            nodes += [helper.make_node("Sigmoid", [cur], [f"s{i}"], name="node_Sigmoid_0"),
                      helper.make_node("Mul", [cur, f"s{i}"], [f"h{i + 1}"], name="node_silu")]
        else:
            nodes.append(helper.make_node(op, [cur], [f"h{i + 1}"], name=f"act{i}", **attrs))
        cur = f"h{i + 1}"
    nodes.append(helper.make_node("Gemm", [cur, "w2", "b2"], ["y"], name="fc2", transB=1))
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                       ["batch", 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])],
                          inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 9
    return m


def test_weights_in_an_external_file_left_behind_are_named(tmp_path):
    # Was: torch.onnx.export(dynamo=True) writes even a small MLP's weights to NAME.onnx.data
    # beside the graph; the .onnx copied alone was "not a readable ONNX model (ValidationError:
    # Data of TensorProto ( tensor name: w1) should be stored in ..., but it is not regular
    # file.)": now the missing file is named, and what to do
    from fastpath.errors import ModelError
    m = _mlp_graph(tmp_path / "m.onnx", [("Relu", {})])
    src = tmp_path / "export"
    src.mkdir()
    onnx.save_model(m, str(src / "m.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="m.onnx.data", size_threshold=0)
    x = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)
    # beside it: loads, and runs what onnxruntime runs
    np.testing.assert_allclose(_engine_outputs(Model.from_onnx(str(src / "m.onnx")), x),
                               _ort_outputs(src / "m.onnx", x), rtol=1e-5, atol=1e-6)
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "m.onnx").write_bytes((src / "m.onnx").read_bytes())
    with pytest.raises(ModelError, match=r"external data file 'm\.onnx\.data', which is not "
                                         r"beside it .*external_data=False"):
        Model.from_onnx(str(alone / "m.onnx"))


@pytest.mark.parametrize("ops,says", [
    ([("SiLU", {})], r"x \* sigmoid\(x\), SiLU / Swish, which is not an activation"),
    ([("Clip", {})], r"unsupported ONNX op 'Clip'.*use ReLU, Tanh or Sigmoid activations"),
    ([("Softplus", {})], r"unsupported ONNX op 'Softplus'.*use ReLU, Tanh or Sigmoid"),
    ([("HardSwish", {})], r"unsupported ONNX op 'HardSwish'.*use ReLU, Tanh or Sigmoid"),
])
def test_activations_torch_writes_that_fastpath_does_not_run_are_named(tmp_path, ops, says):
    # Was: nn.SiLU (Sigmoid then Mul) was refused as "node 'node_silu' (Mul) needs 'h0' to be
    # a constant weight", naming no activation; Clip (nn.Hardtanh, nn.ReLU6) and the others
    # got the generic list of supported ops, with no hint of what to use instead
    from fastpath.errors import ModelError
    p = tmp_path / "m.onnx"
    onnx.save_model(_mlp_graph(p, ops), str(p))
    with pytest.raises(ModelError, match=says):
        Model.from_onnx(str(p))


def _dynamo_export(net, example, path, **kw):
    import torch
    torch.onnx.export(net, (example,), str(path), input_names=["x"], output_names=["y"],
                      dynamo=True, **kw)


def test_dynamo_exporter_mlps_load_and_match_onnxruntime(tmp_path):
    # torch.onnx.export(dynamo=True), torch's default exporter, as users call it: a static
    # batch or a dynamic one, optimized or not, weights in NAME.onnx.data beside the graph
    # (its default) or in the file, an input without a batch dimension (MatMul + Add), a
    # Sigmoid head, a parameter matmul
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript", reason="the dynamo exporter needs onnxscript: pip "
                                             "install 'fastpath[torch-export]'")
    from torch import nn
    torch.manual_seed(0)

    class ParamMatmul(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(8, 16) * 0.3)
            self.c = nn.Parameter(torch.randn(16) * 0.1)
            self.out = nn.Linear(16, 1)

        def forward(self, x):
            return self.out(torch.relu(x @ self.w + self.c))

    relu = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).eval()
    tanh_sig = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2), nn.Sigmoid()).eval()
    cases = [("relu", relu, (2, 8), {}),
             ("relu_dyn", relu, (2, 8), {"dynamic_shapes": ({0: torch.export.Dim("batch")},)}),
             ("tanh_sigmoid_noopt", tanh_sig, (2, 8), {"optimize": False}),
             ("tanh_sigmoid_onefile", tanh_sig, (1, 8), {"external_data": False}),
             ("vector", relu, (8,), {}),
             ("param_matmul", ParamMatmul().eval(), (2, 8), {})]
    x = np.random.default_rng(2).standard_normal((6, 8)).astype(np.float32)
    for name, net, shape, kw in cases:
        p = tmp_path / f"{name}.onnx"
        _dynamo_export(net, torch.zeros(*shape), p, **kw)
        m = Model.from_onnx(str(p))
        got = _engine_outputs(m, x)
        s = ort.InferenceSession(str(p), providers=["CPUExecutionProvider"])
        if "dynamic_shapes" in kw:
            ref = np.asarray(s.run(None, {"x": x})[0], np.float64)
        else:       # a static shape: one row (or the vector), repeated to the exported batch
            ref = np.stack([np.asarray(s.run(None, {"x": np.broadcast_to(
                xi, shape).copy()})[0], np.float64).reshape(-1, got.shape[1])[0] for xi in x])
        with torch.no_grad():
            ref_torch = net(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(got, ref_torch, rtol=1e-5, atol=1e-6, err_msg=name)
