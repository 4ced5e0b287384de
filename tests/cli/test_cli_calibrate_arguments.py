"""`fastpath calibrate`: bad numbers and an unwritable output are usage errors before any
fitting, and --weights measures a model that already has them."""
import numpy as np
import pytest

import fastpath
from fastpath import cli
from fastpath._build import DEMO_MODEL
from fastpath.model import Model
from fastpath.tuning import weights_error
from helpers.serving import run_cli


# ------------------------------------------------------------------ command line
@pytest.mark.parametrize("extra,what", [
    (["--window", "-3"], "--window"),           # each checked before the fit
    (["--window", "0"], "--window"),
    (["--max-error", "nan"], "--max-error"),
    (["--max-error", "-1"], "--max-error"),
])
def test_calibrate_bad_numbers_are_usage_errors(tmp_path, capsys, extra, what):
    ticks = tmp_path / "t.npy"
    np.save(ticks, np.zeros((50, fastpath.get_default_engine().raw_len), np.float32))
    with pytest.raises(SystemExit) as exc:
        cli.main(["calibrate", "--ticks", str(ticks), "--model", DEMO_MODEL,
                  "--out", str(tmp_path / "o.fpm"), *extra])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {what}" in err and "Traceback" not in err
    assert not (tmp_path / "o.fpm").exists()


# ------------------------------------------------------------------ calibrate --out
@pytest.mark.parametrize("out,says", [
    ("m.onnx", "names an ONNX file"),
    (".", "is a directory"),
    ("no/such/dir/m.fpm", "no directory"),
])
def test_calibrate_refuses_an_unwritable_out_before_fitting(tmp_path, out, says):
    """Regression: an unwritable --out was refused only after the whole fit, under a temp
    file's name."""
    rng = np.random.default_rng(0)
    np.save(tmp_path / "t.npy", rng.normal(100, 1, (64, 256)).astype(np.float32))
    r = run_cli(["calibrate", "--ticks", "t.npy", "--model", DEMO_MODEL, "--out", out], tmp_path)
    err = r.stderr.decode()
    assert r.returncode == 2, err
    assert "--out" in err and says in err, err
    assert ".tmp" not in err
    assert "feature spec" not in r.stdout.decode()        # refused before the fit


# ------------------------------------------------------------------ calibrate --weights
def test_calibrate_weights_measures_a_model_that_already_has_them(tmp_path):
    """Regression: --weights bf16 on a bf16 bundle printed no signal error against fp32
    weights."""
    Model.load(DEMO_MODEL).with_weights("bf16").save(tmp_path / "b.fpm")
    rng = np.random.default_rng(3)
    raws = rng.normal(100, 1, (300, 256)).astype(np.float32)
    np.save(tmp_path / "t.npy", raws)
    r = run_cli(["calibrate", "--ticks", "t.npy", "--model", "b.fpm", "--out", "o.fpm",
             "--weights", "bf16"], tmp_path)
    out = r.stdout.decode()
    assert r.returncode == 0, r.stderr.decode()
    m = Model.load(tmp_path / "o.fpm")
    assert m.weights == "bf16"
    e = weights_error(m, raws, "bf16")
    assert (f"weights: bf16 hidden layers (signal against fp32 on these ticks: max |d| "
            f"{e['max_abs']:.4g} (tick {e['worst_tick']})") in out, out
