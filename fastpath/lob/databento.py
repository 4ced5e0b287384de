"""Databento MBP-10 files (.dbn, .dbn.zst) into a BookStream, through the optional
`databento-dbn` package (pip install 'fastpath[databento]').

Design: the package decodes (any DBN version, upgraded to the current one; zstd by content,
not by name) and each record's bytes go into one numpy structured array, so a file of millions
of records is not millions of Python attribute reads. A tick is an MBP-10 record that closes
an event (flag F_LAST; every book record where the file sets no F_LAST at all): the records
before it in the same event are intermediate states. Trades are the 'T' records (MBP-10 or
trades records in the same file), counted on their instrument's next tick.
"""
from __future__ import annotations

import numpy as np

from fastpath.errors import InputError
from fastpath.lob import _levels
from fastpath.lob.adapter import LEVELS, BookStream
from fastpath.lob.readers import label_volatility

_HEADER = [("length", "u1"), ("rtype", "u1"), ("publisher_id", "<u2"),
           ("instrument_id", "<u4"), ("ts_event", "<u8")]
_BODY = [("price", "<i8"), ("size", "<u4"), ("action", "S1"), ("side", "S1"), ("flags", "u1"),
         ("depth", "u1"), ("ts_recv", "<u8"), ("ts_in_delta", "<i4"), ("sequence", "<u4")]
_LEVEL = np.dtype([("bid_px", "<i8"), ("ask_px", "<i8"), ("bid_sz", "<u4"), ("ask_sz", "<u4"),
                   ("bid_ct", "<u4"), ("ask_ct", "<u4")])
MBP10 = np.dtype(_HEADER + _BODY + [("levels", _LEVEL, (LEVELS,))])     # 368 bytes
TRADE = np.dtype(_HEADER + _BODY)                                        # 48 bytes
UNDEF_PRICE = np.iinfo(np.int64).max        # an empty level's price
PRICE_SCALE = 1_000_000_000                 # prices are int64 units of 1e-9
F_LAST = 1 << 7
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_CHUNK = 1 << 23


def _dbn(path: str):
    try:
        import databento_dbn
    except ImportError:
        raise InputError(f"{path}: reading Databento files needs the databento-dbn package: pip "
                         f"install 'fastpath[databento]'") from None
    return databento_dbn


def _decode(path: str):
    """(metadata, MBP-10 rows, their record numbers, trade rows, their record numbers): the
    records in file order, counted from 1 after the metadata."""
    dbn = _dbn(path)
    try:
        with open(path, "rb") as f:
            head = f.read(4)
            zstd = head == _ZSTD_MAGIC
            if not zstd and head[:3] != b"DBN":
                raise InputError(f"{path}: not a DBN file (starts with {head!r}); expected a "
                                 f"Databento .dbn or .dbn.zst file")
            dec = dbn.DBNDecoder(compression=dbn.Compression.ZSTD if zstd else
                                 dbn.Compression.NONE)
            f.seek(0)
            meta, book, trades, book_no, trade_no, k = None, [], [], [], [], 0
            while chunk := f.read(_CHUNK):
                dec.write(chunk)
                for rec in dec.decode():
                    if isinstance(rec, dbn.Metadata):
                        meta = rec
                        continue
                    k += 1
                    if isinstance(rec, dbn.MBP10Msg):
                        book.append(bytes(rec)); book_no.append(k)
                    elif isinstance(rec, dbn.TradeMsg):
                        trades.append(bytes(rec)); trade_no.append(k)
                    elif not isinstance(rec, (dbn.SymbolMappingMsg, dbn.SystemMsg)):
                        raise InputError(f"{path}: record {k} is a {type(rec).__name__} (rtype "
                                         f"{int(rec.rtype)}); expected MBP-10 records")
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror or type(exc).__name__}); "
                         f"expected a Databento .dbn or .dbn.zst file") from None
    except dbn.DBNError as exc:
        raise InputError(f"{path}: not a readable DBN file after record {k} ({exc}); expected "
                         f"a Databento .dbn or .dbn.zst file") from None
    left = len(dec.buffer())
    if meta is None or left:
        raise InputError(f"{path}: truncated: record {k + 1} is cut short ({left} byte(s) after "
                         f"the last whole record)" if meta is not None else
                         f"{path}: truncated or empty: no DBN metadata could be decoded")
    return (meta, np.frombuffer(b"".join(book), MBP10), np.array(book_no, np.int64),
            np.frombuffer(b"".join(trades), TRADE), np.array(trade_no, np.int64))


def _names(meta, ids: tuple) -> tuple:
    """Each instrument id's raw symbol from the file's symbol mappings (the id as text where
    none maps to it)."""
    by_id = {}
    for raw, intervals in (getattr(meta, "mappings", None) or {}).items():
        for iv in intervals:
            by_id.setdefault(str(iv.get("symbol") if isinstance(iv, dict) else iv.symbol), raw)
    return tuple(by_id.get(str(i), str(i)) for i in ids)


def read_databento(path: str, tick_size: float | None = None) -> BookStream:
    """A Databento MBP-10 file (.dbn or .dbn.zst, any DBN version) -> BookStream. One tick per
    record that ends an event (F_LAST) on the instrument's book, timestamped ts_recv; the
    trades ('T' records: signed by the aggressor side, 0 where the side is 'N') since the
    instrument's previous tick. Instruments become symbols 0.. in order of first appearance;
    `stream.symbol_names` holds each one's raw symbol. Empty levels (UNDEF_PRICE) are filled as
    read_lobster fills them; a record with an empty best bid or ask is dropped and its trades
    carried to the next tick. tick_size: per instrument, the exact greatest common divisor of
    its quoted price gaps, when not given. InputError names the file, record and field of anything else."""
    meta, book, book_no, trd, trd_no = _decode(path)
    schema = str(meta.schema) if meta.schema is not None else None
    if schema not in (None, "mbp-10") or (schema is None and not len(book)):
        raise InputError(f"{path}: schema {schema or 'mixed'} (no MBP-10 records); expected an "
                         f"mbp-10 file (Databento's market by price, 10 levels)")
    is_book_trade = book["action"] == b"T"
    if not (~is_book_trade).any():
        raise InputError(f"{path}: no MBP-10 book records (only trades); expected at least one "
                         f"book update")
    # every record in file order: book records then trade records, merged by record number
    rec_no = np.concatenate([book_no, trd_no])
    order = np.argsort(rec_no, kind="stable")
    inst = np.concatenate([book["instrument_id"], trd["instrument_id"]])[order]
    ts_all = np.concatenate([book["ts_recv"], trd["ts_recv"]])[order]
    rec_no = rec_no[order]
    _time_order(path, inst, ts_all, rec_no)
    lv = book["levels"]
    bpx_i, apx_i = lv["bid_px"], lv["ask_px"]
    empty_b, empty_a = bpx_i == UNDEF_PRICE, apx_i == UNDEF_PRICE
    tick = _levels.resolve_tick(path, tick_size, book["instrument_id"], bpx_i, apx_i, empty_b,
                                empty_a, PRICE_SCALE)
    bpx, bsz = _levels.fill_empty(bpx_i / PRICE_SCALE, lv["bid_sz"], empty_b, -1, tick)
    apx, asz = _levels.fill_empty(apx_i / PRICE_SCALE, lv["ask_sz"], empty_a, +1, tick)
    ends = (book["flags"] & F_LAST) != 0 if (book["flags"] & F_LAST).any() else \
        np.ones(len(book), bool)
    two_sided = ~empty_b[:, 0] & ~empty_a[:, 0]
    tick_rows = ends & ~is_book_trade & two_sided
    if not tick_rows.any():
        raise InputError(f"{path}: no MBP-10 record has both a best bid and a best ask; expected "
                         f"at least one two-sided book")
    # per record in file order: a tick?, a trade? (and its signed size)
    is_tick = np.concatenate([tick_rows, np.zeros(len(trd), bool)])[order]
    is_trade = np.concatenate([is_book_trade, np.ones(len(trd), bool)])[order]
    side = np.concatenate([book["side"], trd["side"]])[order]
    size = np.concatenate([book["size"], trd["size"]]).astype(np.float64)[order]
    sign = np.where(side == b"B", 1.0, np.where(side == b"A", -1.0, 0.0))
    vol, cnt, last = _levels.carry_trades(inst, is_tick, sign * size, size, is_trade)
    keep = np.flatnonzero(tick_rows)
    sym, ids = _levels.symbol_ids(book["instrument_id"][keep])
    fields = {("bid", "price"): "bid_px", ("ask", "price"): "ask_px", ("bid", "size"): "bid_sz",
              ("ask", "size"): "ask_sz"}
    _levels.check_books(path, lambda r: f"record {book_no[keep[r]]}", bpx[keep], apx[keep],
                        bsz[keep], asz[keep], lambda s, k, j: f"{fields[s, k]}_{j:02d}")
    bs = BookStream(sym, book["ts_recv"][keep].astype(np.int64), bpx[keep], apx[keep], bsz[keep],
                    asz[keep], vol, cnt, last, tick[keep])
    bs.validate(path, book_no[keep])
    bs.symbol_names = _names(meta, ids)
    label_volatility(bs)
    return bs


def _time_order(path: str, inst: np.ndarray, ts: np.ndarray, rec_no: np.ndarray) -> None:
    if np.any(ts > np.iinfo(np.int64).max):
        r = int(np.flatnonzero(ts > np.iinfo(np.int64).max)[0])
        raise InputError(f"{path}: record {rec_no[r]}: ts_recv {ts[r]} does not fit int64 ns; "
                         f"expected a UNIX time in ns")
    o = np.argsort(inst, kind="stable")
    back = np.flatnonzero((np.diff(ts[o].astype(np.int64)) < 0) & (inst[o][1:] == inst[o][:-1]))
    if len(back):
        r, p = o[back[0] + 1], o[back[0]]
        raise InputError(f"{path}: record {rec_no[r]}: ts_recv {ts[r]} is before record "
                         f"{rec_no[p]}'s {ts[p]} of the same instrument ({inst[r]}); expected "
                         f"records in time order")
