/* A C client of a fastpath server, built only on fp_ring.h (fastpath.get_include()): what a
 * feed handler in C would do. Used by tests/serve/test_serve_rings_c.py (replies
 * checked against a local Engine) and bench/serve.py (round-trip latency without Python).
 *
 *   client NAME check IN.f32 N SYM0 NSYM OUT.f32   step N ticks (raw rows from IN, symbol
 *        SYM0 + i % NSYM, ts_ns = 1000 * (i + 1)), write signal,confidence per tick to OUT
 *   client NAME bench IN.f32 N OUT.i64 [COUNT [WARMUP]]   step WARMUP untimed ticks, then
 *        COUNT timed ones (rows of IN in turn; COUNT defaults to N), write each round trip in ns
 * Exit status: 0, 2 usage, 3 cannot connect, 4 server gone, 5 an error reply.
 */
#include "fp_ring.h"   /* first: it asks for POSIX 2008 under a strict -std */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Round trips are timed with the TSC where there is one (~9 ns a read against ~22 ns for
 * clock_gettime, and the read sits inside the interval it measures), converted at the rate
 * seen over the whole run against CLOCK_MONOTONIC. */
static inline uint64_t stamp(void) {
#if FP_RING_HAVE_TSC
    _mm_lfence();
    return __rdtsc();
#else
    return (uint64_t)fp_ring_now_ns();
#endif
}

static int step(fp_client *c, const float *raw, int32_t sym, int64_t ts, fp_rep *rep) {
    uint64_t seq;
    long spins = 0;
    int rc;
    /* a full ring waits for room, but not for a server that died meanwhile (kill -9 leaves
     * the ring full and the state RUNNING: only the heartbeat and the pid tell) */
    while ((rc = fp_client_try_submit(c, raw, sym, ts, &seq)) == FP_RING_FULL) {
        if ((++spins & 1023) == 0 &&
            fp_seg_server_check(c->h, fp_ring_now_ns(), (int64_t)c->h->stall_ms * 1000000LL) != FP_SRV_ALIVE)
            return 4;
        FP_RING_PAUSE();
    }
    /* FP_RING_ERR_GONE: the server is stopping (it takes no new request) or stopped;
     * FP_RING_ERR_RECLAIMED: the server took this client's rings back (its pid looked dead
     * from the server's PID namespace); nothing was submitted, no reply will come */
    if (rc != FP_RING_OK)
        return 4;
    spins = 0;
    for (;;) {
        if (fp_client_poll_spin(c, rep)) {
            if (rep->seq == seq)
                return rep->err == FP_REP_OK ? 0 : 5;
            continue;
        }
        if ((++spins & 1023) == 0 &&
            (!fp_client_owns(c) ||
             fp_client_server_check(c, fp_ring_now_ns(), (int64_t)c->h->stall_ms * 1000000LL) != FP_SRV_ALIVE))
            return 4;
    }
}

int main(int argc, char **argv) {
    if (argc < 6)
        return 2;
    fp_seg seg;
    fp_client c;
    if (fp_seg_attach(argv[1], &seg) != FP_RING_OK || fp_client_open(&seg, &c) != FP_RING_OK) {
        fprintf(stderr, "cannot connect to %s\n", argv[1]);
        return 3;
    }
    uint32_t raw_len = seg.L.raw_len;
    long n = atol(argv[4]);
    float *raws = malloc(sizeof(float) * raw_len * (size_t)n);
    FILE *f = fopen(argv[3], "rb");
    if (!raws || !f || fread(raws, sizeof(float) * raw_len, (size_t)n, f) != (size_t)n)
        return 2;
    fclose(f);
    int check = strcmp(argv[2], "check") == 0;
    if (check && argc < 8)
        return 2;
    int32_t sym0 = check ? atoi(argv[5]) : 0, nsym = check ? atoi(argv[6]) : 1;
    FILE *out = fopen(argv[check ? 7 : 5], "wb");
    if (!out)
        return 2;
    int64_t t_mono0 = 0;
    uint64_t t_tick0 = 0;
    fp_rep rep;
    if (check) {
        for (long i = 0; i < n; i++) {
            int rc = step(&c, raws + (size_t)i * raw_len, sym0 + (int32_t)(i % nsym),
                          1000 * (i + 1), &rep);
            float sc[2] = {rep.signal, rep.confidence};
            fwrite(sc, sizeof sc, 1, out);
            if (rc) {
                fprintf(stderr, "tick %ld: %s (code %d)\n", i,
                        rc == 4 ? "server gone" : "error reply", rep.err);
                return rc;
            }
        }
    } else {
        long count = argc > 6 ? atol(argv[6]) : n, warm = argc > 7 ? atol(argv[7]) : 0;
        uint64_t *dt = malloc(sizeof(uint64_t) * (size_t)(count > 0 ? count : 1));
        if (!dt || count <= 0)
            return 2;
        for (long i = 0; i < warm + count; i++) {
            const float *raw = raws + (size_t)(i % n) * raw_len;
            if (i == warm) {
                t_mono0 = fp_ring_now_ns();
                t_tick0 = stamp();
            }
            uint64_t a = stamp();
            int rc = step(&c, raw, 0, -1, &rep);
            uint64_t b = stamp();
            if (i >= warm)
                dt[i - warm] = b - a;
            if (rc) {
                fprintf(stderr, "tick %ld: %s (code %d)\n", i,
                        rc == 4 ? "server gone" : "error reply", rep.err);
                return rc;
            }
        }
        double ns_per_tick = (double)(fp_ring_now_ns() - t_mono0) / (double)(stamp() - t_tick0);
        for (long i = 0; i < count; i++) {
            int64_t ns = (int64_t)((double)dt[i] * ns_per_tick + 0.5);
            fwrite(&ns, sizeof ns, 1, out);
        }
        free(dt);
    }
    fclose(out);
    fp_client_close(&c);
    fp_seg_detach(&seg);
    free(raws);
    return 0;
}
