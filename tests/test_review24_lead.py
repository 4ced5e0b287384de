"""Session 24 (lead): the serving loop's reap pass probes one client's pid a heartbeat.

Probing every client's pid each heartbeat (a kill(0) and a read of /proc/<pid>/stat, ~6 us a
client) stopped the loop for ~47 us every millisecond with 8 clients; it now probes one owner
a heartbeat, in turn. These tests hold what that must keep: a dead owner in any slot, behind
live ones, is still found and its slot freed, and no live owner is touched on the way.
"""
import mmap
import os
import struct

import fastpath
from helpers.serving import CLIENTS_OFF, _dead_pid, _entry, raw_zero
from helpers.serving import cfg, deadline, uname


def _slot_of(m, pid, n):
    return [i for i in range(n) if _entry(m, i) == (2, pid)]


def test_a_dead_owner_behind_live_ones_is_reaped_and_the_live_ones_are_not():
    name = uname()
    raw = raw_zero()
    with fastpath.serve(name, None, cfg(max_clients=6)) as srv:
        clients = [fastpath.connect(name) for _ in range(5)]
        for c in clients:
            c.step(raw, 0)
        with open(srv.path, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
            owned = _slot_of(m, os.getpid(), 6)
            assert len(owned) == 5
            victim = owned[3]           # the round-robin must walk past three live owners
            struct.pack_into("<i", m, CLIENTS_OFF + 64 * victim + 4, _dead_pid())
            with deadline(10):
                while srv.stats()["clients_reaped"] == 0:
                    pass
            assert srv.stats()["clients_reaped"] == 1
            for i in owned:
                if i != victim:
                    assert _entry(m, i) == (2, os.getpid())
            # the live clients go on; the slot freed is offered again
            for k, c in enumerate(clients):
                if k != owned.index(victim):
                    assert c.step(raw, 1).seq == 2
            with fastpath.connect(name) as c2:
                assert c2.step(raw, 2).seq == 1
        for k, c in enumerate(clients):
            if k != owned.index(victim):
                c.close()


def test_every_dead_owner_is_found_in_turn():
    """Three owners made to look dead at once: one probe a heartbeat still finds all three."""
    name = uname()
    raw = raw_zero()
    with fastpath.serve(name, None, cfg(max_clients=4)) as srv:
        clients = [fastpath.connect(name) for _ in range(4)]
        for c in clients:
            c.step(raw, 0)
        with open(srv.path, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
            owned = _slot_of(m, os.getpid(), 4)
            dead = _dead_pid()
            for i in owned[1:]:
                struct.pack_into("<i", m, CLIENTS_OFF + 64 * i + 4, dead)
            with deadline(10):
                while srv.stats()["clients_reaped"] < 3:
                    pass
            assert _entry(m, owned[0]) == (2, os.getpid())
            assert clients[0].step(raw, 1).seq == 2
        clients[0].close()
        del clients
        assert srv.stats()["clients_reaped"] >= 3


def test_ctrl_c_in_a_clients_step_says_which_seq_was_sent():
    """A step() interrupted while it waits (Ctrl-C, or a signal handler's exception) has
    sent its tick: the answer comes later through poll(), under the seq the exception now
    carries; the caller was never given it."""
    import signal
    import numpy as np
    from helpers.serving import _wait_stopped, server_process

    class Alarm(Exception):
        pass

    def on_alarm(signum, frame):
        raise Alarm()

    name = uname()
    raw = np.zeros(fastpath.get_default_engine().raw_len, np.float32)
    with server_process(name, stall_timeout_ms=60_000) as p:
        c = fastpath.connect(name, timeout=5)
        assert c.step(raw, 0).seq == 1
        os.kill(p.pid, signal.SIGSTOP)
        old = signal.signal(signal.SIGALRM, on_alarm)
        try:
            _wait_stopped(p.pid)
            signal.setitimer(signal.ITIMER_REAL, 0.05)
            try:
                c.step(raw, 3)
            except Alarm as exc:
                caught = exc
            else:
                raise AssertionError("the step was answered by a stopped server")
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
            os.kill(p.pid, signal.SIGCONT)
        assert caught.seq == 2
        assert any("seq 2" in n and "poll()" in n for n in caught.__notes__)
        got = []
        with deadline(10):
            while not got:
                got = c.poll()
        assert [s for s, _ in got] == [2]
        c.close()


def test_engine_has_a_signature():
    """inspect.signature(fastpath.Engine) raised ValueError (a builtin type's signature comes
    only from its docstring's Argument Clinic line); help() showed none."""
    import inspect
    sig = inspect.signature(fastpath.Engine)
    assert list(sig.parameters) == ["model", "backend", "config"]
    # None: the config's [engine] backend ("cpu" unless it says otherwise; test_review32_docs)
    assert sig.parameters["backend"].default is None
    assert sig.parameters["config"].default is None
    # the docstring a user reads is the prose, not the clinic line
    assert fastpath.Engine.__doc__.startswith("A model, its feature spec and cache")
    e = fastpath.Engine(fastpath.get_default_engine().model, **{"backend": "cpu", "config": None})
    assert e.backend == "cpu"


def test_feature_spec_identity_of_a_bad_length_is_a_model_error():
    """FeatureSpec.identity(None) / ("3") / (-1) raised numpy's TypeError or ValueError."""
    import numpy as np
    import pytest
    from fastpath import FeatureSpec, ModelError
    for n in (None, "3", -1, 0, 2.5, True, 70_000):
        with pytest.raises(ModelError, match=r"identity\(n\): n is the raw tick's length"):
            FeatureSpec.identity(n)
    fs = FeatureSpec.identity(np.int64(5))
    assert fs.raw_len == 5 and type(fs.raw_len) is int
    raws = np.arange(10, dtype=np.float32).reshape(2, 5)
    np.testing.assert_array_equal(fs.apply(raws), raws)
