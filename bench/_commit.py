"""The commit a bench result measured, for every results JSON the benches write.

`git rev-parse --short HEAD` of the checkout the bench runs from, with "-dirty" where the
checkout's files (tracked or untracked, ignored ones left out) differ from that commit. The
benches' own result files are left out of that check: a run rewrites the tracked
bench/results/latest-*.json, and the next run from the same code would otherwise call itself
dirty. None outside a git checkout (an installed bench) or without git.

Beside it, what every bench script's command line shares: where results go by default
(results_dir) and the argument type of a count or seed (int_at_least).
"""
from __future__ import annotations

import argparse
import os
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
# paths (from the checkout's top) whose changes do not change what a bench measures
NOT_MEASURED = ("bench/results",)


def results_dir(here: str | None = None) -> str:
    """Where a bench writes its results by default: bench/results in a checkout; beside the
    caller (./fastpath-bench-results) where the bench runs from an installed package, whose
    folder is site-packages (often not writable, and no place for a user's results)."""
    here = here or HERE
    if os.path.exists(os.path.join(here, "..", "setup.py")):
        return os.path.join(here, "results")
    return os.path.join(os.getcwd(), "fastpath-bench-results")


def int_at_least(lo: int, hi: int | None = None):
    """argparse type: an int >= lo (and <= hi), else a usage error naming what was expected
    (the benches' counts and seeds: a 0 ran the default, a negative one ended in a traceback)."""
    want = f"an integer >= {lo}" if hi is None else f"an integer in {lo}..{hi}"

    def conv(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}") from None
        if v < lo or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"expected {want}, got {v}")
        return v
    return conv


def _git(where: str, *args: str) -> str:
    return subprocess.run(["git", "-C", where, *args], capture_output=True, text=True,
                          timeout=5).stdout.strip()


def commit_stamp(where: str | None = None) -> str | None:
    """'abc1234' or 'abc1234-dirty' for the checkout holding `where` (default: bench/)."""
    where = where or HERE
    try:
        top = _git(where, "rev-parse", "--show-toplevel")
        commit = _git(where, "rev-parse", "--short", "HEAD") if top else ""
        if not commit:
            return None
        if _git(top, "status", "--porcelain", "--", ".",
                *(f":(exclude){p}" for p in NOT_MEASURED)):
            commit += "-dirty"
        return commit
    except (OSError, subprocess.SubprocessError):
        return None
