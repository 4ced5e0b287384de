"""The bench runs end to end (--quick) and writes JSON that validates against bench/schema.json,
and every row measures what its label says: the miss row holds only calls where the cache was on,
looked the symbol up and refused, the hit rows only calls the cache answered. Nothing here looks at the
figures: timing belongs to the bench, not to tests."""
import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..")
BENCH = os.path.abspath(os.path.join(ROOT, "bench"))


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
