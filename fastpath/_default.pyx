# cython: language_level=3
"""The default engine: the one fastpath.step() runs (the embedded demo model on the CPU until
configure() or set_default_engine() puts another in its place).

Design: step() is a builtin function that reads one module global and hands the tick to the
engine's own C-level step (fastpath._engine._engine_step), so the module-level entry point
costs what Engine.step costs. The first call builds the demo engine under a lock.
"""
cimport cython

from fastpath._engine cimport Result, _engine_step, _runs_on_cpu

import os
import threading

import fastpath._build as _build
from fastpath._engine import Engine
from fastpath.errors import InputError

cdef object _default_engine = None
# _default_engine when step() may hand it the tick directly, else None (no engine yet, or a
# GPU engine: step() then goes through Engine.step, which runs the GPU tick and refuses a
# closed engine)
cdef object _default_cpu = None
_default_lock = threading.RLock()


def _default_lock_after_fork():
    # a fork while another thread held the lock (building the default engine) copies it
    # held: the child's first fastpath.step() would wait on it forever
    global _default_lock
    _default_lock = threading.RLock()


os.register_at_fork(after_in_child=_default_lock_after_fork)


cdef _set_default(engine):
    global _default_engine, _default_cpu
    _default_engine = engine
    _default_cpu = engine if engine is not None and _runs_on_cpu(engine) else None


def set_default_engine(engine):
    """Make `engine` the one fastpath.step() uses (None: rebuild the demo engine on next call)."""
    if engine is not None and not isinstance(engine, Engine):
        hint = ("; a GpuEngine's Engine is its .engine"
                if isinstance(getattr(engine, "engine", None), Engine) else "")
        raise InputError(f"expected a fastpath.Engine, got {type(engine).__name__}{hint}")
    _set_default(engine)


def get_default_engine():
    """The engine fastpath.step() uses; the first call (or the first after
    set_default_engine(None)) builds the demo engine."""
    if _default_engine is None:
        # building runs Python code where other threads run: one build at a time, installed
        # only where no engine was set (configure(), set_default_engine()) while it ran
        with _default_lock:
            if _default_engine is None:
                built = _build.default_engine()     # looked up per build: replaceable
                if _default_engine is None:
                    _set_default(built)
    return _default_engine


# binding=False: a builtin function (PyCFunction vectorcall) instead of a cyfunction, a few
# ns less a call on the hottest entry point; the clinic signature line keeps
# inspect.signature working on it
@cython.binding(False)
@cython.embedsignature.format("clinic")
def step(raw, symbol=0, ts_ns=None):
    """fastpath.step(raw, symbol=0, ts_ns=None): one tick through the default engine
    (embedded demo model); the arguments are those of Engine.step."""
    # a reference of this call's own: another thread's configure() / set_default_engine()
    # may drop the global's (often the only) one while _step runs Python code (a symbol's
    # __index__, a raw subclass, an error path)
    e = _default_cpu
    if e is not None:
        return _engine_step(e, raw, symbol, ts_ns)
    return get_default_engine().step(raw, symbol, ts_ns)
