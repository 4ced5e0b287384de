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

typedef struct {
    int idle;                  /* FP_IDLE_* once idle_spin_ns of idleness has passed */
    int64_t idle_spin_ns;
    int64_t idle_sleep_ns;
    int64_t drain_timeout_ns;  /* how long a stop waits for clients to take their replies */
} fp_worker_opts;

/* Sizes of a segment for these parameters (header + client regions). */
uint64_t fp_seg_bytes(uint32_t raw_len, uint32_t slots, uint32_t max_clients);
/* Fill a zeroed segment's header (state STARTING); the caller mapped total_bytes. */
void fp_seg_init(fp_seg_header *h, uint32_t raw_len, uint32_t n_symbols, uint32_t slots,
                 uint32_t max_clients, int32_t server_pid, uint32_t on_full,
                 uint32_t heartbeat_ms, uint32_t dead_after_ms, uint32_t stall_ms);
/* Run until h->stop is set, then drain what clients had published and return with
 * state STOPPED. One thread only; e is stepped by nobody else meanwhile. */
void fp_worker_run(fp_seg_header *h, fp_engine *e, const fp_worker_opts *o);
/* Free the slots of clients that closed or whose process is gone; returns how many. */
int fp_worker_reap(fp_seg_header *h);

#endif
