"""fastpath.connect: a client of a served engine (the ring work is in fastpath._serve.Client).

Answers are fastpath.Result, as an in-process Engine.step returns, with seq and wait_ns (submit
to the worker picking it up) filled in.
"""
from __future__ import annotations

from fastpath._engine import Result
from fastpath._serve import Client


def connect(name: str, timeout: float = 1.0) -> Client:
    """Connect to the server called `name`, waiting up to `timeout` s for it to come up;
    ServeError names the name when nobody serves it."""
    from fastpath.errors import InputError
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 <= timeout <= 3600:
        raise InputError(f"timeout must be a number of seconds in [0, 3600], got {timeout!r}")
    return Client(name, float(timeout))


__all__ = ["connect", "Client", "Result"]
