"""The serving bench's rows (the soak rate over the serving window, worker rows covering every
timed call) and bench/gpu_check.py's figures (the whole call, not the engine build) measure what
their labels say.
"""

import json
import os
import subprocess
import sys
import types

import numpy as np
import pytest

from helpers.bench_scripts import BENCH, import_bench


def test_serve_soak_rate_is_over_the_serving_window(tmp_path):
    """bench/serve.py's soak "requests/s" divided by a wall time that began before the two
    client processes started Python, numpy and fastpath (about a second: most of a quick
    soak). The rate is over the serving window (first submit to last reply, across both
    clients); the wall time with the start is kept beside it."""
    path = tmp_path / "serve.json"
    out = subprocess.run([sys.executable, os.path.join(BENCH, "serve.py"), "--calls", "200",
                          "--soak", "4000", "--out", str(path)],
                         capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    s = json.loads(path.read_text())["soak"]
    assert s["ok"] and s["requests"] == 4000
    assert s["req_per_s"] == pytest.approx(s["requests"] / s["serving_s"])
    # the serving window lies inside the parent's wall time, and each client's loop inside it
    assert max(c["client_wall_s"] for c in s["per_client"]) <= s["serving_s"] <= s["wall_s"]
    assert "s of serving" in out.stdout


def test_gpu_check_step_batch_times_the_call_not_the_engine_build(monkeypatch):
    """bench/gpu_check.py's throughput: the CPU engine was built inside the timed region and
    timed cold, the GPU engines were built outside it; every path now goes through one helper
    that builds and warms outside the timed call. Checked on fake clocks (no GPU, no wall
    time): an engine whose build costs 1 s and whose step_batch costs 1 us per tick."""
    sys.path.insert(0, BENCH)
    try:
        import gpu_check
    finally:
        sys.path.remove(BENCH)
    clock = {"ns": 0}
    monkeypatch.setattr(gpu_check, "time", types.SimpleNamespace(
        perf_counter_ns=lambda: clock["ns"], monotonic=lambda: clock["ns"] / 1e9))
    calls = []

    class Eng:
        def __init__(self):
            clock["ns"] += 1_000_000_000
            calls.append("build")

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            calls.append("close")

        def step_batch(self, raws, syms):
            calls.append(len(raws))
            clock["ns"] += 1000 * len(raws)

    raws, syms = np.zeros((1000, 4), np.float32), np.zeros(1000, np.int64)
    assert gpu_check.time_step_batch(Eng, raws, syms) == 1000 * 1000
    assert calls == ["build", gpu_check.BATCH_WARM, 1000, "close"]
    # and it drives the real CPU engine (a context manager, step_batch(raws, syms)) as it is
    monkeypatch.undo()
    import fastpath
    model = fastpath.Model.load(os.path.join(os.path.dirname(fastpath.__file__), "data",
                                             "demo.fpm"))
    raws = np.random.default_rng(0).standard_normal((300, model.raw_len)).astype(np.float32)
    engines = []

    def make():
        engines.append(fastpath.Engine(model))
        return engines[-1]
    assert isinstance(gpu_check.time_step_batch(make, raws, np.zeros(300, np.int64)), int)
    assert len(engines) == 1 and engines[0].stats()["ticks"] == 300 + gpu_check.BATCH_WARM


def test_gpu_check_gpu_figure_is_the_whole_call(monkeypatch):
    """bench/gpu_check.py compared the CPU forward with Timing.total_ns, which leaves part of the
    GPU call out."""
    # on a fake clock: a call of 5 us whose Timing says 1 us is 5 us
    gc = import_bench("gpu_check")
    from fastpath.gpu._backend import Timing
    clock = {"ns": 0}

    def read():
        clock["ns"] += 40          # what one timer read costs
        return clock["ns"]
    monkeypatch.setattr(gc, "time", types.SimpleNamespace(perf_counter_ns=read))

    class Be:
        def infer(self, x):
            clock["ns"] += 5000
            return x, False, Timing(300, 400, 200, 1000)
    r = gc._gpu_times(Be(), np.zeros(4, np.float32), 50)
    assert r["p50_ns"] == r["p99_ns"] == r["max_ns"] == 5000
    assert r["timer_overhead_ns"] == 40
    assert r["timing_total_p50_ns"] == 1000 and r["stages_sum_p50_ns"] == 900
    assert r["stages_vs_total"] == 0.9
    assert "whole call" in gc.__doc__ and "GpuBackend.infer timed around" in gc.__doc__


@pytest.mark.parametrize("calls", [1, 65_536, 200_000, 1 << 30])
def test_serve_worker_rows_cover_every_timed_call(calls):
    """The worker's latency ring held only the last 65,536 of a row's timed client calls, so its
    fp_step and hand-off rows described a part of the row; it now holds every timed call, up to
    the engine's largest ring."""
    import fastpath
    from fastpath.control.config import load_config
    serve = import_bench("serve")
    cfg = serve.server_config(0, calls)
    rec = cfg["engine"]["latency_records"]
    assert rec >= min(calls, serve.MAX_RECORDS) and rec & (rec - 1) == 0
    assert rec <= serve.MAX_RECORDS and rec >= 65_536
    assert load_config(cfg).latency_records == rec
    if calls == 200_000:
        eng = fastpath.Engine(os.path.join(os.path.dirname(fastpath.__file__), "data",
                                           "demo.fpm"), config=cfg)
        assert eng.stats()["ticks"] == 0
