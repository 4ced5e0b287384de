"""Session 32 review of the serving loop: what a client can write into its own slots must not
reach the server's engine state, which every client shares.

- The worker stepped the engine on the request slot itself (fp_step(e, q->raw, ...)), and
  fp_step reads a tick twice: the features, whose pass checks that raw is finite, then the
  window commit, which stores raw's windowed fields into the symbol's rolling window. A client
  that changed its raw values after publishing them (a buggy C producer reusing its slot) had
  a value the check never saw committed: one NaN so committed made the engine refuse every
  later tick of that symbol, every client's, for good ("features overflowed to NaN/Inf").
  The worker now copies each request into its own buffer first and checks and steps the copy.
- Two more fields of the live header were trusted by the Python side (the family of the
  segfault session 31 fixed for the layout fields): the server's state indexed a tuple of
  names without a bounds check (Cython boundscheck off), so one 4-byte store of state = 7
  segfaulted Server.stats() (the server's process: `fastpath serve --stats` polls it), repr()
  of the server and a client's server_stats(); and Client.placement copied placement_len
  bytes from the header, so placement_len = 4e9 segfaulted the client (and 9000, past the
  report's 8192 bytes, raised UnicodeDecodeError or JSONDecodeError). A state out of range now
  reads as "unknown (N)", and a placement length past its field, or a report that is not JSON,
  is a ServeError that says so.
"""
import shutil
import subprocess
import sys

import numpy as np
import pytest

import fastpath
from fastpath import InputError
from helpers.serving import cfg, deadline, uname

# A client that, after publishing each request, flips one windowed raw field of it between
# NaN and 0 until the answer comes; after each tick served, an honest tick of the same symbol
# must still be served. Exit 3: the honest tick was refused (the symbol is poisoned).
C_FLIP_AFTER_PUBLISH = r"""
#include "fp_ring.h"
#include <math.h>
#include <stdlib.h>
static int wait_rep(fp_client *c, fp_rep *rep, volatile float *flip) {
    for (long i = 0;; i++) {
        if (flip) {
            flip[0] = NAN;
            flip[0] = 0.0f;
        }
        if (fp_client_poll(c, rep))
            return 0;
        if ((i & 0xfffff) == 0 && fp_seg_server_check(c->h, fp_ring_now_ns(), 2000000000LL))
            return -1;
    }
}
int main(int argc, char **argv) {
    fp_seg s;
    fp_client c;
    fp_rep rep;
    uint64_t seq;
    static float raw[1 << 12];
    long ok = 0, refused = 0, tries;
    int field;
    if (argc != 4 || fp_seg_attach(argv[1], &s) != FP_RING_OK || fp_client_open(&s, &c) != FP_RING_OK)
        return 2;
    field = atoi(argv[2]);
    tries = atol(argv[3]);
    for (long t = 0; t < tries; t++) {
        if (fp_client_try_submit(&c, raw, 1, -1, &seq) != FP_RING_OK)
            return 4;
        fp_req *r = fp_lay_req(&c.L, c.ctl, seq - 1);
        if (wait_rep(&c, &rep, (volatile float *)&r->raw[field]))
            return 5;
        r->raw[field] = 0.0f;
        if (rep.err) {
            refused++;          /* the worker saw the NaN: refused, nothing applied */
            continue;
        }
        ok++;
        if (fp_client_try_submit(&c, raw, 1, -1, &seq) != FP_RING_OK)
            return 4;
        if (wait_rep(&c, &rep, NULL))
            return 5;
        if (rep.err) {
            printf("poisoned after %ld tries (%ld served, %ld refused): honest tick error %d\n",
                   t + 1, ok, refused, (int)rep.err);
            return 3;
        }
    }
    printf("%ld served, %ld refused\n", ok, refused);
    fp_client_close(&c);
    return 0;
}
"""


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH")
def test_raw_changed_after_publishing_does_not_poison_the_symbol_for_other_clients(tmp_path):
    src, exe = tmp_path / "flip.c", tmp_path / "flip"
    src.write_text(C_FLIP_AFTER_PUBLISH)
    subprocess.run(["cc", "-std=c99", "-O2", "-Wall", "-Wextra", "-Werror",
                    f"-I{fastpath.get_include()}", str(src), "-o", str(exe), "-lm"], check=True,
                   timeout=60)
    name = uname()
    with fastpath.serve(name, None, cfg(ring_slots=4, max_clients=2)) as srv:
        field = int(srv._worker.model.feature_spec.w_idx[0])     # a windowed field: 40
        r = subprocess.run([str(exe), name, str(field), "20000"], capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
        # another client's honest ticks of that symbol are served, as by a fresh engine
        raw = np.zeros(256, np.float32)
        with deadline(60), fastpath.connect(name, timeout=5) as c:
            for _ in range(3):
                try:
                    c.step(raw, 1)
                except InputError as exc:     # pragma: no cover - the defect
                    pytest.fail(f"an honest tick of the attacked symbol was refused: {exc}")


# fp_seg_header offsets (fastpath/include/fp_ring.h): state, placement_len
_OFF_STATE, _OFF_PLACEMENT_LEN = 136, 320

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
    # a process of its own: the old code's segfault would have ended pytest (started outside
    # the checkout, as test_review31_segment explains)
    r = subprocess.run([sys.executable, "-c", _HEADER_STORE, str(field), str(value), what],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, (r.returncode, r.stdout[-2000:], r.stderr[-3000:])
    assert "state='closed'" in r.stdout, r.stdout
    return r.stdout


def test_a_store_of_the_server_state_does_not_crash_stats_or_repr(tmp_path):
    out = _header_store(tmp_path, _OFF_STATE, 7, "state")
    # the client reads the header's state (bounded: "unknown (7)"); since session 33 the
    # server's stats() and repr report its loop's own state, which no store into the
    # header reaches (test_review33_serve)
    assert "client stats unknown (7)" in out, out
    assert out.splitlines()[0] == "stats running", out
    assert "repr Server(name=" in out and "state='running'" in out, out


@pytest.mark.parametrize("value", [4_000_000_000, 9000])
def test_a_store_of_the_placement_length_is_a_clear_error_in_the_client(tmp_path, value):
    out = _header_store(tmp_path, _OFF_PLACEMENT_LEN, value, "placement")
    assert "ServeError" in out and f"placement report length {value}" in out, out


def test_a_live_server_whose_header_names_a_gone_pid_is_not_replaced():
    """A second server under the name judged the first by the pid its header names alone: a
    pid gone from here with a fresh heartbeat read as a server killed a moment ago, so one
    store of server_pid (or a server in another PID namespace) had the live server's file
    removed and a second server run under the name, the first one's clients on rings nobody
    else could reach. The heartbeat of a live loop moves: that server is left alone."""
    import mmap
    import os
    import struct

    from fastpath import ServeError
    p = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                       capture_output=True, text=True, check=True, timeout=60)
    gone = int(p.stdout)        # a pid that has exited (and been reaped)
    name = uname()
    raw = np.zeros(256, np.float32)
    with fastpath.serve(name, None, cfg(ring_slots=4, max_clients=2)) as srv:
        with deadline(60), fastpath.connect(name, timeout=5) as c:
            want = c.step(raw, 1).signal
            with open(srv.path, "r+b") as f:
                m = mmap.mmap(f.fileno(), 0)
                struct.pack_into("<i", m, 56, gone)       # fp_seg_header.server_pid
                m.close()
            with pytest.raises(ServeError, match="already served"):
                fastpath.serve(name, None, cfg(ring_slots=4, max_clients=2))
            assert os.path.exists(srv.path)
            assert c.step(raw, 1).signal == want
            with fastpath.connect(name, timeout=5) as c2:     # new clients reach it still
                assert c2.step(raw, 1).signal == want
