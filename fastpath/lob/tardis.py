"""Tardis.dev CSV files (plain or .gz) into a BookStream: `book_snapshot_25` (or _5: any
asks[i] / bids[i] depth) and `incremental_book_L2`, with the trades from an optional `trades`
file. Columns are found by header name; times are local_timestamp (arrival, microseconds).

Design: a snapshot file is one tick per row, read by numpy. An incremental file is rebuilt
row by row, per symbol, as Tardis documents it: a snapshot row after a non-snapshot one resets
the book, amount 0 deletes a level, rows before a symbol's first snapshot are skipped, and the
rows of one message (same symbol and local_timestamp) are applied together before the book is
read: one tick per message, the top 10 levels of each side.
"""
from __future__ import annotations

import bisect
import csv
import gzip
import math
import re

import numpy as np

from fastpath.errors import InputError
from fastpath.lob import _levels
from fastpath.lob.adapter import LEVELS, BookStream
from fastpath.lob.readers import _columns, _rows_from_1, _trades_between, label_volatility

_SIDES = {"buy": 1.0, "sell": -1.0, "unknown": 0.0}


def _open(path: str):
    """The file as text, gunzipped when it starts with the gzip magic (whatever its name)."""
    try:
        with open(path, "rb") as f:
            gz = f.read(2) == b"\x1f\x8b"
        return gzip.open(path, "rt", newline="") if gz else open(path, newline="")
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror or type(exc).__name__}); "
                         f"expected a Tardis CSV file (plain or .gz)") from None


def header(path: str) -> list:
    """A Tardis CSV file's column names ([] for an empty file)."""
    try:
        with _open(path) as f:
            line = f.readline()
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not a readable text CSV file ({exc}); expected a Tardis CSV "
                         f"file (plain or .gz)") from None
    return [c.strip() for c in line.strip("\r\n").removeprefix("\ufeff").split(",")] if line else []


def read_tardis(path: str, trades: str | None = None, tick_size: float | None = None) -> BookStream:
    """A Tardis `book_snapshot_*` or `incremental_book_L2` CSV (told apart by their columns)
    -> BookStream; `trades`: a Tardis `trades` CSV whose trades (signed by the taker side, 0
    where 'unknown') are counted on their symbol's next tick (none on its first). Symbols get
    ids 0.. in order of first appearance (`stream.symbol_names`). Empty levels are filled as
    read_lobster fills them; an update without a best bid and ask is dropped. tick_size: per
    symbol, the smallest quoted price gap, when not given. InputError names the file, row and column of
    anything that cannot be read."""
    names = header(path)
    if not names:
        raise InputError(f"{path}: empty file; expected a Tardis CSV header and rows")
    if "is_snapshot" in names:
        sym, ts, rows, bpx, bsz, apx, asz = _incremental(path, names)
    elif "asks[0].price" in names or "bids[0].price" in names:
        sym, ts, rows, bpx, bsz, apx, asz = _snapshots(path, names)
    else:
        raise InputError(f"{path}: neither a book_snapshot nor an incremental_book_L2 file "
                         f"(found columns {', '.join(names[:8])}); expected asks[0].price ... or "
                         f"is_snapshot,side,price,amount")
    empty_b, empty_a = np.isnan(bpx), np.isnan(apx)
    tick = _levels.resolve_tick(path, tick_size, sym, bpx, apx, empty_b, empty_a)
    bpx, bsz = _levels.fill_empty(bpx, bsz, empty_b, -1, tick)
    apx, asz = _levels.fill_empty(apx, asz, empty_a, +1, tick)
    keep = np.flatnonzero(~empty_b[:, 0] & ~empty_a[:, 0])
    if not len(keep):
        raise InputError(f"{path}: no update has both a best bid and a best ask; expected at "
                         f"least one two-sided book")
    sym, ts, rows, tick = sym[keep], ts[keep], rows[keep], tick[keep]
    bpx, bsz, apx, asz = bpx[keep], bsz[keep], apx[keep], asz[keep]
    _levels.check_books(path, lambda r: f"row {rows[r]}", bpx, apx, bsz, asz,
                        lambda s, k, j: f"{s}s[{j}].{'price' if k == 'price' else 'amount'}")
    ids, sym_names = _levels.symbol_ids(sym)
    vol, cnt, last = np.zeros(len(ts)), np.zeros(len(ts)), np.zeros(len(ts))
    if trades is not None:
        t_sym, t_ts, t_signed, t_size = _trades(trades)
        for s, name in enumerate(sym_names):
            at, tk = np.flatnonzero(ids == s), t_sym == name
            vol[at], cnt[at], last[at] = _trades_between(ts[at], t_ts[tk], t_signed[tk], t_size[tk])
    bs = BookStream(ids, ts, bpx, apx, bsz, asz, vol, cnt, last, tick)
    bs.validate(path, rows)
    bs.symbol_names = sym_names
    label_volatility(bs)
    return bs


def _loadtxt(path: str, cols, dtype, what: str, names: list):
    """Some columns of a Tardis CSV; a blank field (a level the book did not have) is NaN, a
    written nan or inf is refused. numpy's C parser reads a file without blanks; only a file
    with some takes the slower per-field converter."""
    def num(s: str) -> float:
        s = s.strip()
        if not s:
            return math.nan
        v = float(s)
        if not math.isfinite(v):
            raise ValueError(f"non-finite value {s!r}")
        return v
    try:
        try:
            with _open(path) as f:
                a = np.loadtxt(f, delimiter=",", skiprows=1, usecols=cols, dtype=dtype, ndmin=2)
        except ValueError:
            if dtype is not float:
                raise
            with _open(path) as f:
                a = np.loadtxt(f, delimiter=",", skiprows=1, usecols=cols, dtype=dtype, ndmin=2,
                               converters=num)
        else:
            if dtype is float and not np.isfinite(a).all():
                r, c = np.argwhere(~np.isfinite(a))[0]
                raise ValueError(f"non-finite value '{a[r, c]}' at row {r + 1}, column "
                                 f"{cols[c] + 1}")
        return a
    except ValueError as exc:
        # numpy counts the file's columns from 1: the header's name says which one it was
        msg = re.sub(r"column (\d+)", lambda m: f"column {m.group(1)} "
                     f"({names[int(m.group(1)) - 1] if int(m.group(1)) <= len(names) else '?'})",
                     _rows_from_1(exc))
        raise InputError(f"{path}: malformed {what} ({msg}); expected one row per line with the "
                         f"header's columns") from None


def _snapshots(path: str, names: list):
    depth = 0
    while f"asks[{depth}].price" in names and f"bids[{depth}].price" in names:
        depth += 1
    depth = min(max(depth, 1), LEVELS)
    need = [f"{s}[{j}].{k}" for j in range(depth) for s in ("bids", "asks")
            for k in ("price", "amount")]
    cols = _columns(path, names, ["symbol", "local_timestamp"] + need)
    sym = _loadtxt(path, [cols[0]], str, "symbol", names)[:, 0]
    ts = _loadtxt(path, [cols[1]], np.int64, "local_timestamp (integer microseconds)", names)[:, 0]
    lv = _loadtxt(path, cols[2:], float, "book row", names).reshape(-1, depth, 4)
    _increasing(path, sym, ts, np.arange(1, len(ts) + 1))
    return (sym, ts * 1000, np.arange(1, len(ts) + 1), lv[:, :, 0], lv[:, :, 1], lv[:, :, 2],
            lv[:, :, 3])


def _increasing(path: str, sym, ts, rows, what: str = "local_timestamp") -> None:
    o = np.argsort(sym, kind="stable")
    back = np.flatnonzero((np.diff(ts[o]) < 0) & (sym[o][1:] == sym[o][:-1]))
    if len(back):
        r, p = o[back[0] + 1], o[back[0]]
        raise InputError(f"{path}: row {rows[r]}: {what} {ts[r]} is before row {rows[p]}'s "
                         f"{ts[p]} ({sym[r]}); expected rows in time order per symbol")


def _field(path: str, i: int, col: str, text: str, want: str, conv=float):
    try:
        v = conv(text)
    except ValueError:
        v = None
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        raise InputError(f"{path}: row {i}: {col} is {text!r}; expected {want}")
    return v


def _incremental(path: str, names: list):
    """Rebuild each symbol's book; one tick (top 10 a side, NaN where the side is shorter) per
    message."""
    c = dict(zip(("symbol", "local_timestamp", "is_snapshot", "side", "price", "amount"),
                 _columns(path, names, ["symbol", "local_timestamp", "is_snapshot", "side",
                                        "price", "amount"])))
    books, out = {}, []
    pending = None                             # (symbol, ts, row) of the message being applied
    with _open(path) as f:
        rd = csv.reader(f)
        next(rd, None)
        for i, row in enumerate(rd, 1):
            if len(row) != len(names):
                raise InputError(f"{path}: row {i} has {len(row)} fields; expected {len(names)} "
                                 f"(the header's columns)")
            s = row[c["symbol"]]
            ts = _field(path, i, "local_timestamp", row[c["local_timestamp"]],
                        "integer microseconds", int)
            if pending is not None and (s, ts) != pending[:2]:
                _emit(books, pending, out)
            snap = row[c["is_snapshot"]].strip().lower()
            if snap not in ("true", "false"):
                raise InputError(f"{path}: row {i}: is_snapshot is {row[c['is_snapshot']]!r}; "
                                 f"expected true or false")
            side = row[c["side"]].strip().lower()
            if side not in ("bid", "ask"):
                raise InputError(f"{path}: row {i}: side is {row[c['side']]!r}; expected bid or ask")
            px = _field(path, i, "price", row[c["price"]], "a finite price")
            amt = _field(path, i, "amount", row[c["amount"]], "a finite amount >= 0")
            if amt < 0:
                raise InputError(f"{path}: row {i}: amount is {amt:g}; expected an amount >= 0 "
                                 f"(0 deletes the level)")
            b = books.get(s)
            if b is not None and ts < b["ts"]:
                raise InputError(f"{path}: row {i}: local_timestamp {ts} is before {b['ts']}, "
                                 f"the previous update of {s}; expected rows in time order")
            if snap == "true" and (b is None or not b["snap"]):
                b = books[s] = {"bid": _Side(-1), "ask": _Side(+1), "snap": True, "ts": ts}
            elif b is None:
                continue                       # before the symbol's first snapshot
            b["snap"], b["ts"] = snap == "true", ts
            b[side].set(px, amt)
            pending = (s, ts, i)
    if pending is not None:
        _emit(books, pending, out)
    if not out:
        raise InputError(f"{path}: no book update after a snapshot; expected an "
                         f"incremental_book_L2 file starting with is_snapshot=true rows")
    sym = np.array([o[0] for o in out])
    ts = np.array([o[1] for o in out], np.int64) * 1000
    rows = np.array([o[2] for o in out], np.int64)
    lv = np.array([o[3] for o in out], np.float64)          # (n, 4, LEVELS)
    return sym, ts, rows, lv[:, 0], lv[:, 1], lv[:, 2], lv[:, 3]


class _Side:
    """One side of a rebuilt book: its prices sorted best first (a bid's key is -price) and
    their amounts in step; an update is a bisection, reading the top 10 a slice."""
    __slots__ = ("keys", "amounts", "sign")

    def __init__(self, sign: int):
        self.keys, self.amounts, self.sign = [], [], sign

    def set(self, px: float, amount: float) -> None:
        """Tardis' update of one level: the new amount, 0 deletes the level (absent: no-op)."""
        k = self.sign * px
        j = bisect.bisect_left(self.keys, k)
        there = j < len(self.keys) and self.keys[j] == k
        if amount == 0:
            if there:
                del self.keys[j], self.amounts[j]
        elif there:
            self.amounts[j] = amount
        else:
            self.keys.insert(j, k)
            self.amounts.insert(j, amount)

    def top(self) -> tuple:
        pad = [math.nan] * max(LEVELS - len(self.keys), 0)
        return ([self.sign * k for k in self.keys[:LEVELS]] + pad,
                self.amounts[:LEVELS] + pad)


def _emit(books: dict, pending: tuple, out: list) -> None:
    s, ts, i = pending
    b = books.get(s)
    if b is not None:
        out.append((s, ts, i, [*b["bid"].top(), *b["ask"].top()]))


def _trades(path: str):
    """(symbol, ts ns, signed amount, amount) of a Tardis trades CSV, in time order per symbol."""
    names = header(path)
    if not names:
        raise InputError(f"{path}: empty file; expected a Tardis trades CSV header and rows")
    cols = _columns(path, names, ["symbol", "local_timestamp", "side", "amount"])
    sym = _loadtxt(path, [cols[0]], str, "symbol", names)[:, 0]
    ts = _loadtxt(path, [cols[1]], np.int64, "local_timestamp (integer microseconds)", names)[:, 0]
    side = np.char.lower(np.char.strip(_loadtxt(path, [cols[2]], str, "side", names)[:, 0]))
    amt = _loadtxt(path, [cols[3]], float, "amount", names)[:, 0]
    rows = np.arange(1, len(ts) + 1)
    bad = np.flatnonzero(~np.isin(side, list(_SIDES)) | ~(amt >= 0))
    if len(bad):
        r = int(bad[0])
        raise InputError(f"{path}: row {r + 1}: side {side[r]!r}, amount {amt[r]:g}; expected "
                         f"side buy, sell or unknown and a finite amount >= 0")
    _increasing(path, sym, ts, rows)
    sign = np.array([_SIDES[s] for s in side]) if len(side) else np.zeros(0)
    return sym, ts * 1000, sign * amt, amt
