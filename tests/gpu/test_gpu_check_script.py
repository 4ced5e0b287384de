"""bench/gpu_check.py where no GPU is: it says why it cannot run, and on the stand-in driver
writes its report, records a broken path and goes on, catches a kernel that drops lanes at the
edges, and reports residency.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

from fastpath.gpu import GpuBackend, _backend as B, gpu_status

from helpers.fake_cuda import FakeCuda, FakeFunction, OccCuda, ROOT, _fake_pycuda, _gpu_check


def test_gpu_check_without_gpu_says_why(tmp_path):
    if gpu_status()[0]:
        pytest.skip("a GPU is usable here")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "gpu_check.py"), "--out",
                          str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "no usable GPU here" in out.stderr
    assert "Traceback" not in out.stderr and not list(tmp_path.iterdir())


def test_gpu_check_report_on_stand_in(tmp_path, monkeypatch, fake_fatbin):
    # the whole check against the stand-in driver: every field of the report is written
    cu = FakeCuda()
    _fake_pycuda(monkeypatch, cu)
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cpus: None)
    gc = _gpu_check()
    # gpu_check imports bench/_report inside its functions (as a script it runs from bench/):
    # alone, this test failed with "No module named '_report'"; in the whole suite an earlier
    # test had left the module imported
    monkeypatch.syspath_prepend(os.path.join(ROOT, "bench"))
    monkeypatch.setattr(gc, "MODELS", [(128, 64, 32, 2), (256, 256, 2)])
    try:
        assert gc.main(["--out", str(tmp_path), "--iters", "20", "--quick"]) == 0
    finally:
        gpu_status.cache_clear()
    (path,) = tmp_path.glob("gpu-*.json")
    assert path.name == "gpu-fake-gpu.json"
    import json
    r = json.loads(path.read_text())
    for k in ("device", "driver", "numa_node", "core", "max_abs_err", "launch", "persistent",
              "crossover"):
        assert k in r, k
    for m in ("launch", "persistent"):
        assert {"p50_ns", "p99_ns", "h2d_p50_ns", "infer_p50_ns", "d2h_p50_ns"} <= set(r[m])
    assert [c["dims"] for c in r["crossover"]][1:] == [[128, 64, 32, 2], [256, 256, 2]]
    assert {"dims", "macs", "cpu_p50_ns", "launch_p50_ns", "persistent_p50_ns"} <= set(
        r["crossover"][0])
    assert r["max_abs_err"] < 1e-4 and r["targets"]["largest_model_rel_within_1e-4"]
    assert r["demo_end_to_end"]["persistent"]["signal_max_abs_err"] < 1e-5
    # Engine(backend="gpu") on a stream with cache hits decides as the CPU engine does
    hits = r["demo_end_to_end"]["cache_hits"]
    assert 0 < hits["hits"] < hits["ticks"] and hits["same_decisions"], hits
    assert hits["signal_max_abs_err"] < 1e-5
    assert r["auto"]["backend"] in ("cpu", "gpu") and "measured" in r["auto"]
    assert r["batch"]["engine_step_batch_persistent_ticks_per_s"] > 0
    assert cu.depth == 0


def test_gpu_check_records_a_broken_path_and_goes_on(tmp_path, monkeypatch, fake_fatbin):
    cu = FakeCuda(kernel_mode="never_starts")      # the persistent kernel never comes up
    _fake_pycuda(monkeypatch, cu)
    # every start waits out its deadline: 0.1 s, not the default 1 s, before it fails
    made = GpuBackend.__init__

    def quick(self, *a, timeout_ns=100_000_000, **kw):
        made(self, *a, timeout_ns=timeout_ns, **kw)

    monkeypatch.setattr(GpuBackend, "__init__", quick)
    monkeypatch.setattr(B, "DEFAULT_TIMEOUT_NS", 100_000_000)
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cpus: None)
    gc = _gpu_check()
    monkeypatch.setattr(gc, "MODELS", [(256, 256, 2)])
    try:
        assert gc.main(["--out", str(tmp_path), "--iters", "10", "--quick"]) == 1
    finally:
        gpu_status.cache_clear()
    import json
    r = json.loads(next(tmp_path.glob("gpu-*.json")).read_text())
    assert r["persistent"] is None and r["launch"]["p50_ns"] > 0
    assert any("persistent" in f and "did not start" in f for f in r["failures"])
    assert r["targets"]["persistent_p50_le_5us"] is None and r["targets"]["no_failures"] is False
    assert r["crossover"][1]["launch_p50_ns"] is not None


def test_gpu_check_edges_catch_a_kernel_that_drops_lanes(fake_fatbin, monkeypatch):
    """The edge models catch a kernel that reads only the first 32 inputs of a row, which every
    timed width hides."""
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


def test_gpu_check_residency_section_on_the_stand_in(fake_fatbin, monkeypatch):
    """bench/gpu_check.py's residency check: refused at the count the occupancy says, never a
    timeout."""
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
