"""Where the bench's scripts are, for tests that run them or import them as modules."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo
BENCH = os.path.join(ROOT, "bench")


def bench_on_path():
    """bench/ first on sys.path for the rest of the run: its scripts import their siblings
    (_report, _commit, peers) by plain name, also from functions called later."""
    if BENCH not in sys.path:
        sys.path.insert(0, BENCH)


def import_bench(name):
    """bench/<name>.py imported as a module, with bench/ on sys.path only while it loads."""
    sys.path.insert(0, BENCH)
    try:
        return __import__(name)
    finally:
        sys.path.remove(BENCH)


def commit_stamp_here():
    """The commit stamp (with "-dirty" where the tree differs) the bench writes for this checkout."""
    return import_bench("_commit").commit_stamp(BENCH)
