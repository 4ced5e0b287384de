"""The steps the vendor readers (Databento, Tardis) share between a file's rows and a BookStream:
the tick size inferred from the prices, empty levels filled as read_lobster fills them, a row
without a two-sided book dropped with its trades carried to the symbol's next kept row, and each
book checked with the file's own names for the row and the field.

Design: a vendor file is the least trusted input, so a bad book is refused here, where the
record and the field can still be named; BookStream.validate stays the backstop.
"""
from __future__ import annotations

import numpy as np

from fastpath.errors import InputError
from fastpath.lob.adapter import LEVELS


def infer_tick(prices: np.ndarray, empty: np.ndarray, scale: int = 0) -> float:
    """The smallest gap between two distinct prices the file quotes: integer prices (scale > 0:
    fixed point, `scale` units per currency unit) give the exact greatest common divisor of
    the gaps; float prices the smallest gap to 10 significant digits (decimal prices read as
    binary floats differ from the grid in the last bits)."""
    p = np.unique(prices[~empty])
    if len(p) < 2:
        return 0.0
    d = np.diff(p)
    if scale:
        return float(np.gcd.reduce(d.astype(np.int64))) / scale
    return float(f"{float(d[d > 0].min()):.10g}")


def ticks(sym: np.ndarray, bpx: np.ndarray, apx: np.ndarray, empty_b: np.ndarray,
          empty_a: np.ndarray, scale: int = 0) -> np.ndarray:
    """infer_tick per symbol (instruments of one file trade on different grids), one per row;
    0 for a symbol with fewer than two distinct prices."""
    out = np.zeros(len(sym))
    for s in np.unique(sym):
        r = sym == s
        out[r] = infer_tick(np.concatenate([bpx[r].ravel(), apx[r].ravel()]),
                            np.concatenate([empty_b[r].ravel(), empty_a[r].ravel()]), scale)
    return out


def fill_empty(px: np.ndarray, sz: np.ndarray, empty: np.ndarray, sign: int, tick):
    """Empty levels (no price) as read_lobster writes them: one tick (a scalar, or one per row)
    beyond the level before, size 0; a side whose best level is empty keeps NaN there (the row
    is dropped later)."""
    tick = np.broadcast_to(np.asarray(tick, np.float64), (len(px),))
    px, sz = px.astype(np.float64), np.where(empty, 0.0, sz).astype(np.float64)
    for j in range(px.shape[1]):
        base = px[:, j - 1] if j else np.full(len(px), np.nan)
        px[:, j] = np.where(empty[:, j], base + sign * tick, px[:, j])
    if px.shape[1] < LEVELS:           # a thinner file: pad to 10 levels, one tick apart, empty
        k = LEVELS - px.shape[1]
        px = np.hstack([px, px[:, -1:] + sign * tick[:, None] * np.arange(1, k + 1)])
        sz = np.hstack([sz, np.zeros((len(sz), k))])
    return px[:, :LEVELS], sz[:, :LEVELS]


def carry_trades(sym: np.ndarray, is_tick: np.ndarray, signed: np.ndarray, size: np.ndarray,
                 is_trade: np.ndarray):
    """Events in file order (book rows and trades, several symbols interleaved) -> per kept
    tick: the signed volume, count and last size of its symbol's trades after that symbol's
    previous kept tick, up to this one. Trades after a symbol's last tick are counted nowhere."""
    n, kept = len(sym), np.flatnonzero(is_tick)
    order = np.argsort(sym, kind="stable")
    pos = np.where(is_tick[order], np.arange(n), n)
    nxt = np.minimum.accumulate(pos[::-1])[::-1]          # next tick at or after, sorted order
    ok = (nxt < n) & is_trade[order]
    ok &= sym[order[np.minimum(nxt, n - 1)]] == sym[order]
    rank = np.full(n, -1)
    rank[kept] = np.arange(len(kept))
    to = rank[order[nxt[ok]]]
    src = order[ok]
    vol = np.bincount(to, weights=signed[src], minlength=len(kept))
    cnt = np.bincount(to, minlength=len(kept)).astype(np.float64)
    last_ev = np.full(len(kept), -1)
    np.maximum.at(last_ev, to, src)
    last = np.where(last_ev >= 0, size[np.maximum(last_ev, 0)], 0.0)
    return vol, cnt, last


def symbol_ids(names: np.ndarray):
    """Names (or instrument ids) -> (int32 ids 0.., the name of each id), ids in order of first
    appearance in the file."""
    uniq, first, inv = np.unique(names, return_index=True, return_inverse=True)
    order = np.argsort(first)
    remap = np.empty(len(uniq), np.int32)
    remap[order] = np.arange(len(uniq), dtype=np.int32)
    return remap[inv.ravel()], tuple(uniq[order].tolist())


def check_books(path: str, at, bpx, apx, bsz, asz, field) -> None:
    """InputError naming the first row (at(i): the file's name for row i) and field
    (field(side, level)) of a book the raw layout cannot describe."""
    with np.errstate(invalid="ignore"):
        checks = (
            (~np.isfinite(bpx) | ~np.isfinite(bsz), "bid", None, "a finite number"),
            (~np.isfinite(apx) | ~np.isfinite(asz), "ask", None, "a finite number"),
            (bsz < 0, "bid", "size", "a size >= 0"),
            (asz < 0, "ask", "size", "a size >= 0"),
            (bpx <= 0, "bid", "price", "a price > 0"),
            (apx <= 0, "ask", "price", "a price > 0"),
            (np.diff(bpx, axis=1, prepend=bpx[:, :1]) > 0, "bid", "price",
             "bid levels in order, each at or below the one before"),
            (np.diff(apx, axis=1, prepend=apx[:, :1]) < 0, "ask", "price",
             "ask levels in order, each at or above the one before"),
        )
    for bad, side, kind, want in checks:
        hit = np.argwhere(bad)
        if len(hit):
            r, j = hit[0]
            px, sz = (bpx, bsz) if side == "bid" else (apx, asz)
            if kind is None:
                kind = "price" if not np.isfinite(px[r, j]) else "size"
            v = px[r, j] if kind == "price" else sz[r, j]
            raise InputError(f"{path}: {at(r)}: {field(side, kind, j)} is {v:.10g}; expected {want}")
    crossed = np.flatnonzero(bpx[:, 0] >= apx[:, 0])
    if len(crossed):
        r = int(crossed[0])
        raise InputError(f"{path}: {at(r)}: {field('bid', 'price', 0)} {bpx[r, 0]:.10g} >= "
                         f"{field('ask', 'price', 0)} {apx[r, 0]:.10g} (a crossed or locked book); "
                         f"expected the best bid below the best ask")


def resolve_tick(path: str, tick_size, sym, bpx, apx, empty_b, empty_a, scale: int = 0):
    """The tick size given (a positive finite number, for every row), else one inferred per
    symbol (one per row): InputError for a bad tick_size or a symbol with a single price."""
    if tick_size is not None:
        if isinstance(tick_size, bool) or not isinstance(
                tick_size, (int, float, np.integer, np.floating)) or not 0 < tick_size < np.inf:
            raise InputError(f"tick_size must be a positive finite number or None, got "
                             f"{tick_size!r}")
        return np.full(len(sym), float(tick_size))
    tick = ticks(sym, bpx, apx, empty_b, empty_a, scale)
    if len(tick) and not (tick > 0).all():
        s = sym[np.flatnonzero(~(tick > 0))[0]]
        raise InputError(f"{path}: cannot infer the tick size of {s} (fewer than two distinct "
                         f"prices); pass tick_size")
    return tick
