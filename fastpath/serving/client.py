"""fastpath.connect: a client of a served engine (the ring work is in fastpath._serve.Client).

Answers are fastpath.Result, as an in-process Engine.step returns, with seq and wait_ns (submit
to the worker picking it up) filled in.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from fastpath._engine import Result
from fastpath._serve import Client
from fastpath.errors import InputError


def _seconds(what: str, v, lo_open: bool, hi: float | None = 3600.0, none: str = "") -> float:
    """v as seconds: a real number >= 0 (> 0 with lo_open) and <= hi (None: any finite
    number), else an InputError naming `what`; `none`: what None would have meant."""
    # any real number but a bool: numpy's too (np.int64(2), np.float32(0.5) from a config
    # array were refused as "must be a number of seconds in [0, 3600], got 2")
    ok = not isinstance(v, (bool, np.bool_)) and isinstance(v, numbers.Real) and v == v \
        and (0 < v if lo_open else 0 <= v) and (math.isfinite(v) if hi is None else v <= hi)
    if not ok:
        if hi is None:
            raise InputError(f"{what} must be a finite number of seconds "
                             f"{'> 0' if lo_open else '>= 0'}{none}, got {v!r}")
        rng = f"(0, {hi:g}]" if lo_open else f"[0, {hi:g}]"
        raise InputError(f"{what} must be a number of seconds in {rng}, got {v!r}")
    return float(v)


def connect(name: str, timeout: float = 1.0, stall_timeout: float | None = None) -> Client:
    """Connect to the server called `name`, waiting up to `timeout` s for it to come up
    and for a client slot to be free (one given back by close() is free again within a
    heartbeat); ServeError names the name when nobody serves it, or when every one of its
    serve.max_clients slots is still taken. `stall_timeout` (s): how long the
    server's loop may go without a heartbeat, its process alive, before a call raises
    ServerGone; None takes the server's [serve] stall_timeout_ms (default 2 s). A dead
    server process is reported after dead_after_ms whatever this says."""
    t = _seconds("timeout", timeout, lo_open=False)
    st = None if stall_timeout is None else _seconds("stall_timeout", stall_timeout, lo_open=True)
    return Client(name, t, st)


__all__ = ["connect", "Client", "Result"]
