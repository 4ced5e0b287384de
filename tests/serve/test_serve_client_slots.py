"""Client slots: connect, the slot table in the segment header, and how the loop takes a slot
back from a client that died, never finished its claim, or shares it with a stalled one.

The tests store into the live header through a second mapping (as another process would) at
the offsets of fastpath/include/fp_ring.h; every wait is for an observable event (a reap
count, a heartbeat, a state word) under a deadline."""
import mmap
import os
import signal
import struct
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import fastpath
from fastpath import InputError, ServeError
from fastpath._build import DEMO_MODEL
from fastpath.serving import client as client_mod
from helpers.serving import (
    CLIENTS_OFF, CL_ACTIVE, CL_CLAIMED, CL_CLOSING, PKG_ROOT, _dead_pid, _entry, _load, _store,
    cfg, deadline, raw_zero, store_entry, ticks, uname, wait_beats, wait_loop_time)

# the client regions follow the 16 KiB header, each starting with four 64-byte cursor lines
# (req_head, req_tail, rep_head, rep_tail; the count in the first 8 bytes of each)
HEADER_BYTES = 16384


@pytest.fixture
def live_pid():
    """A live process standing for another client (the loop probes owners' pids)."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        yield p.pid
    finally:
        p.kill()
        p.wait()


def _slots_of(m, pid, n):
    return [i for i in range(n) if _entry(m, i) == (CL_ACTIVE, pid)]


def _have_own_slot_reaped(srv, m):
    """Slot 0 (this process's, ACTIVE: the offset is right) made to look like a process the
    server cannot find, then until the worker has taken it back."""
    assert _entry(m, 0) == (CL_ACTIVE, os.getpid())
    struct.pack_into("<i", m, CLIENTS_OFF + 4, _dead_pid())
    with deadline(30):
        while srv.stats()["clients_reaped"] == 0:
            time.sleep(0.001)


# ------------------------------------------------------------------ connect
def test_connect_to_an_unknown_name_is_a_clear_error():
    name = uname()
    with deadline(60), pytest.raises(ServeError, match=f"no server is serving '{name}'"):
        fastpath.connect(name, timeout=0.05)
    with pytest.raises(InputError, match="server name"):
        fastpath.connect("a/b")


def test_all_slots_taken_says_how_many():
    """Regression: the message read "all its  client slots taken" (count read after unmap)."""
    name = uname()
    with fastpath.serve(name, None, cfg(max_clients=2)), fastpath.connect(name), \
            fastpath.connect(name):
        with deadline(60), pytest.raises(ServeError, match="all its 2 client slots taken"):
            fastpath.connect(name, timeout=0.05)


def test_reconnect_right_after_close_waits_for_the_slot_to_be_freed():
    """Regression: with max_clients = 1, connect right after close was refused instead of
    waiting (within its timeout) for the next heartbeat to free the slot."""
    name = uname()
    raw = raw_zero()
    with fastpath.serve(name, None, cfg(max_clients=1)):
        for i in range(4):
            with deadline(30), fastpath.connect(name, timeout=10) as c:
                assert c.step(raw, 0, 100 + i).seq == 1


def _interrupt_once_connect_waits(main: int, box: dict):
    """Send SIGINT to this (non-main) thread once the main thread is inside Client() under
    connect(): the signal's C handler runs here, and the main thread's sleep goes on
    uninterrupted, so only a wait that checks for signals itself runs the Python handler."""
    end = time.monotonic() + 60
    while time.monotonic() < end:
        f = sys._current_frames().get(main)
        # connect's frame on top, its line the Client() call: the GIL is free only while
        # that call sleeps between two looks at the slot table
        if f is not None and f.f_code is client_mod.connect.__code__:
            box["sent"] = True
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)
            return
        time.sleep(0.001)


def test_a_signal_handler_runs_while_connect_waits_for_a_client_slot():
    """Regression: connect() waiting for a free client slot ran a signal's handler (Ctrl-C) only
    once its timeout had passed."""
    name = uname()
    box = {}

    def handler(signum, frame):
        # gives the one slot back: connect gets it if this runs while connect waits, and
        # raises "all its 1 client slots taken" if it runs only at connect's timeout
        box["held"].close()

    old = signal.signal(signal.SIGINT, handler)
    try:
        with fastpath.serve(name, None, cfg(max_clients=1)):
            box["held"] = fastpath.connect(name, timeout=10)
            t = threading.Thread(target=_interrupt_once_connect_waits,
                                 args=(threading.get_ident(), box), daemon=True)
            t.start()
            with deadline(120), fastpath.connect(name, timeout=30) as c:
                assert c.step(raw_zero(), 0).seq == 1
            t.join(60)
    finally:
        signal.signal(signal.SIGINT, old)
    assert box.get("sent")


# ------------------------------------------------------------------ dead owners reaped
KILLED_CLIENT = textwrap.dedent("""
    import sys, numpy as np, fastpath
    c = fastpath.connect(sys.argv[1], timeout=5)
    raw = np.zeros(c.raw_len, np.float32)
    for i in range(3):                      # mid-stream: answers left untaken in its ring
        c.submit(raw, 0)
    print("submitted", flush=True)
    sys.stdin.read()
""")


def test_killed_client_frees_its_slot_for_a_clean_next_owner():
    """max_clients = 1: the next client connects once the worker has reaped the killed one,
    and what the dead client left in the rings reads as neither a request nor an answer."""
    name = uname()
    raw = np.zeros(fastpath.get_default_engine().raw_len, np.float32)
    env = dict(os.environ, PYTHONPATH=PKG_ROOT)
    with fastpath.serve(name, None, cfg(max_clients=1)) as srv:
        p = subprocess.Popen([sys.executable, "-c", KILLED_CLIENT, name], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, env=env, text=True, cwd=PKG_ROOT)
        assert p.stdout.readline().strip() == "submitted"
        with pytest.raises(ServeError, match="client slots taken"):
            fastpath.connect(name, timeout=0)
        p.kill()
        p.wait(timeout=10)
        with deadline(30):
            while srv.stats()["clients_reaped"] == 0:
                time.sleep(0.001)
        tick = ticks(1, raw.size, seed=5)[0]
        with fastpath.connect(name, timeout=10) as c:
            r = c.step(tick, 1, 7000)
            assert r.seq == 1
            st = srv.stats()       # before close(): a closed client is reaped (and counted) too
        ref = fastpath.Engine(DEMO_MODEL, config=cfg()).step(tick, 1, 7000)
        assert (r.signal, r.confidence) == (ref.signal, ref.confidence)
        assert st["clients_reaped"] == 1
        assert st["served"] == 3 + 1


def test_a_dead_owner_behind_live_ones_is_reaped_and_the_live_ones_are_not():
    """The one-probe-a-heartbeat round robin walks past live owners to the dead one."""
    name = uname()
    raw = raw_zero()
    with fastpath.serve(name, None, cfg(max_clients=6)) as srv:
        clients = [fastpath.connect(name) for _ in range(5)]
        for c in clients:
            c.step(raw, 0)
        with open(srv.path, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
            owned = _slots_of(m, os.getpid(), 6)
            assert len(owned) == 5
            victim = owned[3]           # the round-robin must walk past three live owners
            struct.pack_into("<i", m, CLIENTS_OFF + 64 * victim + 4, _dead_pid())
            with deadline(30):
                while srv.stats()["clients_reaped"] == 0:
                    time.sleep(0.001)
            assert srv.stats()["clients_reaped"] == 1
            for i in owned:
                if i != victim:
                    assert _entry(m, i) == (CL_ACTIVE, os.getpid())
            # the live clients go on; the slot freed is offered again
            for k, c in enumerate(clients):
                if k != owned.index(victim):
                    assert c.step(raw, 1).seq == 2
            with fastpath.connect(name, timeout=10) as c2:
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
            owned = _slots_of(m, os.getpid(), 4)
            dead = _dead_pid()
            for i in owned[1:]:
                struct.pack_into("<i", m, CLIENTS_OFF + 64 * i + 4, dead)
            with deadline(30):
                while srv.stats()["clients_reaped"] < 3:
                    time.sleep(0.001)
            assert _entry(m, owned[0]) == (CL_ACTIVE, os.getpid())
            assert clients[0].step(raw, 1).seq == 2
        clients[0].close()
        del clients
        assert srv.stats()["clients_reaped"] >= 3


# ------------------------------------------------------------------ a client whose slot was taken back
def test_client_whose_rings_were_taken_back_gets_an_error_not_a_hang():
    """Regression: a client reaped while alive (its pid invisible: another PID namespace) spun
    forever in step(), and its close() wrote CLOSING into the next client's slot."""
    name = uname()
    raw = raw_zero()
    with fastpath.serve(name, None, cfg(max_clients=1)) as srv:
        c = fastpath.connect(name)
        c.step(raw, 0)
        with open(srv.path, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
            _have_own_slot_reaped(srv, m)
            with deadline(30), pytest.raises(ServeError, match="took this client's rings back"):
                c.step(raw, 0)
            with pytest.raises(ServeError, match="closed"):
                c.poll()
            # the slot is free again: the next client gets it
            with fastpath.connect(name, timeout=10) as c2, deadline(30):
                c.close()                                  # must not end c2's use of the slot
                del c
                r = c2.step(raw, 1)
                assert r.seq == 1
                wait_beats(srv, 3)                         # reap passes have looked at it
                assert _entry(m, 0)[0] == CL_ACTIVE
                assert c2.step(raw, 1).seq == 2


def test_client_whose_rings_were_taken_back_errors_in_a_spinning_submit():
    """on_full = "spin": a client submitting into rings the worker no longer reads fills its
    ring and spins; it ends with the error too."""
    name = uname()
    raw = raw_zero()
    with fastpath.serve(name, None, cfg(ring_slots=4)) as srv:
        c = fastpath.connect(name)
        c.step(raw, 0)
        with open(srv.path, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
            _have_own_slot_reaped(srv, m)
            with deadline(30), pytest.raises(ServeError, match="rings back"):
                for _ in range(16):
                    c.submit(raw, 0)
        c.close()


def test_stores_of_a_reclaimed_clients_call_in_flight_do_not_reach_the_next_owner():
    """Regression: cursor stores of a reclaimed client's call in flight landed in rings
    already offered again, and the next owner spun forever in step().

    The slot is taken back from a live client (its pid made to look dead); its late stores
    are made by hand right after the slot left ACTIVE; the next owner must still be served."""
    name = uname()
    raw = np.zeros(fastpath.get_default_engine().raw_len, np.float32)
    # a long heartbeat: the reap passes (one per beat) are far apart, and the late stores
    # below land between the pass that takes the slot back and the next one
    conf = cfg(engine={"n_symbols": 4}, max_clients=1, heartbeat_ms=1000, dead_after_ms=5000,
               stall_timeout_ms=20000)
    with fastpath.serve(name, None, conf) as srv:
        c = fastpath.connect(name)
        c.step(raw, 0)
        with open(srv.path, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
            assert _entry(m, 0) == (CL_ACTIVE, os.getpid())
            struct.pack_into("<i", m, CLIENTS_OFF + 4, _dead_pid())
            end = time.monotonic() + 30
            while _entry(m, 0)[0] == CL_ACTIVE:
                assert time.monotonic() < end, "the worker never took the slot back"
            # the owner's submit and poll, past their checks, finishing now
            struct.pack_into("<Q", m, HEADER_BYTES, 5)           # req_head
            struct.pack_into("<Q", m, HEADER_BYTES + 192, 5)     # rep_tail
            with pytest.raises(ServeError, match="rings back"):
                c.step(raw, 0)
            c.close()
            with deadline(30):
                while True:
                    try:
                        c2 = fastpath.connect(name)
                        break
                    except ServeError as exc:
                        assert "client slots taken" in str(exc), str(exc)
                        time.sleep(0.01)
            with c2, deadline(30):
                assert c2.step(raw, 1).seq == 1
                assert c2.step(raw, 1).seq == 2


# ------------------------------------------------------------------ claims left unfinished
def test_a_slot_claimed_without_a_pid_is_taken_back():
    """Regression: a client killed between its claim and its pid store (older fp_ring.h)
    left the slot CLAIMED with pid 0 for good; with max_clients = 1 nobody could connect."""
    name = uname()
    raw = np.zeros(256, np.float32)
    with fastpath.serve(name, None, cfg(ring_slots=4, max_clients=1,
                                        stall_timeout_ms=300)) as srv:
        store_entry(srv.path, 0, CL_CLAIMED, 0)
        # the client's own stall_timeout is generous: a loaded host's late heartbeat is not
        # what this test is about
        with deadline(30), fastpath.connect(name, timeout=10, stall_timeout=5) as c:
            assert c.step(raw, 1).seq == 1
            assert _load(srv.path, CLIENTS_OFF, "<Ii") == (CL_ACTIVE, os.getpid())
        st = srv.stats()
        assert st["clients_reaped"] >= 1, st


def test_a_slot_claimed_by_a_live_pid_is_not_taken():
    """The grace is for claims without a pid: a claimant whose pid lives keeps its slot
    however long it takes to finish (the reaper probes its pid as an owner's)."""
    name = uname()
    with fastpath.serve(name, None, cfg(ring_slots=4, max_clients=1,
                                        stall_timeout_ms=200)) as srv:
        store_entry(srv.path, 0, CL_CLAIMED, os.getpid())
        wait_loop_time(srv, 0.6)                      # three times the grace, by the loop
        with pytest.raises(ServeError, match="client slots taken"):
            fastpath.connect(name, timeout=0.2, stall_timeout=5)
        assert _load(srv.path, CLIENTS_OFF, "<Ii") == (CL_CLAIMED, os.getpid())
        _store(srv.path, CLIENTS_OFF, "<I", CL_CLOSING)   # freed for the stop


def test_a_stalled_old_claimant_resuming_into_a_reissued_slot_does_not_share_it(live_pid):
    """Regression: an older-fp_ring.h claimant stalled past the grace, resuming with its pid
    store and ACTIVE over the next client's slot, shared that client's ring pair."""
    name = uname()
    raw = np.zeros(256, np.float32)
    with fastpath.serve(name, None, cfg(ring_slots=4, max_clients=1,
                                        stall_timeout_ms=200)) as srv:
        path = srv.path
        # an older fp_ring.h's fp_client_open: CAS of the state alone, FREE -> CLAIMED (the
        # pid left 0 by the worker's free), then it stalls before its pid store
        _store(path, CLIENTS_OFF, "<I", CL_CLAIMED)
        with deadline(30):
            # taken back after the grace, and given to this client
            c = fastpath.connect(name, timeout=10, stall_timeout=5)
        try:
            assert c.step(raw, 1).seq == 1
            assert _load(path, CLIENTS_OFF, "<Ii") == (CL_ACTIVE, os.getpid())
            # a reap pass has seen this client own the slot (a claimant resuming before that
            # is not told apart from it)
            wait_beats(srv, 2)
            # the old client resumes: its pid store, then ACTIVE over the slot already ACTIVE.
            # One 8-byte store: as two stores, a reap pass between them retired the slot and
            # the ACTIVE store then gave it to the stalled claimant alone (not shared, but not
            # freed for the next client either, which this test checks below)
            store_entry(path, 0, CL_ACTIVE, live_pid)
            with deadline(30), pytest.raises(
                    ServeError, match="(?s)took this client's rings back.*another "
                    "pid stored into the slot.*older fp_ring.h"):
                while True:
                    c.step(raw, 1)
                    time.sleep(0.002)
        finally:
            c.close()
        # and the slot is freed for the next client, not left to the stalled one
        with deadline(30), fastpath.connect(name, timeout=10, stall_timeout=5) as c2:
            assert c2.step(raw, 1).seq == 1
            assert [d["pid"] for d in srv.stats()["clients"]] == [os.getpid()]


def test_an_old_claim_that_completes_keeps_its_slot(live_pid):
    """The take-back is for a pid that changes while ACTIVE: an older client's claim (state,
    then its pid, then ACTIVE) keeps the slot across heartbeats."""
    name = uname()
    raw = np.zeros(256, np.float32)
    with fastpath.serve(name, None, cfg(ring_slots=4, max_clients=2,
                                        stall_timeout_ms=200)) as srv:
        path = srv.path
        with fastpath.connect(name, timeout=5, stall_timeout=5) as c:
            slot = 1 - [i for i in range(2)
                        if _load(path, CLIENTS_OFF + 64 * i, "<Ii") == (CL_ACTIVE, os.getpid())][0]
            off = CLIENTS_OFF + 64 * slot
            _store(path, off, "<I", CL_CLAIMED)
            _store(path, off + 4, "<i", live_pid)
            _store(path, off, "<I", CL_ACTIVE)
            wait_beats(srv, 100, each=lambda: c.step(raw, 1))
            assert _load(path, off, "<Ii") == (CL_ACTIVE, live_pid)
            assert sorted(d["pid"] for d in srv.stats()["clients"]) == sorted(
                [os.getpid(), live_pid])
            _store(path, off, "<I", CL_CLOSING)    # given back, as its close would
