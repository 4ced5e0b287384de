"""Co-residency of the persistent kernels: a stand-in driver reports the device's and the
kernel's occupancy attributes; a persistent kernel that cannot be resident is refused before
it starts, per device context, and the launch path fits the room the persistent kernels leave.
"""

import gc

import numpy as np
import pytest

import fastpath
from fastpath.errors import BackendError
from fastpath.gpu import GpuBackend, _backend as B
from fastpath.gpu._pack import packed_forward

from helpers.builders import random_model
from helpers.fake_cuda import (FakeCuda, FakeFunction, OccCuda, OccFunction, _fake_pycuda,
                               _wide)


def test_occupancy_from_the_drivers_attributes():
    # an H200 holds 6 blocks of the persistent kernel an SM: its 33 registers a thread take
    # 1280 a warp, 10240 a block, and 65536 // 10240 = 6 (threads would allow 8)
    cu = OccCuda(sm=132)
    dev, fn = cu.Device(0), OccFunction(cu, "fp_mlp_persistent")
    occ = B.occupancy(cu, dev, fn)
    assert occ.blocks_per_sm == 6 and occ.limit.startswith("registers (33 a thread")
    cu.fn_attrs["NUM_REGS"] = 24                       # 768 a warp: threads bound it at 8
    assert B.occupancy(cu, dev, fn) == (8, "threads (2048 an SM)")
    cu.fn_attrs["SHARED_SIZE_BYTES"] = 100_000         # two blocks' shared memory an SM
    assert B.occupancy(cu, dev, fn).blocks_per_sm == 2
    cu.fn_attrs["MAX_THREADS_PER_BLOCK"] = 128         # the kernel cannot take 256 threads
    assert B.occupancy(cu, dev, fn).blocks_per_sm == 0
    # a driver that knows none of them: one block an SM, what grid_for has always assumed
    old = FakeCuda(sm=132)
    assert B.occupancy(old, old.Device(0), FakeFunction(old, "x")).blocks_per_sm == 1
    # an attribute the driver refuses is left out, not fatal
    cu = OccCuda(sm=132)
    del cu.dev_attrs["MAX_REGISTERS_PER_MULTIPROCESSOR"]
    assert B.occupancy(cu, cu.Device(0), OccFunction(cu, "p")).blocks_per_sm == 8


class _pushed:
    """A context pushed on the stand-in, for driver calls made outside a DeviceContext."""

    def __init__(self, cu):
        self.cu = cu

    def __enter__(self):
        self.cu.depth += 1

    def __exit__(self, *exc):
        self.cu.depth -= 1


def _answers(be, rng):
    x = rng.standard_normal(be.packed.n_in).astype(np.float32)
    y, bad, _ = be.infer(x)
    np.testing.assert_allclose(y, packed_forward(be.packed, x)[0][0], rtol=1e-5, atol=1e-5)
    assert not bad


def test_persistent_kernel_that_cannot_be_resident_is_refused_up_front(fake_fatbin):
    """A persistent kernel with no room left was launched anyway and its grid barrier never
    opened."""
    # 4 SMs, 2 blocks of the kernel an SM (128 registers a thread): two full-grid persistent
    # kernels fill the device. Every backend is made before the first kernel starts
    cu = OccCuda(sm=4, fn={"NUM_REGS": 128})
    rng = np.random.default_rng(0)
    kw = dict(cuda=cu, timeout_ns=5 * 10**9, start=False)
    a = GpuBackend(_wide(1), "persistent", **kw)
    b = GpuBackend(_wide(2), "persistent", **kw)
    third = GpuBackend(_wide(3), "persistent", **kw)
    small = GpuBackend(random_model(rng, [4, 2]), "persistent", **kw)
    try:
        a.start(), b.start()
        assert a.path.grid == b.path.grid == 4 and cu.launches[-1][1] == (4, 1)
        assert a.path.occupancy.blocks_per_sm == 2
        _answers(a, rng), _answers(b, rng)
        launched = len(cu.launches)
        msg = (r"cannot start another persistent GPU kernel: 2 persistent kernel\(s\) already "
               r"run in this process's context on CUDA device 0 \(4 blocks each, 8 blocks "
               r"resident\); this one needs 4 more, and the device holds 8 at once \(2 blocks "
               r"of 256 threads an SM, bounded by registers \(128 a thread, 65536 an SM\), x 4 "
               r"SMs\).*grid barrier.*Close \(stop\) a running persistent GpuBackend.*"
               r"gpu.mode = \"launch\"")
        with pytest.raises(BackendError, match=msg):
            third.start()
        # a one-block (small) model needs a block too: none is left
        with pytest.raises(BackendError, match="needs 1 more"):
            small.start()
        assert len(cu.launches) == launched and cu.depth == 0 and cu.hazards == []
        # the running ones still answer
        _answers(a, rng), _answers(b, rng)
        # stop / close releases its blocks; the memory of a closed one waits for b's kernel
        a_mem = [a.path.d_w, a.path.h_slot.base]
        a.close()
        assert not any(m.freed for m in a_mem) and cu.hazards == []
        # a backend collected without close(): its kernel is stopped first, then the frees
        # held back are made
        del b
        gc.collect()
        assert all(m.freed for m in a_mem)
        d = GpuBackend(_wide(5), "persistent", cuda=cu, timeout_ns=5 * 10**9)
        _answers(d, rng)
        assert B.resident_kernels(cu, 0).running() == [4]
        d.close()
        assert B.resident_kernels(cu, 0).running() == [] and cu.hazards == []
    finally:
        for be in (a, locals().get("b"), third, small, locals().get("d")):
            if be is not None:
                be.close()


def test_launch_path_beside_persistent_kernels_fits_the_room_left(fake_fatbin):
    """The launch grid took every SM beside persistent kernels and could never be all resident."""
    cu = OccCuda(sm=4, fn={"NUM_REGS": 255})            # 1 block an SM: 4 in all
    rng = np.random.default_rng(7)
    kw = dict(cuda=cu, timeout_ns=5 * 10**9)
    with GpuBackend(_wide(1), "launch", max_batch=8, **kw) as lp:
        X = rng.standard_normal((8, 300)).astype(np.float32)
        lp.infer_batch(X)
        assert cu.launches[-1][1] == (4, 1)              # alone: every SM
        small = GpuBackend(random_model(rng, [4, 2]), "persistent", **kw)
        Y, bad, _ = lp.infer_batch(X)
        assert cu.launches[-1][1] == (3, 1) and not bad.any()     # one block is taken
        np.testing.assert_allclose(Y, packed_forward(lp.packed, X)[0], rtol=1e-5, atol=1e-5)
        small.close()
        lp.infer_batch(X)
        assert cu.launches[-1][1] == (4, 1)
        big = GpuBackend(_wide(2), "persistent", **kw)   # all 4 blocks
        try:
            n = len(cu.launches)
            with pytest.raises(BackendError, match=r"launch path cannot run: the 1 persistent "
                                                   r"kernel\(s\) .* hold 4 blocks.*close"):
                lp.infer(X[0])
            assert len(cu.launches) == n and not lp.path._inflight and cu.depth == 0
        finally:
            big.close()
        lp.infer(X[0])


def test_start_refused_after_another_took_the_room_holds_nothing(fake_fatbin):
    # PersistentPath.start() directly: refused when another path took the room after this
    # one was made (the second decision), and then it holds no blocks
    cu = OccCuda(sm=4, fn={"NUM_REGS": 255})            # 1 block an SM: one full grid fits
    with _pushed(cu):
        mod = cu.module_from_buffer(b"")
    from fastpath.gpu._pack import pack
    dc = B.DeviceContext(cu, 0)
    p1 = B.PersistentPath(dc, mod, pack(_wide(1).layers), 5 * 10**9)
    p2 = B.PersistentPath(dc, mod, pack(_wide(2).layers), 5 * 10**9)
    p1.start()
    try:
        with pytest.raises(BackendError, match=r"1 persistent kernel\(s\) already run.*needs "
                                               r"4 more, and the device holds 4 at once"):
            p2.start()
        assert not p2.running and dc.resident.running() == [4]
        # and a third is refused before it allocates anything
        n = len(cu.mem.blocks)
        with pytest.raises(BackendError, match=r"cannot set up a persistent GPU path while 1 "
                                               r"persistent kernel\(s\) run"):
            B.PersistentPath(dc, mod, pack(_wide(3).layers), 5 * 10**9)
        assert len(cu.mem.blocks) == n and cu.depth == 0
    finally:
        p1.close()
    assert dc.resident.running() == []
    p2.start()
    p2.close()
    assert dc.resident.running() == []


def test_residency_is_per_device_context_not_per_backend(fake_fatbin):
    # two stand-in drivers are two processes' worth of contexts; one driver's device 0 is
    # one context whoever opens it
    cu1, cu2 = OccCuda(sm=4, fn={"NUM_REGS": 255}), OccCuda(sm=4, fn={"NUM_REGS": 255})
    assert B.resident_kernels(cu1, 0) is B.resident_kernels(cu1, 0)
    assert B.resident_kernels(cu1, 0) is not B.resident_kernels(cu2, 0)
    with GpuBackend(_wide(1), "persistent", cuda=cu1, timeout_ns=5 * 10**9), \
            GpuBackend(_wide(2), "persistent", cuda=cu2, timeout_ns=5 * 10**9):
        with pytest.raises(BackendError, match="cannot set up a GPU persistent path while 1 "):
            GpuBackend(_wide(3), "persistent", cuda=cu1, timeout_ns=5 * 10**9)


def test_engine_with_a_persistent_kernel_too_many_says_why(fake_fatbin, monkeypatch):
    # through the engine: backend="gpu" is the refusal, backend="auto" falls back to the CPU
    # and says why
    cu = OccCuda(sm=4, fn={"NUM_REGS": 255})
    _fake_pycuda(monkeypatch, cu)
    from fastpath.gpu import gpu_status
    try:
        m = _wide(1)
        cfg = {"gpu": {"mode": "persistent"}, "engine": {"n_symbols": 2}}
        with fastpath.Engine(m, backend="gpu", config=cfg):
            # while its kernel runs, nothing is allocated beside it (it may wait forever)
            with pytest.raises(BackendError, match="cannot set up a GPU persistent path while"):
                fastpath.Engine(_wide(2), backend="gpu", config=cfg)
            e = fastpath.Engine(_wide(2), backend="auto", config=cfg)
            assert e.backend == "cpu" and "cannot set up a GPU" in e.backend_reason
            e.close()
    finally:
        gpu_status.cache_clear()
