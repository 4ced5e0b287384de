"""bench/scaling.py and bench/serve.py call step() from the timing loop itself, not through a
lambda (which would add a Python call a caller of step() does not make): checked by the caller
of each step() call, the function that reads the clock.
"""

import os
import shutil
import sys


import fastpath

from helpers.bench_scripts import bench_on_path


bench_on_path()


def _recording(real, callers):
    """A stand-in for a class (fastpath.Engine) or factory whose step() records the code of the
    function that called it (Engine is a cdef class: not subclassable)."""
    class Recorder:
        def __init__(self, *a, **k):
            self._o = real(*a, **k)

        def step(self, *a, **k):
            callers.append(sys._getframe(1).f_code)
            return self._o.step(*a, **k)

        def __getattr__(self, name):
            return getattr(self._o, name)

        def __enter__(self):
            self._o.__enter__()
            return self

        def __exit__(self, *exc):
            return self._o.__exit__(*exc)
    return Recorder


def _called_from_the_timing_loop(callers):
    # the function holding the clock reads calls step() itself: no wrapper frame between them
    assert callers
    bad = sorted({c.co_name for c in callers if "perf_counter_ns" not in c.co_names})
    assert bad == [], f"step() was called from {bad}, not from the timed loop"


def test_scaling_times_engine_step_itself_not_a_lambda(tmp_path, monkeypatch):
    import scaling
    callers = []
    monkeypatch.setattr(fastpath, "Engine", _recording(fastpath.Engine, callers))
    assert scaling.main(["--models", "32x16x2", "--calls", "100", "--no-peers",
                         "--sets", fastpath.simd(), "--out", str(tmp_path)]) == 0
    _called_from_the_timing_loop(callers)


def test_serve_times_both_steps_themselves_not_lambdas(tmp_path, monkeypatch):
    import serve
    callers = []
    monkeypatch.setattr(fastpath, "Engine", _recording(fastpath.Engine, callers))
    monkeypatch.setattr(fastpath, "connect", _recording(fastpath.connect, callers))
    monkeypatch.setattr(shutil, "which", lambda *a, **k: None)     # no C client row
    cores = os.sched_getaffinity(0)
    try:
        assert serve.main(["--calls", "200", "--soak", "0",
                           "--out", str(tmp_path / "serve.json")]) == 0
    finally:
        os.sched_setaffinity(0, cores)      # main() pins the calling thread to the client core
    _called_from_the_timing_loop(callers)
    # the in-process rows and the client's calls: 2 x (warm-up + timed)
    assert len(callers) == 2 * (200 + 200)
