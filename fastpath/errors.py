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
