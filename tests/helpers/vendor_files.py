"""The vendor sample files in tests/data and builders of variants of them: Databento MBP-10
records edited as numpy rows and written back behind the real file's metadata, Tardis CSV
text written plain or gzipped."""
import gzip
import os

import numpy as np

from fastpath.lob.databento import MBP10, TRADE

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
DBN = os.path.join(DATA, "databento_glbx_esh1_mbp-10.dbn")
DBN_ZST = os.path.join(DATA, "databento_glbx_esh1_mbp-10.v3.dbn.zst")
DBN_TRADES = os.path.join(DATA, "databento_glbx_esh1_trades.dbn")
TARDIS_SNAPSHOT = os.path.join(DATA, "tardis_binance-futures_book_snapshot_5_BTCUSDT.csv")
TARDIS_INCREMENTAL_ASKS = os.path.join(DATA, "tardis_deribit_incremental_book_L2_BTC-PERPETUAL.csv")
TARDIS_INCREMENTAL = os.path.join(DATA, "tardis_documented_incremental_book_L2.csv")
TARDIS_TRADES = os.path.join(DATA, "tardis_documented_trades.csv")


def dbn_parts():
    """(metadata bytes, the two MBP-10 records as a writable structured array) of the real file."""
    raw = open(DBN, "rb").read()
    n = 2 * MBP10.itemsize
    return raw[:-n], np.frombuffer(raw[-n:], MBP10).copy()


def dbn_trade(like, size: int, side: bytes, ts_recv: int, instrument_id=None):
    """A trades-schema record (rtype 0) of `size` at the price of `like`'s last trade field."""
    t = np.zeros(1, TRADE)
    for name in TRADE.names:
        t[name] = like[name]
    t["length"], t["rtype"], t["action"], t["side"] = TRADE.itemsize // 4, 0, b"T", side
    t["size"], t["ts_recv"] = size, ts_recv
    if instrument_id is not None:
        t["instrument_id"] = instrument_id
    return t


def write_dbn(path, meta: bytes, *records) -> str:
    """The metadata then the records (structured rows of MBP10 or TRADE), in the order given."""
    with open(path, "wb") as f:
        f.write(meta)
        for r in records:
            f.write(np.ascontiguousarray(r).tobytes())
    return str(path)


def write_text(path, text: str, gz: bool = False) -> str:
    with (gzip.open(path, "wt") if gz else open(path, "w")) as f:
        f.write(text)
    return str(path)
