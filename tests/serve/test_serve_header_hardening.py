"""The shared segment's header against stores from other processes: a client (any process
that maps the segment) can write any byte of it, so the server, its stats and every client
check the layout they use and keep their own counts. Stores that could crash a process run
in a child process of their own."""
import mmap
import os
import struct
import subprocess
import sys
import time

import numpy as np
import pytest

import fastpath
from fastpath import ServeError
from fastpath._serve import segment_path
from fastpath.serving.server import _stats_line
from helpers.serving import CLIENTS_OFF, CL_ACTIVE, _load, _store, cfg, deadline, uname


# fp_seg_header offsets (fastpath/include/fp_ring.h; checked against offsetof)
_OFF_RAW_LEN, _OFF_N_SYMBOLS, _OFF_SLOTS, _OFF_MAX_CLIENTS, _OFF_REQ_SLOT = 16, 20, 24, 28, 32
_OFF_REGION = 40
_OFF_HEARTBEAT, _OFF_STATE = 128, 136
_OFF_SERVED, _OFF_ERRORS, _OFF_IDLE, _OFF_REAPED, _OFF_LOOPS, _OFF_BUSY = (
    192, 200, 208, 216, 224, 232)
_OFF_PLACEMENT_LEN = 320


@pytest.mark.parametrize("field,value", [
    (_OFF_MAX_CLIENTS, 1000),          # past the client table's 64 entries
    (_OFF_SLOTS, 3),                   # not a power of two: the slot masks are wrong
    (_OFF_RAW_LEN, 4096),              # ticks longer than a request slot holds
    (_OFF_REQ_SLOT, 64),
])
def test_a_segment_whose_header_disagrees_with_itself_is_refused(field, value):
    """Regression: a client attaching to a segment whose layout fields disagree (a corrupt or
    hand-made copy of a live one) computed its slot and ring addresses from them."""
    name, fake = uname(), uname()
    with fastpath.serve(name, None, cfg(ring_slots=4, max_clients=2)) as srv:
        with open(srv.path, "rb") as f:
            data = bytearray(f.read())
        struct.pack_into("<I", data, field, value)
        path = segment_path(fake)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, bytes(data))
            os.close(fd)
            with deadline(60), pytest.raises(ServeError, match="not a fastpath serving segment"):
                fastpath.connect(fake, timeout=0.05)
        finally:
            os.unlink(path)


_SCRIPT = r"""
import mmap, os, struct, sys, time
import numpy as np, fastpath
field, fmt, value = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
cfg = {"engine": {"n_symbols": 4}, "serve": {"ring_slots": 4, "max_clients": 2}}
name = f"test-hdr-{os.getpid()}"
srv = fastpath.serve(name, None, cfg)
try:
    c = fastpath.connect(name, timeout=5)
    raw = np.zeros(256, np.float32)
    want = c.step(raw, 1).signal
    with open(srv.path, "r+b") as f:
        m = mmap.mmap(f.fileno(), 0)
        struct.pack_into(fmt, m, field, value)
        m.close()
    got = []
    for i in range(20):
        got.append(c.step(raw, 1 + i % 3).signal)
    st = srv.stats()
    assert st["served"] == 21, st
    assert all(g == got[0] for g in got[::3]), got
    print("stats", len(st["clients"]), st["queue_depth"])
    c.close()
finally:
    srv.stop()
print("stopped", repr(srv))
"""


@pytest.mark.parametrize("field,fmt,value", [
    (_OFF_MAX_CLIENTS, "<I", 1000),       # past the client table and the drain's accepted[64]
    (_OFF_SLOTS, "<I", 1 << 20),          # ring positions masked into far-away slots
    (_OFF_SLOTS, "<I", 3),                # not a power of two
    (_OFF_REQ_SLOT, "<I", 1000000),       # request slots a megabyte apart
    (_OFF_RAW_LEN, "<I", 1 << 20),        # a tick copied far past its slot
    (_OFF_N_SYMBOLS, "<I", 1 << 30),
    (_OFF_REGION, "<Q", 1 << 40),         # client regions a terabyte apart
])
def test_a_store_into_the_live_header_does_not_crash_the_server_or_its_client(field, fmt, value,
                                                                             tmp_path):
    """Regression: a store into a live header's layout field crashed the server or its
    client (each run in a child process, started outside the checkout: `-c` puts the
    working directory first on sys.path, where an uncompiled fastpath/ would hide the
    installed package)."""
    r = subprocess.run([sys.executable, "-c", _SCRIPT, str(field), fmt, str(value)],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, (r.returncode, r.stdout[-2000:], r.stderr[-3000:])
    assert "state='closed'" in r.stdout, r.stdout


def test_a_new_client_of_a_damaged_header_is_refused_while_the_old_one_is_served():
    """The header the server wrote is damaged after start: a client connecting now reads the
    damage and is refused (its attach checks the layout); the one connected before goes on."""


    name = uname()
    with fastpath.serve(name, None, cfg(ring_slots=4, max_clients=2)) as srv:
        c = fastpath.connect(name, timeout=5)
        raw = np.zeros(256, np.float32)
        first = c.step(raw, 1).signal
        with open(srv.path, "r+b") as f:
            m = mmap.mmap(f.fileno(), 0)
            struct.pack_into("<I", m, _OFF_SLOTS, 3)
            m.close()
        with pytest.raises(ServeError, match="not a fastpath serving segment"):
            fastpath.connect(name, timeout=0.05)
        assert c.step(raw, 1).signal == first
        c.close()


_HEADER_STORE = r"""
import mmap, os, struct, sys
import numpy as np, fastpath
from fastpath import ServeError
field, value, what = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
cfg = {"engine": {"n_symbols": 4}, "serve": {"place": False, "ring_slots": 4, "max_clients": 2}}
srv = fastpath.serve(f"test-hdr32-{os.getpid()}", None, cfg)
try:
    c = fastpath.connect(srv.name, timeout=5)
    raw = np.zeros(256, np.float32)
    want = c.step(raw, 1).signal
    with open(srv.path, "r+b") as f:
        m = mmap.mmap(f.fileno(), 0)
        struct.pack_into("<I", m, field, value)
        m.close()
    if what == "state":
        print("stats", srv.stats()["state"])
        print("client stats", c.server_stats()["state"])
        print("repr", repr(srv))
    else:
        try:
            print("placement", c.placement)
        except ServeError as exc:
            print("ServeError", exc)
        # the client goes on (a state >= stopping makes clients refuse to submit: ServerGone)
        assert c.step(raw, 1).signal == want
    c.close()
finally:
    srv.stop()
print("stopped", repr(srv))
"""


def _header_store(tmp_path, field, value, what):
    # a process of its own, started outside the checkout (see the live-header test above)
    r = subprocess.run([sys.executable, "-c", _HEADER_STORE, str(field), str(value), what],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, (r.returncode, r.stdout[-2000:], r.stderr[-3000:])
    assert "state='closed'" in r.stdout, r.stdout
    return r.stdout


def test_a_store_of_the_server_state_does_not_crash_stats_or_repr(tmp_path):
    """Regression: an unknown state word in the header crashed stats() and repr()."""
    out = _header_store(tmp_path, _OFF_STATE, 7, "state")
    # the client reads the header's state (bounded: "unknown (7)"); the server's stats() and
    # repr report its loop's own state, which no store into the header reaches
    assert "client stats unknown (7)" in out, out
    assert out.splitlines()[0] == "stats running", out
    assert "repr Server(name=" in out and "state='running'" in out, out


@pytest.mark.parametrize("value", [4_000_000_000, 9000])
def test_a_store_of_the_placement_length_is_a_clear_error_in_the_client(tmp_path, value):
    """Regression: a placement report length past the header was read as one."""
    out = _header_store(tmp_path, _OFF_PLACEMENT_LEN, value, "placement")
    assert "ServeError" in out and f"placement report length {value}" in out, out


# fp_seg_header: slots (u32 at 24), client_region_bytes and total_bytes (u64 at 40, 48); the
# server's Worker is wrapped so that the store lands between the header's making and run()
_DAMAGED = r"""
import mmap, struct, sys
import fastpath
import fastpath._serve as S
from fastpath import ServeError
Real = S.Worker
def damaged(*a):
    w = Real(*a)
    slots, raw_len, max_clients = 1 << 20, 256, 2
    region = 256 + slots * (((64 + 4 * raw_len + 63) & ~63) + 64)
    with open(w.path, "r+b") as f:
        m = mmap.mmap(f.fileno(), 0)
        struct.pack_into("<I", m, 24, slots)
        struct.pack_into("<QQ", m, 40, region, 16384 + max_clients * region)
        m.close()
    return w
S.Worker = damaged
cfg = {"engine": {"n_symbols": 4}, "serve": {"place": False, "ring_slots": 4, "max_clients": 2}}
try:
    srv = fastpath.serve(sys.argv[1], None, cfg)
except ServeError as exc:
    print("refused:", exc)
else:
    srv.stop()
    print("stopped", repr(srv))
print("state stopped")
"""


def test_run_checks_the_layout_against_the_mapped_size(tmp_path):
    """Regression: slots, client_region_bytes and total_bytes overwritten together (consistent
    with each other) before the loop started sent the worker past its mapping (SIGSEGV).
    It now serves nothing and stops."""
    r = subprocess.run([sys.executable, "-c", _DAMAGED, uname()], capture_output=True,
                       text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, (r.returncode, r.stdout[-2000:], r.stderr[-3000:])
    assert "state stopped" in r.stdout, r.stdout


def _slot_of(path, pid, max_clients):
    for i in range(max_clients):
        st, p = _load(path, CLIENTS_OFF + 64 * i, "<Ii")
        if st == CL_ACTIVE and p == pid:
            return i
    raise AssertionError(f"no active slot of pid {pid}")


def test_a_client_cannot_forge_the_servers_own_stats():
    """Regression: the server's own counts, state and heartbeat were read from the header,
    where any client could store 10^12 served or state "stopped"."""
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
            _store(path, CLIENTS_OFF + 64 * slot + 16, "<Q", 10**12)
            st = srv.stats()
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
            with deadline(60):
                while c.server_stats()["served"] != 5:
                    time.sleep(0.002)
            cs = c.server_stats()
            assert cs["errors"] == 0 and cs["clients_reaped"] == 0, cs
            assert [d["served"] for d in cs["clients"]] == [5], cs
            # the state and the heartbeat the server reports are its loop's, not the header's
            _store(path, _OFF_HEARTBEAT, "<QI", 1, 3)           # heartbeat 1 ns, state stopped
            st = srv.stats()
            assert st["state"] == "running", st                 # not the "stopped" stored
            assert st["heartbeat_age_ns"] < 60 * 10**9, st      # not 1 ns (the machine's uptime)
            assert "state='running'" in repr(srv)
            _store(path, _OFF_STATE, "<I", 1)                   # let the client close cleanly
        finally:
            c.close()
    assert srv.final_stats["served"] == 5, srv.final_stats
