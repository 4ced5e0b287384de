"""The note `fastpath serve` and `fastpath doctor` print when a regression head runs at the
scale 1.0 nobody fitted: when it is said, what it names (the output, the fitted scale, how it
was replaced), and the output fit_head_scale records for it.
"""

import numpy as np
from hypothesis import given, settings, strategies as st

from fastpath.model import Head, Model

from helpers.models import F32, _model, _onnx


def _regression_model(scale, outputs, fit):
    from types import SimpleNamespace
    from fastpath.model.types import Head
    return SimpleNamespace(head_spec=Head("regression", scale, outputs),
                           meta={} if fit is None else {"head_fit": fit})


def test_the_regression_note_tells_a_replaced_scale_from_a_head_set_after_the_fit():
    """with_head keeps meta['head_fit']: a bundle whose head was set to regression@1.0 through
    the Python API was told '--head without @SCALE replaced it' with no --head given."""
    from fastpath.cli import _regression_scale_note as note
    fit = {"abs_prediction_q": 0.004, "target": 1.0, "quantile": 0.9, "outputs": [0]}
    m = _regression_model(1.0, (0,), fit)
    by_cli = note(m, False, "serve", "m.fpm", head_given=True)
    assert "not the 0.004 calibrate fitted (--head without @SCALE replaced it)" in by_cli
    assert "leave --head out to keep the bundle's" in by_cli
    by_api = note(m, False, "serve", "m.fpm", head_given=False)
    assert "not the 0.004 calibrate fitted (the head was set after the fit)" in by_api
    assert "--head without" not in by_api and "leave --head out" not in by_api
    assert note(_regression_model(0.004, (0,), fit), False, "serve", "m.fpm", head_given=False) is None


def test_a_scale_fitted_to_another_output_is_not_offered():
    """head_fit did not say which output it was fitted on: --head regression:1 on a bundle
    fitted on output 0 was told to use output 0's scale."""
    from fastpath.cli import _regression_scale_note as note
    fit = {"abs_prediction_q": 0.004, "target": 1.0, "quantile": 0.9, "outputs": [0]}
    msg = note(_regression_model(1.0, (1,), fit), False, "serve", "m.fpm", head_given=True)
    assert "never fitted" in msg and "0.004" not in msg and "regression:1@SCALE" in msg
    # a bundle fitted before outputs were recorded: its fit is the head's own
    old = {k: v for k, v in fit.items() if k != "outputs"}
    assert "0.004 calibrate fitted" in note(_regression_model(1.0, (0,), old), False, "serve", "m.fpm")


def test_fit_head_scale_records_the_output_it_fitted():
    from fastpath.model.types import Head
    from fastpath.tuning import fit_head_scale
    import fastpath
    m = fastpath.get_default_engine().model.with_head(Head("regression", outputs=(1,)))
    raws = np.random.default_rng(0).standard_normal((64, m.raw_len)).astype(F32)
    out = fit_head_scale(m, raws)
    assert out.meta["head_fit"]["outputs"] == [1]


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
