"""The bench runs end to end (--quick) and writes JSON that validates against bench/schema.json.
Nothing here looks at the figures: timing belongs to the bench, not to tests."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..")


def run_bench(tmp_path, *extra):
    out = subprocess.run([sys.executable, os.path.abspath(os.path.join(ROOT, "bench", "run.py")), "--quick",
                          "--json-only", "--no-plot", "--out", str(tmp_path), *extra],
                         capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    path = out.stdout.strip().splitlines()[-1]
    with open(path) as f:
        return json.load(f)


def validate(res):
    jsonschema = pytest.importorskip("jsonschema")
    with open(os.path.join(ROOT, "bench", "schema.json")) as f:
        jsonschema.validate(res, json.load(f))


def test_bench_quick_generated(tmp_path):
    res = run_bench(tmp_path)
    validate(res)
    assert res["stream"]["regimes"] == ["calm", "shock", "recovery"]
    assert [r["name"] for r in res["replay"]["regimes"]] == ["calm", "shock", "recovery"]
    assert res["step_hit"]["all_hits"]
    assert res["peers"]["numpy"]["available"]
    # the peers compute the same model
    for p in res["peers"].values():
        if p["available"]:
            assert p["max_abs_diff_vs_fastpath_model"] < 1e-4
    assert {t["what"] for t in res["targets"]} >= {"fastpath.step() miss p50 (ns)",
                                                   "step_batch ticks/s (cache off)"}


def test_bench_quick_binance(tmp_path):
    from conftest import DATA_DIR
    if not os.path.isdir(DATA_DIR):
        pytest.skip("shared Binance data not present")
    res = run_bench(tmp_path, "--data", DATA_DIR)
    validate(res)
    assert res["stream"]["ticks"] == 6493
    assert res["stream"]["regimes"] == ["calm", "volatile"]


def test_bench_schema_rejects_missing_field(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    with open(os.path.join(ROOT, "bench", "schema.json")) as f:
        schema = json.load(f)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"schema_version": 1}, schema)
