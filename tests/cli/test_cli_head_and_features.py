"""The command line's --head (calibrate, serve, doctor) and calibrate's --features
{zscore,raw}: a model with no default head takes one, a bad head is a usage error, a tree or a
model with its own scaler is asked what its features are."""
import subprocess
import sys

import numpy as np
import pytest

from fastpath import Engine
from fastpath.model import Head, Layer, Model
from helpers.builders import strip_fastpath_record
from helpers.models import _tree_onnx


F32 = np.float32


# ------------------------------------------------------------------- the CLI's --head
def _three_output_onnx(tmp_path):
    """A 3-output linear regressor as ONNX as another exporter writes it: no default head
    (3 raw outputs), and none recorded (to_onnx's fastpath record, which would carry the
    head, is taken out)."""
    pytest.importorskip("onnx")
    rng = np.random.default_rng(4)
    m = Model((Layer(rng.standard_normal((3, 6)).astype(F32), rng.standard_normal(3).astype(F32)),),
              head_spec=Head("regression"))
    p = tmp_path / "three.onnx"
    m.to_onnx(str(p))
    return strip_fastpath_record(p)


def _ticks(tmp_path, n=200, width=6, seed=5):
    raws = (np.random.default_rng(seed).standard_normal((n, width)) * 3 + 10).astype(F32)
    np.save(tmp_path / "t.npy", raws)
    return raws


def test_calibrate_takes_a_head_for_a_model_that_needs_one(tmp_path, capsys):
    pytest.importorskip("onnx")
    from fastpath.cli import main
    p = _three_output_onnx(tmp_path)
    _ticks(tmp_path)
    base = ["calibrate", "--ticks", str(tmp_path / "t.npy"), "--model", str(p),
            "--out", str(tmp_path / "o.fpm"), "--z-fields", "0-5", "--window-fields", "none"]
    assert main(base) == 2
    err = capsys.readouterr().err
    assert "no head was given" in err and "--head KIND[:OUTPUTS][@SCALE]" in err
    assert main(base + ["--head", "regression:1"]) == 0
    out = Model.load(tmp_path / "o.fpm")
    assert out.head_spec.kind == "regression" and out.head_spec.outputs == (1,)
    assert out.head_spec.scale != 1.0            # fitted


@pytest.mark.parametrize("value,msg", [
    ("bogus", "KIND one of tanh_sigmoid, regression, classifier3, classifier2, got 'bogus'"),
    ("classifier3:a,b,c", "OUTPUTS the output indices the head reads, comma-separated"),
    ("classifier3:0,1", "head 'classifier3' reads 3 output indices"),
    ("classifier3@2", "@SCALE is the regression head's scale; head 'classifier3' takes none"),
    ("regression:0@-1", "head scale must be a finite number > 0"),
    ("regression:0@x", "SCALE a number > 0"),
])
def test_a_bad_head_is_a_usage_error(tmp_path, capsys, value, msg):
    from fastpath.cli import main
    for cmd in (["calibrate", "--ticks", "t.npy", "--model", "m.onnx", "--out", "o.fpm"],
                ["serve", "--name", "x"], ["doctor"]):
        with pytest.raises(SystemExit) as ei:
            main(cmd + ["--head", value])
        assert ei.value.code == 2
        assert msg in capsys.readouterr().err


def test_calibrate_refuses_a_scale_it_would_fit(tmp_path, capsys):
    from fastpath.cli import main
    _ticks(tmp_path)
    assert main(["calibrate", "--ticks", str(tmp_path / "t.npy"), "--model", "m.onnx",
                 "--out", str(tmp_path / "o.fpm"), "--head", "regression:0@0.5"]) == 2
    assert "calibrate fits the regression head's scale" in capsys.readouterr().err


def test_a_classifier_head_the_outputs_cannot_take_is_refused_on_the_command_line(tmp_path,
                                                                                    capsys):
    pytest.importorskip("onnx")
    from fastpath.cli import main
    p = _three_output_onnx(tmp_path)
    _ticks(tmp_path)
    assert main(["calibrate", "--ticks", str(tmp_path / "t.npy"), "--model", str(p),
                 "--out", str(tmp_path / "o.fpm"), "--z-fields", "0-5", "--window-fields", "none",
                 "--head", "classifier3"]) == 2
    assert "reads class probabilities" in capsys.readouterr().err


def test_serve_and_doctor_take_the_head(tmp_path, monkeypatch, capsys):
    pytest.importorskip("onnx")
    import fastpath.serving.server as server
    from fastpath.cli import main
    p = _three_output_onnx(tmp_path)
    got = {}

    def fake(name, model=None, config=None, stats=False, out=None, tick_sizes=None):
        got["model"] = model
        return 0
    monkeypatch.setattr(server, "run_foreground", fake)
    assert main(["serve", "--name", "x", "--model", str(p), "--head", "regression:2@0.5"]) == 0
    h = got["model"].head_spec
    assert (h.kind, h.outputs, h.scale) == ("regression", (2,), 0.5)
    # a bundle takes the head in place of its own
    Model.from_onnx(p, head=Head("regression")).save(tmp_path / "m.fpm")
    assert main(["serve", "--name", "x", "--model", str(tmp_path / "m.fpm"),
                 "--head", "tanh_sigmoid:2,0"]) == 0
    assert got["model"].head_spec == Head("tanh_sigmoid", outputs=(2, 0))
    # doctor loads the model for its size only: without --head it sizes it with a stand-in
    # head and says so (not the 'give a head' error), and it takes --head
    assert main(["doctor", "--model", str(p), "--json"]) in (0, 1)
    assert "stand-in head" in capsys.readouterr().err
    assert main(["doctor", "--model", str(p), "--json", "--head", "regression:0@0.5"]) in (0, 1)
    assert "stand-in" not in capsys.readouterr().err


def test_calibrate_asks_a_tree_model_what_its_features_are(tmp_path, capsys):
    from fastpath.cli import main
    p = _tree_onnx(tmp_path)
    raws = _ticks(tmp_path)                  # fields around 10: the stump's threshold
    base = ["calibrate", "--ticks", str(tmp_path / "t.npy"), "--model", str(p),
            "--out", str(tmp_path / "o.fpm"), "--z-fields", "0-5", "--window-fields", "none"]
    assert main(base) == 2
    err = capsys.readouterr().err
    assert "a tree ensemble compares each feature with thresholds" in err
    assert "--features raw" in err and "--features zscore" in err
    assert not (tmp_path / "o.fpm").exists()
    assert main(base + ["--features", "raw"]) == 0
    assert "6 raw (not scaled) fields" in capsys.readouterr().out
    out = Model.load(tmp_path / "o.fpm")
    fs = out.feature_spec
    assert np.all(fs.mean == 0) and np.all(fs.inv_std == 1)
    # the stump reads the raw field against its raw threshold: both branches are taken
    eng = Engine(out, config={"engine": {"n_symbols": 1}})
    sig = np.array([eng.step(r).signal for r in raws])
    np.testing.assert_array_equal(sig > 0, raws[:, 0] > 10)
    assert main(base + ["--features", "zscore"]) == 0     # chosen: as asked
    assert Model.load(tmp_path / "o.fpm").feature_spec.inv_std[0] != 1


def test_calibrate_asks_a_model_with_its_own_scaler(tmp_path, capsys):
    from fastpath.cli import main
    from fastpath.model.types import InputScaler
    rng = np.random.default_rng(6)
    m = Model((Layer(rng.standard_normal((1, 6)).astype(F32), np.zeros(1, F32)),),
              head_spec=Head("regression"),
              input_scaler=InputScaler(np.full(6, 10, F32), np.full(6, 1 / 3, F32)))
    m.save(tmp_path / "m.fpm")
    _ticks(tmp_path)
    base = ["calibrate", "--ticks", str(tmp_path / "t.npy"), "--model", str(tmp_path / "m.fpm"),
            "--out", str(tmp_path / "o.fpm"), "--z-fields", "0-5", "--window-fields", "none"]
    assert main(base) == 2
    assert "standardises its input itself" in capsys.readouterr().err
    assert main(base + ["--features", "raw"]) == 0
    assert np.all(Model.load(tmp_path / "o.fpm").feature_spec.inv_std == 1)


def test_calibrate_still_z_scores_an_mlp_by_default(tmp_path, capsys):
    from fastpath.cli import main
    rng = np.random.default_rng(7)
    Model((Layer(rng.standard_normal((1, 6)).astype(F32), np.zeros(1, F32)),),
          head_spec=Head("regression")).save(tmp_path / "m.fpm")
    _ticks(tmp_path)
    assert main(["calibrate", "--ticks", str(tmp_path / "t.npy"), "--model",
                 str(tmp_path / "m.fpm"), "--out", str(tmp_path / "o.fpm"), "--z-fields", "0-5",
                 "--window-fields", "none"]) == 0
    assert "6 z-scored fields" in capsys.readouterr().out
    assert Model.load(tmp_path / "o.fpm").feature_spec.inv_std[0] != 1


def test_cli_help_lists_the_new_options(tmp_path):
    # run from tmp_path: from the checkout, the source tree's fastpath/ (no compiled
    # extension when the package is installed, not editable) would shadow the installed one
    out = subprocess.run([sys.executable, "-m", "fastpath.cli", "calibrate", "--help"],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert "--head" in out.stdout and "--features {zscore,raw}" in out.stdout
