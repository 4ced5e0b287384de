"""Readers of recorded order books into a BookStream: the Binance capture layout
(derived/depth10.csv + trades.csv) and LOBSTER orderbook/message file pairs."""
from __future__ import annotations

import os

import numpy as np

from fastpath.lob.adapter import LEVELS, BookStream

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
