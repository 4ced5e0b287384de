"""The tick adapter: a BookStream (snapshots + trades) -> (n, 256) float32 raw vectors.
The layout of the raw vector, and why it is relative to the book, is documented in the
package docstring (fastpath/lob/__init__.py); field_names() names every field.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fastpath.errors import InputError

RAW_LEN = 256
LEVELS = 10
HALF_LIVES = (1, 2, 4, 8, 16, 32, 64, 128)

# Fields with rolling window stats (mean and std over the last W ticks) in the demo feature
# spec: state fields, whose rolling stats drift slowly while the book is quiet: level-1
# imbalance, cumulative imbalance to level 5, spread, microprice offset, total bid and ask
# depth, and the 32-tick EWMAs of signed trade flow and level-1 imbalance.
WINDOW_FIELDS = (40, 54, 60, 61, 62, 63, 161, 169)

# The logs of the layout. numpy's AVX-512 builds carry their own log and log1p, which may
# differ from the C library's (what the engine's live book calls) in the last bit; the tests
# hold the adapter to the C library's by replacing these two.
_log1p = np.log1p
_log = np.log


def _state_fields() -> frozenset:
    names = field_names()
    event = ("dlogsz", "ofi_", "log_trades", "flow_now", "mid_change_bps", "log_ms_since_tick")
    fast = tuple(f"_hl{h}" for h in (1, 2, 4)) + ("ret_lag1", "ret_lag2", "ret_lag4")
    return frozenset(i for i, n in enumerate(names)
                     if not any(e in n for e in event) and not n.endswith(fast))


def field_names() -> list:
    """Names of the 256 raw fields, in layout order."""
    n = []
    n += [f"bid_px_off_{i}" for i in range(1, 11)] + [f"ask_px_off_{i}" for i in range(1, 11)]
    n += [f"bid_logsz_{i}" for i in range(1, 11)] + [f"ask_logsz_{i}" for i in range(1, 11)]
    n += [f"imb_{i}" for i in range(1, 11)] + [f"cum_imb_{i}" for i in range(1, 11)]
    n += ["spread", "microprice_off", "log_bid_depth", "log_ask_depth"]
    n += [f"bid_logcum_{i}" for i in range(1, 11)] + [f"ask_logcum_{i}" for i in range(1, 11)]
    n += [f"bid_gap_{i}" for i in range(1, 10)] + [f"ask_gap_{i}" for i in range(1, 10)]
    n += [f"bid_dlogsz_{i}" for i in range(1, 11)] + [f"ask_dlogsz_{i}" for i in range(1, 11)]
    n += [f"ofi_{i}" for i in range(1, 11)]
    n += [f"ret_lag{h}" for h in HALF_LIVES]
    for s in ("ofi1", "ofi5", "flow", "imb1", "ret2", "spread", "micro", "depthratio"):
        n += [f"ewm_{s}_hl{h}" for h in HALF_LIVES]
    n += ["last_trade_sign", "last_trade_logsz", "log_trades", "flow_now", "log_ms_since_trade",
          "log_ms_since_tick", "log_ticks_since_mid_move", "mid_change_bps"]
    for lv in range(2, 6):
        n += [f"ewm_imb{lv}_hl{h}" for h in HALF_LIVES]
    n += [f"ewm_absofi1_hl{h}" for h in HALF_LIVES]
    n += ["bid_l1_rel", "ask_l1_rel", "bid_slope", "ask_slope"]
    assert len(n) == RAW_LEN
    return n


def _slog(x: np.ndarray) -> np.ndarray:
    return np.sign(x) * _log1p(np.abs(x))


@dataclass
class BookStream:
    """Ticks in time order: book snapshots after each update and the trades since the last one."""
    symbols: np.ndarray      # (n,) int32
    ts_ns: np.ndarray        # (n,) int64
    bid_px: np.ndarray       # (n, L) float64, level 1 first
    ask_px: np.ndarray
    bid_sz: np.ndarray       # (n, L) float64
    ask_sz: np.ndarray
    trade_vol: np.ndarray    # (n,) signed volume traded since the symbol's previous tick
    trade_cnt: np.ndarray    # (n,) trades since the previous tick
    last_trade_sz: np.ndarray  # (n,) size of the most recent trade (0 when none in this interval)
    tick_size: np.ndarray    # (n,) or scalar
    regime: np.ndarray | None = None  # (n,) int8 label, generated streams only
    regime_names: tuple = ()
    symbol_names: tuple = ()  # the vendor's name of each symbol id, where the file names them

    def __len__(self) -> int:
        return len(self.symbols)

    def mid(self) -> np.ndarray:
        return 0.5 * (self.bid_px[:, 0] + self.ask_px[:, 0])

    def validate(self, source: str = "book stream", row_numbers=None) -> None:
        """InputError, naming the first bad row, unless every array has its documented shape
        and every book is one the raw layout can describe: finite positive prices, levels in
        order away from the touch, best bid below best ask, sizes >= 0, a positive tick size.
        A crossed book or a side with fewer levels would otherwise come out as plausible
        numbers (a negative spread, a broadcast) or NaN that poisons every later EWMA.
        row_numbers[i], when given, is how the message names row i (a reader's file row)."""
        n = len(self.symbols)
        sym = np.asarray(self.symbols)
        if sym.ndim != 1 or sym.dtype.kind not in "iu":
            raise InputError(f"{source}: symbols must be a 1-d integer array, got {sym.dtype} "
                             f"shape {sym.shape}")
        for name in ("ts_ns", "trade_vol", "trade_cnt", "last_trade_sz"):
            a = np.asarray(getattr(self, name))
            if a.shape != (n,):
                raise InputError(f"{source}: {name} must have shape ({n},) (one per tick), got "
                                 f"{a.shape}")
        if np.asarray(self.ts_ns).dtype.kind not in "iu":
            raise InputError(f"{source}: ts_ns must be integer ns, got {np.asarray(self.ts_ns).dtype}")
        for name in ("bid_px", "ask_px", "bid_sz", "ask_sz"):
            a = np.asarray(getattr(self, name))
            if a.shape != (n, LEVELS):
                raise InputError(f"{source}: {name} must have shape ({n}, {LEVELS}): {LEVELS} "
                                 f"levels per side, level 1 first (pad a thinner side with "
                                 f"empty levels one tick apart, size 0), got {a.shape}")
        tick = np.asarray(self.tick_size, np.float64)
        if tick.shape not in ((), (n,)) or not (np.isfinite(tick).all() and (tick > 0).all()):
            raise InputError(f"{source}: tick_size must be a positive finite scalar or one per "
                             f"tick, got {self.tick_size!r}")
        bpx, apx = np.asarray(self.bid_px, np.float64), np.asarray(self.ask_px, np.float64)
        bsz, asz = np.asarray(self.bid_sz, np.float64), np.asarray(self.ask_sz, np.float64)
        fl = [np.asarray(getattr(self, k), np.float64) for k in ("trade_vol", "trade_cnt",
                                                                 "last_trade_sz")]
        checks = (
            (~(np.isfinite(bpx).all(1) & np.isfinite(apx).all(1) & np.isfinite(bsz).all(1)
               & np.isfinite(asz).all(1) & np.isfinite(fl[0]) & np.isfinite(fl[1])
               & np.isfinite(fl[2])), "a non-finite price, size or trade field"),
            ((bpx[:, 0] <= 0) | (apx[:, 0] <= 0), "a best price <= 0 (no log mid)"),
            (bpx[:, 0] >= apx[:, 0], "a crossed or locked book (best bid >= best ask)"),
            ((np.diff(bpx, axis=1) > 0).any(1), "bid levels out of order (each level must be "
                                                "at or below the one before)"),
            ((np.diff(apx, axis=1) < 0).any(1), "ask levels out of order (each level must be "
                                                "at or above the one before)"),
            ((bsz < 0).any(1) | (asz < 0).any(1), "a negative size"),
            ((fl[1] < 0) | (fl[2] < 0), "a negative trade count or last trade size"),
        )
        o = np.argsort(sym, kind="stable")
        ts = np.asarray(self.ts_ns)[o]
        back = np.zeros(n, bool)
        back[o[1:]] = (np.diff(ts) < 0) & (sym[o][1:] == sym[o][:-1])
        checks += ((back, "a timestamp earlier than its symbol's previous tick"),)
        for bad, what in checks:
            rows = np.flatnonzero(bad)
            if len(rows):
                r = int(rows[0])
                at = f"row {r + 1} (of {n})" if row_numbers is None else f"row {row_numbers[r]}"
                raise InputError(f"{source}: {at} has {what}: bid "
                                 f"{bpx[r, 0]:g} x {bsz[r, 0]:g}, ask {apx[r, 0]:g} x "
                                 f"{asz[r, 0]:g}; {len(rows)} such row(s)")


def raw_from_book(bs: BookStream, progress=None) -> np.ndarray:
    """The (n, 256) float32 raw vectors for a book stream (see the module doc for the layout).
    progress(done_symbols, total_symbols), when given, is called per symbol. InputError
    (BookStream.validate) for a book the layout cannot describe."""
    bs.validate()
    n = len(bs)
    out = np.zeros((n, RAW_LEN), np.float64)
    tick = np.broadcast_to(np.asarray(bs.tick_size, np.float64), (n,))
    mid = bs.mid()
    bpx, apx, bsz, asz = bs.bid_px, bs.ask_px, np.maximum(bs.bid_sz, 0), np.maximum(bs.ask_sz, 0)
    out[:, 0:10] = (bpx - mid[:, None]) / tick[:, None]
    out[:, 10:20] = (apx - mid[:, None]) / tick[:, None]
    out[:, 20:30] = _log1p(bsz)
    out[:, 30:40] = _log1p(asz)
    tot = bsz + asz
    out[:, 40:50] = np.where(tot > 0, (bsz - asz) / np.where(tot > 0, tot, 1), 0)
    cb, ca = np.cumsum(bsz, 1), np.cumsum(asz, 1)
    ct = cb + ca
    out[:, 50:60] = np.where(ct > 0, (cb - ca) / np.where(ct > 0, ct, 1), 0)
    spread = (apx[:, 0] - bpx[:, 0]) / tick
    out[:, 60] = spread
    l1 = bsz[:, 0] + asz[:, 0]
    micro = np.where(l1 > 0, (apx[:, 0] * bsz[:, 0] + bpx[:, 0] * asz[:, 0]) / np.where(l1 > 0, l1, 1),
                     mid)
    out[:, 61] = (micro - mid) / tick
    out[:, 62] = _log1p(cb[:, -1])
    out[:, 63] = _log1p(ca[:, -1])
    out[:, 64:74] = _log1p(cb)
    out[:, 74:84] = _log1p(ca)
    out[:, 84:93] = (bpx[:, :-1] - bpx[:, 1:]) / tick[:, None]
    out[:, 93:102] = (apx[:, 1:] - apx[:, :-1]) / tick[:, None]
    lvl_mean = np.maximum((bsz.sum(1) + asz.sum(1)) / (2 * LEVELS), 1e-12)
    out[:, 252] = bsz[:, 0] / lvl_mean
    out[:, 253] = asz[:, 0] / lvl_mean
    out[:, 254] = (_log1p(bsz[:, -1]) - _log1p(bsz[:, 0])) / 9
    out[:, 255] = (_log1p(asz[:, -1]) - _log1p(asz[:, 0])) / 9
    out[:, 207] = _slog(bs.trade_vol)
    out[:, 206] = _log1p(bs.trade_cnt)

    alphas = np.array([1 - 0.5 ** (1 / h) for h in HALF_LIVES])
    symbols = np.unique(bs.symbols)
    for k, s in enumerate(symbols):
        if progress is not None:
            progress(k, len(symbols))
        rows = np.flatnonzero(bs.symbols == s)
        # an update that leaves the visible book as it was and carries no trade is not a new
        # state: it repeats the symbol's previous vector (the per-symbol clock is book changes)
        same = np.zeros(len(rows), bool)
        same[1:] = ((bs.bid_px[rows[1:]] == bs.bid_px[rows[:-1]]).all(1)
                    & (bs.ask_px[rows[1:]] == bs.ask_px[rows[:-1]]).all(1)
                    & (bs.bid_sz[rows[1:]] == bs.bid_sz[rows[:-1]]).all(1)
                    & (bs.ask_sz[rows[1:]] == bs.ask_sz[rows[:-1]]).all(1)
                    & (bs.trade_cnt[rows[1:]] == 0))
        changed = rows[~same]
        _per_symbol(out, changed, bs, mid, alphas)
        if same.any():
            src = np.maximum.accumulate(np.where(~same, np.arange(len(rows)), 0))
            out[rows[same]] = out[rows[src[same]]]
    with np.errstate(over="ignore"):
        res = out.astype(np.float32)
    bad = ~np.isfinite(res)
    if bad.any():
        # finite books can still overflow a field (a tick size of 1e-300 makes every offset
        # inf): refuse here, where the field can be named, not tick by tick in the engine
        r, c = np.argwhere(bad)[0]
        raise InputError(f"raw_from_book: row {r + 1} field {c} ({field_names()[c]}) is "
                         f"{out[r, c]:g}, beyond float32; check the tick size "
                         f"({tick[r]:g}) and the prices and sizes of that row")
    return res


def _per_symbol(out, rows, bs, mid, alphas) -> None:
    m = len(rows)
    bpx, apx = bs.bid_px[rows], bs.ask_px[rows]
    bsz, asz = np.maximum(bs.bid_sz[rows], 0), np.maximum(bs.ask_sz[rows], 0)
    md = mid[rows]
    # size change since the previous tick of this symbol, and order-flow imbalance per level
    prev_b = np.vstack([bsz[:1], bsz[:-1]])
    prev_a = np.vstack([asz[:1], asz[:-1]])
    prev_bp = np.vstack([bpx[:1], bpx[:-1]])
    prev_ap = np.vstack([apx[:1], apx[:-1]])
    out[rows, 102:112] = _log1p(bsz) - _log1p(prev_b)
    out[rows, 112:122] = _log1p(asz) - _log1p(prev_a)
    e_b = np.where(bpx >= prev_bp, bsz, 0) - np.where(bpx <= prev_bp, prev_b, 0)
    e_a = np.where(apx <= prev_ap, asz, 0) - np.where(apx >= prev_ap, prev_a, 0)
    ofi = e_b - e_a
    out[rows, 122:132] = _slog(ofi)
    # returns over lags, bps
    lm = _log(md)
    for j, h in enumerate(HALF_LIVES):
        past = np.concatenate([np.full(min(h, m), lm[0]), lm[:-h]]) if m > h else np.full(m, lm[0])
        out[rows, 132 + j] = (lm - past) * 1e4
    r1 = out[rows, 132]
    out[rows, 211] = r1
    # trades and timing
    ts = bs.ts_ns[rows].astype(np.float64)
    dt_ms = np.diff(ts, prepend=ts[0]) / 1e6
    out[rows, 209] = _log1p(np.maximum(dt_ms, 0))
    traded = bs.trade_cnt[rows] > 0
    sign = np.sign(bs.trade_vol[rows])
    idx = np.where(traded, np.arange(m), -1)
    last = np.maximum.accumulate(idx)
    have = last >= 0
    lsafe = np.where(have, last, 0)
    out[rows, 204] = np.where(have, sign[lsafe], 0)
    out[rows, 205] = np.where(have, _log1p(bs.last_trade_sz[rows][lsafe]), 0)
    out[rows, 208] = np.where(have, _log1p(np.maximum(ts - ts[lsafe], 0) / 1e6), _log1p(1e4))
    moved = np.concatenate([[True], md[1:] != md[:-1]])
    lastmove = np.maximum.accumulate(np.where(moved, np.arange(m), 0))
    out[rows, 210] = _log1p(np.arange(m) - lastmove)
    # exponentially weighted averages, all series at once
    base = np.column_stack([
        out[rows, 122], _slog(ofi[:, :5].sum(1)), out[rows, 207], out[rows, 40], r1 * r1,
        out[rows, 60], out[rows, 61], out[rows, 62] - out[rows, 63],
        out[rows, 41], out[rows, 42], out[rows, 43], out[rows, 44], np.abs(out[rows, 122]),
    ])
    k = base.shape[1]
    a = np.tile(alphas, k)                      # series-major: series i at hl j -> i*8 + j
    x = np.repeat(base, len(alphas), axis=1)
    ew = np.empty_like(x)
    e = x[0].copy()
    for t in range(m):
        e += a * (x[t] - e)
        ew[t] = e
    out[np.ix_(rows, np.arange(140, 204))] = ew[:, :64]
    out[np.ix_(rows, np.arange(212, 244))] = ew[:, 64:96]
    out[np.ix_(rows, np.arange(244, 252))] = ew[:, 96:104]


# Fields that describe the book's state and slow context, as opposed to fields that flash on
# the tick of an event (size changes, per-tick order flow, this tick's trades, 1-4 tick
# averages). A model fed only these sees nearly the same input for ticks that barely move
# the book, which is what lets the per-symbol cache hit without costing accuracy.
STATE_FIELDS = _state_fields()

def future_return_bps(bs: BookStream, horizon: int = 20) -> np.ndarray:
    """Mid return of each tick's symbol over its next `horizon` ticks, bps; 0 for a symbol's
    last `horizon` ticks, which have no tick that far ahead (a return to the symbol's last
    tick would be a label over a shorter horizon)."""
    if isinstance(horizon, bool) or not isinstance(horizon, (int, np.integer)) or horizon < 1:
        raise InputError(f"horizon must be an int >= 1 (ticks ahead), got {horizon!r}")
    mid = bs.mid()
    out = np.zeros(len(bs))
    for s in np.unique(bs.symbols):
        rows = np.flatnonzero(bs.symbols == s)
        lm = np.log(mid[rows])
        fut = np.concatenate([lm[horizon:], lm[len(rows) - min(horizon, len(rows)):]])
        out[rows] = (fut - lm) * 1e4
    return out
