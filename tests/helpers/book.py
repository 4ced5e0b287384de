"""Replaying a fastpath.lob.BookStream update by update through Engine.step_book, and the
engine built for it (the demo model, which reads the 256-value raw vector)."""
import math

import numpy as np

from fastpath import Engine
from fastpath.lob import adapter
from fastpath._build import DEMO_MODEL
from helpers.builders import engine_cfg


def book_engine(isa):
    return Engine(DEMO_MODEL, config=engine_cfg(isa))


def lobster_files(tmp_path, bs, n_levels=10):
    """A LOBSTER orderbook/message file pair holding symbol 0 of a generated stream: prices in
    1e-4 units, one submission per book event, an execution where the stream traded."""
    rows = np.flatnonzero(bs.symbols == 0)
    cols = []
    for j in range(n_levels):
        cols += [np.rint(bs.ask_px[rows, j] * 1e4), np.rint(bs.ask_sz[rows, j]),
                 np.rint(bs.bid_px[rows, j] * 1e4), np.rint(bs.bid_sz[rows, j])]
    ob = np.column_stack(cols).astype(np.int64)
    t = 34200 + np.arange(len(rows)) * 0.01
    traded = bs.trade_cnt[rows] > 0
    kind = np.where(traded, 4, 1)
    size = np.where(traded, np.maximum(np.rint(bs.last_trade_sz[rows]), 1), 1)
    direction = np.where(bs.trade_vol[rows] > 0, -1, 1)      # the executed order's side
    msg = np.column_stack([t, kind, np.arange(len(rows)), size, ob[:, 0], direction])
    ob_path, msg_path = tmp_path / "ob.csv", tmp_path / "msg.csv"
    np.savetxt(ob_path, ob, delimiter=",", fmt="%d")
    np.savetxt(msg_path, msg, delimiter=",", fmt=["%.4f", "%d", "%d", "%d", "%d", "%d"])
    return str(ob_path), str(msg_path)


def replay_book(eng, bs):
    """(raws, signals, confidences, cached) of bs stepped update by update through step_book:
    the raw vector each update gave (book_state's) and each Result."""
    n = len(bs)
    tick = np.broadcast_to(np.asarray(bs.tick_size, np.float64), (n,))
    for s in np.unique(bs.symbols):
        eng.set_tick_size(int(s), float(tick[np.flatnonzero(bs.symbols == s)[0]]))
    raws = np.empty((n, 256), np.float32)
    sig, conf, cached = np.empty(n), np.empty(n), np.empty(n, bool)
    for i in range(n):
        s = int(bs.symbols[i])
        r = eng.step_book(s, bs.bid_px[i], bs.bid_sz[i], bs.ask_px[i], bs.ask_sz[i],
                          int(bs.ts_ns[i]), float(bs.trade_vol[i]), int(bs.trade_cnt[i]),
                          float(bs.last_trade_sz[i]))
        raws[i] = eng.book_state(s)["raw"]
        sig[i], conf[i], cached[i] = r.signal, r.confidence, r.cached
    return raws, sig, conf, cached


def replay_raw(eng, bs, raws):
    """The same ticks stepped from ready raw vectors through step()."""
    n = len(bs)
    sig, conf, cached = np.empty(n), np.empty(n), np.empty(n, bool)
    for i in range(n):
        r = eng.step(raws[i], int(bs.symbols[i]), int(bs.ts_ns[i]))
        sig[i], conf[i], cached[i] = r.signal, r.confidence, r.cached
    return sig, conf, cached


def _libm(fn):
    uf = np.frompyfunc(fn, 1, 1)
    return lambda x: np.asarray(uf(np.asarray(x, np.float64)), np.float64)[()]


def libm_log1p(x):
    """log1p of each float64 of x by the C library (math.log1p calls it), as float64."""
    return _libm(math.log1p)(x)


def raw_from_book_libm(bs):
    """fastpath.lob.raw_from_book with the C library's log and log1p (Python's math module
    calls them), the functions the engine's live book calls: numpy's own, on an AVX-512
    build, may differ from them in the last bit."""
    saved = adapter._log1p, adapter._log
    adapter._log1p, adapter._log = _libm(math.log1p), _libm(math.log)
    try:
        return adapter.raw_from_book(bs)
    finally:
        adapter._log1p, adapter._log = saved


def book_update(bs, i, symbol=None):
    """Update i of a BookStream as step_book's keyword arguments (arrays copied, so a spoiler
    may change them), with symbol= when given."""
    u = dict(bid_px=bs.bid_px[i].copy(), bid_sz=bs.bid_sz[i].copy(),
             ask_px=bs.ask_px[i].copy(), ask_sz=bs.ask_sz[i].copy(), ts_ns=int(bs.ts_ns[i]),
             trade_vol=float(bs.trade_vol[i]), trade_cnt=int(bs.trade_cnt[i]),
             last_trade_sz=float(bs.last_trade_sz[i]))
    if symbol is not None:
        u["symbol"] = symbol
    return u


def spoil_set(name, level, value):
    """A spoiler of a book_update: field name (its level when not None) set to value."""
    def make(u):
        if level is None:
            u[name] = value
        else:
            u[name][level] = value
        return u
    return make


def spoil_order(name):
    """A spoiler: levels 4 and 5 of side name swapped, out of order."""
    def make(u):
        u[name][3], u[name][4] = u[name][4], u[name][3]
        return u
    return make


def spoil_crossed(locked):
    """A spoiler: the bids moved up to the best ask (locked) or a cent past it (crossed)."""
    def make(u):
        u["bid_px"] = u["bid_px"] + (u["ask_px"][0] - u["bid_px"][0]) + (0 if locked else 0.01)
        return u
    return make
