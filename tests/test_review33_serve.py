"""Session 33 review of the serving loop: the server's own figures and its client slots must
not depend on what another process stores into the shared segment.

- The worker counted served, errors, busy_ns, idle_polls, clients_reaped and each client's
  served in the segment header, and Server.stats() (repr, `fastpath serve --stats`) read them
  there: any process that maps the segment (every client) could set the server's own served
  to 10^12, or its state to "stopped". The loop now counts in the server process's memory
  (fp_worker_stats, fp_worker_opts.stats) and Server.stats() reads that; the header keeps a
  copy published about once a heartbeat for client.server_stats(), documented as forgeable.
  rejected_full stays where only the clients can count it (in the segment), and says so.
- A client claimed a slot (FREE -> CLAIMED) and stored its pid in a second store: killed in
  between, it left the slot CLAIMED with pid 0, which the reaper (it probes pids) never took
  back, so the slot was lost for good (with max_clients = 1, every later connect refused).
  The claim now stores state and pid in one compare-and-swap of their 8-byte word, and the
  loop takes back a slot claimed without a pid once it has been so for the server's
  stall_timeout_ms (a client built against an older fp_ring.h, or a forged store).
"""
import mmap
import os
import struct
import time

import numpy as np
import pytest

import fastpath
from fastpath import ServeError
from fastpath._serve import Client, Worker
from fastpath.serving.server import Server, _stats_line
from helpers.serving import cfg, deadline, uname
from helpers.serving import _ENTRY, _OFF_CLIENTS, _load, _store  # noqa: F401

# fp_seg_header offsets (fastpath/include/fp_ring.h; checked against offsetof)
_OFF_STATE, _OFF_HEARTBEAT = 136, 128
_OFF_SERVED, _OFF_ERRORS, _OFF_IDLE, _OFF_REAPED, _OFF_LOOPS, _OFF_BUSY = (
    192, 200, 208, 216, 224, 232)
_FP_CL_CLAIMED, _FP_CL_ACTIVE = 1, 2


def _slot_of(path, pid, max_clients):
    for i in range(max_clients):
        st, p = _load(path, _OFF_CLIENTS + i * _ENTRY, "<Ii")
        if st == _FP_CL_ACTIVE and p == pid:
            return i
    raise AssertionError(f"no active slot of pid {pid}")


def test_a_client_cannot_forge_the_servers_own_stats():
    name = uname()
    raw = np.zeros(256, np.float32)
    with fastpath.serve(name, None, cfg(ring_slots=8, max_clients=2)) as srv:
        c = fastpath.connect(name, timeout=5)
        try:
            for i in range(5):
                c.step(raw, 1 + i % 3)
            path = srv.path
            assert _load(path, _OFF_STATE, "<I") == (1,)       # the layout as this test knows it
            slot = _slot_of(path, os.getpid(), 2)
            # what a client (any process mapping the segment) can store into the header
            _store(path, _OFF_SERVED, "<QQQQQQ", 10**12, 10**9, 10**9, 10**9, 10**9, 10**15)
            _store(path, _OFF_CLIENTS + slot * _ENTRY + 16, "<Q", 10**12)
            st = srv.stats()
            # before: served 10**12, errors 10**9, clients_reaped 10**9, busy 10**15
            assert st["served"] == 5, st
            assert st["errors"] == 0, st
            assert st["clients_reaped"] == 0, st
            assert 0 < st["busy_ns"] < 10**12, st
            assert st["idle_polls"] < 10**9, st
            assert [(d["slot"], d["served"]) for d in st["clients"]] == [(slot, 5)], st
            # `fastpath serve --stats` reads the same: 5 served in its second, not 10^12
            line, _ = _stats_line(srv, {}, 1.0)
            assert line.split()[0] == "5", line
            # the clients' copy: published again by the loop within a heartbeat or so
            with deadline(10):
                while c.server_stats()["served"] != 5:
                    time.sleep(0.002)
            cs = c.server_stats()
            assert cs["errors"] == 0 and cs["clients_reaped"] == 0, cs
            assert [d["served"] for d in cs["clients"]] == [5], cs
            # the state and the heartbeat the server reports are its loop's, not the header's
            _store(path, _OFF_HEARTBEAT, "<QI", 1, 3)           # heartbeat 1 ns, state stopped
            st = srv.stats()
            assert st["state"] == "running", st                 # before: "stopped"
            assert st["heartbeat_age_ns"] < 60 * 10**9, st      # before: the machine's uptime
            assert "state='running'" in repr(srv)
            _store(path, _OFF_STATE, "<I", 1)                   # let the client close cleanly
        finally:
            c.close()
    assert srv.final_stats["served"] == 5, srv.final_stats


def test_rejected_full_is_said_to_be_counted_by_the_clients():
    """The one count only a client can make stays in the segment, and the docs say so."""
    for doc in (Server.stats.__doc__, Worker.stats.__doc__):
        assert "rejected_full" in doc and "counted by the clients" in doc, doc
    assert "forgeable" in Client.server_stats.__doc__


def test_a_slot_claimed_without_a_pid_is_taken_back():
    """A client killed between its claim and its pid store (as an fp_ring.h before the
    one-word claim did them) left the slot CLAIMED with pid 0: never reaped, and with
    max_clients = 1 no client could ever connect again."""
    name = uname()
    raw = np.zeros(256, np.float32)
    with fastpath.serve(name, None, cfg(ring_slots=4, max_clients=1,
                                        stall_timeout_ms=300)) as srv:
        _store(srv.path, _OFF_CLIENTS, "<Ii", _FP_CL_CLAIMED, 0)
        # before: ServeError "all its 1 client slots taken" after the 10 s. The client's own
        # stall_timeout: a loaded host's late heartbeat is not what this test is about
        with fastpath.connect(name, timeout=10, stall_timeout=5) as c:
            assert c.step(raw, 1).seq == 1
            assert _load(srv.path, _OFF_CLIENTS, "<Ii") == (_FP_CL_ACTIVE, os.getpid())
        st = srv.stats()
        assert st["clients_reaped"] >= 1, st


def test_a_slot_claimed_by_a_live_pid_is_not_taken():
    """The grace is for claims without a pid: a claimant whose pid lives keeps its slot
    however long it takes to finish (the reaper probes its pid as an owner's)."""
    name = uname()
    with fastpath.serve(name, None, cfg(ring_slots=4, max_clients=1,
                                        stall_timeout_ms=200)) as srv:
        _store(srv.path, _OFF_CLIENTS, "<Ii", _FP_CL_CLAIMED, os.getpid())
        time.sleep(0.6)                               # three times the grace
        with pytest.raises(ServeError, match="client slots taken"):
            fastpath.connect(name, timeout=0.2, stall_timeout=5)
        assert _load(srv.path, _OFF_CLIENTS, "<Ii") == (_FP_CL_CLAIMED, os.getpid())
        _store(srv.path, _OFF_CLIENTS, "<I", 3)       # CLOSING: freed for the stop


def test_a_slots_served_count_starts_again_with_its_next_client():
    """Each client's served is counted by the loop per slot, from 0 again when the slot is
    freed (the client's own reset at its claim now only touches the published copy)."""
    name = uname()
    raw = np.zeros(256, np.float32)
    with fastpath.serve(name, None, cfg(ring_slots=4, max_clients=1)) as srv:
        with fastpath.connect(name, timeout=5) as c:
            for _ in range(3):
                c.step(raw, 1)
            assert [d["served"] for d in srv.stats()["clients"]] == [3]
        with fastpath.connect(name, timeout=5) as c:
            for _ in range(2):
                c.step(raw, 1)
            st = srv.stats()
            assert [d["served"] for d in st["clients"]] == [2], st
            assert st["served"] == 5, st
