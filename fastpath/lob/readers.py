"""Readers of recorded order books into a BookStream: the Binance capture layout
(derived/depth10.csv + trades.csv) and LOBSTER orderbook/message file pairs.

Recorded files are the least trusted input the package takes, so every problem is an
InputError naming the file, the row and what was expected, never a numpy traceback or a
silently shifted book: Binance columns are found by their header names (a reordered file reads
the same), nanosecond timestamps are parsed as integers (a float64 parse rounds them to 256 ns),
and the book each row describes is checked (BookStream.validate) before it is returned.
"""
from __future__ import annotations

import os
import re
import warnings

import numpy as np

from fastpath.errors import InputError
from fastpath.lob.adapter import LEVELS, BookStream

_DELIMITERS = (",", ";", "\t")


def _trades_between(tick_ts: np.ndarray, trade_ts: np.ndarray, signed: np.ndarray,
                    size: np.ndarray):
    """Per tick: signed volume, count and last size of the trades after the previous tick.
    The first tick has no previous one: it counts none (the trades up to it precede the book
    this stream starts with; a trades file that begins hours before the depth file put all of
    them on tick 0), as the trades after the last tick are counted nowhere."""
    pos = np.searchsorted(trade_ts, tick_ts, side="right")       # trades with ts <= tick
    prev = np.concatenate([pos[:1], pos[:-1]])
    csum = np.concatenate([[0.0], np.cumsum(signed)])
    vol = csum[pos] - csum[prev]
    cnt = (pos - prev).astype(np.float64)
    last = np.where(cnt > 0, size[np.maximum(pos - 1, 0)] if len(size) else 0.0, 0.0)
    return vol, cnt, last


def label_volatility(bs: BookStream, window: int = 50, quantile: float = 0.9) -> None:
    """Label real data with regimes: 'volatile' where the rolling mean |mid change| over
    `window` ticks is in the top (1 - quantile) of the day, else 'calm'."""
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
        raise InputError(f"window must be an int >= 1 (ticks), got {window!r}")
    if isinstance(quantile, bool) or not isinstance(quantile, (int, float, np.integer, np.floating)) \
            or not 0.0 <= quantile <= 1.0:
        raise InputError(f"quantile must be a number in [0, 1], got {quantile!r}")
    if len(bs) == 0:
        raise InputError("label_volatility needs at least one tick, got an empty stream")
    mid = bs.mid()
    r = np.abs(np.diff(np.log(mid), prepend=np.log(mid[0])))
    c = np.concatenate([[0.0], np.cumsum(r)])
    idx = np.arange(1, len(r) + 1)
    roll = (c[idx] - c[np.maximum(idx - window, 0)]) / np.minimum(idx, window)
    bs.regime = (roll > np.quantile(roll, quantile)).astype(np.int8)
    bs.regime_names = ("calm", "volatile")


def _unreadable(path: str, exc: OSError, want: str) -> str:
    why = exc.strerror or type(exc).__name__
    return f"{path}: cannot be read ({why}); expected {want}"


def _header(path: str) -> tuple:
    """(column names, delimiter) from a CSV file's first line."""
    try:
        with open(path, newline="") as f:
            line = f.readline()
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a text CSV file (expected a header line of column "
                         f"names)") from None
    except OSError as exc:
        # a missing or unreadable file was open()'s FileNotFoundError / PermissionError, where
        # every other problem of a recorded file is an InputError naming it
        raise InputError(_unreadable(path, exc, "a CSV file with a header line")) from None
    # a byte-order mark (a CSV saved by a spreadsheet) glued to the first name: that column was
    # "missing" in a message that listed it among those found
    line = line.strip("\r\n").removeprefix("\ufeff")
    if not line:
        raise InputError(f"{path}: empty file (expected a header line of column names and rows)")
    delim = max(_DELIMITERS, key=line.count)
    return [c.strip().strip("\"'") for c in line.split(delim)], delim


def _load(path: str, delim: str, usecols, dtype, what: str) -> np.ndarray:
    """loadtxt of some columns (after a header line), its errors as InputErrors that name the file."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)     # "input contained no data"
            return np.loadtxt(path, delimiter=delim, skiprows=1, usecols=usecols, dtype=dtype,
                              ndmin=2)
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a text CSV file") from None
    except ValueError as exc:
        raise InputError(f"{path}: malformed {what} ({_rows_from_1(exc)}); expected {delim!r}-"
                         f"separated numbers, one row per line, every row with the header's "
                         f"columns") from None


def _rows_from_1(exc: ValueError) -> str:
    """numpy's loadtxt message with its row counted from 1, as every other message here
    counts data rows. numpy counts a value it cannot convert from 0 ("could not convert ...
    at row 0" is the first data row) but a row of the wrong width from 1 ("the number of
    columns changed from 6 to 3 at row 3", "invalid column index 5 at row 1"): only the
    first is moved (adding 1 to every "row N" named the row after a truncated one). numpy's
    advice to pass usecols, which a reader's caller cannot, is dropped."""
    msg = str(exc)
    if msg.startswith("could not convert"):
        msg = re.sub(r"\bat row (\d+)", lambda m: f"at row {int(m.group(1)) + 1}", msg)
    return re.sub(r"; use `usecols` to select a subset and avoid this error", "", msg)


def _columns(path: str, names: list, need: list) -> list:
    missing = [n for n in need if n not in names]
    if missing:
        raise InputError(f"{path}: missing column(s) {', '.join(missing[:6])}"
                         f"{' ...' if len(missing) > 6 else ''}; expected a header naming "
                         f"{', '.join(need[:6])} ... (found {', '.join(names[:8])}"
                         f"{' ...' if len(names) > 8 else ''})")
    return [names.index(n) for n in need]


def _finite(path: str, a: np.ndarray, names: list) -> None:
    bad = ~np.isfinite(a)
    if bad.any():
        r, c = np.argwhere(bad)[0]
        raise InputError(f"{path}: row {r + 1} column {names[c]} is {a[r, c]}; expected a "
                         f"finite number")


def _increasing(path: str, ts: np.ndarray, what: str) -> None:
    back = np.flatnonzero(np.diff(ts) < 0)
    if len(back):
        r = int(back[0]) + 1
        raise InputError(f"{path}: {what} go backwards at row {r + 1} ({ts[r]} after "
                         f"{ts[r - 1]}); expected rows in time order (equal times are fine)")


def read_binance(path: str) -> BookStream:
    """The Binance capture in ../shared/data/binance-btcusdt-2024-08-08: one tick per top-10
    depth snapshot (derived/depth10.csv) with the trades since the previous one
    (derived/trades.csv; none on the first snapshot, and those at or before it are not
    counted); see its SOURCE.txt. Regimes: calm / volatile (label_volatility).
    Columns are found by header name; snapshots must be in time order; InputError names the
    file and row of anything else."""
    d = os.path.join(path, "derived") if os.path.isdir(os.path.join(path, "derived")) else path
    dpath, tpath = os.path.join(d, "depth10.csv"), os.path.join(d, "trades.csv")
    names, delim = _header(dpath)
    need = [f"{s}_{k}_{j}" for j in range(1, LEVELS + 1)
            for s, k in (("ask", "px"), ("ask", "qty"), ("bid", "px"), ("bid", "qty"))]
    cols = _columns(dpath, names, ["local_ts_ns"] + need)
    ts = _load(dpath, delim, cols[0], np.int64, "timestamp (integer ns)")[:, 0]
    depth = _load(dpath, delim, cols[1:], np.float64, "depth row")
    if len(depth) == 0:
        raise InputError(f"{dpath}: no depth snapshots after the header; expected at least one row")
    _finite(dpath, depth, need)
    _increasing(dpath, ts, "timestamps")
    lv = depth.reshape(len(depth), LEVELS, 4)      # ask_px, ask_qty, bid_px, bid_qty
    tnames, tdelim = _header(tpath)
    tneed = ["local_ts_ns", "qty", "aggressor_side"]
    tcols = _columns(tpath, tnames, tneed)
    t_ts = _load(tpath, tdelim, tcols[0], np.int64, "timestamp (integer ns)")[:, 0]
    trades = _load(tpath, tdelim, tcols[1:], np.float64, "trade row")
    _finite(tpath, trades, tneed[1:])
    qty, side = trades[:, 0], trades[:, 1]
    bad = np.flatnonzero((qty < 0) | ~np.isin(side, (-1.0, 1.0)))
    if len(bad):
        r = int(bad[0])
        raise InputError(f"{tpath}: row {r + 1}: qty {qty[r]}, aggressor_side {side[r]}; expected "
                         f"qty >= 0 and aggressor_side +1 (buy) or -1 (sell)")
    order = np.argsort(t_ts, kind="stable")
    t_ts, qty, side = t_ts[order], qty[order], side[order]
    vol, cnt, last = _trades_between(ts, t_ts, side * qty, qty)
    bs = BookStream(np.zeros(len(ts), np.int32), ts, lv[:, :, 2].copy(), lv[:, :, 0].copy(),
                    lv[:, :, 3].copy(), lv[:, :, 1].copy(), vol, cnt, last, np.float64(0.01))
    bs.validate(dpath, np.arange(1, len(ts) + 1))
    label_volatility(bs)
    return bs


def read_lobster(orderbook_csv: str, message_csv: str, tick_size: float = 0.01,
                 date_ns: int = 0) -> BookStream:
    """A LOBSTER orderbook/message file pair (one row per book event). Prices are integers
    in 1e-4 currency units; empty levels (price +-9999999999) are filled one tick beyond the
    last real level with size 0. Trades are message types 4 and 5 (executions); the
    aggressor is the opposite of the executed order's direction. Rows whose best bid or ask
    is empty are dropped (there is no mid to describe the book by)."""
    if isinstance(tick_size, bool) or not isinstance(tick_size, (int, float, np.integer, np.floating)) \
            or not 0 < tick_size < np.inf:
        raise InputError(f"tick_size must be a positive finite number, got {tick_size!r}")
    if isinstance(date_ns, bool) or not isinstance(date_ns, (int, np.integer)):
        raise InputError(f"date_ns must be an int (ns of the trading day's midnight), got {date_ns!r}")
    for p in (orderbook_csv, message_csv):
        try:
            with open(p, "rb") as f:
                if not f.read(1):
                    raise InputError(f"{p}: empty file; expected LOBSTER rows (no header)")
        except IsADirectoryError:
            raise InputError(f"{p}: is a directory; expected a LOBSTER CSV file") from None
        except OSError as exc:
            raise InputError(_unreadable(p, exc, "a LOBSTER CSV file")) from None
    ob = _lobster_load(orderbook_csv)
    msg = _lobster_load(message_csv)
    if len(ob) != len(msg):
        raise InputError(f"LOBSTER files disagree: {len(ob)} book rows, {len(msg)} messages")
    levels = ob.shape[1] // 4
    if levels < 1 or ob.shape[1] % 4:
        raise InputError(f"{orderbook_csv}: expected 4 columns per level, got {ob.shape[1]}")
    if msg.shape[1] < 6:
        raise InputError(f"{message_csv}: expected 6 columns (time, type, order id, size, price, "
                         f"direction), got {msg.shape[1]}")
    _finite(orderbook_csv, ob, [f"{i + 1}" for i in range(ob.shape[1])])
    _finite(message_csv, msg, ["time", "type", "order_id", "size", "price", "direction"]
            + [f"{i + 1}" for i in range(6, msg.shape[1])])
    lv = ob.reshape(len(ob), levels, 4)
    apx, asz, bpx, bsz = lv[:, :, 0] / 1e4, lv[:, :, 1], lv[:, :, 2] / 1e4, lv[:, :, 3]
    empty_a = np.abs(apx) >= 999999
    empty_b = np.abs(bpx) >= 999999
    for px, empty, sgn in ((apx, empty_a, 1), (bpx, empty_b, -1)):
        for j in range(levels):
            base = px[:, j - 1] if j else np.where(empty[:, 0], np.nan, px[:, 0])
            px[:, j] = np.where(empty[:, j], base + sgn * tick_size, px[:, j])
    asz = np.where(empty_a, 0, asz)
    bsz = np.where(empty_b, 0, bsz)
    ok = np.isfinite(apx[:, 0]) & np.isfinite(bpx[:, 0])
    if not ok.any():
        raise InputError(f"{orderbook_csv}: every row has an empty best bid or ask; expected "
                         f"at least one two-sided book")
    if levels < LEVELS:     # pad to 10 levels, one tick apart, empty
        k = LEVELS - levels
        step = np.arange(1, k + 1) * tick_size
        apx = np.hstack([apx, apx[:, -1:] + step]); bpx = np.hstack([bpx, bpx[:, -1:] - step])
        asz = np.hstack([asz, np.zeros((len(asz), k))]); bsz = np.hstack([bsz, np.zeros((len(bsz), k))])
    apx, bpx, asz, bsz = apx[:, :LEVELS], bpx[:, :LEVELS], asz[:, :LEVELS], bsz[:, :LEVELS]
    # seconds after midnight -> integer ns before adding the date: date_ns + a float array
    # would be a float64 sum, rounded to 256 ns at today's epoch
    ts = int(date_ns) + np.round(msg[:, 0] * 1e9).astype(np.int64)
    _increasing(message_csv, ts, "message times")
    is_trade = np.isin(msg[:, 1], (4, 5))
    bad = np.flatnonzero(is_trade & ~np.isin(msg[:, 5], (-1.0, 1.0)))
    if len(bad):
        r = int(bad[0])
        raise InputError(f"{message_csv}: row {r + 1}: execution with direction {msg[r, 5]}; "
                         f"expected -1 (sell order) or 1 (buy order)")
    # an execution's size is its volume: a negative one flipped the sign of the tick's traded
    # volume (silently where a later execution was the tick's last trade; otherwise refused
    # as "a negative ... last trade size" of a row of the order book file, which is fine)
    bad = np.flatnonzero(is_trade & (msg[:, 3] < 0))
    if len(bad):
        r = int(bad[0])
        raise InputError(f"{message_csv}: row {r + 1}: execution of size {msg[r, 3]:g}; expected "
                         f"a size >= 0 (shares executed)")
    signed = np.where(is_trade, -msg[:, 5] * msg[:, 3], 0.0)
    # a dropped row's executions (often the very one that emptied a side) belong to the next
    # kept tick, "the trades since the previous tick"; dropping them lost that volume
    kept = np.flatnonzero(ok)
    to = np.searchsorted(kept, np.arange(len(ok)))          # the first kept row at or after
    carry = to < len(kept)
    vol = np.bincount(to[carry], weights=signed[carry], minlength=len(kept))
    cnt = np.bincount(to[carry], weights=is_trade[carry].astype(np.float64), minlength=len(kept))
    last_row = np.full(len(kept), -1)
    np.maximum.at(last_row, to[carry], np.where(is_trade, np.arange(len(ok)), -1)[carry])
    last = np.where(last_row >= 0, msg[np.maximum(last_row, 0), 3], 0.0)
    bs = BookStream(np.zeros(len(kept), np.int32), ts[ok], bpx[ok], apx[ok], bsz[ok], asz[ok],
                    vol, cnt, last, np.float64(tick_size))
    bs.validate(orderbook_csv, kept + 1)
    label_volatility(bs)
    return bs


def _lobster_load(path: str) -> np.ndarray:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return np.loadtxt(path, delimiter=",", ndmin=2)
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a text CSV file") from None
    except ValueError as exc:
        raise InputError(f"{path}: malformed LOBSTER file ({_rows_from_1(exc)}); expected comma-separated "
                         f"numbers without a header, every row with the same columns") from None
