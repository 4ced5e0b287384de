"""One `--data` argument -> the reader it names, for the bench and `fastpath calibrate`: a
Binance capture folder, a LOBSTER 'orderbook.csv,message.csv' pair, a Databento MBP-10 file
(.dbn / .dbn.zst), or a Tardis book CSV (plain or .gz) with an optional ',trades.csv'.

Design: told apart by content, not by name (a renamed or recompressed file reads the same):
a folder is a Binance capture, a file starting with DBN's or zstd's magic is Databento, a
header starting exchange,symbol,timestamp is Tardis; two comma-separated paths without that
header are a LOBSTER pair.
"""
from __future__ import annotations

import os

from fastpath.errors import InputError
from fastpath.lob import databento, tardis
from fastpath.lob.adapter import BookStream
from fastpath.lob.readers import read_binance, read_lobster

KINDS = ("binance", "lobster", "databento", "tardis")
EXPECTED = ("a Binance capture folder, 'orderbook.csv,message.csv' (LOBSTER), a Databento "
            "MBP-10 .dbn / .dbn.zst file, or a Tardis book CSV (.csv / .csv.gz) with an "
            "optional ',trades.csv'")


def data_paths(data: str) -> list:
    """The paths a --data argument names: two for 'a,b', else one."""
    return data.split(",", 1) if "," in data else [data]


def _starts(path: str, n: int) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(n)
    except OSError:
        return b""


def data_kind(data: str) -> str:
    """Which reader a --data argument is for (one of KINDS); InputError when none fits."""
    paths = data_paths(data)
    for p in paths:
        if not os.path.exists(p):
            raise InputError(f"{p}: no such file or folder; expected {EXPECTED}")
    first = paths[0]
    if len(paths) == 1 and os.path.isdir(first):
        return "binance"
    head = _starts(first, 4)
    if len(paths) == 1 and (head[:3] == b"DBN" or head == databento._ZSTD_MAGIC):
        return "databento"
    if os.path.isfile(first) and tardis.header(first)[:3] == ["exchange", "symbol", "timestamp"]:
        return "tardis"
    if len(paths) == 2:
        return "lobster"
    raise InputError(f"{data}: not a recorded book fastpath reads; expected {EXPECTED}")


def read_data(data: str) -> tuple[BookStream, str]:
    """(the stream, a one-line description naming the source) for a --data argument."""
    kind = data_kind(data)
    paths = data_paths(data)
    name = os.path.basename(os.path.abspath(paths[0]))
    if kind == "binance":
        return read_binance(data), f"Binance {name}"
    if kind == "lobster":
        return read_lobster(*paths), f"LOBSTER {name}"
    if kind == "databento":
        return databento.read_databento(data), f"Databento {name}"
    return tardis.read_tardis(paths[0], trades=paths[1] if len(paths) == 2 else None), \
        f"Tardis {name}"
