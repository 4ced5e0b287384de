"""bench/run.py --data: the stream is read by the reader its content names (Databento, Tardis
beside Binance and LOBSTER) and the result file is named by that source."""
import argparse

import pytest

from helpers.bench_scripts import import_bench
from helpers.vendor_files import DBN, TARDIS_INCREMENTAL, TARDIS_SNAPSHOT, TARDIS_TRADES


@pytest.fixture(scope="module")
def run():
    return import_bench("run")


def _args(data):
    return argparse.Namespace(data=data, quick=True, ticks=None, seed=0)


@pytest.mark.parametrize("data, kind, what", [
    (DBN, "databento", "Databento databento_glbx_esh1_mbp-10.dbn"),
    (TARDIS_SNAPSHOT, "tardis", "Tardis tardis_binance-futures_book_snapshot_5_BTCUSDT.csv"),
    (f"{TARDIS_INCREMENTAL},{TARDIS_TRADES}", "tardis", "Tardis tardis_documented_incremental_"
                                                        "book_L2.csv"),
])
def test_bench_data_reads_vendor_files(run, data, kind, what):
    if kind == "databento":
        pytest.importorskip("databento_dbn")
    bs, label = run.load_stream(_args(data), lambda f: None)
    assert label == what and len(bs) > 0
    assert run.stream_kind(_args(data)) == f"{kind}-quick"


def test_bench_data_refusal_names_every_source(run, tmp_path):
    p = tmp_path / "x.txt"
    p.write_text("price,size\n1,2\n")
    with pytest.raises(SystemExit, match=r"--data .*x\.txt: cannot read it: .*Databento MBP-10 "
                                         r"\.dbn / \.dbn\.zst file, or a Tardis book CSV"):
        run.load_stream(_args(str(p)), lambda f: None)
