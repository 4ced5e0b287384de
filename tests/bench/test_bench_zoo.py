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
