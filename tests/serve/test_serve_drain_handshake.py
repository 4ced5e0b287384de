"""A stop's drain and a submit in flight: a submit that looked at the server state before the
stop began and published after it is answered by the drain, however long it was held between
the two (fastpath/include/fp_ring.h: the busy word of req_head and its fence)."""
import shutil
import subprocess
import threading

import pytest

import fastpath
from fastpath._build import DEMO_MODEL
from helpers.serving import cfg, compile_producer, deadline, uname

# The producer holds its submit between the look and the publish (FP_RING_LOOKED) until the
# server is stopping, and then until it is stopped or 0.3 s have passed: a preemption there.
C_HELD_SUBMIT = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static void held(void);
#define FP_RING_LOOKED(c) held()
#include "fp_ring.h"
static const uint32_t *state;
static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
static void held(void) {
    printf("looked\n");
    fflush(stdout);
    while (FP_LOAD_ACQ(state) < FP_SRV_STOPPING) { }
    double until = now_s() + 0.3;
    while (FP_LOAD_ACQ(state) != FP_SRV_STOPPED && now_s() < until) { }
}
int main(int argc, char **argv) {
    fp_seg s;
    fp_client c;
    fp_rep rep;
    char line[16];
    uint64_t seq = 0;
    (void)argc;
    if (fp_seg_attach(argv[1], &s) != FP_RING_OK || fp_client_open(&s, &c) != FP_RING_OK)
        return 3;
    state = &s.h->state;
    printf("ready\n");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin))
        return 2;
    float *raw = calloc(s.h->raw_len, sizeof(float));
    int rc = fp_client_try_submit(&c, raw, 0, -1, &seq);
    double until = now_s() + 30;
    int got = 0;
    while (rc == FP_RING_OK && !got && now_s() < until)
        got = fp_client_poll(&c, &rep) && rep.seq == seq;
    printf("%d %llu %s %u\n", rc, (unsigned long long)seq, got ? "answered" : "lost",
           __atomic_load_n(&s.h->state, __ATOMIC_ACQUIRE));
    fflush(stdout);
    fp_client_close(&c);
    fp_seg_detach(&s);
    free(raw);
    return 0;
}
"""


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH")
def test_a_submit_held_across_the_stop_is_answered_by_the_drain(tmp_path):
    """A submit that saw RUNNING, was preempted before its publish and published once the
    drain had found nothing pending was sent and never answered (the drain ended, STOPPED)."""
    exe = compile_producer(str(tmp_path), "held", C_HELD_SUBMIT, std="gnu11")
    name = uname()
    srv = fastpath.serve(name, DEMO_MODEL, cfg(drain_timeout_ms=20_000))
    p = subprocess.Popen([str(exe), name], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    t = None
    try:
        with deadline(60):
            assert p.stdout.readline() == "ready\n"
            p.stdin.write("go\n")
            p.stdin.flush()
            assert p.stdout.readline() == "looked\n"
            t = threading.Thread(target=srv.stop)
            t.start()
            rc, seq, fate, state = p.stdout.readline().split()
            assert (int(rc), int(seq), fate) == (0, 1, "answered"), state
            assert p.wait(timeout=30) == 0
            t.join(30)
            assert not t.is_alive() and srv.stats()["state"] == "stopped"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)
        if t is not None:
            t.join(30)
        srv.stop()
