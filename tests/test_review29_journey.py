"""Session 29: a user's walk through README and the command line.

- `fastpath doctor --model M` refused a model that needs a head (3 raw outputs) unless given
  --head, although doctor only sizes the engine (a head is a few numbers in it, not memory):
  it now sizes such a model with a stand-in head and says so on stderr; --head still works.
- A one-output model runs the regression head, signal = tanh(out / scale), and a scale nobody
  fitted (no `fastpath calibrate`, no @SCALE) is 1.0: an output in a return's units reads as a
  signal near 0, one in price units saturates, and nothing said so. `fastpath serve` and
  `fastpath doctor` now say it on stderr (the Python API stays quiet).
- `fastpath bench` printed its usage as "cli.py" (or "fastpath", without "bench"), and a
  --data it could not read exited 1, where every other command exits 2 on bad input.
"""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastpath
from fastpath.model import Head, Layer, Model
from helpers.builders import strip_fastpath_record
from helpers.models import F32, _model, _onnx  # noqa: F401

PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(fastpath.__file__)))


def _env():
    """The CLI in a subprocess run from tmp_path imports the fastpath these tests import."""
    env = dict(os.environ)
    env["PYTHONPATH"] = PKG_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _memlock_bytes(out: str) -> int:
    check = [c for c in json.loads(out)["checks"] if c["name"] == "rlimit_memlock"][0]
    return int(re.search(r"engine arena \+ state (\d+) B", check["detail"]).group(1))


# ------------------------------------------------------------------ doctor and the head
def test_doctor_sizes_a_model_that_needs_a_head_without_one(tmp_path, capsys):
    from fastpath.cli import main
    p = _onnx(tmp_path, 3, "three.onnx")
    assert main(["doctor", "--model", str(p), "--json"]) in (0, 1)
    cap = capsys.readouterr()
    assert "stand-in head" in cap.err and "3 outputs and no head was given" in cap.err
    without = _memlock_bytes(cap.out)
    assert main(["doctor", "--model", str(p), "--json", "--head", "tanh_sigmoid:2,0"]) in (0, 1)
    cap = capsys.readouterr()
    assert "stand-in" not in cap.err
    assert _memlock_bytes(cap.out) == without          # the head is not memory


def test_doctor_still_refuses_a_model_no_head_loads(tmp_path, capsys):
    from fastpath.cli import main
    (tmp_path / "bad.fpm").write_bytes(b"not a bundle at all")
    assert main(["doctor", "--model", str(tmp_path / "bad.fpm")]) == 2
    err = capsys.readouterr().err
    assert "not a fastpath model bundle" in err and "stand-in" not in err
    # a head given on purpose is the user's: a bad one is refused, not replaced
    p = _onnx(tmp_path, 3, "three.onnx")
    assert main(["doctor", "--model", str(p), "--head", "classifier3"]) == 2
    assert "reads class probabilities" in capsys.readouterr().err


# ------------------------------------------------------- the unfitted regression scale
@pytest.fixture
def served(monkeypatch):
    import fastpath.serving.server as server
    got = {}

    def fake(name, model=None, config=None, stats=False, out=None):
        got["model"] = model
        return 0
    monkeypatch.setattr(server, "run_foreground", fake)
    return got


NOTE = "regression head runs at scale 1.0"


def test_serve_says_when_a_regression_scale_was_never_fitted(tmp_path, capsys, served):
    from fastpath.cli import main
    p = _onnx(tmp_path, 1, "one.onnx")
    assert main(["serve", "--name", "x", "--model", str(p)]) == 0
    err = capsys.readouterr().err
    assert NOTE in err and "fastpath calibrate" in err and "--head regression@SCALE" in err
    assert served["model"].head_spec == Head("regression")      # what runs is unchanged
    # a scale given, or given as 1 on purpose: nothing to say
    for head in ("regression@0.004", "regression@1"):
        assert main(["serve", "--name", "x", "--model", str(p), "--head", head]) == 0
        assert NOTE not in capsys.readouterr().err
    # the output it reads is named in the hint
    p3 = _onnx(tmp_path, 3, "three.onnx")
    assert main(["serve", "--name", "x", "--model", str(p3), "--head", "regression:2"]) == 0
    assert "--head regression:2@SCALE" in capsys.readouterr().err
    # the demo model and heads other than regression
    assert main(["serve", "--name", "x"]) == 0
    assert main(["serve", "--name", "x", "--model", str(p3), "--head", "tanh_sigmoid:0,1"]) == 0
    assert NOTE not in capsys.readouterr().err


def test_a_calibrated_scale_is_quiet_and_replacing_it_is_said(tmp_path, capsys, served):
    from fastpath.cli import main
    p = _onnx(tmp_path, 1, "one.onnx")
    raws = (np.random.default_rng(5).standard_normal((300, 6)) * 3 + 10).astype(F32)
    np.save(tmp_path / "t.npy", raws)
    assert main(["calibrate", "--ticks", str(tmp_path / "t.npy"), "--model", str(p), "--out",
                 str(tmp_path / "c.fpm"), "--z-fields", "0-5", "--window-fields", "none"]) == 0
    capsys.readouterr()
    fitted = Model.load(tmp_path / "c.fpm").head_spec.scale
    assert fitted != 1.0
    for cmd in (["serve", "--name", "x"], ["doctor", "--json"]):
        assert main(cmd + ["--model", str(tmp_path / "c.fpm")]) in (0, 1)
        assert NOTE not in capsys.readouterr().err
        # --head regression on the bundle puts the default scale in place of the fitted one
        assert main(cmd + ["--model", str(tmp_path / "c.fpm"), "--head", "regression"]) in (0, 1)
        err = capsys.readouterr().err
        assert NOTE in err and f"@{fitted:.6g}" in err
    assert served["model"].head_spec.scale == 1.0


def test_doctor_says_it_too(tmp_path, capsys):
    from fastpath.cli import main
    p = _onnx(tmp_path, 1, "one.onnx")
    assert main(["doctor", "--model", str(p), "--json"]) in (0, 1)
    err = capsys.readouterr().err
    assert NOTE in err and "fastpath doctor: note:" in err


def test_calibrate_refuses_any_scale_it_would_refit(tmp_path, capsys):
    from fastpath.cli import main
    p = _onnx(tmp_path, 1, "one.onnx")
    np.save(tmp_path / "t.npy", np.ones((50, 6), F32))
    # @1 was taken silently (only a scale other than 1 was refused), then refitted
    assert main(["calibrate", "--ticks", str(tmp_path / "t.npy"), "--model", str(p), "--out",
                 str(tmp_path / "c.fpm"), "--z-fields", "0-5", "--window-fields", "none",
                 "--head", "regression@1"]) == 2
    assert "calibrate fits the regression head's scale" in capsys.readouterr().err


@settings(max_examples=50, deadline=None)
@given(scale=st.floats(1e-30, 1e30, allow_nan=False), out=st.integers(0, 2),
       given_scale=st.booleans())
def test_the_note_is_for_the_default_scale_nobody_chose(scale, out, given_scale):
    from fastpath.cli import _regression_scale_note
    m = _model(3).with_head(Head("regression", scale, (out,)))
    note = _regression_scale_note(m, given_scale, "serve", "m.onnx")
    assert (note is not None) == (scale == 1.0 and not given_scale)
    if note:
        assert ("--head regression@SCALE" if out == 0 else f"regression:{out}@SCALE") in note
    # a head other than regression never gets it
    assert _regression_scale_note(m.with_head(Head("tanh_sigmoid", outputs=(out, (out + 1) % 3))),
                                  False, "serve", "m.onnx") is None


# ------------------------------------------------------------------ fastpath bench
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


# ------------------------------------------------------------- calibrate's inputs
@pytest.mark.parametrize("bad,hint", [(1 << 22, False), (1_700_000_000_000_082_944, True)])
def test_calibrate_refuses_symbols_no_engine_holds(tmp_path, capsys, bad, hint):
    """The --ts file given as --symbols was taken: each tick its own symbol, every rolling
    window fitted on one tick, exit 0."""
    from fastpath.cli import main
    p = _onnx(tmp_path, 1, "one.onnx")
    np.save(tmp_path / "t.npy", (np.random.default_rng(1).standard_normal((40, 6)) + 5).astype(F32))
    syms = np.zeros(40, np.int64)
    syms[7] = bad
    np.save(tmp_path / "s.npy", syms)
    assert main(["calibrate", "--ticks", str(tmp_path / "t.npy"), "--symbols",
                 str(tmp_path / "s.npy"), "--model", str(p), "--out", str(tmp_path / "c.fpm"),
                 "--z-fields", "0-3", "--window-fields", "4,5"]) == 2
    err = capsys.readouterr().err
    assert f"holds symbol {bad}; symbols are ids 0..{(1 << 22) - 1}" in err
    assert ("they go to --ts" in err) == hint
    assert not (tmp_path / "c.fpm").exists()


def test_calibrate_refuses_reduced_weights_for_a_tree_before_the_fit(tmp_path, capsys):
    pytest.importorskip("onnx")
    from fastpath.cli import main
    from helpers.models import _tree_onnx
    p = _tree_onnx(tmp_path)
    np.save(tmp_path / "t.npy", np.ones((20, 6), F32))
    assert main(["calibrate", "--ticks", str(tmp_path / "t.npy"), "--model", str(p), "--out",
                 str(tmp_path / "c.fpm"), "--z-fields", "0-5", "--window-fields", "none",
                 "--features", "raw", "--weights", "int8"]) == 2
    cap = capsys.readouterr()
    assert "--weights int8 packs an MLP's hidden layers" in cap.err
    assert "feature spec:" not in cap.out            # said before the fit, not after it


# ------------------------------------------- an empty option is not the option left out
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
