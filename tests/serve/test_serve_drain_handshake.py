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

# A producer that attaches, says "ready" and waits for a line; runs `before` (submits of its
# own), then submits once more, held between its look and its publish (FP_RING_LOOKED) until
# the server is stopping and then while `held` runs; waits up to 30 s for that submit's
# answer and prints "rc seq answered|lost state".
_HELD_PRODUCER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static void held(void *cv);
#define FP_RING_LOOKED(c) held(c)
#include "fp_ring.h"
static const uint32_t *state;
static int holding;
static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
static void held(void *cv) {
    fp_client *c = (fp_client *)cv;
    (void)c;
    if (!holding)
        return;
    printf("looked\n");
    fflush(stdout);
    while (FP_LOAD_ACQ(state) < FP_SRV_STOPPING) { }
@HELD@
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
@BEFORE@
    holding = 1;
    int rc = fp_client_try_submit(&c, raw, 0, -1, &seq);
    holding = 0;
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


def _held_producer(before: str, held: str) -> str:
    """_HELD_PRODUCER with its two blanks filled: C statements of main and of held()"""
    return _HELD_PRODUCER.replace("@BEFORE@", before).replace("@HELD@", held)


# The only submit, held until the server is stopped or 0.3 s have passed: a preemption there.
C_HELD_SUBMIT = _held_producer("", r"""
    double until = now_s() + 0.3;
    while (FP_LOAD_ACQ(state) != FP_SRV_STOPPED && now_s() < until) { }""")


def _held_submit(tmp_path, exe_name, src, config):
    """Run the producer src against a server of `config`, stop the server once it has looked
    (FP_RING_LOOKED) -> (rc, seq, fate) of its held submit; the stop must end cleanly."""
    exe = compile_producer(str(tmp_path), exe_name, src, std="gnu11")
    name = uname()
    srv = fastpath.serve(name, DEMO_MODEL, config)
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
            assert p.wait(timeout=30) == 0
            t.join(30)
            assert not t.is_alive() and srv.stats()["state"] == "stopped"
            return int(rc), int(seq), fate, state
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)
        if t is not None:
            t.join(30)
        srv.stop()


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH")
def test_a_submit_held_across_the_stop_is_answered_by_the_drain(tmp_path):
    """A submit that saw RUNNING, was preempted before its publish and published once the
    drain had found nothing pending was sent and never answered (the drain ended, STOPPED)."""
    rc, seq, fate, state = _held_submit(tmp_path, "held", C_HELD_SUBMIT,
                                        cfg(drain_timeout_ms=20_000))
    assert (rc, seq, fate) == (0, 1, "answered"), state


# Two requests answered and their replies not taken (the reply ring, 2 slots, full), two more
# queued behind them (the request ring full): the third submit looks (RUNNING) and is held
# there until the server is stopping, takes the two replies so that the drain answers the
# queued pair, and goes on once the drain has moved the tail past them: its room check then
# finds the slot at the stop's tail + slots.
C_HELD_PAST_THE_TAIL = _held_producer(r"""
    for (int k = 0; k < 4;) {
        int rc = fp_client_try_submit(&c, raw, 0, -1, &seq);
        if (rc == FP_RING_OK)
            k++;
        else if (rc != FP_RING_FULL)
            return 4;
    }
    while (FP_LOAD_ACQ(&c.ctl->req_tail.v) < 2) { }""", r"""
    fp_rep rep;
    for (int k = 0; k < 2;)
        k += fp_client_poll(c, &rep);
    double until = now_s() + 10;
    while (FP_LOAD_ACQ(&c->ctl->req_tail.v) < 4 && now_s() < until) { }""")


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH")
def test_a_submit_that_finds_room_the_drain_made_is_answered(tmp_path):
    """The drain answered requests up to the stop's req_tail + slots, but a submit that looked
    before the stop can find its room in a tail the drain has since moved, and publish at
    that very position: it was sent and never answered."""
    rc, seq, fate, state = _held_submit(tmp_path, "held_tail", C_HELD_PAST_THE_TAIL,
                                        cfg(ring_slots=2, drain_timeout_ms=20_000))
    assert (rc, seq, fate) == (0, 5, "answered"), state
