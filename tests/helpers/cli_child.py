"""`python -m fastpath.cli ...` in a child process, as a user runs the command line."""
import os
import subprocess
import sys

import fastpath


def run_cli(*args, cwd=None, timeout=120):
    """The command's CompletedProcess (text stdout and stderr). By default it runs in the
    folder above the imported fastpath (outside the checkout for an installed package), so
    the child imports the same build, not the source folder beside the tests."""
    return subprocess.run([sys.executable, "-m", "fastpath.cli", *args], capture_output=True,
                          text=True, timeout=timeout,
                          cwd=cwd or os.path.dirname(fastpath.__file__) + "/..")
