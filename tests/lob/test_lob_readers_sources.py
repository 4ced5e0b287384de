"""lob.data_kind / lob.read_data: one --data argument -> the reader its content names
(Binance folder, LOBSTER pair, Databento file, Tardis CSV with optional trades), whatever the
file is called."""
import shutil

import pytest

from fastpath import InputError, lob

from helpers.vendor_files import (DBN, DBN_ZST, TARDIS_INCREMENTAL, TARDIS_SNAPSHOT,
                                  TARDIS_TRADES, write_text)


def test_sources_kind_by_content(tmp_path):
    (tmp_path / "capture").mkdir()
    assert lob.data_kind(str(tmp_path / "capture")) == "binance"
    assert lob.data_kind(DBN) == "databento" and lob.data_kind(DBN_ZST) == "databento"
    # a renamed file is read for what it holds
    shutil.copy(DBN_ZST, tmp_path / "book.bin")
    assert lob.data_kind(str(tmp_path / "book.bin")) == "databento"
    assert lob.data_kind(TARDIS_SNAPSHOT) == "tardis"
    assert lob.data_kind(f"{TARDIS_INCREMENTAL},{TARDIS_TRADES}") == "tardis"
    gz = write_text(tmp_path / "s.csv.gz", open(TARDIS_SNAPSHOT).read(), gz=True)
    assert lob.data_kind(gz) == "tardis"
    ob = write_text(tmp_path / "ob.csv", "1001000,5,1000000,7\n")
    msg = write_text(tmp_path / "msg.csv", "34200.0,1,1,5,1001000,1\n")
    assert lob.data_kind(f"{ob},{msg}") == "lobster"


def test_sources_unknown_data_is_refused(tmp_path):
    p = write_text(tmp_path / "x.txt", "price,size\n1,2\n")
    with pytest.raises(InputError, match=r"x\.txt: not a recorded book fastpath reads; expected "
                                         r"a Binance capture folder"):
        lob.data_kind(p)
    with pytest.raises(InputError, match=r"nowhere\.dbn: no such file or folder"):
        lob.data_kind(str(tmp_path / "nowhere.dbn"))
    with pytest.raises(InputError, match=r"msg\.csv: no such file or folder"):
        lob.data_kind(f"{p},{tmp_path}/msg.csv")


def test_sources_read_data_reads_each_vendor():
    bs, what = lob.read_data(DBN)
    assert what == "Databento databento_glbx_esh1_mbp-10.dbn" and len(bs) == 2
    bs, what = lob.read_data(f"{TARDIS_INCREMENTAL},{TARDIS_TRADES}")
    assert what.startswith("Tardis ") and bs.trade_cnt.sum() == 4
    bs, _ = lob.read_data(TARDIS_SNAPSHOT)
    assert len(bs) == 10
