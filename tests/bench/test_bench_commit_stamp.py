"""The results are stamped with the commit they measured: "-dirty" only where the code differs
from it (not where an earlier run wrote its results), and the scaling and serve benches' JSON
carry the commit too.
"""

import json
import os
import subprocess
import sys

import pytest

from helpers.bench_scripts import BENCH, commit_stamp_here


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


def test_results_written_by_a_run_do_not_make_the_next_run_dirty(monkeypatch, checkout,
                                                                  bench_machine):
    """A full run rewrites the tracked bench/results/latest-*.json; the next run, from the
    same code, stamped its results "<commit>-dirty". A change to the code still does."""
    monkeypatch.setattr(bench_machine, "HERE", str(checkout / "bench"))
    head = _git(checkout, "rev-parse", "--short", "HEAD")
    assert bench_machine.machine_facts()["commit"] == head
    (checkout / "bench" / "results" / "latest-generated.json").write_text('{"a": 1}\n')
    (checkout / "bench" / "results" / "20990101-000000-generated.json").write_text("{}\n")
    assert bench_machine.machine_facts()["commit"] == head
    (checkout / "src.py").write_text("x = 2\n")
    assert bench_machine.machine_facts()["commit"] == head + "-dirty"


# (script, its arguments for a short run, the JSON it writes under tmp_path)
STAMPED = {
    "scaling": (["--models", "8x2", "--calls", "100", "--no-peers", "--out", "{tmp}"],
                "scaling-partial.json"),
    "serve": (["--calls", "200", "--soak", "0", "--out", "{tmp}/serve.json"], "serve.json"),
}


@pytest.mark.parametrize("script", sorted(STAMPED))
def test_script_results_are_stamped_with_the_commit(tmp_path, script):
    """bench/scaling.py's and bench/serve.py's JSON did not say which commit ran."""
    args, written = STAMPED[script]
    out = subprocess.run([sys.executable, os.path.join(BENCH, f"{script}.py"),
                          *(a.format(tmp=tmp_path) for a in args)],
                         capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads((tmp_path / written).read_text())
    assert "commit" in res and res["commit"] == commit_stamp_here()
    if script == "serve":
        import fastpath
        assert res["fastpath"] == fastpath.__version__
