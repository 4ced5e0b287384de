"""The `fastpath` command as a process: Ctrl-C during start-up exits 130 without a traceback,
the entry point module is cheap to import, a reader that goes away is not bad input, and an
empty path is refused rather than defaulted.
"""

import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import numpy as np
import pytest

import fastpath

from helpers.models import F32, _onnx
from helpers.packaging import _entry_point


ROOT = Path(__file__).resolve().parents[2]


# where fastpath was imported from (a checkout with built extensions, or site-packages): the
# entry point's module is installed beside it
PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(fastpath.__file__)))


def _console_script(tmp_path) -> Path:
    """The script pip writes for the entry point (bin/fastpath), run with this Python."""
    mod, fn = _entry_point()
    p = tmp_path / "fastpath-script.py"
    p.write_text(f"import re\nimport sys\nfrom {mod} import {fn}\nif __name__ == '__main__':\n"
                 f"    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n"
                 f"    sys.exit({fn}())\n")
    return p


def _maps(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/maps") as f:
            return f.read()
    except OSError:
        return ""


# What the process has mapped when the Ctrl-C is sent: the engine's .so (the start of `import
# fastpath`), numpy's core (inside it), the serving module (near its end); "" is once it
# blocks reading --ticks, the command running. Before the first, Python is still starting
# (site.py), which no code of ours can guard.
@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc/PID/maps")
@pytest.mark.parametrize("mark", ["_engine.cpython", "_multiarray_umath", "_serve.cpython", ""])
def test_ctrl_c_during_start_up_exits_130_without_a_traceback(tmp_path, mark):
    """Ctrl-C during the console script's imports printed a traceback and died by SIGINT instead of
    exiting 130."""
    script = _console_script(tmp_path)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [PKG_PARENT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    # calibrate reading --ticks from a pipe nobody writes: blocked until the Ctrl-C
    p = subprocess.Popen([sys.executable, str(script), "calibrate", "--ticks", "/dev/stdin",
                          "--model", "m.onnx", "--out", str(tmp_path / "o.fpm")],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         cwd=tmp_path, env=env)
    try:
        deadline = time.monotonic() + 60
        if mark:
            while mark not in _maps(p.pid) and p.poll() is None and time.monotonic() < deadline:
                time.sleep(0.0005)
        else:
            time.sleep(1.0)
            while p.poll() is None and time.monotonic() < deadline:
                with open(f"/proc/{p.pid}/wchan") as f:
                    if "pipe" in f.read():       # blocked in read(2) on stdin
                        break
                time.sleep(0.01)
        assert p.poll() is None, p.communicate()
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    err = err.decode()
    assert "Traceback" not in err, err
    assert p.returncode == 130, (p.returncode, err)
    assert len(err.strip().splitlines()) <= 1 and "interrupted" in err, err


# a stand-in fastpath package: its __init__ fails a caught `from . import X` (as numpy does at
# every start), and the Ctrl-C arrives while CPython builds that failure's message
_SIGINT_IN_IMPORT = """import os, signal


class _Name(str):
    def __repr__(self):
        os.kill(os.getpid(), signal.SIGINT)
        return str.__repr__(self)


__name__ = _Name(__name__)
try:
    from . import _absent
except ImportError:
    pass
"""


def test_ctrl_c_while_a_caught_import_error_is_built_exits_130(tmp_path):
    """A Ctrl-C while a caught `from X import Y` failure built its message was a TypeError."""
    pkg = tmp_path / "fake" / "fastpath"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(_SIGINT_IN_IMPORT)
    (pkg / "cli.py").write_text("def main(argv=None):\n    print('ran')\n    return 0\n")
    mod, fn = _entry_point()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "fake"), PKG_PARENT]))
    p = subprocess.run([sys.executable, "-c", f"import sys, {mod}; sys.exit({mod}.{fn}())"],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
    assert "Traceback" not in p.stderr, p.stderr
    assert (p.returncode, p.stdout, p.stderr) == (130, "", "fastpath: interrupted\n")


def test_entry_point_module_is_packaged_and_cheap_to_import(tmp_path):
    # the guard works only if importing the entry point's module does not import fastpath
    mod, fn = _entry_point()
    out = subprocess.run([sys.executable, "-c", f"import sys, {mod}; "
                          f"print(callable({mod}.{fn}), 'fastpath' in sys.modules, "
                          f"'numpy' in sys.modules)"],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path,
                         env=dict(os.environ, PYTHONPATH=PKG_PARENT))
    assert out.stdout.split() == ["True", "False", "False"], out.stdout + out.stderr
    if "." not in mod:          # a top-level module: the wheel and the sdist must carry it
        with open(ROOT / "pyproject.toml", "rb") as f:
            st = tomllib.load(f)["tool"]["setuptools"]
        assert mod in st.get("py-modules", ()), st
        manifest = (ROOT / "MANIFEST.in").read_text()
        assert f"{mod}.py" in manifest


@pytest.mark.parametrize("cmd", ["example-config", "info"])
def test_reader_gone_is_not_reported_as_bad_input(cmd, tmp_path):
    """A closed stdout (`fastpath doctor --json | head`) was reported as a broken pipe with exit 2,
    the code for bad input."""
    import subprocess
    import sys
    p = subprocess.Popen([sys.executable, "-m", "fastpath.cli", cmd], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, cwd=tmp_path)
    p.stdout.close()            # before the command writes a byte
    err = p.stderr.read().decode()
    p.stderr.close()
    assert p.wait(timeout=120) == 1 and err == "", err


def test_an_empty_model_or_symbols_path_is_refused_not_defaulted(tmp_path, capsys, served):
    """--model "$MODEL" with MODEL unset served (and doctor sized) the demo model, and
    --symbols "" fitted every tick as symbol 0: an empty path is a path that is not there."""
    from fastpath.cli import main
    assert main(["serve", "--name", "x", "--model", ""]) == 2
    assert "cannot read model file ''" in capsys.readouterr().err
    assert "model" not in served
    assert main(["doctor", "--model", ""]) == 2
    assert "cannot read model file ''" in capsys.readouterr().err
    p = _onnx(tmp_path, 1, "one.onnx")
    np.save(tmp_path / "t.npy", np.ones((20, 6), F32))
    for opt in ("--symbols", "--ts"):
        extra = ["--max-error", "0.01"] if opt == "--ts" else []
        assert main(["calibrate", "--ticks", str(tmp_path / "t.npy"), opt, "", "--model", str(p),
                     "--out", str(tmp_path / "c.fpm"), "--z-fields", "0-5", "--window-fields",
                     "none"] + extra) == 2
        assert f"{opt} '': cannot read it (No such file or directory)" in capsys.readouterr().err
    assert not (tmp_path / "c.fpm").exists()
    # the demo model under a regression head the user chose says whose head it is
    assert main(["serve", "--name", "x", "--head", "regression"]) == 0
    assert "the demo model's regression head runs at scale 1.0" in capsys.readouterr().err
