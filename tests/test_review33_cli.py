"""Review 33, the `fastpath` command: Ctrl-C during its start-up, empty field lists, and the
option names its errors speak of."""
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
from fastpath.cli import main

ROOT = Path(__file__).resolve().parents[1]
# where fastpath was imported from (a checkout with built extensions, or site-packages): the
# entry point's module is installed beside it
PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(fastpath.__file__)))


def _entry_point() -> tuple:
    """(module, function) of pyproject's `fastpath` script."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        target = tomllib.load(f)["project"]["scripts"]["fastpath"]
    mod, _, fn = target.partition(":")
    return mod, fn


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
    # Was: the console script's `from fastpath.cli import main` took 0.1-0.4 s (numpy, the
    # compiled engine); a Ctrl-C then printed a KeyboardInterrupt traceback and the process
    # died by SIGINT (returncode -2), where a running command exits 130
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


def test_wheel_and_sdist_carry_the_entry_point_module(tmp_path):
    mod, _ = _entry_point()
    if "." in mod:
        pytest.skip("the entry point is inside a package, which the packaging tests cover")
    from helpers.packaging import _setup
    lib = tmp_path / "lib"
    _setup(tmp_path, "build_py", "-d", str(lib))
    assert (lib / f"{mod}.py").is_file(), sorted(p.name for p in lib.iterdir())


def _calibrate_files(tmp_path, n_in=128):
    """256-wide ticks (whose default --window-fields is lob.WINDOW_FIELDS) and an MLP taking
    n_in features."""
    from helpers.builders import random_model
    from fastpath import lob
    raws = np.ascontiguousarray(lob.raw_from_book(lob.generate_stream(300, 2, seed=3)))
    np.save(tmp_path / "t.npy", raws)
    random_model(np.random.default_rng(3), [n_in, 8, 2]).save(tmp_path / "m.fpm")
    return ["calibrate", "--ticks", str(tmp_path / "t.npy"), "--model", str(tmp_path / "m.fpm"),
            "--out", str(tmp_path / "o.fpm")]


@pytest.mark.parametrize("option,value", [("--window-fields", ""), ("--window-fields", "  "),
                                          ("--window-fields", ","), ("--z-fields", ""),
                                          ("--z-fields", " , ")])
def test_an_empty_field_list_is_a_usage_error(tmp_path, capsys, option, value):
    # Was: --window-fields "" (an unset shell variable) meant no window fields, silently; the
    # default --z-fields then grew to the model's 128 inputs and the fit exited 0 with a spec
    # the model was not trained on. --z-fields "" failed only the feature count, not naming
    # the empty list
    base = _calibrate_files(tmp_path)
    assert main(base + [option, value]) == 2
    err = capsys.readouterr().err
    assert f"{option} {value!r} names no field" in err and "'none'" in err, err
    assert not (tmp_path / "o.fpm").exists()


def test_none_says_no_fields(tmp_path, capsys):
    from fastpath.model import Model
    base = _calibrate_files(tmp_path)
    assert main(base + ["--window-fields", "none"]) == 0, capsys.readouterr().err
    fs = Model.load(tmp_path / "o.fpm").feature_spec
    assert len(fs.w_idx) == 0 and len(fs.z_idx) == 128
    # a model over window features only: --z-fields none
    base = _calibrate_files(tmp_path, n_in=6)
    assert main(base + ["--z-fields", "NONE", "--window-fields", "40,60,61"]) == 0, \
        capsys.readouterr().err
    fs = Model.load(tmp_path / "o.fpm").feature_spec
    assert len(fs.z_idx) == 0 and list(fs.w_idx) == [40, 60, 61]


def _ts_files(tmp_path, ts, policy=None):
    """Small ticks (20 fields, no default window fields), an MLP over 14 of them, and the
    stamps `ts` (None: no file)."""
    from helpers.builders import random_model
    rng = np.random.default_rng(5)
    raws = (rng.standard_normal((60, 20)) * 4 + 3).astype(np.float32)
    np.save(tmp_path / "t.npy", raws)
    random_model(rng, [14, 8, 2], policy=policy).save(tmp_path / "m.fpm")
    args = ["calibrate", "--ticks", str(tmp_path / "t.npy"), "--model", str(tmp_path / "m.fpm"),
            "--out", str(tmp_path / "o.fpm"), "--z-fields", "0-13", "--max-error", "0.05",
            "--holdout", "0"]
    if ts is not None:
        np.save(tmp_path / "ts.npy", ts)
        args += ["--ts", str(tmp_path / "ts.npy")]
    return args


def _stamps(kind):
    ts = np.arange(60, dtype=np.int64) * 1000
    if kind == "negative":
        ts[7] = -1
    elif kind == "backwards":
        ts[9] = ts[3]
    elif kind == "past int64":
        ts = ts.astype(np.uint64)
        ts[11] = np.uint64(2 ** 63 + 5)
    return ts


@pytest.mark.parametrize("kind,says", [("negative", "row 7 is -1"),
                                       ("backwards", "row 9 (3000) is earlier than row 8"),
                                       ("past int64", "row 11 is 9223372036854775813")])
def test_bad_ts_is_named_as_the_option_typed(tmp_path, capsys, kind, says):
    # Was: "fastpath calibrate: ts_ns must be >= 0, row 7 is -1" (and "ts_ns row 9 ...",
    # "ts_ns row 11 ..."): ts_ns is the Python argument, the user typed --ts
    assert main(_ts_files(tmp_path, _stamps(kind))) == 2
    err = capsys.readouterr().err
    assert "ts_ns" not in err and "--ts" in err and says in err, err
    assert not (tmp_path / "o.fpm").exists()


def test_the_python_api_still_says_ts_ns(tmp_path):
    from fastpath.errors import InputError
    from fastpath.model import Model
    _ts_files(tmp_path, None)
    m = Model.load(tmp_path / "m.fpm")
    raws = np.ascontiguousarray(np.load(tmp_path / "t.npy")[:, :14])
    for kind, says in [("negative", "ts_ns must be >= 0, row 7 is -1"),
                       ("backwards", "ts_ns row 9 (3000) is earlier than row 8")]:
        with pytest.raises(InputError, match=r"^" + says.replace("(", r"\(").replace(")", r"\)")):
            m.fit_cache_policy(raws, None, max_error=0.05, ts_ns=_stamps(kind))


def test_the_age_guard_note_names_ts(tmp_path, capsys):
    # Was: a policy whose age guard no tick passes printed "raise max_age_ns (or give the
    # ticks' own ts_ns)" to a command user, who gives stamps with --ts
    from fastpath.model import CachePolicy
    args = _ts_files(tmp_path, None, policy=CachePolicy(True, 0.999, 0.02, 1000, 16))
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "max_age_ns 1000" in out and "--ts" in out and "ts_ns" not in out, out
