"""Session 29 review: bench/run.py's run() places the calling thread (one core, SCHED_FIFO 50
unless --no-rt) and nothing gave that back. The --data check in main() only refuses a path
that does not exist: one that exists but cannot be read (an empty folder: no depth10.csv), a
stream over MAX_TICKS, Ctrl-C or any error after the placement left a caller of main() in
process pinned to one core (and under SCHED_FIFO where granted), as a finished run did too.
main() now gives the thread back its affinity and policy however run() ends."""
import os
import subprocess
import sys

import fastpath

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
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
