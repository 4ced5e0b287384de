"""Session 32 review of the serving loop, second pass: what a client (or a buggy C producer
using fp_ring.h) writes into shared memory must not hold the server, send it past its mapping,
crash the client itself, or make the figures say what did not happen.

- fp_client_* after fp_client_close dereferenced the NULL header pointer: FP_RING_ERR_CLOSED.
- FP_RING_FULL of fp_client_try_submit (on_full = "reject") was never counted in
  rejected_full, though fp_ring.h said it was: only the Python client added to it.
- fp_worker_run checked the layout it serves by against the header's own total_bytes: a
  header whose total_bytes was overwritten along with slots and client_region_bytes (all
  consistent) before run() sent the worker past the mapping. It is given the mapped size.
- A stop's drain answered whatever a client had published while anything was published: a
  client that ignored the STOPPING state and went on publishing, its req_head stored huge,
  held the drain open until a second signal (past drain_timeout_ms the drain ends only at a
  round that answers nothing, and each round answered the next tick). The drain now answers
  each client up to what its ring could hold when the stop began (req_tail then + slots).
- Server.stats() queue_depth trusted the client-written cursors (a req_head of 2^62 showed as
  2^62 requests queued), and a wait figure trusted the client's submit stamp (sent = 1 read
  as a wait of the machine's uptime).
"""
import shutil
import subprocess
import sys
import time

import pytest

import fastpath
from fastpath import ServeError
from helpers.serving import cfg, deadline, uname

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH")

# One C client with a few misbehaviours, built on fp_ring.h alone.
#   bad NAME closed             every client call after fp_client_close (then after detach)
#   bad NAME full               8 requests without taking a reply, then 3 more (ring full)
#   bad NAME flood SECONDS      publishes by hand, ignoring the server state, req_head 2^62
#   bad NAME sent STAMP         one request published by hand with sent = STAMP
C_BAD = r"""
#include "fp_ring.h"
#include <stdlib.h>
static float raw[1 << 12];
static int publish(fp_client *c, int64_t sent, uint64_t head_shown) {
    if (c->req_head - FP_LOAD_ACQ(&c->ctl->req_tail.v) >= c->L.slots)
        return 0;
    fp_req *r = fp_lay_req(&c->L, c->ctl, c->req_head);
    memcpy(r->raw, raw, sizeof(float) * c->L.raw_len);
    r->ts_ns = -1;
    r->symbol = 1;
    r->sent = sent;
    FP_STORE_REL(&r->seq, c->next_seq);
    c->req_head++;
    c->next_seq++;
    FP_STORE_REL(&c->ctl->req_head.v, head_shown ? head_shown : c->req_head);
    return 1;
}
int main(int argc, char **argv) {
    fp_seg s;
    fp_client c;
    fp_rep rep;
    uint64_t seq;
    if (argc < 3 || fp_seg_attach(argv[1], &s) != FP_RING_OK || fp_client_open(&s, &c) != FP_RING_OK)
        return 2;
    const char *mode = argv[2];
    if (!strcmp(mode, "closed")) {
        fp_client_close(&c);
        for (int round = 0; round < 2; round++) {
            int rc = fp_client_try_submit(&c, raw, 1, -1, &seq);
            int p = fp_client_poll(&c, &rep), ps = fp_client_poll_spin(&c, &rep);
            int own = fp_client_owns(&c);
            int chk = fp_client_server_check(&c, fp_ring_now_ns(), 1000000000LL);
            printf("submit %d seq %llu poll %d spin %d owns %d check %d\n", rc,
                   (unsigned long long)seq, p, ps, own, chk);
            fp_client_close(&c);
            fp_seg_detach(&s);
        }
        return 0;
    }
    if (!strcmp(mode, "full")) {
        long ok = 0, full = 0;
        while (ok < 8) {
            int rc = fp_client_try_submit(&c, raw, 1, -1, &seq);
            if (rc == FP_RING_OK)
                ok++;
            else if (rc == FP_RING_FULL)
                full++;
            else
                return 4;
        }
        for (int i = 0; i < 3; i++)
            if (fp_client_try_submit(&c, raw, 1, -1, &seq) == FP_RING_FULL)
                full++;
        printf("full %ld\n", full);
        fflush(stdout);
        fp_client_close(&c);
        return 0;
    }
    if (!strcmp(mode, "flood")) {
        int64_t until = fp_ring_now_ns() + (int64_t)atol(argv[3]) * 1000000000LL;
        long sent = 0;
        while (fp_ring_now_ns() < until && FP_LOAD_ACQ(&c.h->state) != FP_SRV_STOPPED) {
            /* the ring kept full: a reply taken, the next request in at once */
            while (publish(&c, fp_ring_sent_stamp(c.sent_clock), 1ULL << 62))
                sent++;
            while (fp_client_poll(&c, &rep))
                ;
        }
        printf("flood sent %ld\n", sent);
        return 0;
    }
    if (!strcmp(mode, "sent")) {
        publish(&c, (int64_t)strtoll(argv[3], NULL, 0), 0);
        for (long i = 0; !fp_client_poll(&c, &rep); i++)
            if ((i & 0xfffff) == 0 && fp_seg_server_check(c.h, fp_ring_now_ns(), 2000000000LL))
                return 5;
        printf("wait %lld err %d\n", (long long)rep.wait_ns, (int)rep.err);
        fp_client_close(&c);
        return 0;
    }
    return 2;
}
"""


@pytest.fixture(scope="module")
def bad(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    src, exe = d / "bad.c", d / "bad"
    src.write_text(C_BAD)
    subprocess.run(["cc", "-std=c99", "-O2", "-Wall", "-Wextra", "-Werror",
                    f"-I{fastpath.get_include()}", str(src), "-o", str(exe)], check=True,
                   timeout=60)
    return str(exe)


def _run(exe, *args, timeout=60):
    return subprocess.run([exe, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def test_client_calls_after_close_are_a_clear_error_not_a_crash(bad):
    name = uname()
    with fastpath.serve(name, None, cfg(ring_slots=4, max_clients=2)):
        r = _run(bad, name, "closed")
    # before: submit after close read the NULL header: exit -11
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    want = "submit -7 seq 0 poll 0 spin 0 owns 0 check -7"
    assert r.stdout.splitlines() == [want, want], r.stdout


def test_ring_full_of_a_c_client_is_counted_in_rejected_full(bad):
    name = uname()
    with fastpath.serve(name, None, cfg(ring_slots=4, max_clients=2, on_full="reject")) as srv:
        r = _run(bad, name, "full")
        assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
        full = int(r.stdout.split()[1])
        assert full >= 3
        assert srv.stats()["rejected_full"] == full      # before: 0
    with fastpath.serve(name, None, cfg(ring_slots=4, max_clients=2, on_full="spin")) as srv:
        r = _run(bad, name, "full")
        assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
        assert int(r.stdout.split()[1]) >= 3
        assert srv.stats()["rejected_full"] == 0        # under spin, FULL is a wait


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
    """A header whose slots, client_region_bytes and total_bytes were overwritten together
    (they check out against each other) before the loop started: the worker addressed rings
    a gigabyte past its mapping (exit -11 at the stop). It now serves nothing and stops."""
    r = subprocess.run([sys.executable, "-c", _DAMAGED, uname()], capture_output=True,
                       text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, (r.returncode, r.stdout[-2000:], r.stderr[-3000:])
    assert "state stopped" in r.stdout, r.stdout


def _flood(bad, name, srv):
    p = subprocess.Popen([bad, name, "flood", "60"], stdout=subprocess.PIPE, text=True)
    with deadline(30):
        while srv.stats()["served"] < 200:
            time.sleep(0.01)
    return p


def test_a_client_publishing_past_the_stop_does_not_hold_the_drain(bad):
    # a deep ring: each round of the drain (64 a client) finds requests waiting, so past
    # drain_timeout_ms no round answers none, and the drain went on as long as the client
    # (2^16 slots: a shallower ring let the drain catch up with this client on 2 cores)
    name = uname()
    slots = 1 << 16
    srv = fastpath.serve(name, None, cfg(ring_slots=slots, max_clients=2, drain_timeout_ms=200))
    p = _flood(bad, name, srv)
    time.sleep(0.5)                       # the client's ring full, and the client in its stride
    try:
        before = srv.stats()["served"]
        try:
            srv.stop(timeout=10)          # before: ServeError, the drain never ended
        except ServeError as exc:         # pragma: no cover - the defect
            srv.end_drain()
            srv.stop()
            pytest.fail(f"the drain was held open: {exc}")
        # no more than the ring held when the stop began
        assert srv.final_stats["served"] - before <= 2 * slots, (before, srv.final_stats)
    finally:
        srv.stop()
        out, _ = p.communicate(timeout=70)
    assert p.returncode == 0 and "flood sent" in out, (p.returncode, out)


def test_a_bogus_request_head_does_not_read_as_a_huge_queue(bad):
    name = uname()
    srv = fastpath.serve(name, None, cfg(ring_slots=4, max_clients=2, drain_timeout_ms=200))
    p = _flood(bad, name, srv)
    try:
        # req_head 2^62 read as 2^62 requests queued: a ring holds 4
        st = srv.stats()
        assert 0 <= st["queue_depth"] <= 4, st
        assert all(0 <= c["queued"] <= 4 for c in st["clients"]), st
    finally:
        srv.end_drain()
        srv.stop()
        p.communicate(timeout=70)


def _publish_with_sent(bad, stamp):
    name = uname()
    t0 = time.monotonic()
    with fastpath.serve(name, None, cfg(ring_slots=4, max_clients=2)) as srv:
        r = _run(bad, name, "sent", stamp)
        up_ns = (time.monotonic() - t0) * 1e9
        assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
        lat = srv.latency_records()
    wait = int(r.stdout.split()[1])
    return wait, int(lat[-1, 4]), up_ns


@pytest.mark.parametrize("stamp", ["1", str(2**62), str(-2**62)])
def test_a_garbage_submit_stamp_does_not_make_a_wait_longer_than_the_server_ran(bad, stamp):
    """sent = 1 read as a wait of the machine's uptime (4.29 s in the records, saturated, at
    the top of every p99); a stamp in the future as a negative or huge one."""
    wait, rec, up_ns = _publish_with_sent(bad, stamp)
    assert 0 <= wait <= up_ns, (wait, up_ns)
    assert 0 <= rec <= up_ns, (rec, up_ns)
