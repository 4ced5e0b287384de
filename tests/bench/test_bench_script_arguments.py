"""The bench scripts (bench/run.py, scaling.py, weights.py, zoo.py, serve.py): bad arguments
are usage errors, unreadable data is one line, a short run writes its own file, and figures
of calls that did not occur (no real miss, no tick) are not reported as met. Nothing here
looks at how fast anything ran: only at which rows, samples and messages a figure or an error
is made of."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from fastpath import InputError, lob


ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


BENCH = os.path.join(ROOT, "bench")


def _env():
    """The child imports the fastpath this test process imported: the installed package in
    CI (a checkout's fastpath/ has no compiled extensions there), the in-place build of a
    checkout or worktree in development."""
    import fastpath
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(fastpath.__file__))) + \
        os.pathsep + env.get("PYTHONPATH", "")
    return env


def _bench(tmp_path, *args, timeout=300):
    return subprocess.run([sys.executable, os.path.join(BENCH, "run.py"), "--quick", "--no-plot",
                           "--no-rt", "--out", str(tmp_path / "res"), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=str(tmp_path),
                          env=_env())


def _script(tmp_path, name, *args, timeout=120):
    return subprocess.run([sys.executable, os.path.join(BENCH, name), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=str(tmp_path),
                          env=_env())


@pytest.mark.parametrize("args, match", [
    (("--ticks", "0"), r"--ticks: expected an integer in 1\.\.16777216, got 0"),
    (("--ticks", "-3"), r"--ticks: expected an integer in 1\.\.16777216, got -3"),
    # the replay's latency records: 20M ticks were generated and turned into ticks (minutes)
    # before the engine's config refused 2**25 records with a ConfigError traceback
    (("--ticks", "20000000"), r"--ticks: expected an integer in 1\.\.16777216, got 20000000"),
    (("--seed", "-1"), r"--seed: expected an integer >= 0, got -1"),
    (("--cpu", "-1"), r"--cpu: expected an integer >= 0, got -1"),
    (("--data", "x", "--ticks", "5"), r"--ticks and --seed set the generated stream"),
])
def test_bench_bad_arguments_are_usage_errors(tmp_path, args, match):
    """--ticks 0 ran the default 30,000-tick stream (under a "-quick" name, not "-custom");
    --ticks -3 and --seed -1 ended in a traceback from the generator; --ticks with --data was
    ignored without a word; --ticks beyond the replay's latency records failed after minutes."""
    out = _bench(tmp_path, *args)
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    assert __import__("re").search(match, out.stderr), out.stderr[-2000:]
    assert not (tmp_path / "res").exists()


@pytest.mark.parametrize("data", ["{tmp}/nowhere", "{tmp}/ob.csv,{tmp}/msg.csv"])
def test_bench_unreadable_data_is_one_line(tmp_path, data):
    """A --data folder without a capture, or a LOBSTER pair that is not there, ended in a
    FileNotFoundError traceback from the reader (and a file the reader refuses, in an
    InputError traceback)."""
    data = data.format(tmp=tmp_path)
    out = _bench(tmp_path, "--data", data)
    assert out.returncode == 1
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    assert f"--data {data}: cannot read it" in out.stderr
    (tmp_path / "ob.csv").write_text("1001000,5,1000000,7\n")
    (tmp_path / "msg.csv").write_text("34200.0,4,1,5,1001000,0\n")       # direction 0
    out = _bench(tmp_path, "--data", f"{tmp_path}/ob.csv,{tmp_path}/msg.csv")
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert "execution with direction 0" in out.stderr


@pytest.fixture(scope="module")
def one_tick_run(tmp_path_factory):
    """The bench over a one-tick stream (no lookup can run: no real miss, no hit), on a CPU
    the control plane refuses."""
    tmp = tmp_path_factory.mktemp("one_tick")
    out = _bench(tmp, "--ticks", "1", "--cpu", "9999")
    assert out.returncode == 0, out.stderr[-3000:]
    path = out.stdout.strip().splitlines()[-1].split("JSON: ")[-1].split(" (and")[0]
    with open(path) as f:
        return json.load(f), out.stdout, path


def test_targets_without_real_misses_are_not_met(one_tick_run):
    """With no real miss the miss row's p50 of no samples read 0 ns, so "real miss p50 <= 1000
    ns" was met, and every peer's ratio against max(0, 1) ns read thousands: "onnxruntime p50
    / fastpath real miss p50 >= 10" met too, on nothing measured."""
    res, text, _ = one_tick_run
    assert res["step"]["miss"]["samples"] == 0
    t = {x["what"]: x for x in res["targets"]}
    for what in ("fastpath.step() real miss p50 (ns)", "fastpath.step() real miss p99 (ns)",
                 "numpy p50 / fastpath real miss p50"):
        assert t[what]["value"] is None and t[what]["met"] is False, t[what]
    assert res["peers"]["numpy"]["ratio_p50"] is None
    # the tables say so instead of printing a ratio
    assert "NOT MEASURED" in text
    numpy_row = next(line for line in text.splitlines() if "numpy (1 BLAS thread)" in line)
    assert numpy_row.rstrip(" │|").endswith("-"), numpy_row


def test_placement_refusal_is_printed(one_tick_run):
    """--cpu 9999: the control plane refused and the run went on unplaced; the terminal said
    "placement: core None, ?" and the reason was in the JSON only."""
    res, text, _ = one_tick_run
    assert res["placement"]["core"] is None and res["placement"]["error"]
    head = " ".join(text.split("fastpath.step() per call")[0].split())
    assert "not placed: ConfigError: placement.core = 9999" in head, head


def test_tradeoff_regime_without_ticks_has_no_hit_rate(one_tick_run, bench):
    """The trade-off table printed 0.0% hits for a regime the stream never entered."""
    res, _, _ = one_tick_run
    _, report = bench
    present = {r["name"] for r in res["replay"]["regimes"]}
    absent = [n for n in res["stream"]["regimes"] if n not in present]
    assert absent
    title, header, rows = report.tradeoff_table(res)
    for n in absent:
        col = header.index(f"hits {n}")
        assert {r[col] for r in rows} == {"-"}


def test_readme_summary_without_real_misses(one_tick_run):
    """readme_figures.py printed "on a real miss (p50 of 0 calls): features 0 ns, ...": stage
    times of no call."""
    _, _, path = one_tick_run
    out = subprocess.run([sys.executable, os.path.join(BENCH, "readme_figures.py"), path],
                         capture_output=True, text=True, timeout=60, env=_env(),
                         cwd=os.path.dirname(path))
    assert out.returncode == 0, out.stderr[-2000:]
    assert "p50 of 0 calls" not in out.stdout
    assert "No real miss in this replay" in out.stdout


def test_histogram_percentiles_never_pass_the_slowest_call(bench):
    """Defect: a 3-digit HdrHistogram read a percentile in the slowest sample's bucket as the
    top of that bucket (p99.9 4,032,511 ns beside a max of 4,031,300), so the plotted series
    went down at its last point."""
    pytest.importorskip("hdrh.histogram")
    _, report = bench
    v = np.array([700] * 995 + [4_031_234, 4_031_300, 4_031_000, 4_031_100, 4_031_200])
    d = report.Dist.of(v)
    assert d._h is not None
    assert d.max == 4_031_300
    assert all(q <= d.max for q in d.q.values()), d.q
    s = d.series()
    assert s["ns"] == sorted(s["ns"]) and s["ns"][-1] == d.max
    # below 2048 ns the histogram is exact: nothing moves there
    assert d.p50 == 700.0


@pytest.mark.parametrize("script, args, match", [
    # --models 32x16x3 ended in a ModelError traceback from building the model
    ("scaling.py", ("--models", "8x3"),
     r"--models: the last width is the model's outputs.*got 8x3"),
    # --calls 0 ran the default number of calls
    ("scaling.py", ("--calls", "0"), r"--calls must be >= 100"),
    # --ticks 5 ended in numpy's "need at least one array to stack" (no symbol had the 8
    # ticks a 1024-wide input takes), --ticks 0 ran the default stream, --seed -1 ended in a
    # traceback from the generator
    ("weights.py", ("--ticks", "5"), r"--ticks: expected an integer >= 1000, got 5"),
    ("weights.py", ("--ticks", "0"), r"--ticks: expected an integer >= 1000, got 0"),
    ("weights.py", ("--seed", "-1"), r"--seed: expected an integer >= 0, got -1"),
])
def test_scaling_and_weights_bad_arguments_are_usage_errors(tmp_path, script, args, match):
    """Each bad argument is a usage error (exit 2) naming it, with no traceback."""
    extra = ("--quick", "--no-peers", "--out", str(tmp_path)) if script == "scaling.py" \
        else ("--quick",)
    out = _script(tmp_path, script, *extra, *args)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    assert __import__("re").search(match, out.stderr), out.stderr[-2000:]


def test_weights_inputs_from_a_stream_too_short(bench):
    """Called with a stream too short for one 1024-wide input: an InputError saying so."""
    sys.path.insert(0, BENCH)
    try:
        import weights
    finally:
        sys.path.remove(BENCH)
    from fastpath import Model
    bs = lob.generate_stream(5, n_symbols=8, seed=1)
    with pytest.raises(InputError, match=r"no symbol with 8 ticks"):
        weights.stream_inputs_1024(Model.load(weights.DEMO_MODEL), lob.raw_from_book(bs),
                                   bs.symbols, 10)


@pytest.fixture
def bench_copy(tmp_path):
    """bench/'s scripts in a folder of their own, so a script's default output folder
    (bench/results beside it) is not the checkout's."""
    import shutil
    dst = tmp_path / "bench"
    dst.mkdir()
    # a checkout (setup.py above bench/), as the benches tell one (_commit.results_dir):
    # without it they write ./fastpath-bench-results, as from an installed package, and the
    # tests looked for bench/results in vain (or found it absent for the wrong reason)
    (tmp_path / "setup.py").write_text("")
    for name in os.listdir(BENCH):
        if name.endswith(".py"):
            shutil.copy(os.path.join(BENCH, name), dst / name)
    # a checkout's layout (setup.py above bench/): the scripts write bench/results, as they
    # do in the repository (from an installed package, ./fastpath-bench-results instead)
    (tmp_path / "setup.py").write_text("")
    return dst


def test_zoo_partial_run_does_not_replace_the_full_table(bench_copy, tmp_path):
    """`python bench/zoo.py --quick` (or --only, --calls) wrote bench/results/zoo-latest.json,
    the README table's source ("20,000 calls a row"), with a few rows of 3000 calls."""
    pytest.importorskip("skl2onnx")
    pytest.importorskip("onnxruntime")
    out = subprocess.run([sys.executable, str(bench_copy / "zoo.py"), "--quick", "--calls", "200",
                          "--only", "ridge"], capture_output=True, text=True, timeout=300,
                         cwd=str(tmp_path), env=_env())
    assert out.returncode == 0, out.stderr[-3000:]
    assert not (bench_copy / "results" / "zoo-latest.json").exists()
    res = json.loads((bench_copy / "results" / "zoo-partial.json").read_text())
    assert [r["name"] for r in res["rows"]] == ["ridge"]


@pytest.mark.parametrize("args, match", [
    (("--only", "nosuchmodel"), r"--only 'nosuchmodel' matches no model"),
    (("--calls", "0"), r"--calls must be >= 1, got 0"),
    (("--cpu", "99999"), r"--cpu 99999: cannot run on it"),
])
def test_zoo_bad_arguments_are_usage_errors(bench_copy, tmp_path, args, match):
    """--only matching nothing wrote an empty table over the results; --calls 0 ran the
    default 20000 calls; --cpu on a CPU this process may not use ended in an OSError
    traceback."""
    pytest.importorskip("sklearn")
    out = subprocess.run([sys.executable, str(bench_copy / "zoo.py"), "--quick", *args],
                         capture_output=True, text=True, timeout=300, cwd=str(tmp_path),
                         env=_env())
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    assert __import__("re").search(match, out.stderr), out.stderr[-2000:]
    assert not (bench_copy / "results").exists()


def test_serve_short_run_writes_its_own_file_and_takes_a_bare_name(bench_copy, tmp_path):
    """A run with --calls / --soak / --quick wrote bench/results/serve-latest.json, the
    README's serving figures' source; and --out serve.json (no folder) failed in
    os.makedirs("") after the whole run."""
    import shutil
    (tmp_path / "tests" / "c").mkdir(parents=True)
    shutil.copy(os.path.join(ROOT, "tests", "c", "client.c"), tmp_path / "tests" / "c")
    run = [sys.executable, str(bench_copy / "serve.py"), "--calls", "200", "--soak", "0"]
    out = subprocess.run(run, capture_output=True, text=True, timeout=300, cwd=str(tmp_path),
                         env=_env())
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert not (bench_copy / "results" / "serve-latest.json").exists()
    assert json.loads((bench_copy / "results" / "serve-partial.json").read_text())["calls"] == 200
    out = subprocess.run(run + ["--out", "serve.json"], capture_output=True, text=True,
                         timeout=300, cwd=str(tmp_path), env=_env())
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert json.loads((tmp_path / "serve.json").read_text())["calls"] == 200


@pytest.mark.parametrize("args, match", [
    (("--calls", "0"), r"--calls must be >= 1, got 0"),
    (("--soak", "-5"), r"--soak must be >= 0"),
])
def test_serve_bad_arguments_are_usage_errors(bench_copy, tmp_path, args, match):
    out = subprocess.run([sys.executable, str(bench_copy / "serve.py"), *args],
                         capture_output=True, text=True, timeout=300, cwd=str(tmp_path),
                         env=_env())
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert __import__("re").search(match, out.stderr), out.stderr[-2000:]


@pytest.mark.parametrize("args, name", [
    (["--quick"], "scaling-partial.json"),
    (["--calls", "300"], "scaling-partial.json"),
    # fp32 alone (the default --weights) replaced the table's bf16 / int8 rows too
    ([], "scaling-partial.json"),
    (["--weights", "fp32,bf16"], "scaling-partial.json"),
    (["--weights", "fp32,bf16,int8"], "scaling-latest.json"),
])
def test_scaling_quick_run_does_not_replace_the_full_table(tmp_path, monkeypatch, args, name):
    """A --quick run (1000 calls a figure) or one with --calls wrote scaling-latest.json, the
    README scaling table's source (5000 calls), as a full run does."""
    sys.path.insert(0, BENCH)
    try:
        import scaling
    finally:
        sys.path.remove(BENCH)
    monkeypatch.setattr(scaling, "run", lambda a: {"calls": a.calls})
    monkeypatch.setattr(scaling, "print_table", lambda res: None)
    monkeypatch.setattr(scaling, "print_layers", lambda res: None)
    assert scaling.main(args + ["--out", str(tmp_path)]) == 0
    assert sorted(os.listdir(tmp_path)) == [name]


def test_plot_of_a_replay_without_real_misses(one_tick_run, bench, tmp_path):
    """The in-C panel of a replay without a real miss was empty, with matplotlib's "No artists
    with labels found to put in legend" warning (an error under -W error) and no word why."""
    pytest.importorskip("matplotlib")
    import warnings
    res, _, _ = one_tick_run
    _, report = bench
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert report.write_plots(res, str(tmp_path / "p.png"))


def test_bench_recorded_stream_longer_than_the_replay_keeps(bench, monkeypatch):
    """A recorded stream past the replay's 1 << 24 latency records is refused as soon as it
    is read, not after its ticks were built, by the engine's config."""
    run, _ = bench
    monkeypatch.setattr(run, "MAX_TICKS", 10)
    bs = lob.generate_stream(11, n_symbols=2, seed=1)
    monkeypatch.setattr(run, "load_stream", lambda args, bar: (bs, "LOBSTER x.csv"))
    monkeypatch.setattr(run, "placement", lambda args: {"core": None})
    monkeypatch.setattr(run, "machine_facts", lambda: {})
    import argparse
    args = argparse.Namespace(quick=True, json_only=True, data="x.csv,y.csv")
    with pytest.raises(SystemExit, match=r"LOBSTER x.csv has 11 ticks.*at most 10"):
        run.run(args)


def test_installed_benches_write_beside_the_caller(tmp_path, monkeypatch):
    """From an installed package (no setup.py above bench/), scaling.py, zoo.py and serve.py
    wrote their results into site-packages; run.py alone wrote ./fastpath-bench-results."""
    import shutil
    inst = tmp_path / "site" / "bench"
    inst.mkdir(parents=True)
    shutil.copy(os.path.join(BENCH, "_commit.py"), inst / "_commit.py")
    sys.path.insert(0, str(inst))
    try:
        import importlib
        mod = importlib.import_module("_commit")
        importlib.reload(mod)
        work = tmp_path / "work"
        work.mkdir()
        monkeypatch.chdir(work)
        assert mod.results_dir(str(inst)) == os.path.join(str(work), "fastpath-bench-results")
        assert mod.results_dir(BENCH) == os.path.join(BENCH, "results")
    finally:
        sys.path.remove(str(inst))
        sys.modules.pop("_commit", None)
    for script in ("run.py", "scaling.py", "zoo.py", "serve.py"):
        with open(os.path.join(BENCH, script)) as f:
            src = f.read()
        assert "results_dir(HERE)" in src and 'os.path.join(HERE, "results"' not in src, script
