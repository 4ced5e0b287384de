"""Defects found reviewing today's merged fixes (window fresh sums, slot generations, the
double redo, model loaders): each test fails on the code before its fix.

Waits are bounded by an alarm, so a hang fails the test instead of stalling the suite;
nothing asserts on wall-clock time.
"""
import mmap
import os
import struct
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest

import fastpath
from fastpath import ServeError

BASE_SERVE = {"place": False, "idle": "yield", "idle_spin_ns": 50_000}
# fp_ring.h offsets: the client table (one 64-byte line per client: state u32, pid i32), and
# the client regions after the 16 KiB header, each starting with four 64-byte cursor lines
# (req_head, req_tail, rep_head, rep_tail; the count in the first 8 bytes of each)
CLIENTS_OFF = 8576
HEADER_BYTES = 16384
CL_ACTIVE = 2


from helpers.serving import deadline  # noqa: E402  (the serve tests' SIGALRM deadline)


def _uname():
    return f"r18f-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait(timeout=30)
    return p.pid


# ------------------------------------------------------------------ a reclaim racing the owner
def test_stores_of_a_reclaimed_clients_call_in_flight_do_not_reach_the_next_owner():
    """The worker takes back the slot of a client whose pid it cannot see (another PID
    namespace) while that client is alive and submitting. A call of that client that passed
    its generation check just before still lands its stores: its request cursor (and the
    request, its reply cursor) went into rings the worker had already cleared and offered,
    and the next owner read that cursor at open: it wrote its requests where the worker never
    looked and spun forever in step(). Here the late stores are made by hand right after
    the slot left ACTIVE; the next owner must still be served."""
    name = _uname()
    raw = np.zeros(fastpath.get_default_engine().raw_len, np.float32)
    # a long heartbeat: the reap passes (one per beat) are far apart, and the late stores
    # below land between the pass that takes the slot back and the next one
    conf = {"engine": {"n_symbols": 4},
            "serve": {**BASE_SERVE, "max_clients": 1, "heartbeat_ms": 1000,
                      "dead_after_ms": 5000, "stall_timeout_ms": 20000}}
    with fastpath.serve(name, None, conf) as srv:
        c = fastpath.connect(name)
        c.step(raw, 0)
        with open(srv.path, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
            assert struct.unpack_from("<Ii", m, CLIENTS_OFF) == (CL_ACTIVE, os.getpid())
            struct.pack_into("<i", m, CLIENTS_OFF + 4, _dead_pid())
            end = time.monotonic() + 30
            while struct.unpack_from("<I", m, CLIENTS_OFF)[0] == CL_ACTIVE:
                assert time.monotonic() < end, "the worker never took the slot back"
            # the owner's submit and poll, past their checks, finishing now
            struct.pack_into("<Q", m, HEADER_BYTES, 5)           # req_head
            struct.pack_into("<Q", m, HEADER_BYTES + 192, 5)     # rep_tail
            with pytest.raises(ServeError, match="rings back"):
                c.step(raw, 0)
            c.close()
            with deadline(10):
                while True:
                    try:
                        c2 = fastpath.connect(name)
                        break
                    except ServeError as exc:
                        assert "client slots taken" in str(exc), str(exc)
                        time.sleep(0.01)
            with c2, deadline(10):
                assert c2.step(raw, 1).seq == 1
                assert c2.step(raw, 1).seq == 2


# ------------------------------------------------------------------ ONNX: trees, width left open
def _reshaped_stump(path, in_shape, rshape):
    """Reshape(x, rshape) -> a one-split TreeEnsembleRegressor on feature 2."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper
    kw = dict(nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[2, 0, 0],
              nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"], nodes_values=[0.5, 0.0, 0.0],
              nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[2, 0, 0], target_treeids=[0, 0],
              target_nodeids=[1, 2], target_ids=[0, 0], target_weights=[1.0, -2.0])
    nodes = [helper.make_node("Reshape", ["x", "shp"], ["xr"]),
             helper.make_node("TreeEnsembleRegressor", ["xr"], ["y"], domain="ai.onnx.ml",
                              n_targets=1, **kw)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                     in_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(np.array(rshape, np.int64), "shp")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("ai.onnx.ml", 3)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return str(path)


@pytest.mark.parametrize("in_shape", [[None, None], None], ids=["open-width", "no-shape"])
def test_tree_ensemble_behind_a_reshape_on_an_input_of_open_width_loads(tmp_path, in_shape):
    """A Reshape to (-1, 4) in front of a tree ensemble whose graph input leaves its width
    open is a no-op on the rows onnxruntime is given: it loaded before the Reshape checks and
    was then refused ("not a no-op on a ?-wide row"). The Reshape's width is the model's."""
    ort = pytest.importorskip("onnxruntime")
    from fastpath.model import Head, Model
    p = _reshaped_stump(tmp_path / "t.onnx", in_shape, [-1, 4])
    m = Model.from_onnx(p, head=Head("regression"))
    assert m.dims[0] == 4
    X = np.random.default_rng(0).standard_normal((16, 4)).astype(np.float32)
    ref = ort.InferenceSession(p, providers=["CPUExecutionProvider"]).run(["y"], {"x": X})[0]
    np.testing.assert_allclose(m.forward(X), ref, rtol=1e-6, atol=1e-6)
    # rows narrower than the features the trees read are still refused
    with pytest.raises(fastpath.ModelError, match="feature 2"):
        Model.from_onnx(_reshaped_stump(tmp_path / "n.onnx", in_shape, [-1, 2]),
                        head=Head("regression"))


def test_a_row_the_gpu_flags_is_answered_as_the_cpu_answers_it(monkeypatch):
    """A row whose float32 sums overflowed on the GPU is answered by the CPU model on the same
    features (which re-sums such a layer in double): the GPU backend used to refuse every
    flagged tick, where the CPU backend answers those whose pre-activations fit float32."""
    pytest.importorskip("helpers.fake_cuda")
    from helpers.fake_cuda import FakeCuda, _fake_pycuda, random_model
    from fastpath.gpu import GpuBackend, GpuEngine, gpu_status

    _fake_pycuda(monkeypatch, FakeCuda())
    gpu_status.cache_clear()
    real_infer = GpuBackend.infer

    def flagged(self, x):
        y, _, t = real_infer(self, x)
        return np.full_like(y, np.nan), True, t

    monkeypatch.setattr(GpuBackend, "infer", flagged)
    rng = np.random.default_rng(3)
    m = random_model(rng, [6, 5, 2], ["relu", "identity"])
    cfg = {"engine": {"n_symbols": 2}, "cache": {"enabled": False}}
    raws = rng.standard_normal((5, 6)).astype(np.float32)
    cpu = fastpath.Engine(m, backend="cpu", config=cfg)
    want = [cpu.step(r, 0, i + 1) for i, r in enumerate(raws)]
    ge = fastpath.Engine(m, backend="gpu", config=cfg)
    got = [ge.step(r, 0, i + 1) for i, r in enumerate(raws)]
    assert [(g.signal, g.confidence) for g in got] == [(w.signal, w.confidence) for w in want]
    ge.close()
    monkeypatch.setattr(GpuBackend, "infer_batch", lambda self, X: (
        np.full((len(X), 2), np.nan, np.float32), np.ones(len(X), bool),
        [real_infer(self, X[0])[2]]))
    ge = GpuEngine(m, cfg, mode="persistent")
    got = ge.step_batch(raws, np.zeros(5, np.int32), np.arange(1, 6))
    assert [(g.signal, g.confidence) for g in got] == [(w.signal, w.confidence) for w in want]
    ge.close()
    gpu_status.cache_clear()
