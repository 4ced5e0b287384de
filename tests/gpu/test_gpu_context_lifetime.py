"""One primary context per device and process: retained once, shared by every GpuBackend,
made current before it is released, released at exit (never by a backend's close()), and
each backend's page-locked buffers freed inside it in close()."""

import numpy as np
import pytest

from fastpath.gpu import GpuBackend, _backend as B

from helpers.builders import random_model
from helpers.fake_cuda import FakeCuda, users

TMO = 5 * 10**9


def _model(seed):
    return random_model(np.random.default_rng(seed), [12, 16, 2])


def test_release_makes_the_context_current_before_detaching_it():
    """release() detached a context that was not current: pycuda pushed it and left the
    released context current on the thread."""
    cu = FakeCuda()
    dc = B.DeviceContext(cu, 0)
    dc.release()
    assert cu.detached == 1 and cu.left_current == 0 and cu.depth == 0
    dc.release()                                 # once only
    assert cu.detached == 1


def test_backends_share_one_context_and_close_never_releases_it(fake_fatbin):
    """Every GpuBackend retained the primary context and every close() released it, under
    the backends still using it."""
    cu = FakeCuda()
    a = GpuBackend(_model(1), "launch", cuda=cu, timeout_ns=TMO)
    b = GpuBackend(_model(2), "persistent", cuda=cu, timeout_ns=TMO)
    assert a.dc is b.dc and cu.retains == 1 and users(cu) == 2
    a.close()
    assert cu.detached == 0 and users(cu) == 1
    assert b.infer(np.ones(12, np.float32))[0].shape == (2,)
    b.close()
    assert cu.detached == 0 and users(cu) == 0 and cu.depth == 0
    c = GpuBackend(_model(3), "launch", cuda=cu, timeout_ns=TMO)     # the same context again
    assert c.dc is a.dc and cu.retains == 1
    c.close()


def test_contexts_are_released_at_exit_unless_a_kernel_still_runs(fake_fatbin, monkeypatch):
    """Nothing released the primary context at exit; a teardown beside a running persistent
    kernel would wait on it."""
    registered = []
    monkeypatch.setattr(B, "_CONTEXTS", {})
    monkeypatch.setattr(B.atexit, "register", registered.append)
    cu = FakeCuda()
    be = GpuBackend(_model(1), "persistent", cuda=cu, timeout_ns=TMO)
    assert registered == [B.release_contexts]
    B.release_contexts()                         # the kernel runs: left to the process's end
    assert cu.detached == 0 and cu.hazards == []
    be.close()
    monkeypatch.setattr(B, "_CONTEXTS", {(id(cu), 0): be.dc})
    B.release_contexts()
    assert cu.detached == 1 and cu.left_current == 0 and cu.depth == 0 and cu.hazards == []


@pytest.mark.parametrize("mode", ["launch", "persistent"])
def test_close_frees_the_pinned_buffers_inside_the_context(fake_fatbin, mode):
    """Page-locked buffers were left to the garbage collector, which skips cuMemFreeHost once
    the context is gone."""
    cu = FakeCuda()
    be = GpuBackend(_model(4), mode, cuda=cu, timeout_ns=TMO)
    p = be.path
    pinned = ([p.h_x.base, p.h_y.base, p.h_st.base] if mode == "launch" else [p.h_slot.base])
    device = [p.d_net, p.d_w, p.d_x, p.d_y]
    be.close()
    # HostAlloc.free asserts a current context: freed inside it
    assert all(h.freed for h in pinned) and all(d.freed for d in device)
    assert cu.depth == 0


def test_a_context_that_fails_its_first_query_is_released_current():
    """The context retained for a device whose attribute read failed was detached while not
    current, left current on the thread."""
    cu = FakeCuda()

    class Broken(cu.Device):
        def get_attribute(self, a):
            raise cu.Error("invalid device")
    cu.Device = Broken
    with pytest.raises(cu.Error, match="invalid device"):
        B.DeviceContext(cu, 0)
    assert cu.retains == cu.detached == 1 and cu.left_current == 0 and cu.depth == 0
