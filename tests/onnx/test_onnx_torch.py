"""What torch.onnx.export really writes, with both exporters (TorchScript and dynamo), imported
by Model.from_onnx and run by the engine on every kernel set: predict equals torch's own output
and onnxruntime's on the same file (1e-5 relative), BatchNorm after Linear is folded whether the
exporter folded it or wrote BatchNormalization, and step() applies each model's default head.

The files under tests/data/torch/ were written by tests/data/make_torch_exports.py with torch
2.14 and onnxscript 0.7 (torch is not in the test extra: its wheel is gigabytes); where torch and
onnxscript are installed, test_live_export repeats the whole check on a fresh export."""
import glob
import os

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from fastpath import Engine, Model  # noqa: E402
from helpers.builders import engine_cfg  # noqa: E402
from helpers.models import predict_rows  # noqa: E402
from helpers.oracle import ort_first, ort_run  # noqa: E402

HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "torch")
FILES = sorted(glob.glob(os.path.join(HERE, "*.onnx")))


def _expected(path):
    name = os.path.basename(path).split("-")[0]
    d = np.load(os.path.join(HERE, f"{name}.npz"))
    return d["x"], d["y"]


def _check(path, x, y, isa):
    m = Model.from_onnx(path)
    got_ort = ort_first(path, x)
    np.testing.assert_allclose(got_ort, y, rtol=1e-5, atol=1e-6)
    eng = Engine(m, config=engine_cfg(isa, enabled=False))
    for i in range(len(x)):
        out = eng.predict(x[i])
        np.testing.assert_allclose(out, got_ort[i], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out, y[i], rtol=1e-5, atol=1e-6)
    # the head the engine applies on step() is the model's default for its outputs
    for i in range(4):
        r = eng.step(x[i], symbol=i)
        sig, conf = m.head_spec.apply(got_ort[i])
        assert r.signal == pytest.approx(sig, abs=2e-6)
        assert r.confidence == pytest.approx(conf, abs=2e-6)
    return m


def test_every_exporter_and_model_has_its_file():
    # both exporters for each of the four models; a lost file would silently shrink coverage
    names = {os.path.basename(p) for p in FILES}
    for model in ("acts", "batchnorm", "regression", "softmax3"):
        for exporter in ("torchscript", "dynamo"):
            assert f"{model}-{exporter}.onnx" in names


@pytest.mark.parametrize("path", FILES, ids=[os.path.basename(p) for p in FILES])
def test_exported_file_matches_torch_and_onnxruntime(path, isa):
    x, y = _expected(path)
    m = _check(path, x, y, isa)
    name = os.path.basename(path).split("-")[0]
    if name == "batchnorm":
        # folded: three dense layers, whatever the exporter wrote in between
        assert m.dims == [10, 24, 12, 2]
    if name == "regression":
        assert m.n_outputs == 1 and m.head_spec.kind == "regression"
    if name == "softmax3":
        assert m.n_outputs == 3 and m.head_spec.kind == "classifier3"
        np.testing.assert_allclose(Engine(m, config=engine_cfg(isa, enabled=False)).predict(x[0]).sum(),
                                   1.0, rtol=1e-6)


def test_batchnorm_written_unfolded_by_torchscript():
    # the point of the fixture: one exporter leaves BatchNormalization for the importer to fold
    ops = [n.op_type for n in onnx.load(os.path.join(HERE, "batchnorm-torchscript.onnx")).graph.node]
    assert "BatchNormalization" in ops


@pytest.mark.parametrize("dynamo", [False, True])
def test_live_export(tmp_path, dynamo):
    torch = pytest.importorskip("torch")
    if dynamo:
        pytest.importorskip("onnxscript", reason="the dynamo exporter needs onnxscript: pip install 'fastpath[torch-export]'")
    import sys
    sys.path.insert(0, os.path.dirname(HERE))
    try:
        import make_torch_exports as mk
    finally:
        sys.path.pop(0)
    for name, net, n_in in mk.models():
        x = np.random.default_rng(5).standard_normal((16, n_in)).astype(np.float32)
        with torch.no_grad():
            y = net(torch.from_numpy(x)).numpy()
        p = str(tmp_path / f"{name}.onnx")
        mk.export(net, n_in, p, dynamo)
        _check(p, x, y, "scalar")


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


def _dynamo_export(net, example, path, **kw):
    import torch
    torch.onnx.export(net, (example,), str(path), input_names=["x"], output_names=["y"],
                      dynamo=True, **kw)


def test_weights_in_an_external_file_left_behind_are_named(tmp_path):
    """Defect: an .onnx copied without the NAME.onnx.data torch's dynamo exporter writes beside
    it was refused with onnx's ValidationError, not naming the missing file or the fix."""
    from fastpath.errors import ModelError
    m = _mlp_graph(tmp_path / "m.onnx", [("Relu", {})])
    src = tmp_path / "export"
    src.mkdir()
    onnx.save_model(m, str(src / "m.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="m.onnx.data", size_threshold=0)
    x = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)
    # beside it: loads, and runs what onnxruntime runs
    np.testing.assert_allclose(predict_rows(Model.from_onnx(str(src / "m.onnx")), x),
                               ort_run(src / "m.onnx", x, 0).astype(np.float64),
                               rtol=1e-5, atol=1e-6)
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
    """Defect: nn.SiLU (Sigmoid then Mul), Clip (nn.Hardtanh, nn.ReLU6) and the others were
    refused without naming the activation or what to use instead."""
    from fastpath.errors import ModelError
    p = tmp_path / "m.onnx"
    onnx.save_model(_mlp_graph(p, ops), str(p))
    with pytest.raises(ModelError, match=says):
        Model.from_onnx(str(p))


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
        got = predict_rows(m, x)
        if "dynamic_shapes" in kw:
            ref = np.asarray(ort_first(p, x), np.float64)
        else:       # a static shape: one row (or the vector), repeated to the exported batch
            ref = np.stack([np.asarray(ort_first(p, np.broadcast_to(xi, shape).copy()),
                                       np.float64).reshape(-1, got.shape[1])[0] for xi in x])
        with torch.no_grad():
            ref_torch = net(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(got, ref_torch, rtol=1e-5, atol=1e-6, err_msg=name)
