"""Defects found by a hostile read of the GPU backend (fastpath/gpu, csrc/fp_gpu.c), checked
where no GPU is: against the stand-in pycuda driver of tests/test_gpu.py (its "kernels" are
packed_forward and a CPU thread serving the persistent slot) and the protocol's CPU device.
Each test failed on the code before its fix; what only a GPU can show is in bench/gpu_check.py.
"""
import gc
import sys
import threading
import time

import numpy as np
import pytest

import fastpath
from fastpath.errors import BackendError, ConfigError, InputError
from fastpath.gpu import GpuBackend, GpuEngine
from fastpath.gpu import _backend as B
from fastpath.gpu import _protocol as P
from fastpath.gpu._pack import pack, packed_forward

from helpers.builders import random_model, windowed_model
from helpers.fake_cuda import FakeCuda, _fake_pycuda, fake_fatbin  # noqa: F401 - fixture
from helpers.fake_cuda import fake_gpu  # noqa: F401 - fixture

NOCACHE = {"enabled": False}


def _cpu_answers(m, cfg, raws, syms, ts=None):
    cpu = fastpath.Engine(m, backend="cpu", config=cfg)
    return [cpu.step(raws[i], int(syms[i]), ts_ns=None if ts is None else int(ts[i]))
            for i in range(len(raws))]


# --- GpuEngine.step_batch: a refused row ------------------------------------------------------

def test_step_batch_refused_row_does_not_leave_a_launch_in_flight(fake_gpu, isa):
    # stateless features, launch mode, two launches of 4 rows: the features of the second
    # launch were computed while the first was in flight, and a NaN there raised between
    # submit and collect. Before: every later call of this engine was refused with "a batch
    # is already in flight" (step, step_batch): one bad tick disabled the GPU engine for good.
    rng = np.random.default_rng(1)
    m = random_model(rng, [6, 8, 2])
    cfg = {"engine": {"simd": isa, "n_symbols": 2}, "cache": NOCACHE}
    raws = rng.standard_normal((8, 6)).astype(np.float32)
    syms = np.zeros(8, np.int64)
    bad = raws.copy()
    bad[6, 2] = np.nan
    with GpuEngine(m, cfg, mode="launch", max_batch=4) as ge:
        with pytest.raises(InputError, match=r"row 6: raw contains 1 non-finite.*no row was "
                                             r"applied"):
            ge.step_batch(bad, syms)
        assert ge.engine.ticks == 0 and not ge.backend.path._inflight
        got = [ge.step(raws[i], 0).result for i in range(4)]
        got += [g for g in ge.step_batch(raws[4:], syms[4:])]
    want = _cpu_answers(m, cfg, raws, syms)
    for g, w in zip(got, want):
        assert abs(g.signal - w.signal) < 1e-5 and abs(g.confidence - w.confidence) < 1e-5


@pytest.mark.parametrize("mode", ["launch", "persistent"])
def test_step_batch_refused_row_applies_no_row(fake_gpu, mode, isa):
    # windowed features: one tick per symbol per launch. Before: the launches before the bad
    # row's were applied (rows 0..5 here) and the error did not say so; Engine.step_batch
    # checks every row first. Now no row is applied and the engine answers as a fresh one.
    rng = np.random.default_rng(2)
    m = windowed_model(rng, hidden=(12,))
    cfg = {"engine": {"simd": isa, "n_symbols": 2}, "cache": NOCACHE}
    raws = rng.standard_normal((10, 40)).astype(np.float32)
    syms = np.zeros(10, np.int64)
    bad = raws.copy()
    bad[6, 0] = np.inf
    with GpuEngine(m, cfg, mode=mode, max_batch=4, timeout_ns=5 * 10**9) as ge:
        with pytest.raises(InputError, match="row 6.*no row was applied"):
            ge.step_batch(bad, syms, np.arange(10) * 1000)
        assert ge.engine.ticks == 0
        got = ge.step_batch(raws, syms, np.arange(10) * 1000)
    want = _cpu_answers(m, cfg, raws, syms, np.arange(10) * 1000)
    for g, w in zip(got, want):
        assert abs(g.signal - w.signal) < 1e-5, (g, w)


def test_step_batch_time_backwards_within_the_batch_applies_no_row(fake_gpu):
    rng = np.random.default_rng(3)
    m = windowed_model(rng, hidden=(12,))
    cfg = {"engine": {"n_symbols": 3}, "cache": NOCACHE}
    raws = rng.standard_normal((6, 40)).astype(np.float32)
    syms = np.array([0, 1, 0, 2, 1, 0])
    ts = np.array([10, 20, 30, 5, 15, 40])      # row 4: symbol 1 at 15 after its 20
    with GpuEngine(m, cfg, mode="launch") as ge:
        with pytest.raises(InputError, match=r"ts_ns row 4 is 15, before row 1's 20 for symbol "
                                             r"1.*no row was applied"):
            ge.step_batch(raws, syms, ts)
        assert ge.engine.ticks == 0
        # against the engine's state (row 0 before the last applied tick) it is the engine
        # that refuses, and the error says how far the batch went
        ge.step_batch(raws[:1], syms[:1], [100])
        with pytest.raises(InputError, match="no row was applied"):
            ge.step_batch(raws[:2], syms[:2], [50, 60])
        # a row behind the engine's last tick of its symbol is refused before any row goes
        # in, as Engine.step_batch refuses it (it was refused after row 0 was applied)
        with pytest.raises(InputError, match=r"row 1: ts_ns 60 .*no row was applied"):
            ge.step_batch(raws[1:3], syms[1:3], [200, 60])
        assert ge.engine.ticks == 1


@pytest.mark.parametrize("case", ["short symbols", "string symbols", "float symbols",
                                  "short ts", "float64 raws", "wrong width", "1-D raws",
                                  "fortran raws", "negative ts"])
def test_step_batch_bad_arguments_are_input_errors(fake_gpu, case):
    # before: IndexError (short symbols / ts), ValueError (string symbols), a float symbol
    # truncated to an int, a negative ts accepted until its row; nothing says what to pass
    rng = np.random.default_rng(4)
    m = random_model(rng, [6, 8, 2])
    raws = rng.standard_normal((5, 6)).astype(np.float32)
    syms = np.zeros(5, np.int64)
    ts = None
    if case == "short symbols":
        syms = syms[:3]
    elif case == "string symbols":
        syms = np.array(["a"] * 5)
    elif case == "float symbols":
        syms = np.full(5, 0.7)
    elif case == "short ts":
        ts = np.arange(4)
    elif case == "negative ts":
        ts = np.array([1, 2, -3, 4, 5])
    elif case == "float64 raws":
        raws = raws.astype(np.float64)
    elif case == "wrong width":
        raws = rng.standard_normal((5, 7)).astype(np.float32)
    elif case == "1-D raws":
        raws = raws[0]
    elif case == "fortran raws":
        raws = np.asfortranarray(raws)
    with GpuEngine(m, {"engine": {"n_symbols": 2}, "cache": NOCACHE}, mode="launch") as ge:
        with pytest.raises(InputError) as ei:
            ge.step_batch(raws, syms, ts)
        assert ge.engine.ticks == 0
        what = {"short symbols": "symbols must be", "string symbols": "symbols must be",
                "float symbols": "symbols must be", "short ts": "ts_ns must be",
                "negative ts": "ts_ns must be >= 0", "float64 raws": "float32",
                "wrong width": "(n, 6)", "1-D raws": "(n, 6)", "fortran raws": "C-contiguous"}
        assert what[case] in str(ei.value)


def test_step_batch_empty(fake_gpu):
    m = random_model(np.random.default_rng(5), [6, 2])
    with GpuEngine(m, {"cache": NOCACHE}, mode="launch") as ge:
        assert ge.step_batch(np.zeros((0, 6), np.float32), []) == []


# --- closed backends --------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["launch", "persistent"])
def test_closed_gpu_engine_and_backend_are_backend_errors(fake_gpu, mode):
    # before: AttributeError ('NoneType' object has no attribute 'max_batch' / 'infer')
    m = random_model(np.random.default_rng(6), [6, 4, 2])
    ge = GpuEngine(m, {"cache": NOCACHE}, mode=mode, timeout_ns=5 * 10**9)
    ge.close()
    raws = np.ones((2, 6), np.float32)
    with pytest.raises(BackendError, match="closed"):
        ge.step_batch(raws, [0, 0])
    be = GpuBackend(m, mode, cuda=fake_gpu, timeout_ns=5 * 10**9)
    be.close()
    with pytest.raises(BackendError, match="closed"):
        be.infer(np.ones(6, np.float32))
    with pytest.raises(BackendError, match="closed"):
        be.infer_batch(raws)


# --- GpuBackend inputs ------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["launch", "persistent"])
def test_backend_infer_refuses_wrong_widths(fake_gpu, mode):
    # launch mode copied x into the pinned rows with numpy broadcasting: one value was sent
    # as all six features and answered (as if x were np.full(6, v)); a 1-D batch of n_in
    # values (n_in <= max_batch) was sent as n_in copies of itself
    m = random_model(np.random.default_rng(7), [6, 4, 2])
    with GpuBackend(m, mode, max_batch=8, cuda=fake_gpu, timeout_ns=5 * 10**9) as be:
        for x in (np.float32([0.5]), np.ones(7, np.float32), np.ones((1, 6), np.float32)):
            with pytest.raises(InputError, match=r"x must hold the model's 6 features"):
                be.infer(x)
        for X in (np.arange(6, dtype=np.float32), np.ones((3, 1), np.float32),
                  np.ones((2, 7), np.float32)):
            with pytest.raises(InputError, match=r"\(n, 6\)"):
                be.infer_batch(X)
        if mode == "launch":
            with pytest.raises(InputError, match=r"\(n, 6\)"):
                be.path.infer(np.float32([0.5]))
        # still right afterwards
        x = np.linspace(-1, 1, 6).astype(np.float32)
        np.testing.assert_allclose(be.infer(x)[0], packed_forward(be.packed, x)[0][0],
                                   rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["launch", "persistent"])
def test_backend_infer_batch_of_no_rows(fake_gpu, mode):
    # before: ValueError from np.concatenate / reshape
    from fastpath.model import Layer
    rng = np.random.default_rng(8)
    m = [Layer(rng.standard_normal((4, 6)).astype(np.float32), np.zeros(4, np.float32), "relu"),
         Layer(rng.standard_normal((3, 4)).astype(np.float32), np.zeros(3, np.float32))]
    with GpuBackend(m, mode, cuda=fake_gpu, timeout_ns=5 * 10**9) as be:
        Y, bad, ts = be.infer_batch(np.zeros((0, 6), np.float32))
        assert Y.shape == (0, 3) and Y.dtype == np.float32 and bad.shape == (0,) and ts == []


# --- the kernel's 32-bit item count -----------------------------------------------------------

class SmallCuda(FakeCuda):
    """A device with 1 GB: the old code tried the multi-GB scratch of the batch below."""

    def mem_alloc(self, n):
        if n > 1 << 30:
            raise self.Error(f"out of memory ({n} bytes)")
        return super().mem_alloc(n)


def test_max_batch_past_the_kernels_item_count_is_refused(fake_fatbin, fake_gpu):
    # fp_mlp_batch walks batch * width items in an int: 65,536 rows of a 32,768-wide layer
    # is 2**31 items, which wraps negative and skips the layer (the previous launch's
    # outputs come back, flagged fine). gpu.max_batch goes up to 65,536, so refuse it here.
    m = random_model(np.random.default_rng(9), [1, 32768, 2])
    cu = SmallCuda()
    with pytest.raises(ConfigError, match=r"gpu.max_batch = 65536.*1\.\.65504"):
        GpuBackend(m, "launch", max_batch=65536, cuda=cu)
    assert cu.depth == 0 and getattr(cu, "detached", False)
    assert B.max_batch_for(pack(m.layers)) == 65504
    # the persistent path sends one row: nothing to refuse there
    with pytest.raises(ConfigError, match="gpu.max_batch"):
        fastpath.Engine(m, backend="gpu", config={"gpu": {"max_batch": 65536}})


# --- the persistent protocol ------------------------------------------------------------------

def _served(rng, **kw):
    ws = [rng.standard_normal((3, 4)).astype(np.float32)]
    bs = [np.zeros(3, np.float32)]
    dev = P.CpuDevice(ws, bs, ["identity"], "scalar")
    slot = P.Slot.on_buffer(P.aligned_buffer(P.slot_bytes(4, 3)), 4, 3)
    t = threading.Thread(target=dev.serve, args=(slot,), kwargs=kw, daemon=True)
    t.start()
    assert slot.wait_ready(P.READY_RUNNING, 5 * 10**9) == P.OK
    return dev, slot, t


def test_request_to_a_device_loop_that_returned_is_stopped_not_a_wait():
    # the device loop gave up (idle) and returned: before, a request spun out its whole
    # deadline and came back TIMEOUT (a dead kernel looked like a slow one)
    dev, slot, t = _served(np.random.default_rng(10), idle_timeout_ns=10**6)
    assert slot.wait_ready(P.READY_EXITED, 5 * 10**9) == P.OK
    t.join(5)
    out = np.empty(3, np.float32)
    rc, seq, _, _ = slot.request(np.ones(4, np.float32), out, 3 * 10**9)
    assert rc == P.STOPPED and seq == 1


def test_device_loop_returning_while_a_request_waits_ends_the_wait():
    # the loop returns (here: idle, answering nothing) while a request waits on it: the
    # request says STOPPED once the loop has exited instead of spinning to its deadline
    # (request() keeps the GIL: no Python thread can call stop() while it waits, so the
    # loop's own exit is what is staged here)
    dev, slot, t = _served(np.random.default_rng(11), max_answers=0, idle_timeout_ns=2 * 10**8)
    rc = slot.request(np.ones(4, np.float32), np.empty(3, np.float32), 5 * 10**9)[0]
    t.join(5)
    assert rc == P.STOPPED and not t.is_alive()
    assert slot.state["ready"] == P.READY_EXITED


def test_answers_still_arrive_after_the_exit_check():
    # the new exit check must not turn answered requests into STOPPED: many requests, the
    # device slow enough that the host polls (and looks at `ready`) while it computes
    rng = np.random.default_rng(12)
    dev, slot, t = _served(rng, delay_ns=20_000)
    out = np.empty(3, np.float32)
    for i in range(200):
        x = rng.standard_normal(4).astype(np.float32)
        rc, seq, _, _ = slot.request(x, out, 5 * 10**9)
        assert rc == P.OK and seq == i + 1
    slot.stop()
    t.join(5)


def test_persistent_backend_collected_unclosed_stops_its_kernel(fake_gpu):
    # a GpuBackend dropped without close(): its device memory and mapped slot were freed
    # while the persistent kernel still polled them (on a GPU: a kernel spinning on freed
    # memory, or a free that waits forever on it). Now the kernel is stopped first.
    m = random_model(np.random.default_rng(13), [4, 2])
    be = GpuBackend(m, "persistent", cuda=fake_gpu, timeout_ns=5 * 10**9)
    be.infer(np.ones(4, np.float32))
    kernel = fake_gpu.threads[-1]
    assert kernel.is_alive()
    del be
    gc.collect()
    kernel.join(5)
    assert not kernel.is_alive()


def test_persistent_path_stopped_by_close_does_not_stop_again(fake_gpu):
    # close() stops the kernel and detaches the collector's stop: nothing runs twice
    m = random_model(np.random.default_rng(14), [4, 2])
    be = GpuBackend(m, "persistent", cuda=fake_gpu, timeout_ns=5 * 10**9)
    path = be.path
    be.close()
    assert not path._fin.alive and not fake_gpu.threads[-1].is_alive()


# --- bench/gpu_check.py's kernel edge checks ---------------------------------------------------

def test_gpu_check_edges_catch_a_kernel_that_drops_lanes(fake_fatbin, monkeypatch):
    # the edge models exist to catch what the timed models (all widths multiples of 32)
    # cannot: a "kernel" that reads only the first 32 inputs of a row (a lane-stride bug)
    # passes every timed model's shape class but must fail the odd-width edges
    import helpers.fake_cuda as T
    gc_mod = T._gpu_check()
    real = T.packed_forward

    def lane_bug(p, x):
        x = np.array(x, np.float32, copy=True)
        x[..., 32:] = 0
        return real(p, x)
    cu = FakeCuda()
    _fake_pycuda(monkeypatch, cu)
    fails = []

    def attempt(where, fn):
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - what gpu_check records
            fails.append(f"{where}: {exc}")
            return None
    try:
        ok = gc_mod.edge_checks(np.random.default_rng(0), attempt)
        assert not fails and {(tuple(r["dims"]), r["mode"]) for r in ok} >= {
            ((300, 700, 2), "launch"), ((4099, 2), "persistent"), ((4, 3, 2), "launch")}
        assert any(r.get("unclosed_backend_stopped") for r in ok)
        monkeypatch.setattr(T, "packed_forward", lane_bug)
        gc_mod.edge_checks(np.random.default_rng(0), attempt)
    finally:
        T.gpu_status.cache_clear()
    # the batch "kernel" is the one made wrong: the launch path's wide edges fail
    assert any(f.startswith("edge 4099x2, launch") for f in fails), fails
    assert any(f.startswith("edge 300x700x2, launch") for f in fails), fails
    assert not any("persistent" in f for f in fails), fails


# --- no fatbin and no compiler ----------------------------------------------------------------

def test_no_fatbin_and_no_compiler_is_a_backend_error_and_auto_falls_back(fake_gpu, tmp_path,
                                                                          monkeypatch):
    # a host with a driver but no CUDA toolkit, fastpath installed without nvcc (no fatbin):
    # the SourceModule fallback cannot compile. Before: the compiler's own exception (here
    # ModuleNotFoundError: the stand-in pycuda has no compiler; on a real host pycuda's
    # CompileError or an OSError for nvcc) escaped Engine(backend="auto") instead of the CPU
    # being chosen, and backend="gpu" said nothing of what to do.
    absent = str(tmp_path / "absent.fatbin")
    monkeypatch.setattr(B, "FATBIN", absent)
    monkeypatch.setattr(B.load_module, "__defaults__", (absent, None))
    m = random_model(np.random.default_rng(15), [8, 4, 2])
    with pytest.raises(BackendError, match=r"no fatbin was built.*compiling .*fp_mlp.cu at run "
                                           r"time failed.*nvcc"):
        fastpath.Engine(m, backend="gpu")
    assert fake_gpu.depth == 0 and getattr(fake_gpu, "detached", False)
    e = fastpath.Engine(m, backend="auto")
    assert e.backend == "cpu" and "cannot be loaded" in e.backend_reason
    e.step(np.ones(8, np.float32), 0)

    def no_nvcc(src, **kw):
        raise FileNotFoundError(2, "No such file or directory", "nvcc")
    cu = FakeCuda()
    cu.depth = 1
    with pytest.raises(BackendError, match="FileNotFoundError.*nvcc"):
        B.load_module(cu, fatbin=absent, source_module=no_nvcc)


def test_slot_over_existing_memory_must_match_its_widths():
    # Slot(init=False) wraps a slot another party set up; request() checked x / out against
    # the widths given here while the C side copied the slot's own: 4 -> 3 memory wrapped as
    # 2 -> 1 read 16 bytes from a 2-float x and wrote 12 into a 1-float out
    buf = P.aligned_buffer(P.slot_bytes(4, 3))
    P.Slot.on_buffer(buf, 4, 3)
    with pytest.raises(InputError, match=r"set up for 4 -> 3, not 2 -> 1"):
        P.Slot(buf, buf.ctypes.data, 2, 1, init=False)
    s = P.Slot(buf, buf.ctypes.data, 4, 3, init=False)
    assert s.n_in == 4


def test_status_with_a_pycuda_that_breaks_at_import(tmp_path, monkeypatch):
    # a pycuda built against another CUDA or numpy can raise anything at import; before,
    # only ImportError was caught, so gpu_status() and Engine(backend="auto") raised it
    from fastpath.gpu import gpu_status
    pkg = tmp_path / "pycuda"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "driver.py").write_text("raise RuntimeError('CUDA driver version is insufficient "
                                   "for CUDA runtime version')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for k in ("pycuda", "pycuda.driver"):
        monkeypatch.delitem(sys.modules, k, raising=False)
    gpu_status.cache_clear()
    try:
        ok, why = gpu_status()
        assert not ok and "pycuda not importable (RuntimeError: CUDA driver version" in why
        m = random_model(np.random.default_rng(16), [4, 2])
        e = fastpath.Engine(m, backend="auto")
        assert e.backend == "cpu" and "RuntimeError" in e.backend_reason
        with pytest.raises(BackendError, match="not available.*RuntimeError"):
            fastpath.Engine(m, backend="gpu")
    finally:
        gpu_status.cache_clear()
        for k in ("pycuda", "pycuda.driver"):
            sys.modules.pop(k, None)


@pytest.mark.parametrize("bad", [0, -5, float("nan"), True, "1s"])
def test_timeout_must_be_a_positive_number(fake_gpu, bad):
    # before: GpuBackend took 0 / negative timeouts and failed at the first tick (launch:
    # "did not complete within -5e-09 s"; persistent: an InputError from every request),
    # NaN or a string raised ValueError / TypeError; GpuEngine turned 0 and negatives into
    # 1 ms without a word
    m = random_model(np.random.default_rng(17), [4, 2])
    for mode in ("launch", "persistent"):
        with pytest.raises(ConfigError, match="timeout_ns must be a number of ns >= 1"):
            GpuBackend(m, mode, cuda=fake_gpu, timeout_ns=bad)
        with pytest.raises(ConfigError, match="timeout_ns must be a number of ns >= 1"):
            GpuEngine(m, None, mode=mode, timeout_ns=bad)
    assert not fake_gpu.launches
    with GpuBackend(m, "launch", cuda=fake_gpu, timeout_ns=1.5e9) as be:   # a float is fine
        assert be.path.timeout_ns == 1_500_000_000
