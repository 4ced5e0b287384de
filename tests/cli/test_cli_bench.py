"""`fastpath bench`: it speaks as `fastpath bench`, exits 2 on bad input and checks its out
folder before it runs.
"""

import os
import subprocess
import sys

import pytest

import fastpath


PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(fastpath.__file__)))


def _env():
    """The CLI in a subprocess run from tmp_path imports the fastpath these tests import."""
    env = dict(os.environ)
    env["PYTHONPATH"] = PKG_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_bench_speaks_as_fastpath_bench_and_exits_2_on_bad_input(tmp_path, capsys):
    from fastpath.cli import main
    with pytest.raises(SystemExit) as e:
        main(["bench", "--help"])
    assert e.value.code == 0
    assert capsys.readouterr().out.startswith("usage: fastpath bench ")
    # in a process of its own: the run places its thread (pinned, SCHED_FIFO) before it reads
    # --data, and a test process left so starved the in-process servers of later tests
    out = subprocess.run([sys.executable, "-m", "fastpath.cli", "bench", "--no-rt", "--data",
                          str(tmp_path / "nothing-here"), "--out", str(tmp_path / "res")],
                         capture_output=True, text=True, cwd=tmp_path, env=_env(), timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("fastpath bench: --data ") and "bench/run.py" not in out.stderr


def test_bench_checks_its_out_folder_before_it_runs(tmp_path, capsys):
    """--out naming a file (or "") failed with a bare OSError once every figure had been
    measured (a full bench: minutes)."""
    from fastpath.cli import main
    (tmp_path / "afile").write_text("")
    for out in (str(tmp_path / "afile"), ""):
        with pytest.raises(SystemExit) as e:
            main(["bench", "--ticks", "10", "--no-plot", "--no-rt", "--out", out])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert f"--out {out!r}: cannot make the results folder" in err
        assert "step_batch" not in err                  # no phase of the run began
