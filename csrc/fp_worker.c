/* fp_worker.c: the serving loop over the rings of fp_ring.h (see fp_worker.h). */
#include "fp_worker.h"

#include <sched.h>
#include <stddef.h>

/* idle polls without a pause after the last request (a few us at ~10 ns a poll) */
#define FP_WORKER_HOT_POLLS 256
/* fp_worker_opts.claim_grace_ns when not given */
#define FP_WORKER_CLAIM_GRACE_NS 2000000000LL

_Static_assert((int)FP_REP_ERR_SYMBOL == (int)FP_ERR_SYMBOL, "reply codes mirror the engine's");
_Static_assert((int)FP_REP_ERR_NONFINITE_INPUT == (int)FP_ERR_NONFINITE_INPUT, "reply codes");
_Static_assert((int)FP_REP_ERR_TIME_BACKWARDS == (int)FP_ERR_TIME_BACKWARDS, "reply codes");
_Static_assert((int)FP_REP_ERR_NONFINITE_OUTPUT == (int)FP_ERR_NONFINITE_OUTPUT, "reply codes");
_Static_assert((int)FP_REP_ERR_NONFINITE_FEATURE == (int)FP_ERR_NONFINITE_FEATURE, "reply codes");
_Static_assert((int)FP_REP_ERR_NOT_PROBABILITY == (int)FP_ERR_NOT_PROBABILITY, "reply codes");
_Static_assert((int)FP_REP_ERR_PARAM == (int)FP_ERR_PARAM, "reply codes");
_Static_assert((int)FP_REP_ERR_BOOK == (int)FP_ERR_BOOK, "reply codes");
_Static_assert(FP_RING_BOOK_LEVELS == FP_BOOK_LEVELS, "a book request carries the book's levels");
_Static_assert((int)FP_REP_BOOK_PRICE == (int)FP_BOOK_ERR_PRICE &&
               (int)FP_REP_BOOK_SIZE == (int)FP_BOOK_ERR_SIZE &&
               (int)FP_REP_BOOK_ORDER == (int)FP_BOOK_ERR_ORDER &&
               (int)FP_REP_BOOK_CROSSED == (int)FP_BOOK_ERR_CROSSED &&
               (int)FP_REP_BOOK_TRADE == (int)FP_BOOK_ERR_TRADE &&
               (int)FP_REP_BOOK_RANGE == (int)FP_BOOK_ERR_RANGE &&
               (int)FP_REP_BOOK_NOTICK == (int)FP_BOOK_ERR_NOTICK, "book refusals mirror fp_book.h");
_Static_assert((int)FP_REP_BOOK_BID_PX == (int)FP_BOOK_BID_PX &&
               (int)FP_REP_BOOK_ASK_SZ == (int)FP_BOOK_ASK_SZ, "sides mirror fp_book.h");
_Static_assert(sizeof(fp_req_book) == 4 * FP_BOOK_LEVELS * sizeof(double), "levels only");
_Static_assert(sizeof(fp_rep) == 64, "a reply is one cache line");
_Static_assert(sizeof(fp_req) == 64, "a request's header is one line, its raw values start on the next");
_Static_assert(sizeof(fp_seg_header) <= FP_SEG_HEADER_BYTES, "header fits its reserved bytes");
_Static_assert(offsetof(fp_client_entry, state) == 0 && offsetof(fp_client_entry, pid) == 4,
               "a client entry's state and pid are one 8-byte word, claimed in one CAS");

uint64_t fp_seg_bytes(uint32_t raw_len, uint32_t slots, uint32_t max_clients) {
    return FP_SEG_HEADER_BYTES + (uint64_t)max_clients * fp_ring_client_region_bytes(raw_len, slots);
}

void fp_seg_init(fp_seg_header *h, uint32_t raw_len, uint32_t n_symbols, uint32_t slots,
                 uint32_t max_clients, int32_t server_pid, uint32_t on_full,
                 uint32_t heartbeat_ms, uint32_t dead_after_ms, uint32_t stall_ms) {
    h->version = FP_SEG_VERSION;
    h->header_bytes = FP_SEG_HEADER_BYTES;
    h->raw_len = raw_len;
    h->n_symbols = n_symbols;
    h->slots = slots;
    h->max_clients = max_clients;
    h->req_slot_bytes = fp_ring_req_slot_bytes(raw_len);
    h->rep_slot_bytes = sizeof(fp_rep);
    h->client_region_bytes = fp_ring_client_region_bytes(raw_len, slots);
    h->total_bytes = fp_seg_bytes(raw_len, slots, max_clients);
    h->server_pid = server_pid;
    h->on_full = on_full;
    h->heartbeat_ms = heartbeat_ms;
    h->dead_after_ms = dead_after_ms;
    h->stall_ms = stall_ms;
    /* clients stamp requests with the TSC when the engine clock is the TSC: wait_ns is then a
     * tick difference converted at the calibrated rate (the TSC is invariant and shared) */
    h->sent_clock = fp_clock.use_tsc ? FP_CLOCK_TSC : FP_CLOCK_MONO;
    FP_STORE_REL(&h->heartbeat_ns, (uint64_t)fp_ring_now_ns());
    FP_STORE_REL(&h->state, FP_SRV_STARTING);
    /* magic last: a client attaching mid-init sees no segment rather than half a header */
    FP_STORE_REL(&h->magic, FP_SEG_MAGIC);
}

static void free_slot(const fp_seg_layout *L, int i, fp_worker_stats *S) {
    fp_seg_header *h = (fp_seg_header *)L->base;
    fp_ring_ctl *ctl = fp_lay_ctl(L, i);
    /* the owner is gone: what it left in its rings is dropped with it. A slot's seq is how a
     * waiting party knows it was written (position + 1): the next owner starts at position 0
     * again, so every old seq is cleared or it would read as a fresh request or reply */
    for (uint64_t k = 0; k < L->slots; k++) {
        FP_STORE_REL(&fp_lay_req(L, ctl, k)->seq, 0);
        FP_STORE_REL(&fp_lay_rep(L, ctl, k)->seq, 0);
    }
    FP_STORE_REL(&ctl->req_head.v, 0);
    FP_STORE_REL(&ctl->req_tail.v, 0);
    FP_STORE_REL(&ctl->rep_head.v, 0);
    FP_STORE_REL(&ctl->rep_tail.v, 0);
    /* the next owner's count starts at 0 (the client zeroing the header's copy at its claim
     * is for the published figure only) */
    __atomic_store_n(&S->client_served[i], 0, __ATOMIC_RELAXED);
    h->clients[i].pid = 0;
    /* a client still using the slot (its pid only looked dead) sees the new generation on
     * its own cursor line at its next call and stops, before the slot is offered again */
    uint64_t gen = __atomic_add_fetch(&h->clients[i].generation, 1, __ATOMIC_RELEASE);
    FP_STORE_REL(&ctl->req_head.gen, gen);
    FP_STORE_REL(&h->clients[i].state, FP_CL_FREE);
}

/* The first of two passes over the slot of an owner whose pid looks dead. That owner may be
 * alive (its pid is only invisible here: another PID namespace) and inside a call that
 * passed its generation check before the generation moved: the call still stores its
 * request, its cursors, into the rings. Freed at once, those stores landed in cleared rings
 * already offered, and the next owner read the stale cursor at open (it wrote where the
 * worker never looked, and spun forever) or the worker served the stale request as the next
 * owner's. So the slot is only retired here (the generation moves: the owner stops at its
 * next call) and cleared and offered by the next pass, a heartbeat later, when a call in
 * flight has long finished (one that stalls mid-call for longer still races; no store of the
 * client side can be fenced off from here). */
static void retire_slot(const fp_seg_layout *L, int i) {
    fp_seg_header *h = (fp_seg_header *)L->base;
    uint64_t gen = __atomic_add_fetch(&h->clients[i].generation, 1, __ATOMIC_RELEASE);
    FP_STORE_REL(&fp_lay_ctl(L, i)->req_head.gen, gen);
    FP_STORE_REL(&h->clients[i].state, FP_CL_RETIRED);
}

/* One reap pass: frees every CLOSING or RETIRED slot and probes the pids of at most
 * `probes` owners (ACTIVE or CLAIMED slots), from slot *next on, cyclically; *next is left
 * after the last slot probed. A slot CLAIMED without a pid has no owner to probe (a client
 * killed between claiming it and storing its pid, with an fp_ring.h older than the one-word
 * claim; or a store by another process): half_since[i] notes when a pass first saw it so
 * (NULL: not looked at) and a pass `grace_ns` later retires it, so that such slots cannot
 * pile up until no client can connect. A slot so taken back may have had a
 * live claimant after all: an older fp_ring.h client stalled that long between its claim and
 * its pid store (SIGSTOP, a debugger). Resumed, it stores its pid and ACTIVE unconditionally,
 * over whatever the slot is by then: the next client's own, ACTIVE, and two clients wrote one
 * ring pair, each taking the other's replies, for as long as both lived. An ACTIVE slot's pid
 * never changes otherwise (it is stored with the claim, or before ACTIVE by an older client,
 * and cleared only by free_slot), so owner[i] keeps the pid a pass first saw the slot ACTIVE
 * with, and a pass that finds another there retires the slot: both clients see the new
 * generation at their next call and stop (RECLAIMED, ServeError) instead of sharing it. One
 * that resumes before a pass has seen the next client's claim ACTIVE (within a heartbeat of
 * it) is not told apart: that pass sees its pid first.
 * A probe is a kill(0) and a read of /proc/<pid>/stat, ~6 us: the loop's pass probes one
 * owner a heartbeat, as probing all of them would stop serving for ~6 us per client every
 * heartbeat. A dead owner is then retired within as many heartbeats as
 * there are owners (64 ms at most at the 1 ms default), and its slot freed one later. */
typedef struct {
    int64_t half_since[FP_SEG_MAX_CLIENTS];  /* when a pass first saw it CLAIMED without a pid
                                                (0: not so when last looked at) */
    int64_t owner[FP_SEG_MAX_CLIENTS];       /* the pid a pass first saw it ACTIVE with
                                                (REAP_NO_OWNER: not ACTIVE when last looked at) */
} reap_memo;
#define REAP_NO_OWNER INT64_MIN

static int reap_pass(const fp_seg_layout *L, uint32_t probes, uint32_t *next,
                     fp_worker_stats *S, reap_memo *memo, int64_t now, int64_t grace_ns) {
    fp_seg_header *h = (fp_seg_header *)L->base;
    int n = 0;
    const uint32_t m = L->max_clients;
    for (uint32_t i = 0; i < m; i++) {
        uint32_t st = FP_LOAD_ACQ(&h->clients[i].state);
        if (st == FP_CL_CLOSING || st == FP_CL_RETIRED) {
            /* CLOSING: the owner's last store was the close itself; RETIRED: a pass ago */
            free_slot(L, (int)i, S);
            n++;
            st = FP_CL_FREE;
        }
        if (!memo)
            continue;
        int64_t *half_since = memo->half_since;
        const int32_t pid = FP_LOAD_RLX(&h->clients[i].pid);
        if (st != FP_CL_ACTIVE) {
            memo->owner[i] = REAP_NO_OWNER;
        } else if (memo->owner[i] == REAP_NO_OWNER) {
            memo->owner[i] = pid;
        } else if (memo->owner[i] != pid) {
            /* another pid stored into an ACTIVE slot (see above): retired, freed a pass later */
            memo->owner[i] = REAP_NO_OWNER;
            retire_slot(L, (int)i);
            st = FP_CL_RETIRED;
        }
        if (st != FP_CL_CLAIMED || pid > 0) {
            half_since[i] = 0;
        } else if (half_since[i] == 0) {
            half_since[i] = now | 1;        /* 0 means "not seen" */
        } else if (now - half_since[i] >= grace_ns) {
            half_since[i] = 0;
            /* retired, then freed a pass later as a dead owner's slot is; only if it is still
             * CLAIMED with the pid read above, one 8-byte swap of (state, pid): a late
             * claimant that stored its pid or made it ACTIVE meanwhile keeps it (a swap of the
             * state alone retired a slot whose pid had just been stored) */
            uint64_t want = fp_cl_word(FP_CL_CLAIMED, pid);
            if (__atomic_compare_exchange_n((fp_cl_word_t *)&h->clients[i].state, &want,
                                            fp_cl_word(FP_CL_RETIRED, pid), 0,
                                            __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
                retire_slot(L, (int)i);
        }
    }
    for (uint32_t k = 0, i = *next % m; k < m && probes; k++, i = (i + 1) % m) {
        uint32_t st = FP_LOAD_ACQ(&h->clients[i].state);
        if ((st == FP_CL_ACTIVE || st == FP_CL_CLAIMED) && h->clients[i].pid > 0) {
            probes--;
            *next = (i + 1) % m;
            if (fp_ring_pid_dead(h->clients[i].pid))
                retire_slot(L, (int)i);
        }
    }
    if (n)
        __atomic_store_n(&S->clients_reaped, S->clients_reaped + (uint64_t)n, __ATOMIC_RELAXED);
    return n;
}

int fp_worker_reap(fp_seg_header *h, uint64_t size) {
    fp_seg_layout L;
    fp_worker_stats S;
    uint32_t next = 0;
    if (fp_seg_layout_read(h, size, &L))
        return -1;
    memset(&S, 0, sizeof S);
    int n = reap_pass(&L, L.max_clients, &next, &S, NULL, 0, 0);
    if (n)
        __atomic_add_fetch(&h->clients_reaped, (uint64_t)n, __ATOMIC_RELAXED);
    return n;
}

/* The counts copied into the segment header for clients (client.server_stats()): about once
 * a heartbeat, and when the loop ends. Nothing reads them back. */
static void publish(const fp_seg_layout *L, const fp_worker_stats *S) {
    fp_seg_header *h = (fp_seg_header *)L->base;
    __atomic_store_n(&h->served, S->served, __ATOMIC_RELAXED);
    __atomic_store_n(&h->errors, S->errors, __ATOMIC_RELAXED);
    __atomic_store_n(&h->busy_ns, S->busy_ns, __ATOMIC_RELAXED);
    __atomic_store_n(&h->idle_polls, S->idle_polls, __ATOMIC_RELAXED);
    __atomic_store_n(&h->loops, S->loops, __ATOMIC_RELAXED);
    __atomic_store_n(&h->clients_reaped, S->clients_reaped, __ATOMIC_RELAXED);
    for (uint32_t i = 0; i < L->max_clients; i++)
        if (FP_LOAD_RLX(&h->clients[i].state) == FP_CL_ACTIVE)
            __atomic_store_n(&h->clients[i].served, S->client_served[i], __ATOMIC_RELAXED);
}

/* A request published at position `tail` of this ring, or NULL: the worker polls the slot's
 * header line, the line the client writes last. */
static inline const fp_req *published(const fp_seg_layout *L, fp_ring_ctl *ctl, uint64_t tail) {
    const fp_req *q = fp_lay_req(L, ctl, tail);
    return FP_LOAD_ACQ(&q->seq) == tail + 1 ? q : NULL;
}

static inline uint32_t sat32(int64_t v) {
    return v <= 0 ? 0u : v >= (int64_t)UINT32_MAX ? UINT32_MAX : (uint32_t)v;
}

size_t fp_lat_snapshot(const fp_lat_ring *L, uint32_t *out) {
    const uint64_t end = __atomic_load_n(&L->count, __ATOMIC_ACQUIRE);
    const uint64_t cap = L->mask + 1;
    size_t n = 0;
    for (uint64_t k = end > cap ? end - cap : 0; k < end; k++) {
        const fp_lat_rec *r = &L->rec[k & L->mask];
        const uint64_t want = 2 * k + 2;
        if (__atomic_load_n(&r->stamp, __ATOMIC_ACQUIRE) != want)
            continue;                       /* already overwritten by a later tick */
        uint32_t v[FP_LAT_FIELDS];
        for (int j = 0; j < FP_LAT_FIELDS; j++)
            v[j] = __atomic_load_n(&r->v[j], __ATOMIC_RELAXED);
        /* the field loads complete before the stamp is read again */
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(&r->stamp, __ATOMIC_RELAXED) != want)
            continue;                       /* overwritten during the copy */
        memcpy(out + n * FP_LAT_FIELDS, v, sizeof v);
        n++;
    }
    return n;
}

/* A book request (q->kind FP_REQ_BOOK) stepped: its levels copied into the worker's own
 * memory first (the slot is the client's, see serve_client: fp_step_book checks the levels,
 * then computes from them), then fp_step_book. The book stage's time goes to *aux (an
 * accepted update), or where the update was refused (FP_ERR_BOOK, with *why). */
static int step_book_request(fp_engine *e, const fp_req *q, int32_t symbol, int64_t ts_ns,
                             fp_result *res, int *why, uint16_t *aux) {
    const volatile fp_req *v = q;       /* each trade field read once */
    fp_req_book b;
    memcpy(&b, (const void *)q->raw, sizeof b);
    fp_book_update u = {b.bid_px, b.bid_sz, b.ask_px, b.ask_sz, ts_ns,
                        v->trade_vol, v->trade_cnt, v->last_trade_sz};
    int64_t book_ns = 0;
    int where = 0;
    const int rc = fp_step_book(e, symbol, &u, res, &book_ns, why, &where);
    if (rc == FP_OK)
        *aux = (uint16_t)(book_ns < 0 ? FP_REP_BOOK_NS_NONE
                          : book_ns > (int64_t)FP_REP_BOOK_NS_MAX ? FP_REP_BOOK_NS_MAX
                          : (uint64_t)book_ns);
    else if (rc == FP_ERR_BOOK)
        *aux = (uint16_t)where;
    return rc;
}

/* Serve what client i has published, at most `budget` requests (so one busy client cannot
 * starve the others); returns how many were served. Stops early when the client's reply
 * ring is full: it has not taken its replies, and its requests wait in its own ring.
 * tick: the worker's own raw_len floats, each raw request is copied there before it is
 * checked and stepped (see below; a book request's levels go to step_book_request's own). */
static int serve_client(const fp_seg_layout *L, fp_engine *e, int i, int budget, uint64_t end,
                        fp_lat_ring *lat, float *tick, uint64_t born, fp_worker_stats *S) {
    fp_ring_ctl *ctl = fp_lay_ctl(L, i);
    uint64_t tail = FP_LOAD_RLX(&ctl->req_tail.v);
    const fp_req *q = tail < end ? published(L, ctl, tail) : NULL;
    if (!q)
        return 0;
    uint64_t rep_head = FP_LOAD_RLX(&ctl->rep_head.v);
    uint64_t rep_tail = FP_LOAD_ACQ(&ctl->rep_tail.v);
    const uint32_t raw_lines = (L->raw_len * 4u + 63u) / 64u;
    const uint32_t book_lines = (uint32_t)((sizeof(fp_req_book) + 63u) / 64u);
    int n = 0;
    uint64_t errors = 0;
    int64_t busy = 0;
    while (q && n < budget) {
        if (rep_head - rep_tail >= L->slots) {
            rep_tail = FP_LOAD_ACQ(&ctl->rep_tail.v);
            if (rep_head - rep_tail >= L->slots)
                break;
        }
        /* the kind is on the header line published() just read: no line more for it */
        const uint32_t kind = FP_LOAD_RLX(&q->kind);
        const uint32_t lines = kind == FP_REQ_BOOK ? book_lines : raw_lines;
        /* every body line at once, before the first load of the z-score stalls on line 0 */
        for (uint32_t k = 0; k < lines; k++)
            __builtin_prefetch((const char *)q->raw + 64u * k, 0, 3);
        fp_rep *r = fp_lay_rep(L, ctl, rep_head);
        const uint64_t t0 = fp_ticks();
        /* The request is read once, into the worker's own memory, and only that copy is
         * checked and stepped: the slot is the client's memory, and fp_step reads a tick
         * twice (the features with their finiteness check, then the window commit). A client
         * that changed its raw values after publishing them (a buggy producer reusing its
         * slot) had a value the check never saw committed to the symbol's window: one NaN so
         * committed made the engine refuse every later tick of that symbol, every client's,
         * for good. seq is the position published() matched, not read again. */
        const uint64_t seq = tail + 1;
        const int32_t symbol = FP_LOAD_RLX(&q->symbol);
        const int64_t ts_ns = FP_LOAD_RLX(&q->ts_ns);
        const uint64_t sent = (uint64_t)FP_LOAD_RLX(&q->sent);
        fp_result res;
        int rc, why = 0;
        uint16_t aux = 0;
        /* the client validated these; the worker still refuses what would corrupt it */
        if (symbol < 0 || (uint32_t)symbol >= L->n_symbols) {
            rc = FP_ERR_SYMBOL;
        } else if (__builtin_expect(kind == FP_REQ_RAW, 1)) {
            memcpy(tick, q->raw, sizeof(float) * L->raw_len);
            rc = ts_ns < -1 ? FP_REP_ERR_BAD_REQUEST : fp_step(e, tick, symbol, ts_ns, &res);
        } else if (kind == FP_REQ_BOOK) {
            rc = step_book_request(e, q, symbol, ts_ns, &res, &why, &aux);
        } else {
            rc = FP_REP_ERR_BAD_REQUEST;
        }
        /* sent is in the unit fp_seg_init announced: TSC ticks with a TSC engine clock; the
         * difference taken unsigned (a sent from the client's garbage must not overflow).
         * The stamp is the client's: one after t0 (in the future) or before the segment
         * was made (born, fp_worker_opts) is no submit time, and gives no wait (0) rather
         * than a wait it did not have: sent = 1 read as a wait of the machine's uptime,
         * saturated at 4.29 s on top of the stats' p99, and a TSC stamp in the future as
         * 2^64 ticks converted (a huge or negative wait_ns in the reply). */
        const uint64_t dt = t0 - sent;
        const int64_t wait = (int64_t)dt <= 0 || (born && dt > t0 - born) ? 0
                             : fp_clock.use_tsc ? fp_ticks_to_ns(dt) : (int64_t)dt;
        r->wait_ns = wait;
        r->err = rc;
        r->aux = aux;
        if (rc == FP_OK) {
            r->signal = res.signal;
            r->confidence = res.confidence;
            r->cached = (uint8_t)res.cached;
            r->reason = (uint8_t)res.reason;
            r->feature_ns = res.feature_ns;
            r->cache_ns = res.cache_ns;
            r->infer_ns = res.infer_ns;
            r->total_ns = res.total_ns;
            busy += res.total_ns;
            if (lat) {
                const uint32_t v[FP_LAT_FIELDS] = {sat32(res.feature_ns), sat32(res.cache_ns),
                                                   sat32(res.infer_ns), sat32(res.total_ns),
                                                   sat32(wait)};
                fp_lat_put(lat, v);
            }
        } else {
            r->signal = r->confidence = 0.0f;
            if (rc == FP_ERR_NOT_PROBABILITY) {
                /* the outputs the classifier head refused (fp_step left them in e->out): their
                 * range, for the client's message */
                float lo = e->out[0], hi = e->out[0];
                for (int k = 1; k < e->n_out; k++) {
                    lo = e->out[k] < lo ? e->out[k] : lo;
                    hi = e->out[k] > hi ? e->out[k] : hi;
                }
                r->signal = lo;
                r->confidence = hi;
            }
            r->cached = 0;
            r->reason = (uint8_t)why;       /* FP_ERR_BOOK: why (FP_REP_BOOK_*), else 0 */
            r->feature_ns = r->cache_ns = r->infer_ns = r->total_ns = 0;
            errors++;
        }
        /* the client spins on this line: seq last, with release, publishes the whole reply */
        FP_STORE_REL(&r->seq, seq);
        tail++;
        rep_head++;
        n++;
        /* the request slot may be reused from here on (the client reads req_tail only when
         * its ring looks full) */
        FP_STORE_REL(&ctl->req_tail.v, tail);
        FP_STORE_REL(&ctl->rep_head.v, rep_head);
        q = tail < end ? published(L, ctl, tail) : NULL;
    }
    if (n) {
        /* single writer: plain stores, no locked add on the loop's path, into the worker's
         * own memory (published to the header once a heartbeat) */
        __atomic_store_n(&S->client_served[i], S->client_served[i] + (uint64_t)n,
                         __ATOMIC_RELAXED);
        __atomic_store_n(&S->served, S->served + (uint64_t)n, __ATOMIC_RELAXED);
        __atomic_store_n(&S->busy_ns, S->busy_ns + (uint64_t)busy, __ATOMIC_RELAXED);
        if (errors)
            __atomic_store_n(&S->errors, S->errors + errors, __ATOMIC_RELAXED);
    }
    return n;
}

/* end: per client, the ring position it is served up to (NULL: no limit; the drain's) */
static int serve_all(const fp_seg_layout *L, fp_engine *e, int budget, const uint64_t *end,
                     fp_lat_ring *lat, float *tick, uint64_t born, fp_worker_stats *S) {
    fp_seg_header *h = (fp_seg_header *)L->base;
    int n = 0;
    for (uint32_t i = 0; i < L->max_clients; i++)
        if (FP_LOAD_ACQ(&h->clients[i].state) == FP_CL_ACTIVE)
            n += serve_client(L, e, (int)i, budget, end ? end[i] : UINT64_MAX, lat, tick, born,
                              S);
    return n;
}

/* 1 when it gave the CPU away (sched_yield or a sleep), 0 when it only spun */
static int idle_wait(const fp_worker_opts *o, int64_t idle_since, int64_t now,
                     uint64_t idle_run) {
    if (o->idle == FP_IDLE_SPIN || now - idle_since < o->idle_spin_ns) {
        /* right after work, poll with plain loads: the next request of a client in a
         * request/reply loop comes within a few hundred ns, and a pause (~25 ns) per poll
         * would add half of itself to each hand-off. Then throttle with pause. */
        if (idle_run > FP_WORKER_HOT_POLLS)
            FP_RING_PAUSE();
        return 0;
    }
    if (o->idle == FP_IDLE_YIELD) {
        sched_yield();
    } else {
        struct timespec ts = {0, (long)o->idle_sleep_ns};
        nanosleep(&ts, NULL);
    }
    return 1;
}

/* The server state, in the header (clients act on it) and in the worker's own counts (what
 * the server reports: the header's copy is any mapping process's to overwrite). The header
 * first: fastpath.serve() returns once the worker's own state reads RUNNING, and a
 * connect(timeout=0) right after it must find RUNNING in the header too */
static inline void set_state(fp_seg_header *h, fp_worker_stats *S, uint32_t st) {
    FP_STORE_REL(&h->state, st);
    __atomic_store_n(&S->state, st, __ATOMIC_RELEASE);
}

static inline void beat(fp_seg_header *h, fp_worker_stats *S, int64_t now) {
    __atomic_store_n(&S->heartbeat_ns, now, __ATOMIC_RELAXED);
    FP_STORE_REL(&h->heartbeat_ns, (uint64_t)now);
}

void fp_worker_run(fp_seg_header *h, uint64_t size, fp_engine *e, const fp_worker_opts *o) {
    /* the layout as fp_seg_init wrote it, copied once: every address below comes from this
     * copy, so a client's store into the live header cannot move the worker's (see
     * fp_seg_layout). A header already damaged (between fp_seg_init and here) is not served.
     * Checked against the bytes the caller mapped, not the header's own total_bytes: a
     * store of total_bytes along with slots and client_region_bytes (consistent with each
     * other) passed the check and sent the worker a gigabyte past the mapping. */
    fp_worker_stats own;
    fp_worker_stats *S = o->stats;
    if (!S) {
        memset(&own, 0, sizeof own);
        S = &own;
    }
    fp_seg_layout lay;
    if (fp_seg_layout_read(h, size, &lay) || lay.raw_len != (uint32_t)e->fs.raw_len) {
        set_state(h, S, FP_SRV_STOPPED);
        return;
    }
    /* each request's tick, copied out of its slot (serve_client); FP_SLACK zeroed floats
     * after it, as after the engine's own buffers */
    float *tick = (float *)fp_aligned_alloc(sizeof(float) * ((size_t)lay.raw_len + FP_SLACK));
    if (!tick) {
        set_state(h, S, FP_SRV_STOPPED);
        return;
    }
    const fp_seg_layout *L = &lay;
    const int64_t beat_ns = (int64_t)h->heartbeat_ms * 1000000LL;
    int64_t now = fp_ring_now_ns(), last_beat = now, idle_since = now;
    uint64_t idle_run = 0, idle_polls = 0, loops = 0, unclocked = 0;
    uint32_t probe = 0;           /* the next owner whose pid a heartbeat's reap looks at */
    reap_memo memo;               /* see reap_pass */
    for (int i = 0; i < FP_SEG_MAX_CLIENTS; i++) {
        memo.half_since[i] = 0;
        memo.owner[i] = REAP_NO_OWNER;
    }
    const int64_t grace = o->claim_grace_ns > 0 ? o->claim_grace_ns : FP_WORKER_CLAIM_GRACE_NS;
    beat(h, S, now);
    set_state(h, S, FP_SRV_RUNNING);
    for (;;) {
        int n = serve_all(L, e, 64, NULL, o->lat, tick, o->born_ticks, S);
        loops++;
        unclocked += (uint64_t)n;
        /* clock_gettime costs about a poll's worth of time: read it every 64 rounds (an idle
         * round is well under 1 us, the heartbeat is 1 ms) or every 64 requests served. A
         * busy round lasts as long as its requests: counted in rounds alone, a backlog of a
         * model taking 1 ms a tick left the heartbeat unbeaten for seconds, and clients
         * called the healthy server stalled (ServerGone) while it worked through it */
        if ((loops & 63) == 0 || unclocked >= 64) {
            now = fp_ring_now_ns();
            unclocked = 0;
        }
        if (n) {
            idle_run = 0;
        } else {
            idle_polls++;
            if (idle_run++ == 0)
                idle_since = now;
        }
        if (now - last_beat >= beat_ns) {
            last_beat = now;
            beat(h, S, now);
            __atomic_store_n(&S->idle_polls, idle_polls, __ATOMIC_RELAXED);
            __atomic_store_n(&S->loops, loops, __ATOMIC_RELAXED);
            reap_pass(L, 1, &probe, S, &memo, now, grace);
            publish(L, S);
            if (FP_LOAD_ACQ(&h->stop))
                break;
        }
        /* after a sleep or a yield the clock moved by far more than a round: read it, or
         * 64 rounds of idle_sleep_ns (up to 640 ms at 10 ms) pass between two heartbeats
         * and clients call a healthy, idle server stalled */
        if (n == 0 && idle_wait(o, idle_since, now, idle_run))
            now = fp_ring_now_ns();
    }
    /* stop: refuse new submissions, then answer what was accepted, in rounds of 64 a client
     * with the heartbeat beating between them: one round of the whole backlog left it
     * unbeaten for as long as the backlog took, and clients waiting for their answers were
     * told the server had stalled. A client that stops taking its replies holds its own
     * requests back: past drain_timeout_ns the drain ends at the first round that answers
     * none of what was accepted.
     * What was accepted: per client, what its ring could hold when the stop began (its
     * req_tail then + slots), not what it publishes: a client ignoring STOPPING (a buggy C
     * producer writing its slots by hand) that kept its ring full held the drain open until
     * a second signal, every round answering its next ticks. Not its req_head either: it
     * writes that cursor (2^62 is as easy to store). An honest submit that read RUNNING just
     * before the stop publishes after this read, and its room check may read a tail the
     * drain has already moved: its position can be req_tail + slots itself, so one more
     * (a client has one submit in flight; its next look sees STOPPING). */
    set_state(h, S, FP_SRV_STOPPING);
    /* the other half of the submit's fence (fp_client_try_submit): a client's busy read
     * after this is 0 only once its look saw STOPPING or its request is published */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    uint64_t accepted[FP_SEG_MAX_CLIENTS];
    for (uint32_t i = 0; i < L->max_clients; i++)
        accepted[i] = FP_LOAD_ACQ(&fp_lay_ctl(L, (int)i)->req_tail.v) + L->slots + 1;
    int64_t until = fp_ring_now_ns() + o->drain_timeout_ns;
    uint64_t left_before = UINT64_MAX;
    for (;;) {
        /* a second stop request (stop = 2: `fastpath serve`'s second Ctrl-C) ends the drain
         * now: what is left unanswered, its clients see STOPPED and raise ServerGone */
        if (FP_LOAD_ACQ(&h->stop) > 1)
            break;
        int n = serve_all(L, e, 64, accepted, o->lat, tick, o->born_ticks, S);
        now = fp_ring_now_ns();
        if (now - last_beat >= beat_ns) {
            last_beat = now;
            beat(h, S, now);
            reap_pass(L, 1, &probe, S, &memo, now, grace);
            publish(L, S);
        }
        int pending = 0;
        uint64_t left = 0;        /* to the clients' bounds: falls as requests are answered */
        for (uint32_t i = 0; i < L->max_clients; i++) {
            if (FP_LOAD_ACQ(&h->clients[i].state) != FP_CL_ACTIVE)
                continue;
            fp_ring_ctl *ctl = fp_lay_ctl(L, (int)i);
            const uint64_t tail = FP_LOAD_RLX(&ctl->req_tail.v);
            /* a submit that looked before the stop and has not published yet (busy) is
             * waited for: its request is below the bound and counts as accepted */
            if (FP_LOAD_ACQ(&ctl->req_head.busy) || (tail < accepted[i] && published(L, ctl, tail)))
                pending = 1;
            if (tail < accepted[i])
                left += accepted[i] - tail;
        }
        if (!pending || (now > until && left >= left_before))
            break;
        left_before = left;
        if (n == 0)
            FP_RING_PAUSE();
    }
    __atomic_store_n(&S->idle_polls, idle_polls, __ATOMIC_RELAXED);
    __atomic_store_n(&S->loops, loops, __ATOMIC_RELAXED);
    fp_aligned_free(tick);
    /* the last counts published before STOPPED: a client that sees the server stopped reads
     * its final figures */
    publish(L, S);
    beat(h, S, fp_ring_now_ns());
    set_state(h, S, FP_SRV_STOPPED);
}
