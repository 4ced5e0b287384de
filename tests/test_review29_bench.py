"""Session 29: the bench's onnxruntime peer and bench/zoo.py left a directory of exported
models in the temp folder on every run (45 of them here after a few sessions): the peer's
session holds its model once built, and the zoo's exports and tl2cgen libraries are not
needed after the run. Both now remove what they write."""
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

import fastpath

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
sys.path.insert(0, BENCH)


def test_onnxruntime_peer_leaves_nothing_behind(tmp_path, monkeypatch):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    import peers
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    model = fastpath.get_default_engine().model
    fn, version = peers.onnxruntime_peer(model)
    assert fn is not None, version
    assert os.listdir(tmp_path) == []
    # the session still runs once its files are gone, and computes the model
    x = np.linspace(-1, 1, model.layers[0].weight.shape[1]).astype(np.float32)
    np.testing.assert_allclose(fn(x), fastpath.Engine(model).predict(x), rtol=1e-4, atol=1e-5)


def test_zoo_leaves_nothing_behind(tmp_path):
    pytest.importorskip("skl2onnx")
    pytest.importorskip("onnxruntime")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp))
    out = subprocess.run([sys.executable, os.path.join(BENCH, "zoo.py"), "--quick", "--calls", "50",
                          "--only", "ridge", "--out", str(tmp_path / "zoo.json")],
                         capture_output=True, text=True, timeout=300, cwd=str(tmp_path), env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    # (a library the zoo imports keeps a one-line ".ses" file there: not the zoo's)
    assert [n for n in os.listdir(tmp) if n != ".ses"] == []


def test_a_missing_data_path_is_refused_before_the_placement(tmp_path, monkeypatch):
    """bench/run.py placed its thread (a pinned core, SCHED_FIFO) before it read --data: a
    main() called in process with a path that was not there left its caller pinned."""
    import run
    placed = []
    monkeypatch.setattr(run, "placement", lambda args: placed.append(args) or {})
    for data in (str(tmp_path / "nope"), f"{tmp_path / 'ob.csv'},{tmp_path / 'msg.csv'}"):
        with pytest.raises(SystemExit) as e:
            run.main(["--data", data, "--out", str(tmp_path / "out"), "--no-plot"])
        assert str(e.value.code).startswith(f"bench/run.py: --data {data}: cannot read it: ")
        assert "does not exist" in str(e.value.code)
    assert placed == []
    assert not (tmp_path / "out").exists()
