"""bench/zoo.py: its JSON is stamped with the commit, its ratios to the peers are percentile for
percentile, and it leaves nothing in the temp folder.
"""

import json
import os
import subprocess
import sys

import pytest


from helpers.bench_scripts import BENCH, commit_stamp_here


@pytest.fixture(scope="module")
def zoo_run(tmp_path_factory):
    """bench/zoo.py on its smallest model, 100 timed calls, once for this file's tests (each
    reads another part of the same run): (results, stdout, the TMPDIR it ran with)."""
    pytest.importorskip("skl2onnx")
    pytest.importorskip("onnxruntime")
    where = tmp_path_factory.mktemp("zoo")
    tmp = where / "tmp"
    tmp.mkdir()
    path = where / "zoo.json"
    out = subprocess.run([sys.executable, os.path.join(BENCH, "zoo.py"), "--quick", "--calls",
                          "100", "--only", "ridge", "--out", str(path)],
                         capture_output=True, text=True, timeout=300, cwd=str(where),
                         env=dict(os.environ, TMPDIR=str(tmp)))
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(path.read_text()), out.stdout, tmp


def test_zoo_results_are_stamped_with_the_commit(zoo_run):
    """bench/zoo.py's JSON (the README's model-zoo table) had the version, not the commit."""
    res, _, _ = zoo_run
    assert "commit" in res and res["commit"] == commit_stamp_here()


def test_zoo_ratios_are_percentile_for_percentile(zoo_run):
    """bench/zoo.py's docstring promised the peer's p50 / fastpath's p50 "and p99 / p99": only
    the p50 ratio existed, and the agreement check ran on the first 256 of the timed inputs,
    not on all of them as it says."""
    res, stdout, _ = zoo_run
    (row,) = res["rows"]
    fp, o = row["fastpath"], row["onnxruntime"]
    assert o["ratio_p50"] == pytest.approx(o["p50"] / max(fp["p50"], 1))
    assert o["ratio_p99"] == pytest.approx(o["p99"] / max(fp["p99"], 1))
    assert row["agreement_inputs"] == 100          # --calls 100: the inputs timed
    assert f"{o['ratio_p50']:.1f}x / {o['ratio_p99']:.1f}x |" in stdout


def test_zoo_leaves_nothing_behind(zoo_run):
    _, _, tmp = zoo_run
    # (a library the zoo imports keeps a one-line ".ses" file there: not the zoo's)
    assert [n for n in os.listdir(tmp) if n != ".ses"] == []


@pytest.fixture(scope="module")
def zoo_tree_run(tmp_path_factory):
    """bench/zoo.py on its smallest LightGBM and CatBoost rows, 100 timed calls: (results,
    stdout, the working directory it ran in)."""
    pytest.importorskip("onnxmltools")
    pytest.importorskip("onnxruntime")
    pytest.importorskip("lightgbm")
    pytest.importorskip("catboost")
    where = tmp_path_factory.mktemp("zoo-trees")
    path = where / "zoo.json"
    out = subprocess.run([sys.executable, os.path.join(BENCH, "zoo.py"), "--quick", "--calls",
                          "100", "--only", "lightgbm-100x6,catboost", "--out", str(path)],
                         capture_output=True, text=True, timeout=600, cwd=str(where))
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(path.read_text()), out.stdout, where


def test_zoo_scores_tree_models_against_the_library_that_trained_them(zoo_tree_run):
    """The zoo compared fastpath with onnxruntime only, whose export rounds LightGBM's
    thresholds to float32: it now also loads the booster natively, times that engine, and
    scores both against LightGBM's own predict on every kind of parity row."""
    res, stdout, _ = zoo_tree_run
    assert [r["name"] for r in res["rows"]] == ["lightgbm-100x6", "catboost-100x6"]
    for row in res["rows"]:
        assert row["fastpath_native"]["n"] == 100
        nat = row["parity_native_vs_library"]
        assert {"random", "threshold", "missing", "zero", "given"} <= set(nat)
        assert max(nat.values()) <= 1e-6, (row["name"], nat)
        assert set(row["parity_onnx_vs_library"]) == set(nat)
        table_row = next(ln for ln in stdout.splitlines() if ln.startswith(f"| {row['name']} |"))
        assert f"/ {max(nat.values()):.1e} |" in table_row
    assert "fastpath native loader" in stdout


def test_zoo_leaves_nothing_in_the_working_directory(zoo_tree_run):
    """CatBoost wrote its training logs to catboost_info/ in the directory the zoo ran from."""
    _, _, where = zoo_tree_run
    assert sorted(os.listdir(where)) == ["zoo.json"]
