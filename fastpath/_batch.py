"""What step_batch returns, and what a batch that stopped carries: its BatchResult, and on the
exception that stopped it the rows applied before it (exc.applied) with their answers
(exc.result), and the words for them. Shared by the engine's step_batch, the GPU tick's
(fastpath.gpu._tick) and fastpath.gpu.GpuEngine's; error paths only, nothing per row.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fastpath.errors import InputError


class BatchResult(NamedTuple):
    """step_batch output, one entry per tick: signal, confidence (float32), cached (bool),
    total_ns (int64, in-C time per tick)."""
    signal: np.ndarray
    confidence: np.ndarray
    cached: np.ndarray
    total_ns: np.ndarray


def partial_batch(exc: BaseException, sig, conf, cached, tot, applied: int) -> BaseException:
    """A step_batch error with what the caller needs of the rows applied before it: a row the
    model stage refuses stops the batch after rows 0..applied-1 changed the engine's state
    (windows, cache, counters), and their answers were lost with the arrays (stepping them
    again to get them applies them twice). exc.applied: that count; exc.result: their
    BatchResult (empty when no row was applied)."""
    if sig is None:
        sig = conf = np.empty(0, np.float32)
        cached = np.empty(0, np.bool_)
        tot = np.empty(0, np.int64)
    applied = int(applied)
    exc.applied = applied
    exc.result = BatchResult(sig[:applied].copy(), conf[:applied].copy(),
                             cached[:applied].copy(), tot[:applied].copy())
    return exc


def applied_note(applied: int) -> str:
    """What a stopped batch says of the rows it applied."""
    return f"rows 0..{applied - 1} were applied" if applied else "no row was applied"


def stopped_note(applied: int, n: int) -> str:
    """The note on an exception that stopped a batch from outside (a signal handler's)."""
    return (f"step_batch stopped after {applied} of {n} rows: {applied_note(applied)} "
            f"(their answers: .result, their count: .applied)")


def no_row(exc: BaseException, row_note: bool = False) -> BaseException:
    """A step_batch refusal before any row: exc.applied 0, exc.result empty, as a refusal of
    a row (which also says so in the message: row_note) carries them."""
    if row_note:
        exc = InputError(str(exc) + "; no row was applied")
    return partial_batch(exc, None, None, None, None, 0)


__all__ = ["BatchResult", "partial_batch", "applied_note", "stopped_note", "no_row"]
