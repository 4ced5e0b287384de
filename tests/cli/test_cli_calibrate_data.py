"""`fastpath calibrate --data`: a recorded book of any source the readers take (here the
Databento and Tardis samples) fits a bundle, and a file they refuse is one line naming it."""
import pytest

from helpers.cli_child import run_cli
from helpers.vendor_files import DBN, DBN_TRADES, TARDIS_INCREMENTAL, TARDIS_TRADES

from fastpath._build import DEMO_MODEL


def test_cli_calibrate_data_tardis(tmp_path):
    out = run_cli("calibrate", "--data", f"{TARDIS_INCREMENTAL},{TARDIS_TRADES}", "--model",
                  DEMO_MODEL, "--out", str(tmp_path / "o.fpm"), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "ticks: 7 from Tardis tardis_documented_incremental_book_L2.csv (2 symbol(s))" \
        in out.stdout
    assert (tmp_path / "o.fpm").exists()


def test_cli_calibrate_data_refusals(tmp_path):
    pytest.importorskip("databento_dbn")
    base = ["--model", DEMO_MODEL, "--out", str(tmp_path / "o.fpm")]
    out = run_cli("calibrate", "--data", DBN_TRADES, *base, cwd=tmp_path)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert f"--data {DBN_TRADES}: cannot read it: " in out.stderr and "schema trades" in out.stderr
    out = run_cli("calibrate", "--data", DBN, "--ts", "t.npy", *base, cwd=tmp_path)
    assert out.returncode != 0 and "--data gives the ticks, their symbols and times; leave out " \
        "--ts" in out.stderr
    out = run_cli("calibrate", "--data", DBN, "--ticks", "t.npy", *base, cwd=tmp_path)
    assert out.returncode == 2 and "not allowed with argument" in out.stderr
    assert not (tmp_path / "o.fpm").exists()
