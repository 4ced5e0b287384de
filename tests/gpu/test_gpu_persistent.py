"""The persistent path's host logic on the stand-in pycuda driver: start, request and stop, a
kernel that never starts, stops answering or faults, and a backend that is closed or collected
unclosed.
"""

import gc

import numpy as np
import pytest

import fastpath
from fastpath.errors import BackendError
from fastpath.gpu import GpuBackend, _backend as B
from fastpath.gpu._pack import packed_forward

from helpers.builders import random_model
from helpers.fake_cuda import FakeCuda, users


def test_persistent_path_host_logic(fake_fatbin):
    rng = np.random.default_rng(8)
    m = random_model(rng, [9, 16, 2], ["tanh", "identity"])
    cu = FakeCuda()
    with GpuBackend(m, "persistent", cuda=cu, timeout_ns=5 * 10**9) as be:
        name, grid, args = cu.launches[0]
        assert name == "fp_mlp_persistent" and len(args) == 10
        assert args[2] == be.path.h_slot.base.get_device_pointer()
        for _ in range(50):
            x = rng.standard_normal(9).astype(np.float32)
            y, bad, t = be.infer(x)
            np.testing.assert_allclose(y, packed_forward(be.packed, x)[0][0], rtol=1e-5,
                                       atol=1e-6)
            assert not bad and t.total_ns >= t.infer_ns and t.d2h_ns == 0
        assert cu.depth == 0
    assert not cu.threads[0].is_alive()      # stop() waited for the "kernel" to return
    assert be.path is None


def test_stopped_persistent_path_is_not_restarted(fake_fatbin):
    m = random_model(np.random.default_rng(14), [4, 2])
    cu = FakeCuda()
    be = GpuBackend(m, "persistent", cuda=cu, timeout_ns=5 * 10**9)
    path = be.path
    path.stop()
    with pytest.raises(BackendError, match="stopped"):
        path.start()
    with pytest.raises(BackendError, match="not running"):
        be.infer(np.zeros(4, np.float32))
    be.close()
    assert len(cu.launches) == 1


def test_persistent_kernel_that_never_starts_is_an_error(fake_fatbin):
    m = random_model(np.random.default_rng(9), [4, 2])
    cu = FakeCuda(kernel_mode="never_starts")
    with pytest.raises(BackendError, match="did not start"):
        GpuBackend(m, "persistent", cuda=cu, timeout_ns=2 * 10**6)
    assert cu.depth == 0 and users(cu) == 0


def test_persistent_kernel_that_stops_answering_times_out(fake_fatbin):
    m = random_model(np.random.default_rng(10), [4, 2])
    cu = FakeCuda(kernel_mode="hangs_after_3")
    be = GpuBackend(m, "persistent", cuda=cu, timeout_ns=5 * 10**9)
    x = np.ones(4, np.float32)
    for _ in range(3):
        be.infer(x)
    be.path.timeout_ns = 2 * 10**6
    with pytest.raises(BackendError, match="no answer within"):
        be.infer(x)
    be.close()       # the stop flag still ends the silent loop: no hang
    assert not cu.threads[0].is_alive()


def test_persistent_backend_collected_unclosed_stops_its_kernel(fake_gpu):
    """A GpuBackend collected unclosed freed the slot and device memory its persistent kernel still
    polled."""
    m = random_model(np.random.default_rng(13), [4, 2])
    be = GpuBackend(m, "persistent", cuda=fake_gpu, timeout_ns=5 * 10**9)
    be.infer(np.ones(4, np.float32))
    kernel = fake_gpu.threads[-1]
    assert kernel.is_alive()
    del be
    gc.collect()
    kernel.join(5)
    assert not kernel.is_alive()


def test_collected_backend_makes_held_back_frees_after_its_kernel_returned(fake_fatbin):
    """A collected backend's kernel counted as returned once its slot said EXITED, and the frees
    held back were made while it still ran."""
    cu = FakeCuda(kernel_mode="returns_late")
    rng = np.random.default_rng(15)
    kw = dict(cuda=cu, timeout_ns=5 * 10**9, start=False)
    a = GpuBackend(random_model(rng, [4, 2]), "persistent", **kw)
    b = GpuBackend(random_model(rng, [4, 2]), "persistent", **kw)
    try:
        a.start(), b.start()
        a_mem = [a.path.d_w, a.path.h_slot.base]
        a.close()
        assert not any(m.freed for m in a_mem)
        kernel = cu.threads[-1]
        del b
        gc.collect()
        assert not kernel.is_alive() and all(m.freed for m in a_mem) and cu.hazards == []
        assert B.resident_kernels(cu, 0).running() == []
    finally:
        for t in cu.threads:
            t.asked.set()
        for be in (a, locals().get("b")):
            if be is not None:
                be.close()


def test_persistent_path_stopped_by_close_does_not_stop_again(fake_gpu):
    # close() stops the kernel and detaches the collector's stop: nothing runs twice
    m = random_model(np.random.default_rng(14), [4, 2])
    be = GpuBackend(m, "persistent", cuda=fake_gpu, timeout_ns=5 * 10**9)
    path = be.path
    be.close()
    assert not path._fin.alive and not fake_gpu.threads[-1].is_alive()


def test_persistent_kernel_fault_ends_the_path_at_once(fake_gpu):
    """After a sticky CUDA fault the persistent path stayed running and every tick waited out the
    timeout."""
    cu = FakeCuda(kernel_mode="hangs_after_3")
    m = random_model(np.random.default_rng(7), [4, 2])
    be = GpuBackend(m, "persistent", cuda=cu, timeout_ns=5 * 10**9)
    x = np.ones(4, np.float32)
    for _ in range(3):
        be.infer(x)
    be.path.timeout_ns = 2 * 10**6
    cu.kernel_mode = "fault"
    with pytest.raises(BackendError, match="no answer within.*kernel fault: FakeError: an "
                                           "illegal memory access"):
        be.infer(x)
    sent = be.path.slot.state["req_seq"]
    with pytest.raises(BackendError, match="kernel faulted.*illegal memory access.*make a new"):
        be.infer(x)
    assert be.path.slot.state["req_seq"] == sent      # no request went out
    assert B.resident_kernels(cu, 0).held == 0
    cu.threads[0].join(10)
    assert not cu.threads[0].is_alive()               # the stop flag reached the slot
    be.close()                                        # the fault was said already
    assert be.path is None and cu.depth == 0 and users(cu) == 0


def test_engine_after_a_persistent_fault_refuses_without_waiting(fake_gpu, isa):
    from helpers.fake_cuda import _head_model, _stream, HIT_CACHE
    rng = np.random.default_rng(8)
    m = _head_model(rng, "tanh_sigmoid")
    raws, syms = _stream(rng, 20)
    cfg = {"engine": {"simd": isa, "n_symbols": 3}, "cache": HIT_CACHE,
           "gpu": {"mode": "persistent", "timeout_ms": 5000}}
    ge = fastpath.Engine(m, backend="gpu", config=cfg)
    for i in range(5):
        ge.step(raws[i], int(syms[i]), ts_ns=i)
    path = ge.gpu_backend.path
    path._faulted("FakeError: an illegal memory access was encountered")
    sent = path.slot.state["req_seq"]
    with pytest.raises(BackendError, match="kernel faulted"):
        ge.step(raws[5] + np.float32(3), int(syms[5]), ts_ns=5)
    assert path.slot.state["req_seq"] == sent and ge.ticks == 5
    ge.close()
