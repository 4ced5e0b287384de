"""fastpath info, calibrate and example-config as commands: info reports the kernel set and
the default model, calibrate z-scores the chosen fields and refuses a mismatch,
example-config writes a config that loads."""
import json

import numpy as np

from fastpath import Model
from helpers.builders import random_model
from helpers.cli_child import run_cli


def test_info_reports_the_kernel_set_and_the_default_model():
    out = run_cli("info")
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["simd"] in ("avx512", "avx2", "scalar") and info["default_model"]["dims"] == [128, 64, 32, 2]


def test_calibrate_z_scores_the_chosen_fields_and_refuses_a_mismatch(tmp_path):
    rng = np.random.default_rng(0)
    raws = (rng.standard_normal((500, 20)) * 4 + 3).astype(np.float32)
    np.save(tmp_path / "t.npy", raws)
    random_model(rng, [14, 8, 2]).save(tmp_path / "m.fpm")
    out = run_cli("calibrate", "--ticks", str(tmp_path / "t.npy"), "--model", str(tmp_path / "m.fpm"),
               "--out", str(tmp_path / "c.fpm"), "--z-fields", "0-9,12,15",
               "--window-fields", "3", "--window", "8")
    assert out.returncode == 0, out.stderr
    m = Model.load(tmp_path / "c.fpm")
    fs = m.feature_spec
    assert list(fs.z_idx) == list(range(10)) + [12, 15] and list(fs.w_idx) == [3]
    feats = fs.apply(raws)
    np.testing.assert_allclose(feats.mean(0), 0, atol=1e-4)
    np.testing.assert_allclose(feats.std(0), 1, atol=1e-3)
    bad = run_cli("calibrate", "--ticks", str(tmp_path / "t.npy"), "--model", str(tmp_path / "m.fpm"),
               "--out", str(tmp_path / "d.fpm"), "--z-fields", "0-3")
    assert bad.returncode != 0 and "features, but the model takes 14" in bad.stderr
    bad = run_cli("calibrate", "--ticks", str(tmp_path / "t.npy"), "--model", str(tmp_path / "nope.fpm"),
               "--out", str(tmp_path / "d.fpm"))
    assert bad.returncode == 2 and "cannot read model file" in bad.stderr


def test_example_config_writes_a_config_that_loads(tmp_path):
    out = run_cli("example-config")
    assert out.returncode == 0 and "[placement]" in out.stdout
    p = tmp_path / "c.toml"
    p.write_text(out.stdout)
    from fastpath.control.config import load_config
    assert load_config(str(p)).placement.priority == 50
