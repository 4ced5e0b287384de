/* fp_worker.h: the serving loop: one thread polls every client's request ring, steps the
 * engine and writes the reply, with no Python and no blocking call on the way.
 *
 * Decision: the loop never sleeps while there is work and, when idle, spins on a pause
 * instruction for idle_spin_ns before its idle strategy (keep spinning, sched_yield, or a
 * short nanosleep): a blocking wake-up costs 1-5 us, the figure the whole design avoids.
 * Housekeeping (heartbeat, dead-client reaping, the stop flag) runs about every
 * heartbeat_ms from inside the loop, so the heartbeat stops exactly when the loop does.
 */
#ifndef FP_WORKER_H
#define FP_WORKER_H

#include "fp_ring.h"
#include "fp_engine.h"

enum { FP_IDLE_SPIN = 0, FP_IDLE_YIELD = 1, FP_IDLE_SLEEP = 2 };

/* Latency records of served ticks, read by a monitor (`fastpath serve --stats`) while the
 * loop writes them. A per-record seqlock: the stamp is 2k+1 while the record of tick k is
 * written and 2k+2 once it is complete, so a reader keeps a record only when the stamp it
 * saw before and after the copy is the one tick k must have: a record half written, or
 * overwritten by a later tick during the copy, is left out instead of mixing two ticks. */
enum { FP_LAT_FEATURE, FP_LAT_CACHE, FP_LAT_INFER, FP_LAT_TOTAL, FP_LAT_WAIT, FP_LAT_FIELDS };
typedef struct {
    uint64_t stamp;
    uint32_t v[FP_LAT_FIELDS];  /* ns, saturated to 32 bits */
    uint32_t _pad;
} fp_lat_rec;

typedef struct {
    fp_lat_rec *rec;            /* mask + 1 records */
    uint64_t mask;
    uint64_t count;             /* records completed; written by the one writer */
} fp_lat_ring;

static inline void fp_lat_begin(fp_lat_ring *L, fp_lat_rec **r, uint64_t *k) {
    *k = L->count;
    *r = &L->rec[*k & L->mask];
    __atomic_store_n(&(*r)->stamp, 2 * *k + 1, __ATOMIC_RELAXED);
    /* the odd stamp is visible before any field changes */
    __atomic_thread_fence(__ATOMIC_RELEASE);
}

static inline void fp_lat_end(fp_lat_ring *L, fp_lat_rec *r, uint64_t k) {
    __atomic_store_n(&r->stamp, 2 * k + 2, __ATOMIC_RELEASE);
    __atomic_store_n(&L->count, k + 1, __ATOMIC_RELEASE);
}

/* One record (the writer alone calls this). */
static inline void fp_lat_put(fp_lat_ring *L, const uint32_t v[FP_LAT_FIELDS]) {
    fp_lat_rec *r;
    uint64_t k;
    fp_lat_begin(L, &r, &k);
    for (int j = 0; j < FP_LAT_FIELDS; j++)
        __atomic_store_n(&r->v[j], v[j], __ATOMIC_RELAXED);
    fp_lat_end(L, r, k);
}

/* Copy the complete records of the last mask + 1 ticks, oldest first, FP_LAT_FIELDS values
 * each, into out (room for (mask + 1) * FP_LAT_FIELDS); returns how many. Any thread, any
 * time, never blocks the writer. */
size_t fp_lat_snapshot(const fp_lat_ring *L, uint32_t *out);

/* The worker's own counts, in the server process's memory: what Server.stats() reports.
 * The segment header carries a copy for clients (client.server_stats()), published about
 * once a heartbeat; any process that maps the segment can overwrite that copy, and a figure
 * read from it let a client set the server's own served to 10^12. One writer (the loop),
 * plain stores as before (no locked instruction, now on lines no other process touches);
 * any thread of the server reads them with relaxed loads. */
typedef struct {
    uint64_t served, errors, busy_ns, idle_polls, loops, clients_reaped;
    int64_t heartbeat_ns;      /* CLOCK_MONOTONIC of the loop's last beat */
    uint32_t state;            /* FP_SRV_* as the loop last set it */
    uint32_t _pad;
    uint64_t client_served[FP_SEG_MAX_CLIENTS];   /* per slot, since the worker last freed it */
} fp_worker_stats;

typedef struct {
    int idle;                  /* FP_IDLE_* once idle_spin_ns of idleness has passed */
    int64_t idle_spin_ns;
    int64_t idle_sleep_ns;
    int64_t drain_timeout_ns;  /* how long a stop waits for clients to take their replies */
    fp_lat_ring *lat;          /* records of served ticks, or NULL */
    uint64_t born_ticks;       /* fp_ticks() before the segment was made: no request can be
                                  sent earlier, so a stamp before it is garbage (0: unknown) */
    fp_worker_stats *stats;    /* the loop's counts (NULL: kept where no one can read them) */
    int64_t claim_grace_ns;    /* a slot claimed without a pid for this long is taken back
                                  (<= 0: 2 s); [serve] stall_timeout_ms */
} fp_worker_opts;

/* Sizes of a segment for these parameters (header + client regions). */
uint64_t fp_seg_bytes(uint32_t raw_len, uint32_t slots, uint32_t max_clients);
/* Fill a zeroed segment's header (state STARTING); the caller mapped total_bytes. */
void fp_seg_init(fp_seg_header *h, uint32_t raw_len, uint32_t n_symbols, uint32_t slots,
                 uint32_t max_clients, int32_t server_pid, uint32_t on_full,
                 uint32_t heartbeat_ms, uint32_t dead_after_ms, uint32_t stall_ms);
/* Run until h->stop is set, then drain what clients had accepted (each client up to what its
 * ring held when the stop began: one that publishes on regardless does not hold the drain)
 * and return with state STOPPED (at once, serving nothing, when h's layout fields no longer check out
 * against themselves and size, the bytes the caller mapped at h, or
 * its raw_len is not e's: the rings are addressed by a copy taken here, see fp_seg_layout;
 * or when its one tick buffer cannot be allocated: each request is copied out of its slot
 * before it is checked and stepped); h->stop set to 2 (before or during the drain) ends the drain at its next
 * round of 64 requests a client. One thread only; e is stepped by nobody else meanwhile. */
void fp_worker_run(fp_seg_header *h, uint64_t size, fp_engine *e, const fp_worker_opts *o);
/* Free the slots of clients that closed or that an earlier call retired, and retire those
 * whose process looks gone (freed by the next call); returns how many were freed (added to
 * the header's clients_reaped), or -1 when h's layout fields do not check out
 * (fp_seg_layout_read) against size, the bytes mapped at h. A slot claimed without a pid is
 * left: only the loop, which sees it over time, takes it back. */
int fp_worker_reap(fp_seg_header *h, uint64_t size);

#endif
