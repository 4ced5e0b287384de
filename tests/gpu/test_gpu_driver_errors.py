"""Driver errors while the GPU stage is set up or launched (a busy device, device memory
exhausted, a launch the driver refuses, a bad device ordinal), on the stand-in pycuda driver:
each is a BackendError, the context is released, and backend="auto" takes the CPU.
"""

import numpy as np
import pytest

import fastpath
from fastpath.errors import BackendError
from fastpath.gpu import GpuBackend, _backend as B

from helpers.builders import random_model
from helpers.fake_cuda import FakeError, users


BUSY = "cuDevicePrimaryCtxRetain failed: all CUDA-capable devices are busy or unavailable"


def _busy_device(cu):
    def retain(self):
        raise FakeError(BUSY)
    cu.Device.retain_primary_context = retain


@pytest.mark.parametrize("auto", ["measure", "gpu"])
def test_device_that_cannot_be_used_is_a_backend_error_and_auto_takes_the_cpu(fake_gpu, auto):
    """A device gpu_status() passes but whose context is refused leaked pycuda's error past
    backend='auto'."""
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
    """gpu.auto = 'gpu' on a host whose kernels cannot be loaded raised instead of taking the
    CPU."""
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
    """cuda.MemoryError from mem_alloc on a full GPU is a BackendError and the backend lets
    the context go."""
    def oom(n):
        raise FakeError("cuMemAlloc failed: out of memory")
    fake_gpu.mem_alloc = oom
    m = random_model(np.random.default_rng(3), [8, 4, 2])
    for mode in ("launch", "persistent"):
        with pytest.raises(BackendError, match=f"GPU {mode} path could not be set up.*out of "
                                               f"memory"):
            GpuBackend(m, mode, cuda=fake_gpu)
        assert fake_gpu.depth == 0 and users(fake_gpu) == 0
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
    assert fake_gpu.depth == 0 and users(fake_gpu) == 0
    assert B.resident_kernels(fake_gpu, 0).held == 0


def test_negative_device_ordinal_is_a_backend_error(fake_gpu):
    m = random_model(np.random.default_rng(6), [4, 2])
    with pytest.raises(BackendError, match="CUDA device -1 requested"):
        GpuBackend(m, "launch", device=-1, cuda=fake_gpu)
