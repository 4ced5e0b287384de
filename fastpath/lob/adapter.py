"""Limit-order-book adapter: book snapshots + trades -> the 256-value raw vector, and a
seeded synthetic book stream with regimes.

Design: the raw vector describes the book relative to itself (prices in ticks from
mid, log sizes, imbalances), never in absolute prices, so one model serves every
instrument and price level. Slow-moving context (returns over several lags and
exponentially weighted averages at half-lives of 1..128 ticks) replaces a shifting
window of past snapshots: consecutive ticks of a calm book give nearly the same
vector, which is what lets the per-symbol cache hit, while a shock changes it at once.
Everything is computed per symbol, in tick order, vectorised over fields. The per-symbol
clock is book changes: an update that leaves the visible top-10 book unchanged and carries no
trade (activity deeper in the book, a repeated snapshot) repeats the symbol's previous vector
exactly, so "since the previous tick" below means since the previous change.

Raw layout (RAW_LEN = 256 float32), L = 10 levels, "hl" = half-lives 1,2,4,...,128 ticks:
    0-9    bid price offset from mid, ticks, level 1..10 (negative)
    10-19  ask price offset from mid, ticks (positive)
    20-29  log1p bid size            30-39  log1p ask size
    40-49  level imbalance (b-a)/(b+a)
    50-59  cumulative depth imbalance, levels 1..k
    60     spread, ticks             61     microprice offset from mid, ticks
    62     log1p total bid depth     63     log1p total ask depth
    64-83  log1p cumulative depth, bid 1..10 then ask 1..10
    84-101 gaps between consecutive levels, ticks, bid 9 then ask 9
    102-121 log size change since the symbol's previous tick, bid 10 then ask 10
    122-131 order-flow imbalance per level (Cont et al.), log-signed
    132-139 mid return over the last 1,2,4,...,128 ticks, bps
    140-203 EWMA of 8 series x 8 hl: [OFI level 1, OFI levels 1-5, signed trade volume,
            level-1 imbalance, squared 1-tick return (bps^2), spread, microprice offset,
            log depth ratio bid/ask]; series-major (140-147 is OFI level 1 at hl 1..128)
    204    last trade sign (+1 buy, -1 sell, 0 none yet)
    205    log1p size of the last trade
    206    log1p trades since the previous tick
    207    signed trade volume since the previous tick, log-signed
    208    log1p ms since the last trade
    209    log1p ms since the symbol's previous tick
    210    log1p ticks since the mid last changed
    211    mid change since the previous tick, bps
    212-243 EWMA of imbalance at levels 2..5 x hl (1, 2, 8, 32, 128, 4, 16, 64 -> sorted 1..128)
    244-251 EWMA of |OFI level 1| x 8 hl
    252-253 level-1 size / mean level size, bid then ask
    254-255 depth slope (log size level 10 - level 1) / 9, bid then ask
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

RAW_LEN = 256
LEVELS = 10
HALF_LIVES = (1, 2, 4, 8, 16, 32, 64, 128)

# Fields with rolling window stats (mean and std over the last W ticks) in the demo feature
# spec: state fields, whose rolling stats drift slowly while the book is quiet: level-1
# imbalance, cumulative imbalance to level 5, spread, microprice offset, total bid and ask
# depth, and the 32-tick EWMAs of signed trade flow and level-1 imbalance.
WINDOW_FIELDS = (40, 54, 60, 61, 62, 63, 161, 169)


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
    return np.sign(x) * np.log1p(np.abs(x))


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

    def __len__(self) -> int:
        return len(self.symbols)

    def mid(self) -> np.ndarray:
        return 0.5 * (self.bid_px[:, 0] + self.ask_px[:, 0])


def raw_from_book(bs: BookStream, progress=None) -> np.ndarray:
    """The (n, 256) float32 raw vectors for a book stream (see the module doc for the layout).
    progress(done_symbols, total_symbols), when given, is called per symbol."""
    n = len(bs)
    out = np.zeros((n, RAW_LEN), np.float64)
    tick = np.broadcast_to(np.asarray(bs.tick_size, np.float64), (n,))
    mid = bs.mid()
    bpx, apx, bsz, asz = bs.bid_px, bs.ask_px, np.maximum(bs.bid_sz, 0), np.maximum(bs.ask_sz, 0)
    out[:, 0:10] = (bpx - mid[:, None]) / tick[:, None]
    out[:, 10:20] = (apx - mid[:, None]) / tick[:, None]
    out[:, 20:30] = np.log1p(bsz)
    out[:, 30:40] = np.log1p(asz)
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
    out[:, 62] = np.log1p(cb[:, -1])
    out[:, 63] = np.log1p(ca[:, -1])
    out[:, 64:74] = np.log1p(cb)
    out[:, 74:84] = np.log1p(ca)
    out[:, 84:93] = (bpx[:, :-1] - bpx[:, 1:]) / tick[:, None]
    out[:, 93:102] = (apx[:, 1:] - apx[:, :-1]) / tick[:, None]
    lvl_mean = np.maximum((bsz.sum(1) + asz.sum(1)) / (2 * LEVELS), 1e-12)
    out[:, 252] = bsz[:, 0] / lvl_mean
    out[:, 253] = asz[:, 0] / lvl_mean
    out[:, 254] = (np.log1p(bsz[:, -1]) - np.log1p(bsz[:, 0])) / 9
    out[:, 255] = (np.log1p(asz[:, -1]) - np.log1p(asz[:, 0])) / 9
    out[:, 207] = _slog(bs.trade_vol)
    out[:, 206] = np.log1p(bs.trade_cnt)

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
    return out.astype(np.float32)


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
    out[rows, 102:112] = np.log1p(bsz) - np.log1p(prev_b)
    out[rows, 112:122] = np.log1p(asz) - np.log1p(prev_a)
    e_b = np.where(bpx >= prev_bp, bsz, 0) - np.where(bpx <= prev_bp, prev_b, 0)
    e_a = np.where(apx <= prev_ap, asz, 0) - np.where(apx >= prev_ap, prev_a, 0)
    ofi = e_b - e_a
    out[rows, 122:132] = _slog(ofi)
    # returns over lags, bps
    lm = np.log(md)
    for j, h in enumerate(HALF_LIVES):
        past = np.concatenate([np.full(min(h, m), lm[0]), lm[:-h]]) if m > h else np.full(m, lm[0])
        out[rows, 132 + j] = (lm - past) * 1e4
    r1 = out[rows, 132]
    out[rows, 211] = r1
    # trades and timing
    ts = bs.ts_ns[rows].astype(np.float64)
    dt_ms = np.diff(ts, prepend=ts[0]) / 1e6
    out[rows, 209] = np.log1p(np.maximum(dt_ms, 0))
    traded = bs.trade_cnt[rows] > 0
    sign = np.sign(bs.trade_vol[rows])
    idx = np.where(traded, np.arange(m), -1)
    last = np.maximum.accumulate(idx)
    have = last >= 0
    lsafe = np.where(have, last, 0)
    out[rows, 204] = np.where(have, sign[lsafe], 0)
    out[rows, 205] = np.where(have, np.log1p(bs.last_trade_sz[rows][lsafe]), 0)
    out[rows, 208] = np.where(have, np.log1p(np.maximum(ts - ts[lsafe], 0) / 1e6), np.log1p(1e4))
    moved = np.concatenate([[True], md[1:] != md[:-1]])
    lastmove = np.maximum.accumulate(np.where(moved, np.arange(m), 0))
    out[rows, 210] = np.log1p(np.arange(m) - lastmove)
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

REGIMES = ("calm", "shock", "recovery")


def generate_stream(n_ticks: int = 200_000, n_symbols: int = 8, seed: int = 7,
                    shock_at: float = 0.45, shock_len: float = 0.1, progress=None) -> BookStream:
    """A seeded synthetic order book stream, several symbols interleaved, with regimes:
    calm, a shock (sweeps through several levels, 5x volatility, wide spread, heavy trading),
    then calm again ("recovery"). Level-1 imbalance predicts the next mid move, so a model
    trained on it has a real signal to find. progress(done, total), when given, is called
    every 10,000 ticks."""
    rng = np.random.default_rng(seed)
    L = LEVELS
    tick = 0.01
    mid2 = rng.integers(8_000, 20_000, n_symbols) * 2        # 2 x mid, in ticks
    spread = np.ones(n_symbols, np.int64)
    bsz = rng.lognormal(3.0, 0.6, (n_symbols, L))
    asz = rng.lognormal(3.0, 0.6, (n_symbols, L))
    sym = rng.integers(0, n_symbols, n_ticks).astype(np.int32)
    s0, s1 = int(n_ticks * shock_at), int(n_ticks * (shock_at + shock_len))
    regime = np.zeros(n_ticks, np.int8)
    regime[s0:s1] = 1
    regime[s1:] = 2
    gaps = rng.exponential(1.0, n_ticks) * np.where(regime == 1, 10_000, 50_000)
    ts = (1_700_000_000_000_000_000 + np.cumsum(gaps)).astype(np.int64)
    out_bpx = np.empty((n_ticks, L))
    out_apx = np.empty((n_ticks, L))
    out_bsz = np.empty((n_ticks, L))
    out_asz = np.empty((n_ticks, L))
    tvol = np.zeros(n_ticks)
    tcnt = np.zeros(n_ticks)
    tlast = np.zeros(n_ticks)
    u = rng.random((n_ticks, 7))
    lvl = np.minimum(rng.geometric(0.12, n_ticks) - 1, L - 1)
    mult = rng.lognormal(0.0, 0.25, n_ticks)
    tsz = rng.lognormal(1.5, 0.8, n_ticks)
    fresh = rng.lognormal(3.0, 0.6, (n_ticks, L))
    levels = np.arange(L)
    for t in range(n_ticks):
        if progress is not None and t % 10_000 == 0:
            progress(t, n_ticks)
        s = sym[t]
        shock = regime[t] == 1
        b, a = bsz[s], asz[s]
        imb = (b[0] - a[0]) / (b[0] + a[0])
        p_move = 0.35 if shock else 0.04
        if u[t, 0] < p_move:
            up = u[t, 1] < 0.5 + 0.35 * imb
            k = 1 + int(u[t, 2] * (4 if shock else 1.3))          # levels swept
            k = min(k, L - 1)
            if up:   # asks swept, book shifts up
                mid2[s] += 2 * k
                asz[s] = np.concatenate([a[k:], fresh[t, :k]])
                bsz[s] = np.concatenate([fresh[t, :k] * 0.5, b[:L - k]])
            else:
                mid2[s] -= 2 * k
                bsz[s] = np.concatenate([b[k:], fresh[t, :k]])
                asz[s] = np.concatenate([fresh[t, :k] * 0.5, a[:L - k]])
            spread[s] = 1 + int(u[t, 3] * 3) if shock else 1
            if u[t, 4] < (0.9 if shock else 0.6):
                sign = 1.0 if up else -1.0
                tcnt[t] = 1 + int(u[t, 5] * 3)
                tvol[t] = sign * tsz[t] * tcnt[t] * (3 if shock else 1)
                tlast[t] = tsz[t]
        elif u[t, 6] < (0.1 if shock else 0.5):
            pass    # activity beyond the visible 10 levels: the top-10 book is unchanged
        else:
            side = bsz if u[t, 1] < 0.5 else asz
            j = lvl[t]
            side[s, j] = max(side[s, j] * mult[t], 0.5)
            if shock:   # heavy cancellation through the book
                side[s] *= np.where(u[t, 2] < 0.5, 0.7, 1.3) ** (levels < 5)
                spread[s] = 1 + int(u[t, 3] * 3)
            elif spread[s] > 1 and u[t, 3] < 0.3:
                spread[s] -= 1
            if u[t, 4] < (0.5 if shock else 0.03):
                tcnt[t] = 1
                tvol[t] = (1.0 if u[t, 5] < 0.5 + 0.3 * imb else -1.0) * tsz[t]
                tlast[t] = tsz[t]
        half = spread[s]
        bb2 = mid2[s] - half
        ba2 = mid2[s] + half
        out_bpx[t] = (bb2 / 2 - levels) * tick
        out_apx[t] = (ba2 / 2 + levels) * tick
        out_bsz[t] = bsz[s]
        out_asz[t] = asz[s]
    return BookStream(sym, ts, out_bpx, out_apx, out_bsz, out_asz, tvol, tcnt, tlast,
                      np.float64(tick), regime, REGIMES)


def future_return_bps(bs: BookStream, horizon: int = 20) -> np.ndarray:
    """Mid return of each tick's symbol over its next `horizon` ticks, bps (0 at the end)."""
    mid = bs.mid()
    out = np.zeros(len(bs))
    for s in np.unique(bs.symbols):
        rows = np.flatnonzero(bs.symbols == s)
        lm = np.log(mid[rows])
        fut = np.concatenate([lm[horizon:], np.full(min(horizon, len(rows)), lm[-1])])
        out[rows] = (fut - lm) * 1e4
    return out


def _trades_between(tick_ts: np.ndarray, trade_ts: np.ndarray, signed: np.ndarray,
                    size: np.ndarray):
    """Per tick: signed volume, count and last size of the trades after the previous tick."""
    pos = np.searchsorted(trade_ts, tick_ts, side="right")       # trades with ts <= tick
    prev = np.concatenate([[0], pos[:-1]])
    csum = np.concatenate([[0.0], np.cumsum(signed)])
    vol = csum[pos] - csum[prev]
    cnt = (pos - prev).astype(np.float64)
    last = np.where(cnt > 0, size[np.maximum(pos - 1, 0)] if len(size) else 0.0, 0.0)
    return vol, cnt, last


def label_volatility(bs: BookStream, window: int = 50, quantile: float = 0.9) -> None:
    """Label real data with regimes: 'volatile' where the rolling mean |mid change| over
    `window` ticks is in the top (1 - quantile) of the day, else 'calm'."""
    mid = bs.mid()
    r = np.abs(np.diff(np.log(mid), prepend=np.log(mid[0])))
    c = np.concatenate([[0.0], np.cumsum(r)])
    idx = np.arange(1, len(r) + 1)
    roll = (c[idx] - c[np.maximum(idx - window, 0)]) / np.minimum(idx, window)
    bs.regime = (roll > np.quantile(roll, quantile)).astype(np.int8)
    bs.regime_names = ("calm", "volatile")


def read_binance(path: str) -> BookStream:
    """The Binance capture in ../shared/data/binance-btcusdt-2024-08-08: one tick per top-10
    depth snapshot (derived/depth10.csv) with the trades since the previous one
    (derived/trades.csv); see its SOURCE.txt. Regimes: calm / volatile (label_volatility)."""
    import os
    d = os.path.join(path, "derived") if os.path.isdir(os.path.join(path, "derived")) else path
    depth = np.loadtxt(os.path.join(d, "depth10.csv"), delimiter=",", skiprows=1)
    trades = np.loadtxt(os.path.join(d, "trades.csv"), delimiter=",", skiprows=1)
    if depth.ndim != 2 or depth.shape[1] != 4 + 4 * LEVELS:
        raise ValueError(f"{d}/depth10.csv: expected {4 + 4 * LEVELS} columns, got {depth.shape}")
    ts = depth[:, 0].astype(np.int64)
    lv = depth[:, 4:].reshape(len(depth), LEVELS, 4)      # ask_px, ask_qty, bid_px, bid_qty
    t_ts = trades[:, 0].astype(np.int64)
    order = np.argsort(t_ts, kind="stable")
    t_ts, qty, side = t_ts[order], trades[order, 5], trades[order, 7]
    vol, cnt, last = _trades_between(ts, t_ts, side * qty, qty)
    bs = BookStream(np.zeros(len(ts), np.int32), ts, lv[:, :, 2], lv[:, :, 0], lv[:, :, 3],
                    lv[:, :, 1], vol, cnt, last, np.float64(0.01))
    label_volatility(bs)
    return bs


def read_lobster(orderbook_csv: str, message_csv: str, tick_size: float = 0.01,
                 date_ns: int = 0) -> BookStream:
    """A LOBSTER orderbook/message file pair (one row per book event). Prices are integers
    in 1e-4 currency units; empty levels (price +-9999999999) are filled one tick beyond the
    last real level with size 0. Trades are message types 4 and 5 (executions); the
    aggressor is the opposite of the executed order's direction."""
    ob = np.loadtxt(orderbook_csv, delimiter=",", ndmin=2)
    msg = np.loadtxt(message_csv, delimiter=",", ndmin=2)
    if len(ob) != len(msg):
        raise ValueError(f"LOBSTER files disagree: {len(ob)} book rows, {len(msg)} messages")
    levels = ob.shape[1] // 4
    if levels < 1 or ob.shape[1] % 4:
        raise ValueError(f"{orderbook_csv}: expected 4 columns per level, got {ob.shape[1]}")
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
    if levels < LEVELS:     # pad to 10 levels, one tick apart, empty
        k = LEVELS - levels
        step = np.arange(1, k + 1) * tick_size
        apx = np.hstack([apx, apx[:, -1:] + step]); bpx = np.hstack([bpx, bpx[:, -1:] - step])
        asz = np.hstack([asz, np.zeros((len(asz), k))]); bsz = np.hstack([bsz, np.zeros((len(bsz), k))])
    apx, bpx, asz, bsz = apx[:, :LEVELS], bpx[:, :LEVELS], asz[:, :LEVELS], bsz[:, :LEVELS]
    ts = (date_ns + msg[:, 0] * 1e9).astype(np.int64)
    is_trade = np.isin(msg[:, 1], (4, 5))
    signed = np.where(is_trade, -msg[:, 5] * msg[:, 3], 0.0)
    cnt = is_trade.astype(np.float64)
    last = np.where(is_trade, msg[:, 3], 0.0)
    bs = BookStream(np.zeros(int(ok.sum()), np.int32), ts[ok], bpx[ok], apx[ok], bsz[ok], asz[ok],
                    signed[ok], cnt[ok], last[ok], np.float64(tick_size))
    label_volatility(bs)
    return bs
