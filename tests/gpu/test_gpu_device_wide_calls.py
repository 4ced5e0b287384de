"""Driver calls that may wait for every kernel on the device (allocations, frees, a module
load) are never made while a persistent kernel runs: the stand-in raises DeviceWideCall for
each and records it in `hazards`, where a GPU would hang."""

import numpy as np
import pytest

from fastpath.errors import BackendError
from fastpath.gpu import GpuBackend
from fastpath.gpu._pack import packed_forward

from helpers.builders import random_model
from helpers.fake_cuda import FakeCuda, OccCuda, _fake_pycuda, _gpu_check

TMO = 5 * 10**9


def _model(seed):
    return random_model(np.random.default_rng(seed), [12, 16, 2])


def test_no_backend_is_set_up_while_a_persistent_kernel_runs(fake_fatbin):
    """A second GpuBackend allocated and loaded its module beside a spinning persistent kernel."""
    cu = FakeCuda()
    with GpuBackend(_model(1), "persistent", cuda=cu, timeout_ns=TMO):
        for mode in ("launch", "persistent"):
            with pytest.raises(BackendError, match=rf"cannot set up a GPU {mode} path while 1 "
                                                   r"persistent kernel\(s\) run.*never returns.*"
                                                   r"start=False"):
                GpuBackend(_model(2), mode, cuda=cu, timeout_ns=TMO)
        assert cu.hazards == [] and cu.depth == 0
    assert cu.hazards == []


def test_module_loaded_once_per_context_before_any_kernel_runs(fake_fatbin, monkeypatch):
    """Each backend loaded the module again (lazily loaded kernels load at first launch)."""
    monkeypatch.delenv("CUDA_MODULE_LOADING", raising=False)
    cu = OccCuda()          # a launch's events wait for its own stream, not the spinning ones
    a = GpuBackend(_model(1), "launch", cuda=cu, timeout_ns=TMO)
    b = GpuBackend(_model(2), "persistent", cuda=cu, timeout_ns=TMO, start=False)
    c = GpuBackend(_model(3), "persistent", cuda=cu, timeout_ns=TMO, start=False)
    try:
        assert cu.module_loads == 1 and cu.module_loading == "EAGER"
        b.start(), c.start()
        x = np.ones(12, np.float32)
        for be in (a, b, c):
            np.testing.assert_allclose(be.infer(x)[0], packed_forward(be.packed, x)[0][0],
                                       rtol=1e-5, atol=1e-6)
        assert cu.module_loads == 1 and cu.hazards == []
    finally:
        for be in (b, c, a):
            be.close()
    assert cu.hazards == []


def test_close_beside_a_running_persistent_kernel_defers_its_frees(fake_fatbin):
    """Closing a backend freed its memory (cuMemFree) while a persistent kernel spun."""
    cu = FakeCuda()
    lb = GpuBackend(_model(1), "launch", cuda=cu, timeout_ns=TMO)
    p1 = GpuBackend(_model(2), "persistent", cuda=cu, timeout_ns=TMO, start=False)
    p2 = GpuBackend(_model(3), "persistent", cuda=cu, timeout_ns=TMO, start=False)
    p1.start(), p2.start()
    mem = [lb.path.d_w, lb.path.h_x.base, p1.path.d_w, p1.path.h_slot.base]
    lb.close()
    p1.close()                          # its kernel stops; p2's still runs
    assert cu.hazards == [] and not any(m.freed for m in mem)
    assert p2.infer(np.ones(12, np.float32))[0].shape == (2,)
    p2.close()                          # the last kernel returned: every held-back free made
    assert cu.hazards == [] and all(m.freed for m in mem) and p2.path is None


def test_gpu_check_residency_makes_no_device_wide_call_while_kernels_spin(fake_fatbin,
                                                                          monkeypatch):
    """gpu_check's residency check made backends, allocated and closed them while persistent
    kernels spun: the first real run would hang there and write no JSON."""
    cu = OccCuda(sm=4, fn={"NUM_REGS": 128})            # 2 blocks an SM: 2 full grids fit
    _fake_pycuda(monkeypatch, cu)
    gc = _gpu_check()
    monkeypatch.setattr(gc, "RESIDENCY_DIMS", (300, 256, 2))   # a grid of every SM
    r = gc.residency_check(np.random.default_rng(0))
    assert r["started"] == r["expected"] == 2 and "cannot start another" in r["refusal"]
    assert r["launch_beside"].startswith("refused")
    assert cu.hazards == [] and not any(t.is_alive() for t in cu.threads)
