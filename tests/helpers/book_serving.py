"""Book updates through a served engine: a server whose engine reads the 256-value book vector,
a stream's updates as step_book arguments, and a replay through any step_book (a served
client's or an in-process Engine's)."""
from contextlib import contextmanager
import time

import numpy as np

import fastpath
from fastpath._build import DEMO_MODEL
from helpers.book import book_engine, book_update
from helpers.serving import cfg, uname


def counted(srv, served, errors=0, timeout=60.0):
    """srv.stats() once its loop has counted at least `served` requests and `errors` error
    replies: the loop adds a round's requests to its counts after it has answered them, so a
    count read right after the last answer may not hold it yet."""
    end = time.monotonic() + timeout
    while True:
        st = srv.stats()
        if st["served"] >= served and st["errors"] >= errors:
            return st
        assert time.monotonic() < end, (f"the server counted {st['served']} requests, "
                                        f"{st['errors']} errors in {timeout} s; expected "
                                        f"{served}, {errors}")
        time.sleep(0.0005)


def tick_sizes(bs):
    """{symbol: tick size} of a BookStream (its first update's, per symbol)."""
    tick = np.broadcast_to(np.asarray(bs.tick_size, np.float64), (len(bs),))
    return {int(s): float(tick[np.flatnonzero(bs.symbols == s)[0]])
            for s in np.unique(bs.symbols)}


def update(bs, i):
    """Update i of bs as step_book's keyword arguments with its own symbol (copies: a test
    may spoil them)."""
    return book_update(bs, i, symbol=int(bs.symbols[i]))


def replay(step_book, bs, rows=None):
    """(signal, confidence, cached) of each update of bs (rows: those only) through step_book."""
    rows = range(len(bs)) if rows is None else rows
    out = np.empty((len(rows), 3))
    for k, i in enumerate(rows):
        r = step_book(**update(bs, i))
        out[k] = r.signal, r.confidence, r.cached
    return out


def local_engine(isa, ticks):
    """An in-process Engine as the served one is built (demo model, same config), its tick
    sizes set."""
    eng = book_engine(isa)
    for s, t in ticks.items():
        eng.set_tick_size(s, t)
    return eng


@contextmanager
def book_server(isa, ticks, **serve):
    """(server, client) of the demo model on kernel set isa, with these tick sizes."""
    name = uname()
    with fastpath.serve(name, model=DEMO_MODEL, config=cfg(engine={"simd": isa}, **serve),
                        tick_sizes=ticks) as srv:
        with fastpath.connect(name, timeout=10) as c:
            yield srv, c


# tests/c/book_client.c's update record and its answer record
UPDATE = np.dtype([("symbol", "<i4"), ("pad", "<i4"), ("ts_ns", "<i8"), ("bid_px", "<f8", 10),
                   ("bid_sz", "<f8", 10), ("ask_px", "<f8", 10), ("ask_sz", "<f8", 10),
                   ("trade_vol", "<f8"), ("trade_cnt", "<f8"), ("last_trade_sz", "<f8")])
ANSWER = np.dtype([("signal", "<f4"), ("confidence", "<f4"), ("err", "<i4"), ("reason", "<i4"),
                   ("aux", "<i4"), ("cached", "<i4")])


def write_updates(path, bs):
    """bs's updates as tests/c/book_client.c reads them."""
    rec = np.zeros(len(bs), UPDATE)
    for k in ("symbol", "ts_ns", "bid_px", "bid_sz", "ask_px", "ask_sz", "trade_vol",
              "trade_cnt", "last_trade_sz"):
        rec[k] = getattr(bs, "symbols" if k == "symbol" else k)
    rec.tofile(path)
