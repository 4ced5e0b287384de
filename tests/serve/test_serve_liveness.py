"""Liveness: the worker's heartbeat, and how a client tells a dead or stopped server from a
busy or idle one (ServerGone after its stall timeout, never a hang, never a false alarm).

Timeouts here are generous or sized from the speed this host steps the model at right now:
the claim checked is the ratio (a round of the loop against a whole backlog), not a time."""
import os
import signal
import time

import numpy as np
import pytest

import fastpath
from fastpath import ServerGone
from fastpath._build import DEMO_MODEL
from fastpath._serve import segment_path
from fastpath.model import CachePolicy
from helpers.builders import random_model
from helpers.serving import (
    _stopped, _wait_stopped, cfg, deadline, raw_zero, serve_cli, server_process, uname)


# ------------------------------------------------------------------ heartbeat of an idle worker
def test_idle_sleeping_server_keeps_beating():
    """Regression: with idle = "sleep" (10 ms naps) the loop beat only every ~650 ms, and
    clients called the idle, healthy server "not responding"."""
    name = uname()
    raw = raw_zero()
    conf = cfg(idle="sleep", idle_spin_ns=0, idle_sleep_ns=10_000_000, stall_timeout_ms=300)
    with fastpath.serve(name, None, conf):
        for i in range(8):
            time.sleep(0.2)                 # the server idles (naps) between clients
            with deadline(60), fastpath.connect(name, timeout=2) as c:
                c.step(raw, 0)


# ------------------------------------------------------------------ liveness under load
def _slow_model():
    """An MLP taking about 1 ms a tick (cache off): a backlog of it lasts seconds."""
    return random_model(np.random.default_rng(24), [1024, 2048, 2048, 2],
                        policy=CachePolicy(enabled=False))


def _stall_and_backlog(eng, raw, min_stall=1.0):
    """(stall_timeout, n) sized from how fast this host steps the model now: eight rounds of
    the loop (64 requests each, a heartbeat between two) fit in the stall timeout, and a
    backlog of n requests lasts about two stall timeouts, so a heartbeat that waited for
    the backlog would be called stalled."""
    t0 = time.perf_counter()
    for _ in range(64):
        eng.step(raw, 1)
    round_s = time.perf_counter() - t0
    stall = max(min_stall, 8 * round_s)
    return round(stall, 3), max(1000, min(4000, int(2 * stall / (round_s / 64))))


def test_a_server_working_through_a_backlog_is_not_called_stalled():
    """Regression: the loop read its clock every 64 rounds, so behind a backlog of slow ticks
    the heartbeat went unbeaten and a waiting client got ServerGone from a healthy server."""
    m = _slow_model()
    raw = np.random.default_rng(24).standard_normal(1024).astype(np.float32)
    eng = fastpath.Engine(m, config={"engine": {"n_symbols": 16}})
    want = eng.step(raw, 1).signal
    stall, n = _stall_and_backlog(eng, raw)
    name = uname()
    with fastpath.serve(name, m, cfg(ring_slots=4096)), \
            fastpath.connect(name, timeout=5, stall_timeout=stall) as c, deadline(600):
        for _ in range(n):
            c.submit(raw, 0)
        r = c.step(raw, 1)
        assert r.signal == want
        assert len(c.poll()) == n


def test_a_stopping_server_draining_a_backlog_is_not_called_stalled():
    """Regression: the drain answered the whole backlog in one round with no heartbeat, and a
    client taking its answers got ServerGone before they came.

    All of them come, each as a local engine answers the same tick (drain_timeout_ms, shorter
    than the backlog, bounds only a wait that makes no progress)."""
    m = _slow_model()
    raws = np.random.default_rng(24).standard_normal((4, 1024)).astype(np.float32)
    eng = fastpath.Engine(m, config={"engine": {"n_symbols": 16}})
    want = [eng.step(raws[i], i).signal for i in range(4)]
    stall, n = _stall_and_backlog(eng, raws[0], min_stall=0.5)
    name = uname()
    srv = fastpath.serve(name, m, cfg(ring_slots=4096, drain_timeout_ms=100))
    try:
        with fastpath.connect(name, timeout=5, stall_timeout=stall) as c, deadline(600):
            for k in range(n):
                c.submit(raws[k % 4], k % 4)
            srv._worker.stop()          # ask for the drain without waiting for it
            got = []
            while len(got) < n:
                got += c.poll()
        assert [seq for seq, _ in got] == list(range(1, n + 1))
        assert [r.signal for _, r in got] == [want[k % 4] for k in range(n)]
    finally:
        srv.stop()


def test_step_that_gives_up_on_a_stalled_server_names_the_tick_it_sent(tmp_path):
    """Regression: the ServerGone of a step() said nothing of the tick it had sent."""
    name = uname()
    p = serve_cli(tmp_path, name)
    try:
        assert p.stdout.readline().startswith(f"serving '{name}'")
        c = fastpath.connect(name, timeout=5, stall_timeout=1.0)
        raw = np.zeros(c.raw_len, np.float32)
        c.step(raw, 0)                          # seq 1, answered
        os.kill(p.pid, signal.SIGSTOP)
        with deadline(60):
            while not _stopped(p.pid):          # SIGSTOP takes effect asynchronously
                time.sleep(0.001)
            with pytest.raises(ServerGone, match="not responding") as ei:
                c.step(raw, 0)
        # the tick's seq, as a KeyboardInterrupt there carries it
        assert ei.value.seq == 2
        assert any("sent as seq 2" in n for n in ei.value.__notes__)
        c.close()
    finally:
        os.kill(p.pid, signal.SIGCONT)
        p.terminate()
        p.communicate(timeout=60)


@pytest.mark.parametrize("reap", [True, False], ids=["reaped", "zombie"])
def test_worker_killed_is_server_gone_then_replaced(reap):
    """A killed server (reaped, or a zombie) is ServerGone "dead" at the client's next call;
    its segment, left behind, is named at connect and replaced by the next server."""
    name = uname()
    raw = np.zeros(fastpath.get_default_engine().raw_len, np.float32)
    with server_process(name) as p:
        c = fastpath.connect(name, timeout=5)
        c.step(raw, 0)
        assert c.server_pid == p.pid
        p.kill()
        if reap:
            p.wait(timeout=10)
        # the heartbeat goes stale and the pid is gone (or a zombie): an error, not a hang
        with deadline(30), pytest.raises(ServerGone, match="dead"):
            c.step(raw, 0)
        c.close()
        p.wait(timeout=10)
        # kill -9 left the segment behind: connecting says so, a new server replaces it
        assert os.path.exists(segment_path(name))
        with pytest.raises(ServerGone, match="left from a server"):
            fastpath.connect(name, timeout=0.05)
        with fastpath.serve(name, None, cfg()) as srv:
            assert srv.replaced == p.pid
            with fastpath.connect(name) as c2:
                assert c2.step(raw, 0).signal == fastpath.Engine(DEMO_MODEL, config=cfg()).step(raw, 0).signal


def test_stalled_worker_is_server_gone_after_the_stall_timeout():
    """A server stopped by a signal (alive, not beating): ServerGone after the stall timeout,
    the server's [serve] stall_timeout_ms by default, connect(stall_timeout=) per client."""
    name = uname()
    raw = np.zeros(fastpath.get_default_engine().raw_len, np.float32)
    with server_process(name, stall_timeout_ms=1000) as p:
        c = fastpath.connect(name, timeout=5)
        c2 = fastpath.connect(name, timeout=5, stall_timeout=0.5)
        assert (c.stall_timeout, c2.stall_timeout) == (1.0, 0.5)
        c.step(raw, 0)
        os.kill(p.pid, signal.SIGSTOP)
        try:
            # kill() returns before every thread of the target has stopped (a spinning worker
            # stops at its next kernel entry): wait until /proc says so, or a request sent in
            # between is still answered
            _wait_stopped(p.pid)
            with deadline(30), pytest.raises(ServerGone, match=r"not responding.*over 1 s"):
                c.step(raw, 0)
            with deadline(30), pytest.raises(ServerGone, match=r"not responding.*over 0.5 s"):
                c2.step(raw, 0)
        finally:
            os.kill(p.pid, signal.SIGCONT)
        c.close()
        c2.close()
