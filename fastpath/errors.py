"""Exceptions raised by fastpath; every message says what was wrong and what was expected."""


class FastpathError(Exception):
    """Base class of every error fastpath raises on purpose."""


class InputError(FastpathError, ValueError):
    """A tick, batch or argument was rejected; the engine state is unchanged."""


class ModelError(FastpathError, ValueError):
    """A model file or Model object cannot be used (corrupt, truncated, unsupported op, bad shapes)."""


class ConfigError(FastpathError, ValueError):
    """A configuration key is unknown, of the wrong type or out of range."""


class BackendError(FastpathError, RuntimeError):
    """The requested backend cannot run on this host."""


class EngineBusyError(FastpathError, RuntimeError):
    """The engine is being stepped by another thread (engines are single-writer)."""


class ServeError(FastpathError, RuntimeError):
    """A serving segment cannot be created or reached (a name nobody serves, one already
    served, every client slot taken)."""


class ServerGone(ServeError):
    """The server stopped, died (even kill -9: found by its heartbeat) or stopped beating; the
    request in flight has no answer."""


class RingFull(ServeError):
    """The request ring is full and [serve] on_full = "reject": the tick was not sent."""
