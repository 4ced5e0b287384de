"""Defects of the GPU backend and the config found in review, checked where no GPU is: the
persistent kernels' co-residency (a stand-in driver that reports the device's and the kernel's
occupancy attributes), the launch path's refusal tag at its wrap, and numpy numbers for the
config's numeric keys. Each test failed on the code before its fix.
"""
import gc
import types

import numpy as np
import pytest

import fastpath
from fastpath.control.config import (CacheConfig, EngineConfig, GpuConfig, PlacementConfig,
                                     ServeConfig, load_config)
from fastpath.errors import BackendError, ConfigError
from fastpath.gpu import GpuBackend, GpuEngine
from fastpath.gpu import _backend as B
from fastpath.gpu._pack import packed_forward

from helpers.builders import random_model
from helpers.fake_cuda import FakeCuda, FakeFunction, FakeModule, _fake_pycuda, _gpu_check
from helpers.fake_cuda import fake_fatbin  # noqa: F401 - fixture
from helpers.fake_cuda import OccCuda, OccFunction, _wide  # noqa: F401


# --- 1. persistent kernels that cannot all be resident ---------------------------------------

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
    # 4 SMs, 2 blocks of the kernel an SM (128 registers a thread): two full-grid persistent
    # kernels fill the device. Before, the third was launched anyway: on a GPU its blocks
    # never all became resident and its grid barrier never opened (a timeout, later, that
    # said nothing of why). Now it is refused before anything is allocated or launched.
    cu = OccCuda(sm=4, fn={"NUM_REGS": 128})
    rng = np.random.default_rng(0)
    kw = dict(cuda=cu, timeout_ns=5 * 10**9)
    a = GpuBackend(_wide(1), "persistent", **kw)
    b = GpuBackend(_wide(2), "persistent", **kw)
    try:
        assert a.path.grid == b.path.grid == 4 and cu.launches[-1][1] == (4, 1)
        assert a.path.occupancy.blocks_per_sm == 2
        _answers(a, rng), _answers(b, rng)
        launched, allocs = len(cu.launches), len(cu.mem.blocks)
        msg = (r"cannot start another persistent GPU kernel: 2 persistent kernel\(s\) already "
               r"run in this process's context on CUDA device 0 \(4 blocks each, 8 blocks "
               r"resident\); this one needs 4 more, and the device holds 8 at once \(2 blocks "
               r"of 256 threads an SM, bounded by registers \(128 a thread, 65536 an SM\), x 4 "
               r"SMs\).*grid barrier.*Close \(stop\) a running persistent GpuBackend.*"
               r"gpu.mode = \"launch\"")
        with pytest.raises(BackendError, match=msg):
            GpuBackend(_wide(3), "persistent", **kw)
        # a one-block (small) model needs a block too: none is left
        with pytest.raises(BackendError, match="needs 1 more"):
            GpuBackend(random_model(rng, [4, 2]), "persistent", **kw)
        assert len(cu.launches) == launched and len(cu.mem.blocks) == allocs
        assert cu.depth == 0
        # the running ones still answer
        _answers(a, rng), _answers(b, rng)
        # stop / close releases its blocks: the refused one now starts
        a.close()
        c = GpuBackend(_wide(3), "persistent", **kw)
        _answers(c, rng)
        # so does a backend collected without close() (its kernel is stopped first)
        del b
        gc.collect()
        d = GpuBackend(_wide(5), "persistent", **kw)
        _answers(d, rng)
        assert B.resident_kernels(cu, 0).running() == [4, 4]
        c.close(), d.close()
        assert B.resident_kernels(cu, 0).running() == []
    finally:
        for be in (a, locals().get("b"), locals().get("c"), locals().get("d")):
            if be is not None:
                be.close()


def test_launch_path_beside_persistent_kernels_fits_the_room_left(fake_fatbin):
    # the launch kernel's grid barrier needs its blocks resident as well: beside persistent
    # kernels that hold blocks for good, a grid of every SM could never all be resident (a
    # timeout, and a kernel left spinning in the context). Now its grid takes the room left,
    # and none left is a BackendError before anything is queued.
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
        with pytest.raises(BackendError, match="cannot start another persistent"):
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
        with pytest.raises(BackendError, match="cannot start another"):
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
            with pytest.raises(BackendError, match="cannot start another persistent"):
                fastpath.Engine(_wide(2), backend="gpu", config=cfg)
            e = fastpath.Engine(_wide(2), backend="auto", config=cfg)
            assert e.backend == "cpu" and "cannot start another persistent" in e.backend_reason
            e.close()
    finally:
        gpu_status.cache_clear()


def test_gpu_check_residency_section_on_the_stand_in(fake_fatbin, monkeypatch):
    # bench/gpu_check.py starts persistent paths until one is refused: the refusal must come
    # at the count the occupancy says, each running one answering, and never as a timeout
    cu = OccCuda(sm=4, fn={"NUM_REGS": 128})            # 2 full grids fit
    _fake_pycuda(monkeypatch, cu)
    from fastpath.gpu import gpu_status
    try:
        gc_mod = _gpu_check()
        r = gc_mod.residency_check(np.random.default_rng(0))
    finally:
        gpu_status.cache_clear()
    assert r["started"] == 2 and r["expected"] == 2 and r["blocks_each"] == 4
    assert r["device_holds_blocks"] == 8 and "cannot start another" in r["refusal"]
    assert r["refused_after_s"] < 5
    assert r["room_blocks"] == 0 and r["launch_beside"].startswith("refused: the GPU launch")
    assert B.resident_kernels(cu, 0).running() == [] and cu.depth == 0

    # a "device" where the third kernel is accepted but never comes up (the old behaviour:
    # no refusal, a timeout) is a failure of the check, not a pass
    monkeypatch.setattr(B.ResidentKernels, "_refusal", lambda self, *a: None)
    cu = OccCuda(sm=4, fn={"NUM_REGS": 128}, kernel_mode="ok")
    _fake_pycuda(monkeypatch, cu)
    real = FakeFunction.prepared_async_call
    started = []

    def third_never_starts(self, grid, block, stream, *args):
        if self.name == "fp_mlp_persistent":
            started.append(1)
            if len(started) > 2:
                return
        return real(self, grid, block, stream, *args)
    monkeypatch.setattr(FakeFunction, "prepared_async_call", third_never_starts)
    try:
        with pytest.raises(AssertionError, match="not refused up front.*did not start"):
            gc_mod.residency_check(np.random.default_rng(0), timeout_ns=2 * 10**8)
    finally:
        gpu_status.cache_clear()


# --- 2. the launch path's refusal tag at its wrap ---------------------------------------------

def test_launch_refusal_tag_wrap_does_not_flag_a_clean_row(fake_fatbin):
    # status[s] == tag marks a refused row and status is never cleared; the tag ran
    # 1..2**31-1 and started again at 1, so a row refused at tag 1 read as refused again
    # 2**31-1 launches later (the CPU recompute made the answer right, the flag and the
    # count wrong). Here the counter is set near the wrap instead of launching 2**31 times.
    m = random_model(np.random.default_rng(6), [4, 3, 2], ["relu", "identity"])
    cu = OccCuda()
    with GpuBackend(m, "launch", max_batch=4, cuda=cu) as be:
        w = cu.mem.view(int(be.path.d_w), np.float32, 1)
        w[0] = 3e38
        big = np.full(4, 1e38, np.float32)
        clean = np.zeros(4, np.float32)
        assert be.infer(big)[1] is True                # tag 1: status[0] = 1
        be.path._tag = 2**31 - 2
        assert be.infer(clean)[1] is False             # tag 2**31 - 1
        assert be.infer(clean)[1] is False             # the wrap: tag 1 again
        Y, bad, _ = be.infer_batch(np.stack([clean, big, clean]))
        assert bad.tolist() == [False, True, False]    # a refusal after the wrap still shows
        assert be.path._tag == 2 and cu.depth == 0


def test_step_batch_across_the_tag_wrap_flags_only_refused_rows(fake_fatbin, monkeypatch):
    # GpuEngine.step_batch recomputes a flagged row on the CPU: the answers were right
    # across the wrap, but each wrongly flagged row cost a CPU forward. Count them.
    cu = OccCuda()
    _fake_pycuda(monkeypatch, cu)
    from fastpath.gpu import gpu_status
    import fastpath.gpu as G
    calls = []
    real = G._cpu_outputs
    monkeypatch.setattr(G, "_cpu_outputs", lambda *a: calls.append(1) or real(*a))
    try:
        rng = np.random.default_rng(3)
        m = random_model(rng, [6, 8, 2])
        cfg = {"engine": {"n_symbols": 2}, "cache": {"enabled": False}}
        raws = rng.standard_normal((8, 6)).astype(np.float32)
        syms = np.zeros(8, np.int64)
        with GpuEngine(m, cfg, mode="launch", max_batch=8) as ge:
            path = ge.backend.path
            # a refusal left at rows 0..7 from tag 1, as an overflow 2**31 - 1 launches ago
            cu.mem.view(int(path.d_st), np.int32, 8)[:] = 1
            path._tag = 2**31 - 1
            got = ge.step_batch(raws, syms)
        assert calls == []                  # before: all 8 rows recomputed on the CPU
        cpu = fastpath.Engine(m, backend="cpu", config=cfg)
        for g, r in zip(got, raws):
            assert abs(g.signal - cpu.step(r, 0).signal) < 1e-5
    finally:
        gpu_status.cache_clear()


# --- 3. numpy numbers for the config's numeric keys -------------------------------------------

NP_INTS = [np.int64, np.int32, np.uint16, np.int8]


@pytest.mark.parametrize("t", NP_INTS, ids=lambda t: t.__name__)
def test_numpy_integers_are_ints_in_every_section(t):
    # before: ConfigError "engine.n_symbols must be int, got int64 8" for a value taken from
    # an array (len of a numpy array is an int, but np.unique(...).size, arr.max() + 1 are not)
    d = {"engine": {"n_symbols": t(8), "latency_records": t(64)},
         "serve": {"ring_slots": t(64), "max_clients": t(2), "heartbeat_ms": t(2),
                   "dead_after_ms": t(20), "stall_timeout_ms": t(100)},
         "gpu": {"device": t(0), "max_batch": t(64), "timeout_ms": t(5)},
         "placement": {"core": t(0), "priority": t(10)},
         "cache": {"max_run": t(3), "max_age_ns": t(100)}}
    c = EngineConfig.from_dict(d)
    assert (c.n_symbols, c.latency_records) == (8, 64)
    assert (c.serve.ring_slots, c.gpu.max_batch, c.placement.core, c.cache.max_run) == (
        64, 64, 0, 3)
    # the config holds plain Python ints, whatever it was given
    for v in (c.n_symbols, c.latency_records, c.serve.ring_slots, c.serve.max_clients,
              c.gpu.device, c.gpu.max_batch, c.gpu.timeout_ms, c.placement.core,
              c.placement.priority, c.cache.max_run, c.cache.max_age_ns):
        assert type(v) is int, (v, type(v))
    assert load_config(d) == c
    # the keyword API
    e = EngineConfig(n_symbols=t(8), gpu={"max_batch": t(16)}, serve=ServeConfig(mode=0o600))
    assert type(e.n_symbols) is int and type(e.gpu.max_batch) is int
    assert type(GpuConfig(device=t(1)).device) is int
    assert type(PlacementConfig(core=t(3)).core) is int


def test_numpy_integer_config_runs_an_engine(isa):
    m = random_model(np.random.default_rng(4), [6, 8, 2])
    n = np.int64(np.arange(3).max() + 1)
    e = fastpath.Engine(m, config={"engine": {"n_symbols": n, "simd": isa}})
    assert e.n_symbols == 3
    e.step(np.ones(6, np.float32), 2)
    e.close()


@pytest.mark.parametrize("bad, what", [
    (np.bool_(True), "bool"), (True, "bool"), (np.float64(8.0), "float64"),
    (np.float32(8), "float32"), (8.0, "float"), ("8", "str"),
])
def test_numpy_bools_and_floats_are_still_refused_for_int_keys(bad, what):
    with pytest.raises(ConfigError, match=rf"engine.n_symbols must be int, got {what}"):
        EngineConfig(n_symbols=bad)
    with pytest.raises(ConfigError, match=r"gpu.max_batch must be int"):
        load_config({"gpu": {"max_batch": bad}})
    with pytest.raises(ConfigError, match=r"must be int|CPU number"):
        PlacementConfig(core=bad) if what != "str" else PlacementConfig(priority=bad)


def test_numpy_integers_keep_their_range_checks():
    with pytest.raises(ConfigError, match=r"engine.n_symbols must be in \[1, 4194304\], got 0"):
        EngineConfig(n_symbols=np.int64(0))
    with pytest.raises(ConfigError, match="power of two"):
        EngineConfig(latency_records=np.int64(100))
    # the octal hint for file permissions reads a numpy integer too
    with pytest.raises(ConfigError, match=r"permissions are octal: write 0o600"):
        ServeConfig(mode=np.int64(600))
    assert ServeConfig(mode=np.int64(0o640)).mode == 0o640


def test_numpy_floats_for_float_keys():
    # np.float64 is a float subclass and was accepted; np.float32 (a model's own dtype) and
    # numpy integers for a float key were refused
    c = EngineConfig(cache={"cos_threshold": np.float32(0.5), "norm_tol": np.int64(1),
                            "enabled": True})
    assert c.cache.cos_threshold == 0.5 and type(c.cache.cos_threshold) is float
    assert c.cache.norm_tol == 1.0
    assert type(CacheConfig(norm_tol=np.float16(0.25)).norm_tol) is float
    with pytest.raises(ConfigError, match=r"cache.cos_threshold must be in \[-1.0, 1.0\]"):
        EngineConfig(cache={"cos_threshold": np.float32(2)})
    with pytest.raises(ConfigError, match="must be a number, got NaN"):
        EngineConfig(cache={"norm_tol": np.float32("nan")})
    with pytest.raises(ConfigError, match="cache.cos_threshold must be float"):
        EngineConfig(cache={"cos_threshold": np.bool_(True)})
    # and the policy in force is built from plain floats
    m = random_model(np.random.default_rng(5), [6, 8, 2])
    e = fastpath.Engine(m, config={"cache": {"cos_threshold": np.float32(0.75)}})
    e.close()
