"""Builds of the package (sdist, wheel) for tests of what a user installs."""
from pathlib import Path
import shutil
import subprocess
import sys
import tomllib

import pytest


ROOT = Path(__file__).resolve().parents[2]  # the repo


def _setup(tmp_path, *args):
    """setup.py <args> on a copy of the checkout: a stale *.egg-info/SOURCES.txt in the
    checkout is read back into the next sdist and would hide a missing MANIFEST.in line."""
    pytest.importorskip("Cython", reason="the build requirements (Cython) are not installed here")
    pytest.importorskip("setuptools", reason="setuptools is not installed here")
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", ".hypothesis",
        ".pytest_cache", "*.so"))
    out = subprocess.run([sys.executable, "setup.py", "-q", *args], cwd=src, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return out


def _entry_point() -> tuple:
    """(module, function) of pyproject's `fastpath` script."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        target = tomllib.load(f)["project"]["scripts"]["fastpath"]
    mod, _, fn = target.partition(":")
    return mod, fn
