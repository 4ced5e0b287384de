"""fastpath.connect: a client of a served engine (the ring work is in fastpath._serve.Client).

Answers are fastpath.Result, as an in-process Engine.step returns, with seq and wait_ns (submit
to the worker picking it up) filled in.
"""
from __future__ import annotations

from fastpath._checks import check_seconds
from fastpath._engine import Result
from fastpath._serve import Client


def connect(name: str, timeout: float = 1.0, stall_timeout: float | None = None) -> Client:
    """Connect to the server called `name`, waiting up to `timeout` s for it to come up
    and for a client slot to be free (one given back by close() is free again within a
    heartbeat); ServeError names the name when nobody serves it, or when every one of its
    serve.max_clients slots is still taken. `stall_timeout` (s): how long the
    server's loop may go without a heartbeat, its process alive, before a call raises
    ServerGone; None takes the server's [serve] stall_timeout_ms (default 2 s). A dead
    server process is reported after dead_after_ms whatever this says."""
    t = check_seconds("timeout", timeout, lo_open=False)
    st = None if stall_timeout is None else check_seconds("stall_timeout", stall_timeout,
                                                          lo_open=True)
    return Client(name, t, st)


__all__ = ["connect", "Client", "Result"]
