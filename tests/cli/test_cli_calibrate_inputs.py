"""The command line's input checks: bad calibrate inputs and a binary doctor config are
usage errors naming what is wrong, with no traceback."""

import numpy as np

from helpers.builders import random_model
from helpers.cli_child import run_cli


def test_cli_bad_calibrate_inputs_are_usage_errors(tmp_path):
    rng = np.random.default_rng(3)
    raws = rng.standard_normal((200, 20)).astype(np.float32)
    np.save(tmp_path / "t.npy", raws)
    np.savez(tmp_path / "t.npz", raws)
    np.save(tmp_path / "str.npy", raws.astype(str))
    nan = raws.copy(); nan[17, 4] = np.nan
    np.save(tmp_path / "nan.npy", nan)
    np.save(tmp_path / "fsym.npy", np.zeros(200))
    np.save(tmp_path / "nsym.npy", -np.ones(200, np.int64))
    random_model(rng, [14, 8, 2]).save(tmp_path / "m.fpm")
    base = ["--model", "m.fpm", "--out", "o.fpm", "--window-fields", "3", "--window", "8"]
    cases = [
        (["--ticks", "t.npz", "--z-fields", "0-11"], ".npz archive"),
        (["--ticks", "str.npy", "--z-fields", "0-11"], "as numbers"),
        (["--ticks", "nan.npy", "--z-fields", "0-11"], "tick 17 field 4 is nan"),
        (["--ticks", "t.npy", "--symbols", "fsym.npy", "--z-fields", "0-11"], "symbols as integers"),
        (["--ticks", "t.npy", "--symbols", "nsym.npy", "--z-fields", "0-11"], "symbol -1"),
        (["--ticks", "t.npy", "--z-fields", "0-10,99"], "field 99, but the ticks have 20"),
        (["--ticks", "t.npy", "--z-fields", "0-10,4"], "lists field 4 twice"),
    ]
    for extra, msg in cases:
        out = run_cli("calibrate", *base, *extra, cwd=tmp_path)
        assert out.returncode != 0 and msg in out.stderr and "Traceback" not in out.stderr, \
            (extra, out.stderr)
    assert not (tmp_path / "o.fpm").exists()


def test_cli_doctor_binary_config(tmp_path):
    (tmp_path / "c.toml").write_bytes(b"\x93NUMPY\x01\x00\xff")
    out = run_cli("doctor", "--config", "c.toml", cwd=tmp_path)
    assert out.returncode != 0 and "c.toml is not a TOML config: not UTF-8" in out.stderr
    assert "Traceback" not in out.stderr
    assert "Traceback" not in out.stderr
