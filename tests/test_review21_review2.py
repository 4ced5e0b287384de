"""Second review of the model-API and ONNX changes: defects found in them, each test failing
on the code before its fix."""
import os
import threading

import numpy as np
import pytest

from fastpath.model import FeatureSpec, Head, Layer, Model

RNG = np.random.default_rng(212)


# to_onnx names each export's data file <name>.<12 hex>.data (see onnx_export)
_DATA = __import__("re").compile(r"m\.onnx\.[0-9a-f]{12}\.data")

def _mlp(seed: int) -> Model:
    r = np.random.default_rng(seed)
    fs = FeatureSpec(raw_len=4, z_idx=[0, 1, 2, 3], w_idx=[], window=1,
                     mean=np.zeros(4, np.float32), inv_std=np.ones(4, np.float32))
    return Model(layers=(Layer(r.standard_normal((3, 4)).astype(np.float32),
                               r.standard_normal(3).astype(np.float32), "relu"),
                         Layer(r.standard_normal((1, 3)).astype(np.float32),
                               np.zeros(1, np.float32), "identity")),
                 feature_spec=fs, head_spec=Head("regression", 1.0, (0,)))


def test_to_onnx_from_two_threads_uses_a_temp_file_each(tmp_path, monkeypatch):
    # Model.save names its temp file by thread; to_onnx named it by process only, so two
    # threads exporting to one path wrote one temp file: the model renamed into place could
    # hold both writes, or the second checker / rename found the file gone
    onnx = pytest.importorskip("onnx")
    real_save = onnx.save
    both_inside = threading.Barrier(2, timeout=20)
    temps, errors = [], []

    def save(m, f, *a, **k):
        temps.append(str(f))
        both_inside.wait()          # both threads hold their temp name at once
        return real_save(m, f, *a, **k)

    monkeypatch.setattr(onnx, "save", save)
    dest = tmp_path / "m.onnx"
    models = [_mlp(1), _mlp(2)]

    def export(m):
        try:
            m.to_onnx(dest)
        except Exception as exc:  # noqa: BLE001 - collected for the assertion below
            errors.append(exc)

    ts = [threading.Thread(target=export, args=(m,)) for m in models]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    assert len(temps) == 2 and temps[0] != temps[1], temps
    assert errors == []
    back = Model.from_onnx(dest)
    assert any(np.array_equal(back.layers[0].weight, m.layers[0].weight) for m in models)


def test_a_failed_external_data_export_leaves_the_model_at_the_path_whole(tmp_path, monkeypatch):
    # past the external-data size the weights were written straight to <path>.data, over the
    # weights of the model already at <path>, before the new file was checked; a failure
    # then deleted <path>.data, so the good model there could no more be read
    onnx = pytest.importorskip("onnx")
    from fastpath.model import onnx_export
    monkeypatch.setattr(onnx_export, "_EXTERNAL_BYTES", 0)     # every model goes external
    dest = tmp_path / "m.onnx"
    good, other = _mlp(3), _mlp(4)
    good.to_onnx(dest)
    files = sorted(os.listdir(tmp_path))
    assert len(files) == 2 and files[0] == "m.onnx" and _DATA.fullmatch(files[1])

    def broken(*a, **k):
        raise onnx.checker.ValidationError("simulated failure")

    monkeypatch.setattr(onnx.checker, "check_model", broken)
    with pytest.raises(onnx.checker.ValidationError):
        other.to_onnx(dest)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == files
    back = Model.from_onnx(dest)
    assert np.array_equal(back.layers[0].weight, good.layers[0].weight)
    # and a good export replaces both
    monkeypatch.setattr(onnx_export, "_EXTERNAL_BYTES", 0)
    other.to_onnx(dest)
    new = sorted(os.listdir(tmp_path))
    assert len(new) == 2 and new[0] == "m.onnx" and _DATA.fullmatch(new[1])
    assert np.array_equal(Model.from_onnx(dest).layers[0].weight, other.layers[0].weight)


def test_save_from_two_threads_uses_a_temp_file_each(tmp_path, monkeypatch):
    # deterministic twin of test_review21_modelapi's threaded save (which passes on the old
    # code whenever the threads happen not to overlap): both threads hold their temp file
    # at once, and the names must differ
    from fastpath.model import bundle
    both_inside = threading.Barrier(2, timeout=20)
    temps, errors = [], []

    def opener(f, mode="r", *a, **k):
        if "w" in mode:
            temps.append(str(f))
            both_inside.wait()
        return open(f, mode, *a, **k)

    monkeypatch.setattr(bundle, "open", opener, raising=False)
    dest = tmp_path / "m.fpm"
    models = [_mlp(5), _mlp(6)]

    def save(m):
        try:
            m.save(dest)
        except Exception as exc:  # noqa: BLE001 - collected for the assertion below
            errors.append(exc)

    ts = [threading.Thread(target=save, args=(m,)) for m in models]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    assert len(temps) == 2 and temps[0] != temps[1], temps
    assert errors == [] and Model.load(dest) in models
    assert os.listdir(tmp_path) == ["m.fpm"]


@pytest.mark.parametrize("opset", [11, 13, 17])
def test_softmax_over_axis_0_of_a_rank1_tensor_is_read_as_onnxruntime_runs_it(tmp_path, opset,
                                                                              isa):
    # a [features] input makes rank-1 tensors, whose one axis, 0, is the features axis:
    # onnxruntime runs Softmax(axis=0) there as the softmax over the outputs; the importer
    # refused it ("must come ... over axis 1")
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper
    from fastpath import Engine
    from helpers.builders import engine_cfg
    w = RNG.standard_normal((4, 3)).astype(np.float32)
    b = RNG.standard_normal(3).astype(np.float32)
    x = RNG.standard_normal((5, 4)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "b"], ["z"]),
         helper.make_node("Softmax", ["z"], ["y"], axis=0)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 7
    path = str(tmp_path / "m.onnx")
    onnx.save(m, path)
    s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    ref = np.stack([s.run(None, {"x": r})[0] for r in x])
    got = Model.from_onnx(path, head=Head("classifier3", 1.0, ()))
    assert got.post == "softmax"
    np.testing.assert_allclose(got.forward(x), ref, rtol=1e-5, atol=1e-6)
    eng = Engine(got, config=engine_cfg(isa, enabled=False))
    for i in range(len(x)):
        np.testing.assert_allclose(eng.predict(x[i]), ref[i], rtol=1e-5, atol=1e-5)
