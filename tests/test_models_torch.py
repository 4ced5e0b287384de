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
ort = pytest.importorskip("onnxruntime")

from fastpath import Engine, Model  # noqa: E402
from helpers.builders import engine_cfg  # noqa: E402

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "torch")
FILES = sorted(glob.glob(os.path.join(HERE, "*.onnx")))


def _expected(path):
    name = os.path.basename(path).split("-")[0]
    d = np.load(os.path.join(HERE, f"{name}.npz"))
    return d["x"], d["y"]


def _check(path, x, y, isa):
    m = Model.from_onnx(path)
    got_ort = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
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


def test_fixtures_present():
    # both exporters for each of the four models; a lost file would silently shrink coverage
    names = {os.path.basename(p) for p in FILES}
    for model in ("acts", "batchnorm", "regression", "softmax3"):
        for exporter in ("torchscript", "dynamo"):
            assert f"{model}-{exporter}.onnx" in names


@pytest.mark.parametrize("path", FILES, ids=[os.path.basename(p) for p in FILES])
def test_exported_file(path, isa):
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
