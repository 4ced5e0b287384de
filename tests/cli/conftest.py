"""Fixtures for the command line's tests."""
import pytest


@pytest.fixture
def served(monkeypatch):
    """`fastpath serve` without a server: run_foreground records the model it was given."""
    import fastpath.serving.server as server
    got = {}

    def fake(name, model=None, config=None, stats=False, out=None, tick_sizes=None):
        got["model"] = model
        got["tick_sizes"] = tick_sizes
        return 0
    monkeypatch.setattr(server, "run_foreground", fake)
    return got
