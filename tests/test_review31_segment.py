"""A store into a live server's segment header (any process that maps the segment can make
one: a stray write of a buggy C producer) must not move the server's or a connected client's
loads and stores out of the segment. The worker, the stats and the client functions read the
layout fields from the live header on every access: max_clients = 1000 overflowed the
worker's stack when it stopped (accepted[64]), slots = 2^20 and req_slot_bytes = 10^6 sent
the worker's and the client's stores past the mapping. Each ended the server's process with a
segfault (exit -11), taking every other client's answers with it. Now each party addresses
the segment by the layout it checked (fp_ring.h fp_seg_layout)."""
import subprocess
import sys

import pytest

# fp_seg_header offsets (fastpath/include/fp_ring.h)
_OFF_RAW_LEN, _OFF_N_SYMBOLS, _OFF_SLOTS, _OFF_MAX_CLIENTS, _OFF_REQ_SLOT = 16, 20, 24, 28, 32
_OFF_REGION = 40

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
    # a process of its own (the old code's segfault would have ended pytest), started outside
    # the checkout: `-c` puts the working directory first on sys.path, and the checkout's
    # uncompiled fastpath/ then hid the installed package
    r = subprocess.run([sys.executable, "-c", _SCRIPT, str(field), fmt, str(value)],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, (r.returncode, r.stdout[-2000:], r.stderr[-3000:])
    assert "state='closed'" in r.stdout, r.stdout


def test_a_new_client_of_a_damaged_header_is_refused_while_the_old_one_is_served():
    """The header the server wrote is damaged after start: a client connecting now reads the
    damage and is refused (its attach checks the layout); the one connected before goes on."""
    import mmap
    import struct

    import numpy as np

    import fastpath
    from fastpath import ServeError
    from helpers.serving import cfg, uname
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
