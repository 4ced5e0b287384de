"""Session 29: fastpath calibrate named an unreadable --ticks / --symbols / --ts file only by
errno ("[Errno 2] No such file or directory: 'x'": which of the three?), and said "fp32 hidden
layers" of a tree ensemble given --weights fp32."""
import numpy as np
import pytest

from helpers.models import F32, _onnx


@pytest.mark.parametrize("opt", ["--ticks", "--symbols", "--ts"])
def test_an_unreadable_input_file_names_its_option(tmp_path, capsys, opt):
    from fastpath.cli import main
    p = _onnx(tmp_path, 1, "one.onnx")
    np.save(tmp_path / "t.npy", np.ones((20, 6), F32))
    args = {"--ticks": str(tmp_path / "t.npy")}
    args[opt] = str(tmp_path / "missing.npy")
    argv = ["calibrate", "--model", str(p), "--out", str(tmp_path / "c.fpm"), "--z-fields",
            "0-5", "--window-fields", "none"]
    for k, v in args.items():
        argv += [k, v]
    if opt == "--ts":
        argv += ["--max-error", "0.01"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"fastpath calibrate: {opt} '{tmp_path / 'missing.npy'}': cannot read it (No such " \
           f"file or directory)" in err
    (tmp_path / "adir.npy").mkdir()
    args[opt] = str(tmp_path / "adir.npy")
    argv[argv.index(opt) + 1] = args[opt]
    assert main(argv) == 2
    assert f"{opt} '{tmp_path / 'adir.npy'}': cannot read it (Is a directory)" in \
        capsys.readouterr().err
    assert not (tmp_path / "c.fpm").exists()


def test_fp32_weights_on_a_tree_say_what_a_tree_holds(tmp_path, capsys):
    pytest.importorskip("onnx")
    from fastpath.cli import main
    from helpers.models import _tree_onnx
    p = _tree_onnx(tmp_path)
    np.save(tmp_path / "t.npy", np.random.default_rng(3).standard_normal((40, 6)).astype(F32))
    assert main(["calibrate", "--ticks", str(tmp_path / "t.npy"), "--model", str(p), "--out",
                 str(tmp_path / "c.fpm"), "--z-fields", "0-5", "--window-fields", "none",
                 "--features", "raw", "--weights", "fp32"]) == 0
    out = capsys.readouterr().out
    assert "hidden layers" not in out
    assert "weights: fp32 (a tree ensemble's float32 thresholds and leaves" in out


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
