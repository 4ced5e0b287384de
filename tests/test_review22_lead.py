"""Defects found while merging session 22's reviews: Model.to_onnx's external-data file.

Each test failed on the code before its fix: the weights of a replaced model were renamed
over <name>.data before the new graph was renamed over <name>, so a reader between the two
renames (or after a crash there) read the old graph over the new weights; and a small model
written over a large one left the large one's <name>.data behind.
"""
import os
import re

import numpy as np
import pytest

from fastpath.model import FeatureSpec, Head, Layer, Model

pytest.importorskip("onnx")

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


# ------------------------------------------- GpuEngine.step_batch (the GPU stand-in driver)
from helpers.paths import F, cfg, make_model, make_stream  # noqa: E402
from helpers.fake_cuda import fake_fatbin, fake_gpu  # noqa: E402,F401 - fixtures (the GPU stand-in)


def test_gpu_engine_batch_behind_the_engines_last_tick_applies_no_row(fake_gpu):
    # GpuEngine.step_batch checked time order within the batch only: a row behind the
    # engine's last tick of its symbol was refused after the rows before it were applied
    # ("rows 0..0 were applied", ticks 2), where Engine.step_batch applies none
    from fastpath import InputError
    from fastpath.gpu import GpuEngine
    raws, _, _, _ = make_stream(21, n=4, nan_every=0)
    with GpuEngine(make_model("acts"), cfg(), mode="launch") as ge:
        ge.step(raws[0], 0, 10_000)
        with pytest.raises(InputError, match=r"row 1: .*no row was applied"):
            ge.step_batch(raws[1:3], np.array([1, 0]), np.array([20_000, 500]))
        assert ge.engine.ticks == 1


def test_gpu_engine_batch_stopped_mid_way_keeps_the_applied_rows_answers(fake_gpu):
    # a row the model stage refuses after others were applied: the refusal said how many
    # went in but dropped their answers (Engine.step_batch's carries .applied and .result)
    from fastpath import Engine, InputError
    from fastpath.gpu import GpuEngine
    m = make_model("acts")
    raws, syms, ts, _ = make_stream(22, n=8, nan_every=0)
    bad = raws.copy()
    bad[5] = F(3.4e38)
    want = [Engine(m, config=cfg()).step(r, int(s), int(t)).signal
            for r, s, t in zip(raws[:5], syms[:5], ts[:5])]
    with GpuEngine(m, cfg(), mode="launch", max_batch=2) as ge:
        with pytest.raises(InputError, match=r"rows 0\.\.\d were applied") as ei:
            ge.step_batch(bad, syms, ts)
        # the rows before row 5's launch went in (its launch's features are computed before
        # any of its rows is applied)
        k = ei.value.applied
        assert 1 <= k <= 5 and ge.engine.ticks == k and f"rows 0..{k - 1} were" in str(ei.value)
        got = [r.signal for r in ei.value.result]
        np.testing.assert_allclose(got, want[:k], atol=1e-5)
