"""Defects found by a GPU engineer's read of the GPU stage (fastpath/gpu, csrc/fp_gpu.c), shown
where no GPU is: against the stand-in pycuda driver of tests/test_gpu.py and the protocol's CPU
device. Each test failed on the code before its fix.
"""
import threading

import numpy as np
import pytest

import fastpath
from fastpath.errors import BackendError, ConfigError
from fastpath.gpu import GpuBackend
from fastpath.gpu import _backend as B
from fastpath.gpu import _protocol as P

from helpers.builders import random_model
from helpers.fake_cuda import FakeCuda, FakeError, _fake_pycuda, fake_fatbin  # noqa: F401 - fixture
from helpers.fake_cuda import fake_gpu  # noqa: F401 - fixture

BUSY = "cuDevicePrimaryCtxRetain failed: all CUDA-capable devices are busy or unavailable"


# --- a driver error while the GPU is set up --------------------------------------------------

def _busy_device(cu):
    def retain(self):
        raise FakeError(BUSY)
    cu.Device.retain_primary_context = retain


@pytest.mark.parametrize("auto", ["measure", "gpu"])
def test_device_that_cannot_be_used_is_a_backend_error_and_auto_takes_the_cpu(fake_gpu, auto):
    # gpu_status() makes no context, so a device held by another process in exclusive-process
    # mode passes it; the context is refused later. Before: pycuda's own error (not a
    # BackendError) escaped Engine(backend="gpu") and Engine(backend="auto"), which must
    # take the CPU where the GPU cannot be used
    _busy_device(fake_gpu)
    m = random_model(np.random.default_rng(1), [8, 4, 2])
    with pytest.raises(BackendError, match="CUDA device 0 cannot be used.*devices are busy"):
        fastpath.Engine(m, backend="gpu")
    e = fastpath.Engine(m, backend="auto", config={"gpu": {"auto": auto}})
    assert e.backend == "cpu" and e.gpu_backend is None
    assert e.backend_reason.startswith("auto: cpu chosen")
    assert "devices are busy" in e.backend_reason
    e.step(np.ones(8, np.float32), 0)
    assert e.ticks == 1


def test_auto_that_chose_the_gpu_falls_back_when_the_gpu_path_fails(fake_gpu, tmp_path,
                                                                    monkeypatch):
    # gpu.auto = "gpu" takes the GPU without measuring; where its kernels cannot then be
    # loaded (no fatbin, no compiler) Engine(backend="auto") raised instead of taking the CPU
    absent = str(tmp_path / "absent.fatbin")
    monkeypatch.setattr(B, "FATBIN", absent)
    monkeypatch.setattr(B.load_module, "__defaults__", (absent, None))
    m = random_model(np.random.default_rng(2), [8, 4, 2])
    e = fastpath.Engine(m, backend="auto", config={"gpu": {"auto": "gpu"}})
    assert e.backend == "cpu" and e.gpu_backend is None
    assert "auto: cpu chosen (the GPU launch path failed" in e.backend_reason
    assert "cannot be loaded" in e.backend_reason
    assert e.backend_report == {"backend": "cpu", "reason": e.backend_reason}
    r = e.step(np.ones(8, np.float32), 0)
    assert r.latency.h2d_ns == 0
    with pytest.raises(BackendError, match="cannot be loaded"):
        fastpath.Engine(m, backend="gpu")
    assert fake_gpu.depth == 0


def test_device_memory_exhausted_is_a_backend_error_and_the_context_is_released(fake_gpu):
    # cuda.MemoryError (a pycuda.driver.Error) from mem_alloc on a GPU others fill
    def oom(n):
        raise FakeError("cuMemAlloc failed: out of memory")
    fake_gpu.mem_alloc = oom
    m = random_model(np.random.default_rng(3), [8, 4, 2])
    for mode in ("launch", "persistent"):
        fake_gpu.detached = False
        with pytest.raises(BackendError, match=f"GPU {mode} path could not be set up.*out of "
                                               f"memory"):
            GpuBackend(m, mode, cuda=fake_gpu)
        assert fake_gpu.depth == 0 and fake_gpu.detached
    e = fastpath.Engine(m, backend="auto")
    assert e.backend == "cpu" and "out of memory" in e.backend_reason


def test_launch_the_driver_refuses_is_a_backend_error(fake_gpu):
    m = random_model(np.random.default_rng(4), [8, 4, 2])
    with GpuBackend(m, "launch", cuda=fake_gpu) as be:
        fn = be.path._fn

        def refuse(*a, **k):
            raise FakeError("cuLaunchKernel failed: too many resources requested for launch")
        fn.prepared_async_call = refuse
        with pytest.raises(BackendError, match="GPU launch failed.*too many resources"):
            be.infer(np.ones(8, np.float32))
        assert be.path._inflight == 0 and fake_gpu.depth == 0


def test_persistent_launch_the_driver_refuses_is_a_backend_error(fake_gpu, monkeypatch):
    real = B.PersistentPath.start

    def start(self, timeout_ns=None):
        def refuse(*a, **k):
            raise FakeError("cuLaunchKernel failed: too many resources requested for launch")
        self._fn.prepared_async_call = refuse
        return real(self, timeout_ns)
    monkeypatch.setattr(B.PersistentPath, "start", start)
    m = random_model(np.random.default_rng(5), [8, 4, 2])
    with pytest.raises(BackendError, match="persistent kernel could not be launched.*too many"):
        GpuBackend(m, "persistent", cuda=fake_gpu)
    assert fake_gpu.depth == 0 and fake_gpu.detached
    assert B.resident_kernels(fake_gpu, 0).held == 0


def test_negative_device_ordinal_is_a_backend_error(fake_gpu):
    m = random_model(np.random.default_rng(6), [4, 2])
    with pytest.raises(BackendError, match="CUDA device -1 requested"):
        GpuBackend(m, "launch", device=-1, cuda=fake_gpu)


# --- a persistent kernel that faulted ---------------------------------------------------------

def test_persistent_kernel_fault_ends_the_path_at_once(fake_gpu):
    # a CUDA fault is sticky: the context and the kernel are gone. Before: the path stayed
    # "running", so every later tick sent a request and spun out the whole timeout (1 s by
    # default, holding the GIL) before reporting the same fault again; its blocks stayed
    # counted as resident (no other persistent path could start) until close(), which then
    # raised the fault once more
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
    assert be.path is None and cu.depth == 0 and cu.detached


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


# --- deadlines near INT64_MAX -------------------------------------------------------------------

def test_request_with_the_longest_timeout_waits_for_the_answer():
    # deadline = now + timeout_ns wrapped negative for a timeout near INT64_MAX ("as long as
    # it takes"): the request came back TIMEOUT at its first clock check
    rng = np.random.default_rng(9)
    W = [rng.standard_normal((3, 4)).astype(np.float32)]
    b = [np.zeros(3, np.float32)]
    dev = P.CpuDevice(W, b, ["identity"])
    buf = P.aligned_buffer(P.slot_bytes(4, 3))
    slot = P.Slot.on_buffer(buf, 4, 3)
    t = threading.Thread(target=dev.serve, args=(slot, 2**62, 20_000_000, 10**10))
    t.start()
    try:
        assert slot.wait_ready(P.READY_RUNNING, 10**10) == P.OK
        out = np.zeros(3, np.float32)
        x = np.arange(4, dtype=np.float32)
        rc, seq, _, _ = slot.request(x, out, 2**63 - 1)
        assert rc == P.OK and seq == 1
        np.testing.assert_allclose(out, W[0] @ x, rtol=1e-6)
    finally:
        slot.stop()
        t.join()


def test_wait_ready_with_the_longest_timeout_waits_for_the_device():
    buf = P.aligned_buffer(P.slot_bytes(4, 3))
    slot = P.Slot.on_buffer(buf, 4, 3)
    dev = P.CpuDevice([np.ones((3, 4), np.float32)], [np.zeros(3, np.float32)], ["identity"])
    # the device comes up 50 ms after the wait began (wait_ready releases the GIL)
    starter = threading.Timer(0.05, dev.serve, args=(slot, 2**62, 0, 10**10))
    starter.start()
    try:
        assert slot.wait_ready(P.READY_RUNNING, 2**63 - 1) == P.OK
    finally:
        slot.stop()
        starter.join()
    assert slot.state["ready"] == P.READY_EXITED


def test_backend_timeout_past_int64_is_a_config_error(fake_gpu):
    # before: an OverflowError from the persistent path's start (the C wait takes int64)
    m = random_model(np.random.default_rng(10), [4, 2])
    with pytest.raises(ConfigError, match="timeout_ns must be at most 2\\*\\*63 - 1"):
        GpuBackend(m, "persistent", cuda=fake_gpu, timeout_ns=1e30)
    with GpuBackend(m, "persistent", cuda=fake_gpu, timeout_ns=2**63 - 1) as be:
        y, bad, _ = be.infer(np.ones(4, np.float32))
        assert not bad
