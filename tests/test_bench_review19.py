"""The bench's figures measure what their labels say, with or without its optional packages:
percentiles without hdrhistogram pick the sample the histogram would, a replay's run-queue wait
is never more than its time off the CPU, the results are stamped with the commit they measured
(and "-dirty" only where the code differs from it, not where an earlier run wrote its results),
the peers' BLAS pools hold one thread whatever the caller's environment says, and the MLP
kernel's GFLOP/s is printed where the CPU has no FMA rate to compare with. Nothing here looks
at how fast anything ran: only at which samples, windows and fields a figure is made of."""
import json
import os
import subprocess
import sys
import types

import numpy as np
import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
BENCH = os.path.join(ROOT, "bench")


def _without_hdrh(monkeypatch):
    # a None entry in sys.modules makes `import hdrh.histogram` raise ImportError, as on a
    # host where the package is not installed
    monkeypatch.setitem(sys.modules, "hdrh", None)
    monkeypatch.setitem(sys.modules, "hdrh.histogram", None)


@pytest.mark.parametrize("n", [2, 3, 44, 1218, 3000])
def test_percentiles_without_hdrhistogram_are_the_histograms(bench, monkeypatch, n):
    """Below 2048 ns a 3-digit HdrHistogram is exact, so the figures computed from the sorted
    samples must be the histogram's to the ns: np.percentile interpolated (a p50 of two calls
    that no call took) and the plotted series rounded ranks up where the histogram rounds half
    up."""
    pytest.importorskip("hdrh.histogram")
    _, report = bench
    v = np.random.default_rng(n).integers(1, 2000, n)
    with_hdr = report.Dist.of(v)
    assert with_hdr._h is not None
    _without_hdrh(monkeypatch)
    without = report.Dist.of(v)
    assert without._h is None
    assert without.summary() == {**with_hdr.summary(), "mean": without.summary()["mean"]}
    assert without.series() == with_hdr.series()
    # every percentile is a time some call took
    assert set(without.q.values()) <= set(float(x) for x in v)


class _PreemptingHost:
    """Fake clocks (reading them is free) of a thread that is preempted for wait_ns on its
    way back from every run-queue counter read (a syscall: where a kernel reschedules), as on
    a shared core; a counter read itself costs read_ns of CPU (the /proc file). The wall clock
    and the CPU clock advance together while it runs; a wait advances the wall clock and the
    run-queue counter only."""

    def __init__(self, wait_ns=5_000_000, read_ns=0):
        self.wall = self.cpu = self.wait = 0
        self.WAIT_NS, self.READ_NS = wait_ns, read_ns

    def _run(self, ns=0):
        self.wall += ns
        self.cpu += ns

    def perf_counter_ns(self):
        self._run()
        return self.wall

    def thread_time_ns(self):
        self._run()
        return self.cpu

    def counters(self):
        self._run(self.READ_NS)
        got = (0, 0, self.wait)
        self.wall += self.WAIT_NS
        self.wait += self.WAIT_NS
        return got


@pytest.fixture(params=[(5_000_000, 0)])
def host(bench, monkeypatch, request):
    run, _ = bench
    h = _PreemptingHost(*request.param)
    monkeypatch.setattr(run, "time", types.SimpleNamespace(perf_counter_ns=h.perf_counter_ns,
                                                           thread_time_ns=h.thread_time_ns))
    monkeypatch.setattr(run, "_thread_counters", h.counters)
    return h


@pytest.fixture(scope="module")
def small(bench):
    from fastpath import Model, lob
    run, _ = bench
    bs = lob.generate_stream(400, n_symbols=4, seed=run.DEFAULT_SEED)
    return Model.load(run.DEMO_MODEL), lob.raw_from_book(bs), bs.symbols, bs.ts_ns


def test_replay_runqueue_wait_is_part_of_its_time_off_cpu(bench, host, small):
    """The replay's printed note reads "spent X ms off the CPU, Y ms of it waiting in the run
    queue": Y was read over a wider window than X (counters outside the wall-clock pair), so a
    preemption at a counter read made Y larger than X (42.5 ms "of" 35.2 ms on this host)."""
    run, _ = bench
    model, raws, syms, ts = small
    sched = run.replay_step(model, {"enabled": False}, raws, syms, ts, 0, 50)["sched"]
    assert sched["runqueue_wait_ms"] > 0
    assert sched["runqueue_wait_ms"] <= sched["off_cpu_ms"]


@pytest.mark.parametrize("host", [(0, 50_000)], indirect=True)
def test_counter_reads_are_not_time_off_cpu(bench, host, small):
    """The run-queue counters' own reads (a /proc file: tens of us of CPU) sit inside the CPU
    clock's window: outside it they were time off the CPU, and every 1 ms call of a small
    stream was counted as descheduled by a hypervisor."""
    from fastpath import Engine
    run, _ = bench
    model, raws, syms, ts = small
    sched = run.replay_step(model, {"enabled": False}, raws, syms, ts, 0, 50)["sched"]
    assert sched["off_cpu_ms"] * 1e6 < host.READ_NS
    (_, _, bt), = run.time_batches([lambda: Engine(model)], raws, syms, ts, runs=2, warm=50)
    assert all(off * 1e6 < host.READ_NS for off in bt["off_cpu_ms"])
    assert bt["descheduled_runs"] == 0


def test_batch_call_runqueue_wait_is_part_of_its_time_off_cpu(bench, host, small):
    """The same for each timed step_batch call (batch_timing: off_cpu_ms, runqueue_wait_ms),
    on which the notes decide what held a descheduled call."""
    from fastpath import Engine
    run, _ = bench
    model, raws, syms, ts = small
    (_, _, bt), = run.time_batches([lambda: Engine(model)], raws, syms, ts, runs=2, warm=50)
    assert len(bt["runqueue_wait_ms"]) == 2
    for wait, off in zip(bt["runqueue_wait_ms"], bt["off_cpu_ms"]):
        assert 0 < wait <= off


def _git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.fixture
def checkout(tmp_path):
    """A git checkout with the bench's layout: a source file and a tracked results file."""
    if subprocess.run(["git", "--version"], capture_output=True).returncode:
        pytest.skip("no git")
    repo = tmp_path / "repo"
    (repo / "bench" / "results").mkdir(parents=True)
    (repo / "src.py").write_text("x = 1\n")
    (repo / "bench" / "results" / "latest-generated.json").write_text("{}\n")
    _git(repo, "init", "-q")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    return repo


def test_results_written_by_a_run_do_not_make_the_next_run_dirty(bench, monkeypatch, checkout):
    """A full run rewrites the tracked bench/results/latest-*.json; the next run, from the
    same code, stamped its results "<commit>-dirty". A change to the code still does."""
    run, _ = bench
    monkeypatch.setattr(run, "HERE", str(checkout / "bench"))
    head = _git(checkout, "rev-parse", "--short", "HEAD")
    assert run.machine_facts()["commit"] == head
    (checkout / "bench" / "results" / "latest-generated.json").write_text('{"a": 1}\n')
    (checkout / "bench" / "results" / "20990101-000000-generated.json").write_text("{}\n")
    assert run.machine_facts()["commit"] == head
    (checkout / "src.py").write_text("x = 2\n")
    assert run.machine_facts()["commit"] == head + "-dirty"


def _stamp_here():
    sys.path.insert(0, BENCH)
    try:
        from _commit import commit_stamp
    finally:
        sys.path.remove(BENCH)
    return commit_stamp(BENCH)


def test_scaling_results_are_stamped_with_the_commit(tmp_path):
    """bench/scaling.py's JSON said which fastpath version, not which commit, ran."""
    out = subprocess.run([sys.executable, os.path.join(BENCH, "scaling.py"), "--models", "8x2",
                          "--calls", "100", "--no-peers", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads((tmp_path / "scaling-partial.json").read_text())
    assert "commit" in res and res["commit"] == _stamp_here()


def test_serve_results_are_stamped_with_the_commit(tmp_path):
    """bench/serve.py's JSON had neither the commit nor the version."""
    path = tmp_path / "serve.json"
    out = subprocess.run([sys.executable, os.path.join(BENCH, "serve.py"), "--calls", "200",
                          "--soak", "0", "--out", str(path)],
                         capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(path.read_text())
    import fastpath
    assert "commit" in res and res["commit"] == _stamp_here()
    assert res["fastpath"] == fastpath.__version__


def _run_zoo(tmp_path):
    """bench/zoo.py on its smallest model, 100 timed calls: (results, stdout)."""
    pytest.importorskip("skl2onnx")
    pytest.importorskip("onnxruntime")
    path = tmp_path / "zoo.json"
    out = subprocess.run([sys.executable, os.path.join(BENCH, "zoo.py"), "--quick", "--calls",
                          "100", "--only", "ridge", "--out", str(path)],
                         capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(path.read_text()), out.stdout


def test_zoo_results_are_stamped_with_the_commit(tmp_path):
    """bench/zoo.py's JSON (the README's model-zoo table) had the version, not the commit."""
    res, _ = _run_zoo(tmp_path)
    assert "commit" in res and res["commit"] == _stamp_here()


def test_zoo_ratios_are_percentile_for_percentile(tmp_path):
    """bench/zoo.py's docstring promised the peer's p50 / fastpath's p50 "and p99 / p99": only
    the p50 ratio existed, and the agreement check ran on the first 256 of the timed inputs,
    not on all of them as it says."""
    res, stdout = _run_zoo(tmp_path)
    (row,) = res["rows"]
    fp, o = row["fastpath"], row["onnxruntime"]
    assert o["ratio_p50"] == pytest.approx(o["p50"] / max(fp["p50"], 1))
    assert o["ratio_p99"] == pytest.approx(o["p99"] / max(fp["p99"], 1))
    assert row["agreement_inputs"] == 100          # --calls 100: the inputs timed
    assert f"{o['ratio_p50']:.1f}x / {o['ratio_p99']:.1f}x |" in stdout


CHILD_POOLS = r"""
import importlib.util, json, sys
sys.path.insert(0, sys.argv[1])
spec = importlib.util.spec_from_file_location("bench_mod", sys.argv[2])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
import numpy as np
a = np.ones((64, 64), np.float32)
a @ a                                   # the BLAS pool is up
from threadpoolctl import threadpool_info
print(json.dumps([p["num_threads"] for p in threadpool_info()]))
"""


@pytest.mark.parametrize("script", ["run.py", "zoo.py"])
def test_peers_blas_pool_holds_one_thread_whatever_the_environment(script, tmp_path):
    """The bench only defaulted OPENBLAS_NUM_THREADS and its kin to 1: a caller who had set
    them (OPENBLAS_NUM_THREADS=2 here) got numpy timed on that many threads under a table that
    says the pools hold one."""
    pytest.importorskip("threadpoolctl")
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one core: a BLAS pool holds one thread whatever it is told")
    env = dict(os.environ, OPENBLAS_NUM_THREADS="2", OMP_NUM_THREADS="2", MKL_NUM_THREADS="2")
    # started outside the checkout: `python -c` puts its cwd first on sys.path, and from a
    # non-editable install the checkout's fastpath is unbuilt sources
    out = subprocess.run([sys.executable, "-c", CHILD_POOLS, BENCH, os.path.join(BENCH, script)],
                         capture_output=True, text=True, timeout=120, env=env, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    pools = json.loads(out.stdout.strip().splitlines()[-1])
    assert pools and all(n == 1 for n in pools), pools


def test_the_json_says_which_thread_pools_the_peers_ran_on(bench):
    run, _ = bench
    pools = run.thread_pools()
    assert pools
    try:
        import threadpoolctl  # noqa: F401
    except ImportError:
        assert pools[0]["env"]["OPENBLAS_NUM_THREADS"] == "1"
    else:
        assert all("num_threads" in p for p in pools)


def test_mlp_gflops_is_printed_where_the_cpu_has_no_fma_rate(bench, monkeypatch):
    """Without an FMA probe result (a CPU without AVX2+FMA: rate 0) the kernel's GFLOP/s was
    left out of the JSON and the throughput table printed "0.0 GFLOP/s" for a kernel that ran;
    GFLOP/s is the kernel's multiply-adds over its own time and needs no bound."""
    import fastpath
    run, report = bench
    monkeypatch.setattr(run, "fma_macs_per_ns", lambda isa: 0.0)
    model = fastpath.Model.load(run.DEMO_MODEL)
    k = run.mlp_kernel(model)
    assert "fma_bound_ns" not in k and "ratio_to_bound" not in k
    assert k["gflops"] == pytest.approx(2 * k["macs"] / k["ns_per_forward"])
    with open(os.path.join(BENCH, "results", "latest-generated.json")) as f:
        res = json.load(f)
    res["mlp_kernel"] = k
    (_, _, rows), = [t for t in report.tables(res) if t[0] == "Throughput"]
    (cell,) = [r[2] for r in rows if r[0].startswith("MLP kernel alone")]
    assert cell == f"{k['gflops']:.1f} GFLOP/s"
    sys.path.insert(0, BENCH)
    try:
        import readme_figures
    finally:
        sys.path.remove(BENCH)
    assert f"({k['gflops']:.0f} GFLOP/s)" in readme_figures.summary(res)


def test_scaling_reduced_weight_rows_read_the_bytes_the_engine_packs(tmp_path):
    """bench/scaling.py's read bound for a bf16 / int8 row took padded MACs x the type's bytes,
    though the engine keeps the output layer fp32 and pads its blocks as the reduced kernels
    need: int8 32x16x2 was bounded on 640 bytes where the kernel streams 1280. The row also
    says the peers ran fp32 weights, as they do on every row."""
    from fastpath._kernels import LowpMLP, lowp_kernels
    sys.path.insert(0, BENCH)
    try:
        import scaling
    finally:
        sys.path.remove(BENCH)
    out = subprocess.run([sys.executable, os.path.join(BENCH, "scaling.py"), "--models",
                          "32x16x2", "--weights", "fp32,int8,bf16", "--calls", "100", "--no-peers",
                          "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads((tmp_path / "scaling-partial.json").read_text())
    model = scaling.build_model((32, 16, 2))
    isa = [i for i in res["kernel_sets"] if lowp_kernels(i) is not None][-1]
    rows = {r["weights"]: r for r in res["rows"]}
    assert rows["fp32"]["weight_bytes"] == scaling.padded_macs((32, 16, 2)) * 4
    for wt in ("int8", "bf16"):
        packed = LowpMLP([L.weight for L in model.layers], [L.bias for L in model.layers],
                         [L.activation for L in model.layers], wt, isa)
        r = rows[wt]
        assert r["weight_bytes"] == packed.arena_bytes
        assert r["read_bound_ns"] == pytest.approx(r["weight_bytes"] / r["read_gbps"])
        assert r["peer_weights"] == "fp32"


def test_weights_sign_flips_count_changes_of_sign_only():
    """bench/weights.py counted np.sign(sig) != np.sign(ref): a signal at exactly 0 against a
    small one of either sign was a "sign flip", where bench/run.py (and the docstring: "ticks
    whose signal changes sign") count + to - and - to + only."""
    sys.path.insert(0, BENCH)
    try:
        import weights
    finally:
        sys.path.remove(BENCH)
    ref = np.array([0.0, 0.3, -0.2, 0.4, 0.0], np.float32)
    sig = np.array([0.01, -0.1, 0.0, 0.41, 0.0], np.float32)
    e = weights.signal_errors(sig, ref)
    assert e["sign_flips"] == 1
    assert e["n"] == 5 and e["max_abs"] == pytest.approx(0.4)


def test_max_and_mean_are_the_samples_own(bench):
    """With hdrhistogram the max column (and the last point of each plotted line, "its slowest
    sample") was the top of the slowest sample's bucket, 4,032,511 ns for a call of
    4,031,234 ns, and the mean was of bucket values: both are taken from the samples."""
    pytest.importorskip("hdrh.histogram")
    _, report = bench
    v = np.array([100] * 10 + [4_031_234, 2049, 3001])
    d = report.Dist.of(v)
    assert d._h is not None
    assert d.max == 4_031_234 == d.summary()["max"] == d.series()["ns"][-1]
    assert d.mean == pytest.approx(float(v.mean()), rel=0, abs=1e-9)


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


def test_scaling_numpy_all_cores_is_the_cores_it_may_run_on(tmp_path):
    """bench/scaling.py labelled its numpy row "numpy {os.cpu_count()}t" and asked the BLAS
    pool for that many threads; under an affinity of one core (taskset, a container's cpuset)
    OpenBLAS held one, so "numpy 2t" timed one thread. The row is named after the allowed
    cores, and the child reports the pool's threads. With one core the all-cores row and the
    one-thread row shared a JSON key and the run died (TypeError), on any one-core host too."""
    if not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs a process allowed on two or more cores")
    core = min(os.sched_getaffinity(0))
    out = subprocess.run([sys.executable, os.path.join(BENCH, "scaling.py"), "--models", "8x2",
                          "--calls", "100", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=300, cwd=str(tmp_path),
                         preexec_fn=lambda: os.sched_setaffinity(0, {core}))
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads((tmp_path / "scaling-partial.json").read_text())
    assert res["machine"]["cores"] == 1
    (row,) = res["rows"]
    assert "numpy_1t" in row and not any(k.startswith("numpy_") and k != "numpy_1t"
                                         for k in row)
    try:
        import threadpoolctl  # noqa: F401
    except ImportError:
        return
    assert row["numpy_1t"]["blas_threads"] and set(row["numpy_1t"]["blas_threads"]) == {1}


def test_numpy_peer_runs_the_mlp_only(monkeypatch):
    """The numpy peer, labelled "MLP only" beside onnxruntime's graph and the torch module
    (both end at the output layer), also computed the head, tanh and sigmoid of the two
    outputs, and threw it away: ~10% of its figure was work the others did not do. Counted
    here by the calls it makes to np.tanh on the demo model (ReLU, ReLU, identity: none)."""
    import fastpath
    sys.path.insert(0, BENCH)
    try:
        import peers
    finally:
        sys.path.remove(BENCH)
    model = fastpath.Model.load(os.path.join(os.path.dirname(fastpath.__file__), "data",
                                             "demo.fpm"))
    assert all(L.activation in ("relu", "identity") for L in model.layers)
    fn = peers.numpy_peer(model)
    x = np.random.default_rng(0).standard_normal(model.dims[0]).astype(np.float32)
    calls = []
    real = np.tanh
    monkeypatch.setattr(peers.np, "tanh", lambda *a, **k: calls.append(1) or real(*a, **k))
    out = np.asarray(fn(x))
    assert calls == []
    np.testing.assert_allclose(out, model.forward(x[None, :])[0], rtol=1e-5, atol=1e-6)


def test_mlp_kernel_figure_says_it_is_the_best_run(bench):
    """The throughput table's "MLP kernel alone: 106 ns" (and the README sentence) was the
    best of five runs' means with nothing saying so, beside step_batch rows that say "best of
    5; median ..."; the JSON and both labels now name it."""
    import fastpath
    run, report = bench
    k = run.mlp_kernel(fastpath.Model.load(run.DEMO_MODEL))
    assert k["runs"] == run.MLP_RUNS and k["passes_per_run"] == run.MLP_PASSES
    assert k["ns_per_forward"] <= k["ns_median_of_runs"]
    with open(os.path.join(BENCH, "results", "latest-generated.json")) as f:
        res = json.load(f)
    res["mlp_kernel"] = k
    (_, _, rows), = [t for t in report.tables(res) if t[0] == "Throughput"]
    want = f"best of {run.MLP_RUNS} runs, each the mean of {run.MLP_PASSES:,} passes"
    assert any(r[0].startswith("MLP kernel alone") and want in r[0] for r in rows)
    sys.path.insert(0, BENCH)
    try:
        import readme_figures
    finally:
        sys.path.remove(BENCH)
    assert want in readme_figures.summary(res)


NO_OPTIONAL = r"""
import runpy, sys
# every optional package of the bench absent, as on a bare install: an import of each fails
for m in ("rich", "rich.console", "rich.table", "rich.progress", "matplotlib",
          "matplotlib.pyplot", "hdrh", "hdrh.histogram", "onnxruntime", "onnx", "torch",
          "threadpoolctl"):
    sys.modules[m] = None
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_bench_runs_and_says_so_without_any_optional_package(tmp_path):
    """bench/run.py with rich, matplotlib, hdrhistogram, onnxruntime, onnx, torch and
    threadpoolctl all missing: it runs, the JSON says what was skipped and why, and the plain
    tables say the percentiles did not come from hdrhistogram (only the rich branch said so)."""
    out = subprocess.run([sys.executable, "-c", NO_OPTIONAL, os.path.join(BENCH, "run.py"),
                          "--quick", "--ticks", "3000", "--no-rt", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads((tmp_path / "latest-generated-custom-quick.json").read_text())
    assert res["hdrhistogram"] is False and res["plot"] is None
    assert res["peers"]["numpy"]["available"]
    for name in ("onnxruntime", "torch"):
        assert not res["peers"][name]["available"] and "not installed" in res["peers"][name]["reason"]
    assert res["peer_thread_pools"][0]["env"]["OPENBLAS_NUM_THREADS"] == "1"
    assert "hdrhistogram not installed" in out.stdout
    assert "rich not installed: plain table" in out.stdout
    assert "onnxruntime: skipped" in out.stdout


def test_stage_table_names_the_clock_the_host_had(bench):
    """The stage table's title said "(TSC)" on a host whose fastpath clock fell back to
    CLOCK_MONOTONIC (no invariant TSC), where the in-C figures are clock_gettime readings."""
    _, report = bench
    with open(os.path.join(BENCH, "results", "latest-generated.json")) as f:
        res = json.load(f)
    res["machine"]["clock"]["source"] = "clock_gettime(CLOCK_MONOTONIC)"
    (title,) = [t[0] for t in report.tables(res) if t[0].startswith("Stages inside fp_step()")]
    assert "CLOCK_MONOTONIC" in title and "TSC" not in title
    res["machine"]["clock"]["source"] = "tsc"
    (title,) = [t[0] for t in report.tables(res) if t[0].startswith("Stages inside fp_step()")]
    assert "(TSC)" in title


def test_zero_readings_stay_zero(bench, monkeypatch):
    """A stage shorter than one step of a coarse clock (10 ns here) reads 0; the histogram was
    fed max(v, 1), so a stage that read 0 on most calls printed a p50 of "1 ns", which no call
    took and which the run without hdrhistogram did not print."""
    pytest.importorskip("hdrh.histogram")
    _, report = bench
    v = np.array([0] * 60 + [10] * 40)
    d = report.Dist.of(v)
    assert d._h is not None
    assert d.p50 == 0.0 and d.q[90] == 10.0 and d.series()["ns"][0] == 0.0
    _without_hdrh(monkeypatch)
    plain = report.Dist.of(v)
    assert plain.summary() == d.summary() and plain.series() == d.series()


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
