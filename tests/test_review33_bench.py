"""Session 33 audit of bench/scaling.py and bench/serve.py.

- Both benches timed step() through a lambda (scaling: `time_fn(lambda v: eng.step(v, 0), ...)`,
  serve: `timed_calls(lambda r: eng.step(r, 0), ...)` and the same around the client's step),
  so every "Engine.step from Python" / "round trip from Python" figure carried a Python call a
  caller of step() does not make (~20 ns here, a fifth of the 32x16x2 model's step); bench/run.py
  times fastpath.step() called in the timed region itself. The step is now called from the
  timing loop, which these tests check by the caller of each step() call: the function that
  reads the clock.
- scaling.py gave a bf16 / int8 row the fp32 FMA bound (padded MACs / the core's fp32 FMA rate)
  and the fp32 latency bound, and named the FMA bound "binding" for int8 256x256x2: those
  kernels multiply with dot-product instructions (vdpbf16ps, vpdpbusd: 2 or 4 products a lane)
  whose rate and latency nothing measures. Such a row now has the read bound alone, and says so.
"""
import json
import math
import os
import shutil
import sys

import pytest

import fastpath

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
sys.path.insert(0, BENCH)


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
    # the in-process rows and the round trips: 2 x (warm-up + timed)
    assert len(callers) == 2 * (200 + 200)


def _nan(v):
    return v is None or (isinstance(v, float) and math.isnan(v))


def test_scaling_reduced_weight_rows_claim_no_fp32_compute_bounds(tmp_path):
    import scaling
    assert scaling.main(["--models", "256x256x2", "--weights", "fp32,bf16,int8", "--calls",
                         "100", "--no-peers", "--sets", fastpath.simd(),
                         "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "scaling-partial.json").read_text())
    rows = {r["weights"]: r for r in res["rows"]}
    fp32 = rows["fp32"]
    if res["machine"]["fma_macs_per_ns"]:
        # fp32 keeps its FMA bound: padded MACs at the core's FMA rate
        rate = max(res["machine"]["fma_macs_per_ns"].values())
        assert fp32["fma_bound_ns"] == pytest.approx(fp32["padded_macs"] / rate)
        assert "bounds_note" not in fp32
    for wt in ("bf16", "int8"):
        r = rows[wt]
        assert _nan(r["fma_bound_ns"]) and _nan(r["latency_bound_ns"]), r
        assert r["bound"] == "read" and r["bound_ns"] == r["read_bound_ns"]
        assert r["max_bound"] is None and r["issue_bound"] in (None, "read")
        assert "vpdpbusd" in r["bounds_note"]
