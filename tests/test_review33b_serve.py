"""Review of the session 33 serving change (the loop's own counts; the one-word slot claim and
the take-back of a slot claimed without a pid).

- The loop takes back a slot it has seen CLAIMED without a pid for [serve] stall_timeout_ms,
  as left by a client built against an older fp_ring.h killed between its claim and its pid
  store. Such a client that was only stalled there (SIGSTOP, a debugger) stores its pid and
  then ACTIVE unconditionally when it resumes, over whatever the slot is by then: the next
  client's, ACTIVE. Both clients then wrote one ring pair (each taking the other's replies)
  for as long as both lived, and the stats named the stalled client's pid for the slot. An
  ACTIVE slot's pid changes no other way, so the loop now takes such a slot back within a
  heartbeat: both clients stop (ServeError here) instead of sharing it. (One that resumes
  within a heartbeat of the next client's claim is not seen: the loop first sees the slot
  ACTIVE with the stalled client's pid.)
"""
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import fastpath
from fastpath import ServeError
from helpers.serving import _OFF_CLIENTS, _load, _store
from helpers.serving import cfg, deadline, uname

# fp_client_entry.state values (fastpath/include/fp_ring.h)
_FREE, _CLAIMED, _ACTIVE, _CLOSING = 0, 1, 2, 3


@pytest.fixture
def live_pid():
    """A live process standing for the stalled client (the loop probes owners' pids)."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        yield p.pid
    finally:
        p.kill()
        p.wait()


def _beats(srv, k, timeout=20.0):
    """Return once the server's loop has beaten k more times (its heartbeat age fell k
    times: each beat restarts it)."""
    end = time.monotonic() + timeout
    prev, seen = srv.stats()["heartbeat_age_ns"], 0
    while seen < k:
        assert time.monotonic() < end, f"the loop beat {seen} of {k} times in {timeout} s"
        age = srv.stats()["heartbeat_age_ns"]
        seen += age < prev
        prev = age
        time.sleep(0.0005)


def test_a_stalled_old_claimant_resuming_into_a_reissued_slot_does_not_share_it(live_pid):
    name = uname()
    raw = np.zeros(256, np.float32)
    with fastpath.serve(name, None, cfg(ring_slots=4, max_clients=1,
                                        stall_timeout_ms=200)) as srv:
        path = srv.path
        # an older fp_ring.h's fp_client_open: CAS of the state alone, FREE -> CLAIMED (the
        # pid left 0 by the worker's free), then it stalls before its pid store
        _store(path, _OFF_CLIENTS, "<I", _CLAIMED)
        with deadline(30):
            # taken back after the grace, and given to this client
            c = fastpath.connect(name, timeout=10, stall_timeout=5)
        try:
            assert c.step(raw, 1).seq == 1
            assert _load(path, _OFF_CLIENTS, "<Ii") == (_ACTIVE, os.getpid())
            # the loop has seen this client own the slot (a claimant resuming within the
            # heartbeat after the new client's claim is not told apart from it): two beats
            # after the claim, a reap pass has run since (each beat is followed by one); a
            # fixed sleep was not always enough on a loaded host
            _beats(srv, 2)
            # the old client resumes: its pid store, then ACTIVE, neither conditional
            _store(path, _OFF_CLIENTS + 4, "<i", live_pid)
            _store(path, _OFF_CLIENTS, "<I", _ACTIVE)
            # before: this client went on using the ring pair the other one now wrote too (and
            # the stats named the other's pid for the slot), for as long as both lived
            end = time.monotonic() + 5
            with pytest.raises(ServeError, match="(?s)took this client's rings back.*another "
                               "pid stored into the slot.*older fp_ring.h"):
                while time.monotonic() < end:
                    c.step(raw, 1)
                    time.sleep(0.002)
        finally:
            c.close()
        # and the slot is freed for the next client, not left to the stalled one
        with deadline(30), fastpath.connect(name, timeout=10, stall_timeout=5) as c2:
            assert c2.step(raw, 1).seq == 1
            assert [d["pid"] for d in srv.stats()["clients"]] == [os.getpid()]


def test_an_old_claim_that_completes_keeps_its_slot(live_pid):
    """The check is on a pid that changes while ACTIVE: an older client's claim, its pid
    stored after the state, then ACTIVE, keeps the slot across heartbeats."""
    name = uname()
    raw = np.zeros(256, np.float32)
    with fastpath.serve(name, None, cfg(ring_slots=4, max_clients=2,
                                        stall_timeout_ms=200)) as srv:
        path = srv.path
        with fastpath.connect(name, timeout=5, stall_timeout=5) as c:
            slot = 1 - [i for i in range(2)
                        if _load(path, _OFF_CLIENTS + 64 * i, "<Ii") == (_ACTIVE, os.getpid())][0]
            off = _OFF_CLIENTS + 64 * slot
            _store(path, off, "<I", _CLAIMED)
            _store(path, off + 4, "<i", live_pid)
            _store(path, off, "<I", _ACTIVE)
            for _ in range(100):                 # ~100 heartbeats and more
                c.step(raw, 1)
                time.sleep(0.003)
            assert _load(path, off, "<Ii") == (_ACTIVE, live_pid)
            assert sorted(d["pid"] for d in srv.stats()["clients"]) == sorted(
                [os.getpid(), live_pid])
            _store(path, off, "<I", _CLOSING)    # given back, as its close would
