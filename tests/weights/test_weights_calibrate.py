"""The signal cost of bf16/int8 weights measured on the user's own ticks, and `fastpath calibrate
--weights` printing that cost and recording the choice in the config."""

import os
import subprocess

import numpy as np
import pytest

import fastpath
from fastpath import Engine


# subprocesses run outside the checkout, so the installed package is imported, not the source
# folder (which has no built extensions when CI installs a wheel-like build)
PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(fastpath.__file__)))


def test_weights_error_measures_the_signal_cost_on_the_users_ticks():
    """The cost of bf16/int8 weights depends on the inputs (a model fed raw inputs of mixed
    scale lost its signal under int8 where z-scored features lost 0.01): tuning.weights_error
    measures it on the user's ticks, against an independent replay of the same engines."""
    from fastpath import lob
    from fastpath.model import Model
    from fastpath._build import DEMO_MODEL
    from fastpath.tuning import weights_error
    m = Model.load(DEMO_MODEL)
    bs = lob.generate_stream(600, n_symbols=3, seed=5)
    raws = np.ascontiguousarray(lob.raw_from_book(bs))
    for wt in ("bf16", "int8"):
        e = weights_error(m, raws, wt, bs.symbols)
        cfg = {"engine": {"n_symbols": 3}, "cache": {"enabled": False}}
        ts = np.arange(len(raws), dtype=np.int64) * 1_000_000
        ref = Engine(m.with_weights("fp32"), config=cfg).step_batch(raws, bs.symbols, ts).signal
        sig = Engine(m.with_weights(wt), config=cfg).step_batch(raws, bs.symbols, ts).signal
        d = np.abs(sig.astype(np.float64) - ref)
        assert e["n"] == len(raws) and e["weights"] == wt
        assert e["max_abs"] == d.max() > 0 and e["mean_abs"] == pytest.approx(d.mean())
        assert e["worst_tick"] == int(np.argmax(d))
        assert e["sign_flips"] == int(np.count_nonzero(np.sign(sig) * np.sign(ref) < 0))
    assert weights_error(m, raws, "fp32", bs.symbols)["max_abs"] == 0.0
    with pytest.raises(fastpath.ModelError, match="not supported"):
        weights_error(m, raws, "fp16")


def test_calibrate_weights_prints_the_cost_and_records_the_choice(tmp_path):
    import sys
    from fastpath import lob
    from fastpath.model import Model
    from fastpath._build import DEMO_MODEL
    bs = lob.generate_stream(400, n_symbols=2, seed=6)
    np.save(tmp_path / "t.npy", np.ascontiguousarray(lob.raw_from_book(bs)))
    np.save(tmp_path / "s.npy", bs.symbols)
    out = subprocess.run([sys.executable, "-m", "fastpath.cli", "calibrate", "--ticks",
                          str(tmp_path / "t.npy"), "--symbols", str(tmp_path / "s.npy"),
                          "--model", DEMO_MODEL, "--out", str(tmp_path / "o.fpm"),
                          "--weights", "int8"], capture_output=True, text=True, timeout=300,
                         cwd=PKG_PARENT)
    assert out.returncode == 0, out.stderr
    assert "weights: int8 hidden layers (signal against fp32 on these ticks: max |d|" in out.stdout
    assert Model.load(tmp_path / "o.fpm").weights == "int8"
    # and back: the report is what int8 cost, not fp32 against itself (0)
    back = subprocess.run([sys.executable, "-m", "fastpath.cli", "calibrate", "--ticks",
                           str(tmp_path / "t.npy"), "--symbols", str(tmp_path / "s.npy"),
                           "--model", str(tmp_path / "o.fpm"), "--out", str(tmp_path / "b.fpm"),
                           "--weights", "fp32"], capture_output=True, text=True, timeout=300,
                          cwd=PKG_PARENT)
    assert back.returncode == 0, back.stderr
    assert "weights: fp32 hidden layers (were int8; int8's signal against fp32" in back.stdout
    assert "max |d| 0 " not in back.stdout
    assert Model.load(tmp_path / "b.fpm").weights == "fp32"
