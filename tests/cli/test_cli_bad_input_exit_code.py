"""`fastpath calibrate` exits 2 on every kind of bad input, whichever check finds it."""

import os
import subprocess

import numpy as np

import fastpath


# subprocesses run outside the checkout, so the installed package is imported, not the source
# folder (which has no built extensions when CI installs a wheel-like build)
PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(fastpath.__file__)))


def test_cli_bad_input_exits_2_whichever_check_finds_it(tmp_path):
    """Defect guarded: fastpath calibrate exited 1 on a bad ticks file but 2 on a bad option or
    model file, so a script could not tell a usage error from a failed check; every bad-input
    path exits 2."""
    import sys
    from fastpath._build import DEMO_MODEL
    ticks = tmp_path / "t.npy"
    np.save(ticks, np.zeros((4, 3, 2), np.float32))        # 3-d: not (ticks, raw_len)
    out = subprocess.run([sys.executable, "-m", "fastpath.cli", "calibrate", "--ticks",
                          str(ticks), "--model", DEMO_MODEL, "--out", str(tmp_path / "o.fpm")],
                         capture_output=True, text=True, timeout=120, cwd=PKG_PARENT)
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert "must hold a 2-d array" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "o.fpm").exists()
