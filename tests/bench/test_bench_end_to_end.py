"""The bench runs end to end (--quick) and writes JSON that validates against bench/schema.json,
and every row measures what its label says: the miss row holds only calls where the cache was on,
looked the symbol up and refused, the hit rows only calls the cache answered. It runs without any
optional package, and a --data it cannot read is refused before the thread is placed, leaving a
caller of main() as it was. Nothing here looks at the figures: timing belongs to the bench, not to
tests.
"""

import json
import os
import re
import subprocess
import sys

import pytest

import fastpath

from helpers.bench_scripts import BENCH, bench_on_path

bench_on_path()


def run_bench(tmp_path, *extra):
    out = subprocess.run([sys.executable, os.path.join(BENCH, "run.py"), "--quick",
                          "--json-only", "--out", str(tmp_path), *extra],
                         capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    path = out.stdout.strip().splitlines()[-1]
    with open(path) as f:
        return json.load(f), path


def validate(res):
    jsonschema = pytest.importorskip("jsonschema")
    with open(os.path.join(BENCH, "schema.json")) as f:
        jsonschema.validate(res, json.load(f))


def check_rows(res):
    """Each row's calls are what its label says, by the engine's own answers for those calls."""
    st = res["step"]
    miss = st["miss"]
    assert miss["policy"]["enabled"]
    assert miss["samples"] > 0
    assert miss["cached_samples"] == 0
    assert miss["reasons"]["disabled"] == 0 and miss["reasons"]["hit"] == 0
    # lookup done: only misses where a slot held a result and a guard refused it
    assert miss["reasons"]["cold"] == 0
    assert sum(miss["reasons"][x] for x in ("age", "run", "cosine", "norm")) == miss["samples"]
    # the in-C records of the same calls agree: every one ran the MLP
    assert miss["in_c_records_with_infer"] == miss["samples"]
    for key in ("hit", "hit_loose"):
        hit = st[key]
        assert hit["policy"]["enabled"]
        assert hit["cached_samples"] == hit["samples"]
        assert hit["reasons"]["hit"] == hit["samples"]
        assert hit["in_c_records_with_infer"] == 0
    off = st["cache_off"]
    assert off["reasons"]["disabled"] == off["samples"] == res["stream"]["ticks"]
    # the book update -> signal row replays every update of the same stream through step_book
    # (results committed before the row have none)
    book = res.get("book")
    if book is not None:
        assert book["samples"] == book["in_c"]["book"]["n"] == res["stream"]["ticks"]
        assert book["step_cache_off_p50_ns"] == off["python"]["p50"]
        assert book["adapter_ns_per_tick"] > 0
    assert "cache off" in off["label"] and "miss" not in off["label"]
    # the bundle replay's calls are all accounted for: real misses, cold misses, hits
    assert (miss["samples"] + sum(miss["other_misses"].values()) + st["hit"]["samples"]
            == res["stream"]["ticks"])
    assert res["replay"]["hits"] == st["hit"]["samples"]
    # the step() replay with the looser policy hits exactly where its step_batch twin does
    loose = [t for t in res["replay"]["tradeoff"] if t["cos_threshold"] == st["hit_loose"]["policy"]
             ["cos_threshold"] and t["norm_tol"] == st["hit_loose"]["policy"]["norm_tol"]]
    assert loose and loose[0]["hits"] == st["hit_loose"]["samples"]
    # ratios are against the real miss
    mp50 = max(miss["python"]["p50"], 1)
    for p in res["peers"].values():
        if p["available"]:
            assert p["ratio_p50"] == pytest.approx(p["python"]["p50"] / mp50)
    # the plotted percentile series are the rows' own distributions
    pd = res["percentile_distributions"]
    for key in ("miss", "hit", "hit_loose", "cache_off"):
        s = pd[f"step_{key}"]
        assert s["n"] == st[key]["samples"]
        if s["n"]:
            assert s["percentile"] == sorted(s["percentile"]) and s["percentile"][0] == 0
            assert s["ns"] == sorted(s["ns"])
            assert s["ns"][-1] == st[key]["python"]["max"]
            assert s["percentile"][-1] == pytest.approx(100 * (1 - 1 / s["n"]), abs=1e-6)


def no_internal_numbers(text):
    assert not re.search(r"issue\s*#?\s*\d", text, re.I), re.search(r".{40}issue.{40}", text, re.I)


def test_bench_quick_generated(tmp_path):
    res, path = run_bench(tmp_path)
    validate(res)
    assert "book" in res and "adapter_ns_per_tick" in res
    assert res["stream"]["regimes"] == ["calm", "shock", "recovery"]
    assert [r["name"] for r in res["replay"]["regimes"]] == ["calm", "shock", "recovery"]
    check_rows(res)
    # the looser policy hits on the generated stream, so its hit row is never empty
    assert res["step"]["hit_loose"]["samples"] > 0
    assert res["peers"]["numpy"]["available"]
    # the peers compute the same model
    for p in res["peers"].values():
        if p["available"]:
            assert p["max_abs_diff_vs_fastpath_model"] < 1e-4
    assert {t["what"] for t in res["targets"]} >= {"fastpath.step() real miss p50 (ns)",
                                                   "step_batch ticks/s (cache off)"}
    # stable names beside the timestamped ones; a quick run never overwrites the committed ones
    assert os.path.exists(tmp_path / "latest-generated-quick.json")
    assert not os.path.exists(tmp_path / "latest-generated.json")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert res["plot"] is None
    else:
        assert res["plot"] == "latest-generated-quick.png"
        assert os.path.getsize(tmp_path / res["plot"]) > 10_000
        assert os.path.exists(path[:-len(".json")] + ".png")
    # what users read: the JSON, the tables, the README figures printed from the JSON
    no_internal_numbers(json.dumps(res))
    sys.path.insert(0, BENCH)
    try:
        from _report import markdown
    finally:
        sys.path.remove(BENCH)
    no_internal_numbers(markdown(res))
    out = subprocess.run([sys.executable, os.path.join(BENCH, "readme_figures.py"), path],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    assert res["step"]["miss"]["label"] in out.stdout
    no_internal_numbers(out.stdout)


def test_bench_quick_binance(tmp_path):
    from helpers.builders import DATA_DIR
    if not os.path.isdir(DATA_DIR):
        pytest.skip("shared Binance data not present")
    res, _ = run_bench(tmp_path, "--data", DATA_DIR, "--no-plot")
    validate(res)
    assert res["stream"]["ticks"] == 6493
    assert res["stream"]["regimes"] == ["calm", "volatile"]
    check_rows(res)
    assert res["plot"] is None if "plot" in res else True
    assert os.path.exists(tmp_path / "latest-binance-quick.json")


def test_bench_schema_rejects_missing_field(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    with open(os.path.join(BENCH, "schema.json")) as f:
        schema = json.load(f)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"schema_version": 2}, schema)


def test_committed_results_validate():
    """The results the README figures come from are committed, and match the schema."""
    path = os.path.join(BENCH, "results", "latest-generated.json")
    assert os.path.exists(path), "bench/results/latest-generated.json is not committed"
    assert os.path.exists(path[:-len(".json")] + ".png")
    with open(path) as f:
        res = json.load(f)
    validate(res)
    assert not res["quick"]
    check_rows(res)


def test_zoo_quick_rows(tmp_path):
    """bench/zoo.py end to end on its two smallest models: each row timed fastpath and
    onnxruntime and checked their agreement first (a fast wrong answer is not a row)."""
    pytest.importorskip("skl2onnx")
    pytest.importorskip("onnxruntime")
    out_json = tmp_path / "zoo.json"
    out = subprocess.run([sys.executable, os.path.join(BENCH, "zoo.py"), "--quick", "--calls", "300",
                          "--only", "ridge,logistic", "--out", str(out_json)],
                         capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out_json.read_text())
    assert [r["name"] for r in res["rows"]] == ["ridge", "logistic-3"]
    for r in res["rows"]:
        assert r["fastpath"]["n"] == 300 and r["onnxruntime"]["n"] == 300
        assert r["max_rel_diff_vs_onnxruntime"] < 1e-4
    assert "| ridge | linear |" in out.stdout


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


def test_a_missing_data_path_is_refused_before_the_placement(tmp_path, monkeypatch):
    """bench/run.py placed its thread (a pinned core, SCHED_FIFO) before it read --data: a
    main() called in process with a path that was not there left its caller pinned."""
    import run
    placed = []
    monkeypatch.setattr(run, "placement", lambda args: placed.append(args) or {})
    for data in (str(tmp_path / "nope"), f"{tmp_path / 'ob.csv'},{tmp_path / 'msg.csv'}"):
        with pytest.raises(SystemExit) as e:
            run.main(["--data", data, "--out", str(tmp_path / "out"), "--no-plot"])
        assert str(e.value.code).startswith(f"bench/run.py: --data {data}: cannot read it: ")
        assert "does not exist" in str(e.value.code)
    assert placed == []
    assert not (tmp_path / "out").exists()


PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(fastpath.__file__)))


# in a process of its own: a failure here must not leave the pytest process pinned
SCRIPT = r"""
import os, sys
sys.path.insert(0, sys.argv[1])
import run
def state():
    return (sorted(os.sched_getaffinity(0)), os.sched_getscheduler(0),
            os.sched_getparam(0).sched_priority)
before = state()
placed = []
real = run.placement
def spy(args):
    d = real(args)
    placed.append(state())
    return d
run.placement = spy
try:
    run.main(sys.argv[2:])
except SystemExit as e:
    print("exit:", e.code)
print("placed", placed)
print("before", before)
print("after ", state())
assert placed, "the run never placed its thread"
assert state() == before, (before, state())
"""


def _run_main(tmp_path, *argv):
    env = dict(os.environ)
    env["PYTHONPATH"] = PKG_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", SCRIPT, BENCH, *argv], capture_output=True,
                          text=True, cwd=tmp_path, env=env, timeout=300)


def test_a_data_folder_it_cannot_read_leaves_the_caller_as_it_was(tmp_path):
    if len(os.sched_getaffinity(0)) < 2:
        import pytest
        pytest.skip("one allowed CPU: a pinned thread looks like an unpinned one")
    (tmp_path / "capture").mkdir()                    # there, but no depth10.csv in it
    for extra in ([], ["--no-rt"]):
        out = _run_main(tmp_path, "--data", str(tmp_path / "capture"), "--out",
                        str(tmp_path / "res"), "--no-plot", *extra)
        assert "exit: bench/run.py: --data" in out.stdout, out.stdout + out.stderr
        assert "cannot read it" in out.stdout
        assert out.returncode == 0, out.stdout + out.stderr[-2000:]
