"""Serving one pinned engine to other threads and processes through shared-memory rings.

    with fastpath.serve("md") as srv:             # the C loop in a thread of this process
        c = fastpath.connect("md")                # from any process on the host
        r = c.step(raw, symbol=3)                 # submit and spin for the answer

A request is a raw vector (step) or one order book update (step_book, with the tick sizes the
server was given: serve(..., tick_sizes=...)).

`fastpath serve --name md` runs the same server in the foreground. C and C++ producers include
fp_ring.h from fastpath.get_include().
"""
from fastpath.serving.client import connect
from fastpath.serving.server import Server, serve

__all__ = ["serve", "connect", "Server"]
