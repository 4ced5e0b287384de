"""The files Model.to_onnx and Model.save write: the graph is renamed into place before its
external-data file (<name>.<12 hex>.data), so a reader never sees a new graph over old weights
or the reverse; a small model written over a large one leaves no stale data file; each thread
writes its own temp file; a failed export leaves the model at the path whole."""
import os
import re
import threading

import numpy as np
import pytest

from fastpath.model import FeatureSpec, Head, Layer, Model

pytest.importorskip("onnx")

# to_onnx names each export's data file <name>.<12 hex>.data (see onnx_export)
DATA = re.compile(r"m\.onnx\.[0-9a-f]{12}\.data")


def _mlp(seed: int, width: int = 3) -> Model:
    r = np.random.default_rng(seed)
    fs = FeatureSpec(raw_len=4, z_idx=[0, 1, 2, 3], w_idx=[], window=1,
                     mean=np.zeros(4, np.float32), inv_std=np.ones(4, np.float32))
    return Model(layers=(Layer(r.standard_normal((width, 4)).astype(np.float32),
                               r.standard_normal(width).astype(np.float32), "relu"),
                         Layer(r.standard_normal((1, width)).astype(np.float32),
                               np.zeros(1, np.float32), "identity")),
                 feature_spec=fs, head_spec=Head("regression", 1.0, (0,)))


def test_a_reader_between_the_renames_reads_the_old_model_whole(tmp_path, monkeypatch):
    from fastpath.model import onnx_export
    monkeypatch.setattr(onnx_export, "_EXTERNAL_BYTES", 0)     # every model goes external
    dest = str(tmp_path / "m.onnx")
    old, new = _mlp(3), _mlp(4)
    old.to_onnx(dest)
    seen = []
    real = os.replace

    def replace(src, dst):
        # just before the graph is renamed into place, what a reader at `dest` gets
        if os.fspath(dst) == dest:
            seen.append(Model.from_onnx(dest).layers[0].weight.copy())
        return real(src, dst)

    monkeypatch.setattr(onnx_export.os, "replace", replace)
    new.to_onnx(dest)
    monkeypatch.undo()
    assert len(seen) == 1
    np.testing.assert_array_equal(seen[0], old.layers[0].weight)
    np.testing.assert_array_equal(Model.from_onnx(dest).layers[0].weight, new.layers[0].weight)
    files = sorted(os.listdir(tmp_path))
    assert len(files) == 2 and files[0] == "m.onnx" and DATA.fullmatch(files[1]), files


def test_a_small_model_over_a_large_one_leaves_no_stale_data(tmp_path, monkeypatch):
    from fastpath.model import onnx_export
    dest = str(tmp_path / "m.onnx")
    monkeypatch.setattr(onnx_export, "_EXTERNAL_BYTES", 0)
    _mlp(3).to_onnx(dest)
    assert len(os.listdir(tmp_path)) == 2
    monkeypatch.undo()                              # the next model is written inline
    small = _mlp(5)
    small.to_onnx(dest)
    assert os.listdir(tmp_path) == ["m.onnx"]
    np.testing.assert_array_equal(Model.from_onnx(dest).layers[0].weight, small.layers[0].weight)


def test_files_beside_the_model_that_to_onnx_did_not_write_are_left(tmp_path, monkeypatch):
    from fastpath.model import onnx_export
    dest = str(tmp_path / "m.onnx")
    (tmp_path / "m.onnx.notes.data").write_bytes(b"mine")
    (tmp_path / "other.onnx.data").write_bytes(b"mine too")
    monkeypatch.setattr(onnx_export, "_EXTERNAL_BYTES", 0)
    _mlp(3).to_onnx(dest)
    _mlp(4).to_onnx(dest)
    files = sorted(os.listdir(tmp_path))
    assert "m.onnx.notes.data" in files and "other.onnx.data" in files
    assert len([f for f in files if DATA.fullmatch(f)]) == 1





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
    assert len(files) == 2 and files[0] == "m.onnx" and DATA.fullmatch(files[1])

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
    assert len(new) == 2 and new[0] == "m.onnx" and DATA.fullmatch(new[1])
    assert np.array_equal(Model.from_onnx(dest).layers[0].weight, other.layers[0].weight)


def test_save_from_two_threads_uses_a_temp_file_each(tmp_path, monkeypatch):
    # the deterministic form of tests/model/test_model_api.py's threaded save: both threads
    # hold their temp file at once, and the names must differ
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
