"""The default engine behind fastpath.step() under threads and fork: replaced while a tick runs
on it, set while the first call builds it, built once for two first callers, and a fork while
it builds. Every wait is bounded; a test that could crash the interpreter runs in a
subprocess."""
import os
import subprocess
import sys
import textwrap
import threading

import pytest

import fastpath
import fastpath._build as _build
from fastpath import Engine
from fastpath._build import DEMO_MODEL
from helpers.threads import WAIT, raw_tick as _raw, run_in_thread as _run


@pytest.fixture
def restore_default():
    """The default engine as it was, after the test (these tests replace it)."""
    yield
    fastpath.set_default_engine(None)


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
    """Defect guarded: configure() / set_default_engine() from another thread during
    fastpath.step() freed the default engine while its tick ran on it (use after free); the tick
    completes on the engine it started on."""
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
    """Defect guarded: an engine set by configure() / set_default_engine() while the first
    fastpath.step() built the demo engine was overwritten by the demo engine; the engine set
    meanwhile stays and gets the first tick."""
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
    """Defect guarded: two threads making the first fastpath.step() calls each built a default
    engine and the first tick was lost with the replaced one; one engine is built and both ticks
    are on it."""
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


def test_fork_while_default_engine_builds_does_not_deadlock_the_child(restore_default):
    """The default engine is built under a lock (above); a fork while another thread held it
    (a pool forking while a strategy thread makes its first step()) must not leave the
    child's first fastpath.step() waiting on a lock nobody will release."""
    import fastpath._default as D
    fastpath.set_default_engine(None)
    raw = _raw(3)
    held, release = threading.Event(), threading.Event()

    def builder():                      # another thread inside the build at the fork
        with D._default_lock:
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
