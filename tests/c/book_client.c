/* A C feed handler driving a served engine with order book updates, built only on fp_ring.h
 * (fastpath.get_include()): fp_client_try_submit_book, then the reply as for a raw tick. Used
 * by tests/serve/test_serve_book_c.py (replies checked against a local Engine.step_book) and
 * bench/serve.py (book update round trips without Python).
 *
 *   book_client NAME check IN.bin N OUT.bin   send the N updates of IN in order, write each
 *        reply to OUT: float signal, confidence; int32 err, reason, aux, cached
 *   book_client NAME bench IN.bin N OUT.i64 [COUNT [WARMUP]]   WARMUP untimed updates, then
 *        COUNT timed ones (updates of IN in turn, their ts_ns replaced by 1000 * (i + 1) so
 *        that time goes forward however often IN is cycled), each round trip in ns to OUT
 * An update in IN (360 bytes, little-endian): int32 symbol, int32 0, int64 ts_ns, then
 * doubles bid_px[10], bid_sz[10], ask_px[10], ask_sz[10], trade_vol, trade_cnt,
 * last_trade_sz.
 * Exit status: 0, 2 usage, 3 cannot connect, 4 server gone, 5 an error reply (bench only).
 */
#include "fp_ring.h"   /* first: it asks for POSIX 2008 under a strict -std */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define L FP_RING_BOOK_LEVELS

typedef struct {
    int32_t symbol, _pad;
    int64_t ts_ns;
    double bid_px[L], bid_sz[L], ask_px[L], ask_sz[L];
    double trade_vol, trade_cnt, last_trade_sz;
} update;

typedef struct {
    float signal, confidence;
    int32_t err, reason, aux, cached;
} answer;

static inline uint64_t stamp(void) {
#if FP_RING_HAVE_TSC
    _mm_lfence();
    return __rdtsc();
#else
    return (uint64_t)fp_ring_now_ns();
#endif
}

/* one update, one reply: 0, or 4 when the server is gone (the reply in *rep either way) */
static int step_book(fp_client *c, const update *u, int64_t ts, fp_rep *rep) {
    uint64_t seq;
    long spins = 0;
    int rc;
    const int64_t stall = (int64_t)c->h->stall_ms * 1000000LL;
    while ((rc = fp_client_try_submit_book(c, u->symbol, u->bid_px, u->bid_sz, u->ask_px,
                                           u->ask_sz, ts, u->trade_vol, u->trade_cnt,
                                           u->last_trade_sz, &seq)) == FP_RING_FULL) {
        if ((++spins & 1023) == 0 &&
            fp_seg_server_check(c->h, fp_ring_now_ns(), stall) != FP_SRV_ALIVE)
            return 4;
        FP_RING_PAUSE();
    }
    if (rc != FP_RING_OK)
        return 4;
    spins = 0;
    for (;;) {
        if (fp_client_poll_spin(c, rep)) {
            if (rep->seq == seq)
                return 0;
            continue;
        }
        if ((++spins & 1023) == 0 &&
            (!fp_client_owns(c) || fp_client_server_check(c, fp_ring_now_ns(), stall) != FP_SRV_ALIVE))
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
    long n = atol(argv[4]);
    update *ups = malloc(sizeof(update) * (size_t)(n > 0 ? n : 1));
    FILE *f = fopen(argv[3], "rb");
    if (n <= 0 || !ups || !f || fread(ups, sizeof(update), (size_t)n, f) != (size_t)n)
        return 2;
    fclose(f);
    FILE *out = fopen(argv[5], "wb");
    if (!out)
        return 2;
    fp_rep rep;
    if (strcmp(argv[2], "check") == 0) {
        for (long i = 0; i < n; i++) {
            if (step_book(&c, &ups[i], ups[i].ts_ns, &rep)) {
                fprintf(stderr, "update %ld: server gone\n", i);
                return 4;
            }
            answer a = {rep.signal, rep.confidence, rep.err, rep.reason, rep.aux, rep.cached};
            fwrite(&a, sizeof a, 1, out);
        }
    } else {
        long count = argc > 6 ? atol(argv[6]) : n, warm = argc > 7 ? atol(argv[7]) : 0;
        uint64_t *dt = malloc(sizeof(uint64_t) * (size_t)(count > 0 ? count : 1));
        if (!dt || count <= 0)
            return 2;
        int64_t t_mono0 = 0;
        uint64_t t_tick0 = 0;
        for (long i = 0; i < warm + count; i++) {
            if (i == warm) {
                t_mono0 = fp_ring_now_ns();
                t_tick0 = stamp();
            }
            uint64_t a = stamp();
            int rc = step_book(&c, &ups[i % n], 1000 * (int64_t)(i + 1), &rep);
            uint64_t b = stamp();
            if (i >= warm)
                dt[i - warm] = b - a;
            if (rc || rep.err != FP_REP_OK) {
                fprintf(stderr, "update %ld: %s (code %d)\n", i, rc ? "server gone" : "error reply",
                        rep.err);
                return rc ? rc : 5;
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
    free(ups);
    return 0;
}
