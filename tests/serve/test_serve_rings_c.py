"""The shared-memory rings: a full ring (reject or spin), and C producers written against
fastpath/include/fp_ring.h (compiled here with cc), including ones that misuse the ring."""
import os
import shutil
import subprocess
import time

import numpy as np
import pytest

import fastpath
from fastpath import InputError, RingFull, ServeError
from fastpath._build import DEMO_MODEL
from helpers.serving import (
    TESTS_DIR, _stuck, cfg, compile_producer, deadline, held_server, stop_in_thread, ticks, uname)


C_SUBMIT_AFTER_STOP = r"""
#include "fp_ring.h"
#include <stdlib.h>
int main(int argc, char **argv) {
    fp_seg s;
    fp_client c;
    char line[16];
    uint64_t seq = 0;
    (void)argc;
    if (fp_seg_attach(argv[1], &s) != FP_RING_OK || fp_client_open(&s, &c) != FP_RING_OK)
        return 3;
    printf("ready\n");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin))
        return 2;
    float *raw = calloc(s.h->raw_len, sizeof(float));
    int rc = fp_client_try_submit(&c, raw, 0, -1, &seq);
    printf("%d %llu\n", rc, (unsigned long long)seq);
    fflush(stdout);
    fp_client_close(&c);
    fp_seg_detach(&s);
    free(raw);
    return 0;
}
"""


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH")
def test_c_client_submit_is_refused_once_the_stop_begins(tmp_path):
    exe = compile_producer(str(tmp_path), "late", C_SUBMIT_AFTER_STOP)
    name = uname()
    srv, c = held_server(name)
    p = subprocess.Popen([str(exe), name], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    t = None
    try:
        with deadline(60):
            assert p.stdout.readline() == "ready\n"
            _stuck(c)                  # the drain waits on c: it stays "stopping"
            t = stop_in_thread(srv)
            p.stdin.write("go\n")
            p.stdin.flush()
            rc, seq = map(int, p.stdout.readline().split())
        # FP_RING_ERR_GONE (-5), nothing sent (not FP_RING_OK: a tick accepted after the
        # stop began might never be answered once the drain had ended)
        assert (rc, seq) == (-5, 0)
        assert p.wait(timeout=30) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)
        srv.end_drain()
        if t is not None:
            t.join(30)
        c.close()
        srv.stop()


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
# tries: flipped ticks, each a round trip of two busy processes; the soak gives the race ten
# times the chances
@pytest.mark.parametrize("tries", [2_000, pytest.param(20_000, marks=pytest.mark.soak)])
def test_raw_changed_after_publishing_does_not_poison_the_symbol_for_other_clients(tmp_path,
                                                                                  tries):
    exe = compile_producer(str(tmp_path), "flip", C_FLIP_AFTER_PUBLISH, libs=["-lm"])
    name = uname()
    with fastpath.serve(name, None, cfg(ring_slots=4, max_clients=2)) as srv:
        field = int(srv._worker.model.feature_spec.w_idx[0])     # a windowed field: 40
        r = subprocess.run([str(exe), name, str(field), str(tries)], capture_output=True,
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
    return compile_producer(str(d), "bad", C_BAD)


def _run(exe, *args, timeout=60):
    return subprocess.run([exe, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def test_client_calls_after_close_are_a_clear_error_not_a_crash(bad):
    """Regression: a C client's submit after its close read the NULL header (SIGSEGV)."""
    name = uname()
    with fastpath.serve(name, None, cfg(ring_slots=4, max_clients=2)):
        r = _run(bad, name, "closed")
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
        assert srv.stats()["rejected_full"] == full
    with fastpath.serve(name, None, cfg(ring_slots=4, max_clients=2, on_full="spin")) as srv:
        r = _run(bad, name, "full")
        assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
        assert int(r.stdout.split()[1]) >= 3
        assert srv.stats()["rejected_full"] == 0        # under spin, FULL is a wait


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
            srv.stop(timeout=10)          # the drain ends
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
    """Regression: a garbage submit stamp read as a wait of the machine's uptime (or a negative
    one)."""
    wait, rec, up_ns = _publish_with_sent(bad, stamp)
    assert 0 <= wait <= up_ns, (wait, up_ns)
    assert 0 <= rec <= up_ns, (rec, up_ns)


def test_ring_full_reject_raises_and_counts(model):
    name = uname()
    raw = ticks(1, model.feature_spec.raw_len)[0]
    with fastpath.serve(name, model, cfg(ring_slots=4, on_full="reject")) as srv, \
            fastpath.connect(name) as c:
        accepted = []
        with pytest.raises(RingFull, match="full"), deadline(60):
            for i in range(100):
                accepted.append(c.submit(raw, 0, 1000 * (i + 1)))
        # 4 answers waiting to be taken, 4 requests behind them: nothing more fits
        assert len(accepted) <= 8
        assert srv.stats()["rejected_full"] == 1
        got = []
        with deadline(60):
            while len(got) < len(accepted):
                got += c.poll()
        assert [s for s, _ in got] == accepted        # the refused tick took no seq
        assert c.step(raw, 0, 10**9).seq == accepted[-1] + 1


def test_ring_full_spin_waits_without_deadlock(model):
    """on_full = "spin" with a client that never polls: submit takes answers aside while it
    waits, so nothing deadlocks."""
    name = uname()
    raw = ticks(1, model.feature_spec.raw_len)[0]
    with fastpath.serve(name, model, cfg(ring_slots=4, on_full="spin")) as srv, \
            fastpath.connect(name) as c:
        with deadline(60):
            seqs = [c.submit(raw, 0, 1000 * (i + 1)) for i in range(200)]
            got = []
            while len(got) < 200:
                got += c.poll()
        assert [s for s, _ in got] == seqs
        assert srv.stats()["rejected_full"] == 0


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH")
def test_c_client_round_trip(tmp_path):
    exe = compile_producer(str(tmp_path), "client", os.path.join(TESTS_DIR, "c", "client.c"))
    eng_cfg = cfg()
    local = fastpath.Engine(DEMO_MODEL, config=eng_cfg)
    n = 2000
    raws = ticks(n, local.raw_len, seed=3)
    raws.tofile(tmp_path / "in.f32")
    name = uname()
    with fastpath.serve(name, None, eng_cfg) as srv:
        out = subprocess.run([str(exe), name, "check", str(tmp_path / "in.f32"), str(n), "2", "3",
                              str(tmp_path / "out.f32")], timeout=60)
        assert out.returncode == 0
        assert srv.stats()["served"] == n
    got = np.fromfile(tmp_path / "out.f32", np.float32).reshape(n, 2)
    syms = 2 + np.arange(n) % 3
    ref = local.step_batch(raws, syms, 1000 * (np.arange(n, dtype=np.int64) + 1))
    np.testing.assert_array_equal(got[:, 0], ref.signal)
    np.testing.assert_array_equal(got[:, 1], ref.confidence)


@pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler (c++) on PATH")
def test_ring_header_compiles_as_cpp(tmp_path):
    """fp_ring.h compiles as C++ as well as C (for C++ feed handlers)."""
    src = tmp_path / "h.cpp"
    src.write_text('#include "fp_ring.h"\nint main() { fp_seg s; fp_client c; fp_rep r; '
                   '(void)s; (void)c; (void)r; return 0; }\n')
    subprocess.run(["c++", "-std=c++17", "-Wall", "-Wextra", "-Werror",
                    f"-I{fastpath.get_include()}", str(src), "-o", str(tmp_path / "h")],
                   check=True, timeout=60)
