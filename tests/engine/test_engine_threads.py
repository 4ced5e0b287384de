"""Threads, re-entrancy and lifetimes: the default engine replaced while a tick runs on it, two
first callers of fastpath.step(), a server stopped from two threads, one engine stepped from
several threads. Every wait is bounded (Event.wait / join with a timeout, then an assert that
the thread finished); a test that could crash the interpreter runs in a subprocess. Each test
marked as a regression failed on the code before its fix.
"""
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import fastpath
import fastpath._build as _build
from fastpath import EngineBusyError, Engine
from fastpath._build import DEMO_MODEL

from helpers.builders import windowed_model
from helpers.fake_cuda import FakeCuda, _fake_pycuda
from helpers.fake_cuda import fake_fatbin  # noqa: F401 - fixture

WAIT = 10.0     # seconds any wait of these tests may take before the test fails instead of hanging


def _raw(seed=0, n=256):
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


def _run(fn, *args):
    """fn(*args) in a thread; -> (thread, box) where box gets "r" or "e"."""
    box = {}

    def body():
        try:
            box["r"] = fn(*args)
        except BaseException as exc:        # reported by the test, in its own thread
            box["e"] = exc
    t = threading.Thread(target=body, daemon=True)
    t.start()
    return t, box


@pytest.fixture
def restore_default():
    """The default engine as it was, after the test (these tests replace it)."""
    yield
    fastpath.set_default_engine(None)


# ------------------------------------------------------------ the default engine's lifetime

_UAF_SCRIPT = textwrap.dedent("""
    import gc, threading
    import numpy as np
    import fastpath
    from fastpath._build import DEMO_MODEL
    raw = np.linspace(-1, 1, 256, dtype=np.float32)
    ref = fastpath.Engine(DEMO_MODEL).step(raw, 0, ts_ns=1000)
    # the default engine is referenced by nothing but the module (as after fastpath.configure())
    fastpath.set_default_engine(fastpath.Engine(DEMO_MODEL))
    inside, resume = threading.Event(), threading.Event()

    class Sym:
        # a strategy's own symbol type: its __index__ is Python code, where threads switch
        def __index__(self):
            inside.set()
            resume.wait(10)
            return 0

    box = {}
    def strategy():
        try:
            box["r"] = fastpath.step(raw, Sym(), 1000)
        except BaseException as exc:
            box["e"] = exc
    t = threading.Thread(target=strategy)
    t.start()
    assert inside.wait(10)
    # a control thread reconfigures while the strategy's tick is inside step()
    fastpath.set_default_engine(fastpath.Engine(DEMO_MODEL))
    gc.collect()
    junk = [np.full(4096, 7.0, np.float32) for _ in range(200)]   # reuse freed memory
    resume.set()
    t.join(10)
    assert not t.is_alive()
    r = box.get("r")
    assert r is not None, box
    assert (r.signal, r.confidence) == (ref.signal, ref.confidence), (r, ref)
    print("OK")
""")


def test_default_engine_replaced_during_step_is_not_freed_under_it():
    """Regression: fastpath.step() called the default engine's tick on the module's borrowed
    reference; configure() / set_default_engine() from another thread while the tick ran
    Python code (a symbol's __index__) freed the engine, and the tick ran on freed memory:
    a segfault (or a signal read from reused memory). Now the tick completes on the engine it
    started on, with a fresh engine's answer."""
    p = subprocess.run([sys.executable, "-c", _UAF_SCRIPT], capture_output=True, text=True,
                       timeout=60, cwd=os.path.dirname(__file__))
    assert p.returncode == 0 and "OK" in p.stdout, (p.returncode, p.stdout, p.stderr[-2000:])


class _SlowBuild:
    """fastpath._build.default_engine held at its start until released, counting builds."""

    def __init__(self):
        self.calls = 0
        self.inside = threading.Event()
        self.release = threading.Event()
        self._orig = _build.default_engine

    def __call__(self):
        self.calls += 1
        self.inside.set()
        assert self.release.wait(WAIT)
        return self._orig()


def test_engine_set_while_default_builds_is_not_replaced(monkeypatch, restore_default):
    """Regression: the first fastpath.step() builds the demo engine (milliseconds of Python
    code); a configure() / set_default_engine() from a control thread meanwhile was then
    overwritten by the demo engine, and every later step() ran the demo model instead of
    the configured one. Now the engine set meanwhile stays, and the first tick goes to it."""
    slow = _SlowBuild()
    monkeypatch.setattr(_build, "default_engine", slow)
    fastpath.set_default_engine(None)
    mine = Engine(DEMO_MODEL)
    raw = _raw(1)
    t, box = _run(fastpath.step, raw, 0, 1000)
    assert slow.inside.wait(WAIT)
    fastpath.set_default_engine(mine)
    slow.release.set()
    t.join(WAIT)
    assert not t.is_alive()
    assert "e" not in box, box
    assert fastpath.get_default_engine() is mine
    assert mine.ticks == 1
    ref = Engine(DEMO_MODEL).step(raw, 0, 1000)
    assert (box["r"].signal, box["r"].confidence) == (ref.signal, ref.confidence)


def test_two_first_callers_share_one_default_engine(monkeypatch, restore_default):
    """Regression: two threads making the first fastpath.step() calls each built a demo
    engine and the second replaced the first: the tick stepped on the first was lost (its
    window, cache and counters gone with that engine). Now one engine is built and both
    ticks are on it."""
    slow = _SlowBuild()
    monkeypatch.setattr(_build, "default_engine", slow)
    fastpath.set_default_engine(None)
    runs = [_run(fastpath.step, _raw(s), s, 1000) for s in (0, 1)]
    assert slow.inside.wait(WAIT)
    # the second caller reaches get_default_engine while the first builds (it waits for the
    # build under the fix; before it, it started a build of its own)
    others = [t for t, _ in runs]
    deadline = threading.Event()
    deadline.wait(0.2)
    slow.release.set()
    for t in others:
        t.join(WAIT)
        assert not t.is_alive()
    for _, box in runs:
        assert "e" not in box, box
    assert slow.calls == 1
    assert fastpath.get_default_engine().ticks == 2


# ------------------------------------------------------------ one engine, several threads

def _batch(rng, n, syms, t0=1000):
    raws = rng.standard_normal((n, 256)).astype(np.float32)
    symbols = np.asarray([syms[i % len(syms)] for i in range(n)], np.int32)
    ts = t0 + np.arange(n, dtype=np.int64) * 1000
    return raws, symbols, ts


def test_threads_on_one_engine_serialize_or_refuse_cleanly():
    """A thread stepping batches (symbols 0-3) and a thread stepping ticks and reading stats
    (symbols 4-7) on one engine: every call either runs whole or raises EngineBusyError
    having changed nothing, so the engine ends as a single-threaded replay of the calls that
    succeeded (symbols do not share state; the order between the two threads' symbols does
    not matter)."""
    cfg = {"engine": {"n_symbols": 8}}
    eng = Engine(DEMO_MODEL, config=cfg)
    rng = np.random.default_rng(7)
    batches = [_batch(rng, 2000, (0, 1, 2, 3), 1000 + k * 10_000_000) for k in range(6)]
    ticks = [(_raw(100 + i), 4 + i % 4, 1000 + i * 1000) for i in range(3000)]
    done_b, done_t = [], []
    busy = {"n": 0}

    def batcher():
        for b in batches:
            while True:
                try:
                    done_b.append((b, eng.step_batch(*b)))
                    break
                except EngineBusyError:
                    busy["n"] += 1

    def ticker():
        for raw, s, ts in ticks:
            while True:
                try:
                    done_t.append(eng.step(raw, s, ts))
                    eng.stats()
                    break
                except EngineBusyError:
                    busy["n"] += 1
    t1, b1 = _run(batcher)
    t2, b2 = _run(ticker)
    for t in (t1, t2):
        t.join(WAIT * 3)
        assert not t.is_alive()
    assert "e" not in b1 and "e" not in b2, (b1, b2)
    ref = Engine(DEMO_MODEL, config=cfg)
    for b, got in done_b:
        want = ref.step_batch(*b)
        np.testing.assert_array_equal(got.signal, want.signal)
        np.testing.assert_array_equal(got.cached, want.cached)
    for (raw, s, ts), got in zip(ticks, done_t):
        want = ref.step(raw, s, ts)
        assert (got.signal, got.confidence, got.cached) == (want.signal, want.confidence,
                                                            want.cached)
    assert eng.ticks == ref.ticks == 6 * 2000 + 3000
    probe = _raw(999)
    for s in range(8):
        a, b = eng.step(probe, s, 10**12), ref.step(probe, s, 10**12)
        assert (a.signal, a.confidence, a.cached) == (b.signal, b.confidence, b.cached)


# ------------------------------------------------------------ the serving loop

def test_server_stopped_from_two_threads(tmp_path):
    """Regression: Server.stop() from two threads at once (a control thread and a `with`
    exit, or the exit hook) both went on to close the worker: one raised AttributeError
    ('NoneType' object has no attribute 'close' / 'stats') or ServeError "is closed". Now
    one closes and the other returns; final_stats is kept."""
    errs = []
    for i in range(5):
        srv = fastpath.serve(f"fp-h22t-stop2-{os.getpid()}-{i}",
                             config={"serve": {"place": False}})
        gate = threading.Barrier(2, timeout=WAIT)

        def stopper():
            gate.wait()
            try:
                srv.stop()
            except BaseException as exc:
                errs.append(repr(exc))
        ts = [threading.Thread(target=stopper, daemon=True) for _ in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(WAIT)
            assert not t.is_alive()
        assert not srv.running
        assert srv.final_stats is not None and srv.stats() == srv.final_stats
        assert not os.path.exists(srv.path)
    assert errs == []


def test_server_start_interrupted_leaves_no_server(monkeypatch):
    """Regression: Ctrl-C while fastpath.serve() waited for its thread to start (placement
    can take a while) raised KeyboardInterrupt, but the thread went on to run the loop: a
    server serving under the name with no handle to stop it, its segment left in /dev/shm
    at exit. Now the interrupted start is given up as a timed-out one is: the thread ends
    and the segment is removed."""
    import _thread

    from fastpath._serve import segment_path
    from fastpath.serving import server as S
    placing, release = threading.Event(), threading.Event()

    def slow_place(self):
        placing.set()
        assert release.wait(WAIT)
        return {"placed": False, "why": "test"}
    monkeypatch.setattr(S.Server, "_place", slow_place)
    monkeypatch.setattr(S, "_START_JOIN_S", 0.1)

    def interrupter():
        if placing.wait(WAIT):
            _thread.interrupt_main()
    threading.Thread(target=interrupter, daemon=True).start()
    name = f"fp-h22t-intr-{os.getpid()}"
    with pytest.raises(KeyboardInterrupt):
        try:
            fastpath.serve(name, config={"serve": {"place": True}})
        finally:
            release.set()
    th = [t for t in threading.enumerate() if t.name == f"fastpath-serve:{name}"]
    for t in th:
        t.join(5.0)
        assert not t.is_alive(), "the interrupted server's loop is still running"
    assert not os.path.exists(segment_path(name))


def test_fork_while_default_engine_builds_does_not_deadlock_the_child(restore_default):
    """The default engine is built under a lock (above); a fork while another thread held it
    (a pool forking while a strategy thread makes its first step()) must not leave the
    child's first fastpath.step() waiting on a lock nobody will release."""
    import fastpath._engine as E
    fastpath.set_default_engine(None)
    raw = _raw(3)
    held, release = threading.Event(), threading.Event()

    def builder():                      # another thread inside the build at the fork
        with E._default_lock:
            held.set()
            release.wait(WAIT)
    t = threading.Thread(target=builder, daemon=True)
    t.start()
    assert held.wait(WAIT)
    try:
        pid = os.fork()
        if pid == 0:                    # the child: one tick, then leave without cleanup
            try:
                fastpath.step(raw, 0, 1000)
                os._exit(0)
            except BaseException:
                os._exit(3)
    finally:
        release.set()
        t.join(WAIT)
    import time
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.01)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child's first fastpath.step() hung on the default engine's lock")
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status


def test_keyboard_interrupt_around_step_batch_leaves_the_rows_it_says():
    """Ctrl-C while step_batch runs: the engine holds exactly the rows the KeyboardInterrupt's
    .applied says (step_batch takes the GIL back between pieces of ~50 ms to let it in;
    review 23: it used to be seen only once the whole batch had gone in), their answers in
    .result; or all of the batch when the interrupt came after the call. It is not left
    busy, and answers the next tick as a single-threaded replay of those rows does."""
    import _thread
    eng = Engine(DEMO_MODEL)
    rng = np.random.default_rng(5)
    raws, syms, ts = _batch(rng, 100_000, (0,))
    timer = threading.Timer(0.01, _thread.interrupt_main)
    timer.start()
    k = None
    try:
        eng.step_batch(raws, syms, ts)
    except KeyboardInterrupt as exc:
        k = exc.applied
        assert len(exc.result.signal) == k
    finally:
        timer.join(WAIT)
    if k is None:                   # the interrupt came after the call: take it here
        try:
            threading.Event().wait(1.0)
        except KeyboardInterrupt:
            pass
        k = len(raws)
    assert eng.ticks == k
    eng.stats()                     # not busy
    ref = Engine(DEMO_MODEL)
    if k:
        ref.step_batch(raws[:k], syms[:k], ts[:k])
    probe = _raw(11)
    a, b = eng.step(probe, 0, 10**12), ref.step(probe, 0, 10**12)
    assert (a.signal, a.confidence, a.cached) == (b.signal, b.confidence, b.cached)


def test_client_used_from_a_second_thread_is_refused():
    from fastpath.errors import ServeError
    name = f"fp-h22t-cli-{os.getpid()}"
    with fastpath.serve(name, config={"serve": {"place": False}}):
        c = fastpath.connect(name)
        try:
            raw = _raw(4)
            c.step(raw, 0)
            t, box = _run(c.step, raw, 0)
            t.join(WAIT)
            assert not t.is_alive()
            assert isinstance(box.get("e"), ServeError), box
        finally:
            c.close()


def test_gpu_engine_batch_refuses_another_threads_tick_meanwhile(monkeypatch, fake_fatbin):
    from fastpath.gpu import GpuEngine, gpu_status
    _fake_pycuda(monkeypatch, FakeCuda())
    try:
        rng = np.random.default_rng(2)
        m = windowed_model(rng, hidden=(16,))
        cfg = {"engine": {"n_symbols": 2}, "cache": {"enabled": False}}
        raws = rng.standard_normal((6, 40)).astype(np.float32)
        syms = np.zeros(6, np.int64)
        other = rng.standard_normal(40).astype(np.float32)
        with GpuEngine(m, cfg, mode="launch") as ge:
            path = ge.backend.path
            collect = path.collect
            seen = {}

            def collect_with_a_tick_meanwhile():
                # what another thread's step() can do while this one waits for the GPU
                if "e" not in seen:
                    def tick():
                        try:
                            ge.engine.step(other, 0, 10**6)
                            seen["e"] = None
                        except Exception as exc:      # the engine's answer, judged below
                            seen["e"] = exc
                    t = threading.Thread(target=tick)
                    t.start()
                    t.join(WAIT)
                    assert not t.is_alive()
                return collect()
            monkeypatch.setattr(path, "collect", collect_with_a_tick_meanwhile)
            ge.step_batch(raws, syms, np.arange(6, dtype=np.int64) * 10**7)
        assert isinstance(seen.get("e"), EngineBusyError), seen
    finally:
        gpu_status.cache_clear()
