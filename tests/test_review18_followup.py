"""Defects found reviewing today's merged fixes (window fresh sums, slot generations, the
double redo, model loaders): each test fails on the code before its fix.

Waits are bounded by an alarm, so a hang fails the test instead of stalling the suite;
nothing asserts on wall-clock time.
"""
import mmap
import os
import struct
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
import signal

import numpy as np
import pytest

import fastpath
from fastpath import ServeError

BASE_SERVE = {"place": False, "idle": "yield", "idle_spin_ns": 50_000}
# fp_ring.h offsets: the client table (one 64-byte line per client: state u32, pid i32), and
# the client regions after the 16 KiB header, each starting with four 64-byte cursor lines
# (req_head, req_tail, rep_head, rep_tail; the count in the first 8 bytes of each)
CLIENTS_OFF = 8576
HEADER_BYTES = 16384
CL_ACTIVE = 2


@contextmanager
def deadline(seconds):
    def boom(*_):
        raise TimeoutError(f"took longer than {seconds} s")
    old = signal.signal(signal.SIGALRM, boom)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _uname():
    return f"r18f-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait(timeout=30)
    return p.pid


# ------------------------------------------------------------------ a reclaim racing the owner
def test_stores_of_a_reclaimed_clients_call_in_flight_do_not_reach_the_next_owner():
    """The worker takes back the slot of a client whose pid it cannot see (another PID
    namespace) while that client is alive and submitting. A call of that client that passed
    its generation check just before still lands its stores: its request cursor (and the
    request, its reply cursor) went into rings the worker had already cleared and offered,
    and the next owner read that cursor at open: it wrote its requests where the worker never
    looked and spun forever in step(). Here the late stores are made by hand right after
    the slot left ACTIVE; the next owner must still be served."""
    name = _uname()
    raw = np.zeros(fastpath.get_default_engine().raw_len, np.float32)
    # a long heartbeat: the reap passes (one per beat) are far apart, and the late stores
    # below land between the pass that takes the slot back and the next one
    conf = {"engine": {"n_symbols": 4},
            "serve": {**BASE_SERVE, "max_clients": 1, "heartbeat_ms": 300,
                      "dead_after_ms": 5000, "stall_timeout_ms": 20000}}
    with fastpath.serve(name, None, conf) as srv:
        c = fastpath.connect(name)
        c.step(raw, 0)
        with open(srv.path, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
            assert struct.unpack_from("<Ii", m, CLIENTS_OFF) == (CL_ACTIVE, os.getpid())
            struct.pack_into("<i", m, CLIENTS_OFF + 4, _dead_pid())
            with deadline(10):
                while struct.unpack_from("<I", m, CLIENTS_OFF)[0] == CL_ACTIVE:
                    pass
            # the owner's submit and poll, past their checks, finishing now
            struct.pack_into("<Q", m, HEADER_BYTES, 5)           # req_head
            struct.pack_into("<Q", m, HEADER_BYTES + 192, 5)     # rep_tail
            with pytest.raises(ServeError, match="rings back"):
                c.step(raw, 0)
            c.close()
            with deadline(10):
                while True:
                    try:
                        c2 = fastpath.connect(name)
                        break
                    except ServeError as exc:
                        assert "client slots taken" in str(exc), str(exc)
                        time.sleep(0.01)
            with c2, deadline(10):
                assert c2.step(raw, 1).seq == 1
                assert c2.step(raw, 1).seq == 2
