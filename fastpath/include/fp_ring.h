/* fp_ring.h: the shared-memory segment a fastpath server polls, and the client side of it.
 *
 * Plain C99 + GCC/Clang atomic builtins, no fastpath internals, so a C or C++ feed handler can
 * include it alone (fastpath.get_include()) and talk to `fastpath serve` without Python.
 *
 * Decision: one single-producer single-consumer ring pair per client (a request ring the
 * client writes and the worker reads, a reply ring the worker writes and the client reads),
 * so no slot is ever written by two parties and a cursor needs nothing stronger than a
 * release store / acquire load. Slots are fixed and 64-byte aligned.
 *
 * The hot path polls the slot, not a cursor: a slot's `seq` is its position + 1 and is stored
 * last, with release, so the party waiting for it spins on the one cache line that carries
 * the data (a request's first line holds its header, its raw values start on the next line;
 * a reply is one line). A round trip then moves the request lines, one reply line and
 * nothing else: no cursor line bounces between the cores per request. The cursors (each on
 * its own line) still count what was published and consumed, for flow control (read only
 * when a ring looks full), the drain on stop and the queue depth in the stats.
 * The submit time is a TSC reading where the worker's clock is the TSC (sent_clock), a
 * read costing under half of a clock_gettime on the client's critical path.
 *
 * The worker proves it is alive by a heartbeat it stores about every
 * millisecond even when idle; a client that sees it stale asks the kernel whether the
 * server pid still exists (or is a zombie), which turns a kill -9 into an error, never a hang.
 *
 * The segment is one file, /dev/shm/fastpath.<name>; where the server got huge pages from a
 * hugetlbfs mount that path is a symlink to the file in the mount (open() follows it), and
 * the file may be longer than total_bytes (rounded up to the page size): map st_size.
 *
 * Segment layout (FP_SEG_PREFIX + name):
 *   fp_seg_header (FP_SEG_HEADER_BYTES, includes the client table and the placement report)
 *   then max_clients client regions, each: fp_ring_ctl (4 cache lines: req head, req tail,
 *   rep head, rep tail), `slots` request slots of req_slot_bytes, `slots` reply slots of 64 B.
 *
 * A request is of one of two kinds (fp_req.kind, on its header line): a raw vector of raw_len
 * floats (FP_REQ_RAW), or one order book update (FP_REQ_BOOK: 10 levels a side, price and
 * size in double, fp_req_book, after the header line; its trades on the header line), which
 * the worker turns into the raw vector with the engine's live book (fp_step_book). A slot
 * holds either: req_slot_bytes is sized for the larger.
 */
#ifndef FP_RING_H
#define FP_RING_H

/* clock_gettime, kill, O_CLOEXEC are POSIX 2008: a strict -std=c99/c11 build hides them
 * unless asked (effective when this header comes before the system headers). Only there:
 * in the GNU modes everything is visible, and defining it would hide the BSD/GNU names
 * that the includer's own code may use. */
#if defined(__STRICT_ANSI__) && !defined(__cplusplus) && !defined(_GNU_SOURCE) && \
    !defined(_DEFAULT_SOURCE) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L
#endif

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <x86intrin.h>
#define FP_RING_PAUSE() _mm_pause()
#define FP_RING_HAVE_TSC 1
#else
#define FP_RING_PAUSE() __asm__ __volatile__("" ::: "memory")
#define FP_RING_HAVE_TSC 0
#endif
/* Polls of a reply slot between two pause instructions. A pause costs ~25 ns on recent x86
 * (Zen 4/5, Skylake+ ~40 ns), longer than the poll it throttles: waiting on pause alone
 * adds half of that to every hand-off. Plain loads first, a pause now and then. A C client
 * may define its own count before including this header. */
#ifndef FP_RING_SPIN_LOADS
#define FP_RING_SPIN_LOADS 32
#endif

/* Run between a submit's look at the server state and its publish; nothing by default. A
 * program may define it before including this header to stand for a preemption there (the
 * serving tests do, to hold a submit open across a stop). */
#ifndef FP_RING_LOOKED
#define FP_RING_LOOKED(c) ((void)0)
#endif

#define FP_SEG_MAGIC 0x31474e4952535046ULL /* "FPSRING1" little-endian */
#define FP_SEG_VERSION 3u   /* 3: request kinds (book updates), the reply's aux, req_head.busy */
#define FP_SEG_DIR "/dev/shm/"
#define FP_SEG_PREFIX "fastpath."
#define FP_SEG_HEADER_BYTES 16384u
#define FP_SEG_MAX_CLIENTS 64
#define FP_SEG_PLACEMENT_BYTES 8192u
#define FP_SEG_NAME_MAX 200

/* server state (fp_seg_header.state) */
enum { FP_SRV_STARTING = 0, FP_SRV_RUNNING = 1, FP_SRV_STOPPING = 2, FP_SRV_STOPPED = 3 };
/* client table entry state. RETIRED: the worker took the slot back from an owner whose pid
 * looks dead (its generation moved on) and offers it again only a heartbeat later, once
 * whatever a call of that owner still in flight has stored is cleared (fp_worker.c) */
enum { FP_CL_FREE = 0, FP_CL_CLAIMED = 1, FP_CL_ACTIVE = 2, FP_CL_CLOSING = 3, FP_CL_RETIRED = 4 };
/* reply error codes: 0, the engine's own codes (fp_engine.h FP_ERR_*, same values), or the
 * worker's refusal of a request the client should never have sent */
enum {
    FP_REP_OK = 0,
    FP_REP_ERR_SYMBOL = -1,
    FP_REP_ERR_NONFINITE_INPUT = -2,
    FP_REP_ERR_TIME_BACKWARDS = -3,
    FP_REP_ERR_NONFINITE_OUTPUT = -4,
    FP_REP_ERR_PARAM = -6,             /* a book update to a model whose raw_len is not 256,
                                          or with ts_ns < 0 */
    FP_REP_ERR_NONFINITE_FEATURE = -7,
    FP_REP_ERR_NOT_PROBABILITY = -8,   /* signal / confidence: the outputs' min / max */
    FP_REP_ERR_BOOK = -9,              /* a book update refused: reason = FP_REP_BOOK_*,
                                          aux = where (see below) */
    FP_REP_ERR_BAD_REQUEST = -100,     /* ts_ns below -1, or an unknown kind: refused by the
                                          worker */
};
/* request kinds (fp_req.kind) */
enum { FP_REQ_RAW = 0, FP_REQ_BOOK = 1 };
#define FP_RING_BOOK_LEVELS 10
/* Why a book update was refused (an FP_REP_ERR_BOOK reply's reason; fp_book.h's
 * FP_BOOK_ERR_*, same values) and where (its aux): PRICE, SIZE, ORDER: side * 256 + level
 * (0-based; side FP_REP_BOOK_BID_PX .. FP_REP_BOOK_ASK_SZ); TRADE: 0 trade_vol, 1 trade_cnt,
 * 2 last_trade_sz; RANGE: the raw field past float32's range; CROSSED, NOTICK: 0. The
 * update changed nothing: the symbol's book, window and cache are as they were. */
enum {
    FP_REP_BOOK_PRICE = 1,             /* a price not finite or <= 0 */
    FP_REP_BOOK_SIZE = 2,              /* a size not finite or < 0 */
    FP_REP_BOOK_ORDER = 3,             /* a level above (bid) / below (ask) the one before */
    FP_REP_BOOK_CROSSED = 4,           /* best bid >= best ask */
    FP_REP_BOOK_TRADE = 5,             /* a trade field not finite, or a count or size < 0 */
    FP_REP_BOOK_RANGE = 6,             /* a raw field past float32's range */
    FP_REP_BOOK_NOTICK = 7,            /* the server has no tick size for the symbol */
};
enum { FP_REP_BOOK_BID_PX = 0, FP_REP_BOOK_BID_SZ = 1, FP_REP_BOOK_ASK_PX = 2, FP_REP_BOOK_ASK_SZ = 3 };
/* an accepted book update's aux: its book stage in ns, saturated at FP_REP_BOOK_NS_MAX;
 * FP_REP_BOOK_NS_NONE: not measured ([engine] stage_times = false). 0 for a raw vector. */
#define FP_REP_BOOK_NS_MAX 65534u
#define FP_REP_BOOK_NS_NONE 65535u
/* client call results */
enum {
    FP_RING_OK = 0,
    FP_RING_FULL = 1,          /* request ring full (on_full = "reject": counted in rejected_full) */
    FP_RING_ERR_NOENT = -1,    /* no segment by that name */
    FP_RING_ERR_OPEN = -2,     /* open/mmap failed (errno kept) */
    FP_RING_ERR_MAGIC = -3,    /* not a fastpath segment, or another version */
    FP_RING_ERR_NOSLOT = -4,   /* every client slot taken */
    FP_RING_ERR_GONE = -5,     /* server dead, stopping or stopped */
    FP_RING_ERR_RECLAIMED = -6, /* the worker freed this client's slot: the client is done */
    FP_RING_ERR_CLOSED = -7,   /* the client was closed (fp_client_close) or never opened */
};
/* on_full policy (fp_seg_header.on_full) */
enum { FP_ON_FULL_SPIN = 0, FP_ON_FULL_REJECT = 1 };
/* fp_seg_header.sent_clock */
enum { FP_CLOCK_MONO = 0, FP_CLOCK_TSC = 1 };
/* fp_seg_header.seg_flags */
enum { FP_SEG_HUGE_NONE = 0, FP_SEG_HUGE_TLB = 1, FP_SEG_HUGE_THP = 2 };
/* fp_seg_server_check() */
enum { FP_SRV_ALIVE = 0, FP_SRV_GONE_STOPPED = 1, FP_SRV_GONE_DEAD = 2, FP_SRV_GONE_STALLED = 3 };

/* gen is used in req_head only: the worker stores the slot's generation there when it frees
 * the slot (fp_client_entry.generation, bumped), on the line the client writes on every
 * submit, so checking it costs the client nothing. A client whose slot was freed under it
 * (its pid looked dead to the server: another PID namespace) then stops at its next call
 * instead of writing into rings that may already belong to the slot's next owner. */
/* busy is used in req_head only: 1 while a submit is between its look at the server's state
 * and its publish. A stopping worker's drain waits for it (fp_client_try_submit says why). */
typedef struct { uint64_t v; uint64_t gen; uint64_t busy; char _pad[40]; } __attribute__((aligned(64))) fp_ring_cursor;

typedef struct {
    fp_ring_cursor req_head;   /* written by the client: requests published */
    fp_ring_cursor req_tail;   /* written by the worker: requests consumed */
    fp_ring_cursor rep_head;   /* written by the worker: replies published */
    fp_ring_cursor rep_tail;   /* written by the client: replies consumed */
} fp_ring_ctl;

/* One request: the header line, then from the next line on raw_len values (FP_REQ_RAW) or
 * one fp_req_book (FP_REQ_BOOK). */
typedef struct {
    uint64_t seq;              /* the client's own count, from 1 = ring position + 1; stored last */
    int64_t ts_ns;             /* tick time (ns >= 0), or -1 for the server's engine clock
                                  (a book update: its time, >= 0) */
    int64_t sent;              /* submit time: TSC ticks or CLOCK_MONOTONIC ns (sent_clock) */
    int32_t symbol;
    uint32_t kind;             /* FP_REQ_*: what follows the header line */
    /* FP_REQ_BOOK: the trades since the symbol's previous update (fastpath.lob.BookStream's):
     * signed volume, count, size of the last one (0 when none) */
    double trade_vol, trade_cnt, last_trade_sz;
    char _line[8];
    float raw[];               /* raw_len values or an fp_req_book, slot padded to a multiple
                                  of 64 bytes */
} __attribute__((aligned(64))) fp_req;

/* A book update's levels, level 1 first (the top FP_RING_BOOK_LEVELS of each side) */
typedef struct {
    double bid_px[FP_RING_BOOK_LEVELS], bid_sz[FP_RING_BOOK_LEVELS];
    double ask_px[FP_RING_BOOK_LEVELS], ask_sz[FP_RING_BOOK_LEVELS];
} fp_req_book;

/* the levels of a book request (r->kind == FP_REQ_BOOK) */
static inline fp_req_book *fp_req_book_of(fp_req *r) {
    return (fp_req_book *)(void *)r->raw;
}

typedef struct {
    uint64_t seq;              /* the request's seq = ring position + 1; stored last */
    float signal, confidence;
    int32_t err;               /* FP_REP_* */
    uint8_t cached, reason;    /* reason: 0 hit, 1 cold, 2 age, 3 run, 4 cosine, 5 norm, 6 disabled;
                                  FP_REP_ERR_BOOK: why (FP_REP_BOOK_*) */
    uint16_t aux;              /* FP_REP_ERR_BOOK: where; a book update answered: its book
                                  stage (fp_rep_book_ns); 0 otherwise */
    int64_t feature_ns, cache_ns, infer_ns, total_ns;
    int64_t wait_ns;           /* submit (sent) to the worker picking it up */
} __attribute__((aligned(64))) fp_rep;

/* state and pid are one aligned 8-byte word (fp_cl_word): a client claims a slot by one
 * compare-and-swap of both, FREE to CLAIMED with its pid, so that no claimed slot is ever
 * without its owner's pid. Claimed first and the pid stored next, a client killed between
 * the two left a slot CLAIMED with pid 0, which the reaper (it probes pids) never took back:
 * the slot was lost for good. The worker still takes back a slot claimed without a pid (a
 * client built against an older fp_ring.h, a forged store) once it has been so for the
 * server's stall_timeout_ms (fp_worker.c). A client built against an older fp_ring.h that was
 * only stalled that long between its claim and its pid store (SIGSTOP, a debugger) stores its
 * pid and ACTIVE when it resumes, whoever has the slot by then; the worker, which sees an
 * ACTIVE slot's pid change, takes the slot back within a heartbeat, and both clients stop
 * (FP_RING_ERR_RECLAIMED, fp_client_owns() false) rather than go on sharing one ring pair
 * (not when it resumes within a heartbeat of the other's claim: the worker sees its pid
 * first): build C clients against this header. */
typedef struct {
    uint32_t state;            /* FP_CL_* */
    int32_t pid;               /* the owner's, stored with the claim */
    uint64_t generation;       /* bumped each time the worker frees the slot */
    uint64_t served;           /* published by the worker about once a heartbeat */
    uint64_t rejected_full;    /* counted by the client itself */
    char _pad[32];
} __attribute__((aligned(64))) fp_client_entry;

typedef uint64_t __attribute__((may_alias, aligned(8))) fp_cl_word_t;

/* the word (state, pid) of a client entry, as one 8-byte value */
static inline uint64_t fp_cl_word(uint32_t state, int32_t pid) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    return (uint64_t)state << 32 | (uint64_t)(uint32_t)pid;
#else
    return (uint64_t)(uint32_t)pid << 32 | (uint64_t)state;
#endif
}

static inline uint32_t fp_cl_word_state(uint64_t w) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    return (uint32_t)(w >> 32);
#else
    return (uint32_t)w;
#endif
}

typedef struct {
    uint64_t magic;
    uint32_t version, header_bytes;
    uint32_t raw_len, n_symbols, slots, max_clients;
    uint32_t req_slot_bytes, rep_slot_bytes;
    uint64_t client_region_bytes, total_bytes;
    int32_t server_pid;
    uint32_t on_full;          /* FP_ON_FULL_* */
    uint32_t heartbeat_ms, dead_after_ms;
    uint32_t sent_clock;       /* FP_CLOCK_*: what fp_req.sent counts in */
    uint32_t seg_flags;        /* FP_SEG_HUGE_*: what backs the segment (reported) */
    uint32_t stall_ms;         /* the server's [serve] stall_timeout_ms: clients' default */
    uint32_t _pad0;
    /* read by clients on every submit: written about once per heartbeat only */
    uint64_t heartbeat_ns __attribute__((aligned(64)));  /* CLOCK_MONOTONIC of the last beat */
    uint32_t state;            /* FP_SRV_* */
    uint32_t stop;             /* set by anyone to ask the worker to drain and stop */
    /* the worker's counts as it publishes them for clients, about once a heartbeat (and
     * when it stops): a copy, which any process mapping the segment can overwrite. The
     * worker counts in its own memory (fp_worker_stats), and the server's stats read that */
    uint64_t served __attribute__((aligned(64)));
    uint64_t errors, idle_polls, clients_reaped, loops;
    uint64_t busy_ns;          /* time in fp_step, for the utilisation figure */
    /* counted by the clients themselves (atomic add): on_full = "reject" refusals happen in
     * the client and only the client can count them; a figure any client can also inflate */
    uint64_t rejected_full __attribute__((aligned(64)));
    uint32_t placement_len __attribute__((aligned(64)));
    char placement[FP_SEG_PLACEMENT_BYTES];   /* JSON, written once before RUNNING */
    fp_client_entry clients[FP_SEG_MAX_CLIENTS] __attribute__((aligned(64)));
} fp_seg_header;

#define FP_LOAD_ACQ(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define FP_STORE_REL(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define FP_LOAD_RLX(p) __atomic_load_n((p), __ATOMIC_RELAXED)

static inline int64_t fp_ring_now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* The client's submit stamp in the unit the worker asked for. */
static inline int64_t fp_ring_sent_stamp(uint32_t sent_clock) {
#if FP_RING_HAVE_TSC
    if (sent_clock == FP_CLOCK_TSC)
        return (int64_t)__rdtsc();
#endif
    (void)sent_clock;
    return fp_ring_now_ns();
}

/* A slot holds a raw vector or a book update, whichever is larger */
static inline uint32_t fp_ring_req_slot_bytes(uint32_t raw_len) {
    const uint64_t raw = 4u * (uint64_t)raw_len;
    const uint64_t body = raw > sizeof(fp_req_book) ? raw : sizeof(fp_req_book);
    return (uint32_t)((sizeof(fp_req) + body + 63u) & ~(uint64_t)63u);
}

/* An answered book update's book stage in ns (its reply's aux), or -1 when not measured */
static inline int64_t fp_rep_book_ns(const fp_rep *r) {
    return r->aux == FP_REP_BOOK_NS_NONE ? -1 : (int64_t)r->aux;
}

static inline uint64_t fp_ring_client_region_bytes(uint32_t raw_len, uint32_t slots) {
    return sizeof(fp_ring_ctl) + (uint64_t)slots * (fp_ring_req_slot_bytes(raw_len) + sizeof(fp_rep));
}

/* "/dev/shm/fastpath.<name>" into out; -1 when the name is empty, too long or has a '/' */
static inline int fp_seg_path(const char *name, char *out, size_t n) {
    size_t len = strlen(name);
    if (len == 0 || len > FP_SEG_NAME_MAX || strchr(name, '/'))
        return -1;
    snprintf(out, n, "%s%s%s", FP_SEG_DIR, FP_SEG_PREFIX, name);
    return 0;
}

/* The segment's layout as one party addresses it: the header's layout fields copied once and
 * checked as copied (fp_seg_layout_read), never read from the shared header again. Every
 * slot and ring address a party computes comes from its own copy, so a store into the live
 * header (a stray write of a buggy producer: any process that maps the segment can make it)
 * cannot move that party's loads and stores out of the segment. Read live, one 4-byte store
 * of max_clients = 1000 overflowed the worker's stack when it stopped, and slots = 2^20 or
 * req_slot_bytes = 10^6 sent the worker's and the clients' stores past the mapping: the
 * server that every other client relied on died with a segfault. */
typedef struct {
    char *base;                 /* the header's address (the mapping's start) */
    uint64_t header_bytes, client_region_bytes, total_bytes;
    uint32_t raw_len, n_symbols, slots, max_clients, req_slot_bytes, rep_slot_bytes;
} fp_seg_layout;

/* Copy h's layout fields into *L (each read once) and check the copy against itself and
 * against `size`, the bytes mapped: 0, or -1 when the fields disagree (a corrupt or
 * hand-made header: a client indexed the client table past its 64 entries or copied a tick
 * past its request slot when it trusted them). */
static inline int fp_seg_layout_read(const fp_seg_header *h, uint64_t size, fp_seg_layout *L) {
    const volatile fp_seg_header *v = h;   /* one load per field: the copy is what is checked */
    L->base = (char *)h;
    L->header_bytes = v->header_bytes;
    L->client_region_bytes = v->client_region_bytes;
    L->total_bytes = v->total_bytes;
    L->raw_len = v->raw_len;
    L->n_symbols = v->n_symbols;
    L->slots = v->slots;
    L->max_clients = v->max_clients;
    L->req_slot_bytes = v->req_slot_bytes;
    L->rep_slot_bytes = v->rep_slot_bytes;
    if (L->total_bytes > size || L->header_bytes != FP_SEG_HEADER_BYTES ||
        L->slots == 0 || (L->slots & (L->slots - 1)) != 0 || L->slots > (1u << 24) ||
        L->max_clients == 0 || L->max_clients > FP_SEG_MAX_CLIENTS || L->raw_len == 0 ||
        L->raw_len > (1u << 24) || L->req_slot_bytes != fp_ring_req_slot_bytes(L->raw_len) ||
        L->rep_slot_bytes != sizeof(fp_rep) ||
        L->client_region_bytes != fp_ring_client_region_bytes(L->raw_len, L->slots) ||
        L->total_bytes != FP_SEG_HEADER_BYTES + (uint64_t)L->max_clients * L->client_region_bytes)
        return -1;
    return 0;
}

typedef struct {
    fp_seg_header *h;
    size_t size;
    fp_seg_layout L;            /* the layout as checked at attach: address the rings by it */
} fp_seg;

/* Map an existing segment read-write. Returns FP_RING_OK or FP_RING_ERR_* (errno kept). */
static inline int fp_seg_attach(const char *name, fp_seg *s) {
    char path[512];
    struct stat st;
    s->h = NULL;
    s->size = 0;
    if (fp_seg_path(name, path, sizeof path))
        return FP_RING_ERR_NOENT;
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? FP_RING_ERR_NOENT : FP_RING_ERR_OPEN;
    if (fstat(fd, &st) || (size_t)st.st_size < sizeof(fp_seg_header)) {
        close(fd);
        return FP_RING_ERR_MAGIC;
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return FP_RING_ERR_OPEN;
    fp_seg_header *h = (fp_seg_header *)p;
    /* the layout fields are checked against each other, not only the magic: every slot and
     * ring address a client computes comes from them, and a header that disagrees with
     * itself (a corrupt or hand-made file under the name) made a client index the client
     * table past its 64 entries or copy a tick past its request slot */
    if (h->magic != FP_SEG_MAGIC || h->version != FP_SEG_VERSION ||
        fp_seg_layout_read(h, (uint64_t)st.st_size, &s->L)) {
        munmap(p, (size_t)st.st_size);
        return FP_RING_ERR_MAGIC;
    }
    s->h = h;
    s->size = (size_t)st.st_size;
    return FP_RING_OK;
}

static inline void fp_seg_detach(fp_seg *s) {
    if (s->h)
        munmap((void *)s->h, s->size);
    s->h = NULL;
}

/* 1 when pid does not exist or is a zombie (killed, not yet reaped) */
static inline int fp_ring_pid_dead(int32_t pid) {
    char path[64], buf[256];
    if (pid <= 0)
        return 1;
    if (kill(pid, 0) == -1 && errno == ESRCH)
        return 1;
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    const char *rp = strrchr(buf, ')');   /* the command name may hold spaces and ')' */
    return rp && rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X');
}

/* Is the server there? FP_SRV_ALIVE, or why not. A stale heartbeat alone is not death (the
 * worker may be descheduled on a busy host): the pid decides, and a live pid whose loop has
 * not beaten for stall_ns counts as stalled. A client waiting for replies asks
 * fp_client_server_check instead. */
static inline int fp_seg_server_check(const fp_seg_header *h, int64_t now, int64_t stall_ns) {
    uint32_t st = FP_LOAD_ACQ(&h->state);
    if (st == FP_SRV_STOPPED)
        return FP_SRV_GONE_STOPPED;
    int64_t beat = (int64_t)FP_LOAD_ACQ(&h->heartbeat_ns);
    int64_t age = now - beat;
    if (age <= (int64_t)h->dead_after_ms * 1000000LL)
        return FP_SRV_ALIVE;
    if (fp_ring_pid_dead(h->server_pid))
        return FP_SRV_GONE_DEAD;
    if (st == FP_SRV_STARTING)
        return FP_SRV_ALIVE;
    return age > stall_ns ? FP_SRV_GONE_STALLED : FP_SRV_ALIVE;
}

/* Addresses by a checked layout copy (fp_seg_layout_read): what the worker and the client
 * functions below use */
static inline fp_ring_ctl *fp_lay_ctl(const fp_seg_layout *L, int idx) {
    return (fp_ring_ctl *)(L->base + L->header_bytes + (uint64_t)idx * L->client_region_bytes);
}

static inline fp_req *fp_lay_req(const fp_seg_layout *L, fp_ring_ctl *ctl, uint64_t i) {
    return (fp_req *)((char *)ctl + sizeof(fp_ring_ctl) + (i & (L->slots - 1)) * L->req_slot_bytes);
}

static inline fp_rep *fp_lay_rep(const fp_seg_layout *L, fp_ring_ctl *ctl, uint64_t i) {
    return (fp_rep *)((char *)ctl + sizeof(fp_ring_ctl) + (uint64_t)L->slots * L->req_slot_bytes +
                      (i & (L->slots - 1)) * sizeof(fp_rep));
}

/* The same from the live header's fields (kept for code written against them): only as safe
 * as the header is intact; prefer fp_lay_* with the fp_seg's layout */
static inline fp_ring_ctl *fp_seg_ctl(const fp_seg_header *h, int idx) {
    return (fp_ring_ctl *)((char *)h + h->header_bytes + (uint64_t)idx * h->client_region_bytes);
}

static inline fp_req *fp_seg_req(const fp_seg_header *h, fp_ring_ctl *ctl, uint64_t i) {
    return (fp_req *)((char *)ctl + sizeof(fp_ring_ctl) + (i & (h->slots - 1)) * h->req_slot_bytes);
}

static inline fp_rep *fp_seg_rep(const fp_seg_header *h, fp_ring_ctl *ctl, uint64_t i) {
    return (fp_rep *)((char *)ctl + sizeof(fp_ring_ctl) + (uint64_t)h->slots * h->req_slot_bytes +
                      (i & (h->slots - 1)) * sizeof(fp_rep));
}

/* ------------------------------------------------------------------ client side */
typedef struct {
    fp_seg_header *h;
    fp_ring_ctl *ctl;
    int idx;
    fp_seg_layout L;                    /* the segment's layout as checked at attach */
    uint64_t req_head, req_tail_seen;   /* own head; the worker's tail as last read */
    uint64_t rep_tail;
    uint64_t next_seq;
    uint64_t gen;                       /* the slot's generation when claimed */
    uint32_t sent_clock;
} fp_client;

/* Claim a free client slot for this process (its state and this pid in one atomic store).
 * FP_RING_OK, FP_RING_ERR_NOSLOT or _GONE. */
static inline int fp_client_open(fp_seg *s, fp_client *c) {
    fp_seg_header *h = s->h;
    if (FP_LOAD_ACQ(&h->state) >= FP_SRV_STOPPING)
        return FP_RING_ERR_GONE;
    const int32_t pid = (int32_t)getpid();
    for (uint32_t i = 0; i < s->L.max_clients; i++) {
        fp_client_entry *e = &h->clients[i];
        fp_cl_word_t *w = (fp_cl_word_t *)&e->state;
        /* the claim and the pid in one store (see fp_client_entry); a FREE slot's pid is
         * whatever was left there, replaced */
        uint64_t cur = __atomic_load_n(w, __ATOMIC_ACQUIRE);
        int claimed = 0;
        while (fp_cl_word_state(cur) == FP_CL_FREE && !claimed)
            claimed = __atomic_compare_exchange_n(w, &cur, fp_cl_word(FP_CL_CLAIMED, pid), 0,
                                                  __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
        if (!claimed)
            continue;
        /* the worker zeroed the cursors before it freed the slot */
        e->served = 0;
        e->rejected_full = 0;
        c->h = h;
        c->idx = (int)i;
        c->L = s->L;
        c->ctl = fp_lay_ctl(&c->L, (int)i);
        c->req_head = FP_LOAD_ACQ(&c->ctl->req_head.v);
        c->req_tail_seen = FP_LOAD_ACQ(&c->ctl->req_tail.v);
        c->rep_tail = FP_LOAD_ACQ(&c->ctl->rep_tail.v);
        c->next_seq = c->req_head + 1;    /* seq = ring position + 1, from 1 */
        c->gen = FP_LOAD_ACQ(&c->ctl->req_head.gen);
        c->sent_clock = h->sent_clock;
        /* CLAIMED with this pid to ACTIVE: a slot the worker took back meanwhile (it does
         * not take one whose claimant's pid lives; a store by another process may) is left */
        cur = fp_cl_word(FP_CL_CLAIMED, pid);
        if (__atomic_compare_exchange_n(w, &cur, fp_cl_word(FP_CL_ACTIVE, pid), 0,
                                        __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
            return FP_RING_OK;
    }
    c->h = NULL;
    c->ctl = NULL;
    return FP_RING_ERR_NOSLOT;
}

/* 1 while the slot is still this client's (the worker has not freed it since it was claimed);
 * 0 once the client is closed. The fp_client_* calls on a closed client touch neither the
 * header nor the rings (fp_client_close clears both pointers, and the segment may have been
 * detached since): a call after the close dereferenced the NULL header and segfaulted the
 * caller's process, a feed handler's shutdown path calling one more submit. */
static inline int fp_client_owns(const fp_client *c) {
    return c->h != NULL && FP_LOAD_ACQ(&c->ctl->req_head.gen) == c->gen;
}

/* fp_seg_server_check for a client waiting for its replies (FP_RING_ERR_CLOSED for a closed
 * client): FP_SRV_ALIVE while a reply waits
 * in its ring. A stopping server's drain publishes its last replies before it stores STOPPED
 * (release stores, in that order): a reply published between the client's last poll and the
 * state check is there once the state is seen, and "gone" said it never came. */
static inline int fp_client_server_check(const fp_client *c, int64_t now, int64_t stall_ns) {
    if (c->h == NULL)
        return FP_RING_ERR_CLOSED;      /* closed: not FP_SRV_ALIVE, so a wait ends */
    int chk = fp_seg_server_check(c->h, now, stall_ns);
    if (chk != FP_SRV_ALIVE && fp_client_owns(c) &&
        FP_LOAD_ACQ(&fp_lay_rep(&c->L, c->ctl, c->rep_tail)->seq) == c->rep_tail + 1)
        return FP_SRV_ALIVE;
    return chk;
}

/* The slot for the client's next request, or why there is none: FP_RING_OK with *out set,
 * else what fp_client_try_submit returns, with nothing written. */
static inline int fp_client_next_slot(fp_client *c, fp_req **out) {
    fp_seg_header *h = c->h;
    if (h == NULL)
        return FP_RING_ERR_CLOSED;
    if (!fp_client_owns(c))
        return FP_RING_ERR_RECLAIMED;
    /* a stopping server answers what was sent before its stop (the drain): a request sent
     * after it kept the drain busy (a feed handler that goes on submitting held it for the
     * whole drain_timeout_ms) or came once the drain had ended and was never answered. The
     * state shares the heartbeat's line, written about once a millisecond.
     * busy = 1 before the look (a full fence: the store before the load), 0 after the
     * publish: a drain that ends on seeing busy 0 (after its own STOPPING and fence) has
     * either seen this request published or made this look see STOPPING. Without it, a
     * submit preempted between a look that saw RUNNING and its publish was sent and never
     * answered. A caller given a slot (FP_RING_OK) must publish it. */
    fp_ring_cursor *own = &c->ctl->req_head;
    __atomic_store_n(&own->busy, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&h->state, __ATOMIC_SEQ_CST) >= FP_SRV_STOPPING) {
        FP_STORE_REL(&own->busy, 0);
        return FP_RING_ERR_GONE;
    }
    FP_RING_LOOKED(c);
    if (c->req_head - c->req_tail_seen >= c->L.slots) {
        c->req_tail_seen = FP_LOAD_ACQ(&c->ctl->req_tail.v);
        if (c->req_head - c->req_tail_seen >= c->L.slots) {
            /* counted here, for every client the header serves (the Python client included):
             * the header's comment said a C client's refusal was counted while only the
             * Python client added it, and stats() showed rejected_full 0 for a C feed
             * handler dropping ticks. The client's own entry has one writer, this client */
            if (FP_LOAD_RLX(&h->on_full) == FP_ON_FULL_REJECT) {
                fp_client_entry *e = &h->clients[c->idx];
                __atomic_add_fetch(&h->rejected_full, 1, __ATOMIC_RELAXED);
                FP_STORE_REL(&e->rejected_full, FP_LOAD_RLX(&e->rejected_full) + 1);
            }
            FP_STORE_REL(&own->busy, 0);
            return FP_RING_FULL;
        }
    }
    *out = fp_lay_req(&c->L, c->ctl, c->req_head);
    return FP_RING_OK;
}

/* Publish the request whose body is written: its header line in one go, ending with the
 * release store of seq (the worker spins on that line), then the cursor. */
static inline void fp_client_publish(fp_client *c, fp_req *r, uint32_t kind, int32_t symbol,
                                     int64_t ts_ns, uint64_t *seq) {
    r->ts_ns = ts_ns;
    r->symbol = symbol;
    r->kind = kind;
    r->sent = fp_ring_sent_stamp(c->sent_clock);
    FP_STORE_REL(&r->seq, c->next_seq);
    c->req_head++;
    /* for the stats and the drain; the worker does not read it per request */
    FP_STORE_REL(&c->ctl->req_head.v, c->req_head);
    FP_STORE_REL(&c->ctl->req_head.busy, 0);     /* set by fp_client_next_slot */
    *seq = c->next_seq++;
}

/* Publish one request (raw must hold raw_len finite floats; the caller validated it).
 * FP_RING_OK with *seq set; FP_RING_FULL (counted in the server's rejected_full when its
 * on_full is "reject": there the caller drops the tick; under "spin" it is a wait, not a
 * refusal), FP_RING_ERR_GONE (the server is stopping or
 * stopped: it takes no new request), FP_RING_ERR_CLOSED (after fp_client_close) or
 * FP_RING_ERR_RECLAIMED with nothing written and *seq = 0, a seq no reply carries (a loop written before RECLAIMED existed, retrying only
 * on FULL, then waits on a reply that never comes: check fp_client_owns where it checks
 * fp_seg_server_check). */
static inline int fp_client_try_submit(fp_client *c, const float *raw, int32_t symbol,
                                       int64_t ts_ns, uint64_t *seq) {
    fp_req *r;
    *seq = 0;
    const int rc = fp_client_next_slot(c, &r);
    if (rc != FP_RING_OK)
        return rc;
    /* the raw lines first (nobody polls them), then the header line */
    memcpy(r->raw, raw, sizeof(float) * c->L.raw_len);
    fp_client_publish(c, r, FP_REQ_RAW, symbol, ts_ns, seq);
    return FP_RING_OK;
}

/* Publish one order book update of `symbol`, as fastpath's Engine.step_book takes it:
 * bid_px, bid_sz, ask_px, ask_sz: FP_RING_BOOK_LEVELS doubles each, level 1 first; ts_ns:
 * the update's time (ns >= 0, not going backwards per symbol); trade_vol, trade_cnt,
 * last_trade_sz: the trades since the symbol's previous update (signed volume, count, size
 * of the last one; 0, 0, 0 for none). The worker checks the update (a crossed or locked
 * book, a bad price, size or order of levels, time going back, no tick size for the
 * symbol on the server: an error reply, FP_REP_ERR_BOOK with reason and aux, or an engine
 * code, and nothing changed) and answers as it answers a raw vector, the reply's aux
 * holding the book stage's time (fp_rep_book_ns). The server's model must read the 256-value
 * raw vector of fastpath.lob (else FP_REP_ERR_PARAM). Returns as fp_client_try_submit. */
static inline int fp_client_try_submit_book(fp_client *c, int32_t symbol, const double *bid_px,
                                            const double *bid_sz, const double *ask_px,
                                            const double *ask_sz, int64_t ts_ns,
                                            double trade_vol, double trade_cnt,
                                            double last_trade_sz, uint64_t *seq) {
    fp_req *r;
    *seq = 0;
    const int rc = fp_client_next_slot(c, &r);
    if (rc != FP_RING_OK)
        return rc;
    fp_req_book *b = fp_req_book_of(r);
    const size_t side = sizeof(double) * FP_RING_BOOK_LEVELS;
    memcpy(b->bid_px, bid_px, side);
    memcpy(b->bid_sz, bid_sz, side);
    memcpy(b->ask_px, ask_px, side);
    memcpy(b->ask_sz, ask_sz, side);
    r->trade_vol = trade_vol;
    r->trade_cnt = trade_cnt;
    r->last_trade_sz = last_trade_sz;
    fp_client_publish(c, r, FP_REQ_BOOK, symbol, ts_ns, seq);
    return FP_RING_OK;
}

/* Take the next reply if there is one: 1 (copied to *out) or 0 (none, or the slot is no
 * longer this client's: fp_client_owns tells; a reply there would be the next owner's). */
static inline int fp_client_poll(fp_client *c, fp_rep *out) {
    if (c->h == NULL)
        return 0;                       /* closed: the rings may be unmapped by now */
    const fp_rep *r = fp_lay_rep(&c->L, c->ctl, c->rep_tail);
    if (FP_LOAD_ACQ(&r->seq) != c->rep_tail + 1 || !fp_client_owns(c))
        return 0;
    *out = *r;
    c->rep_tail++;
    FP_STORE_REL(&c->ctl->rep_tail.v, c->rep_tail);
    return 1;
}

/* fp_client_poll up to FP_RING_SPIN_LOADS times, then one pause: 1 (a reply in *out) or 0.
 * The wait loop of a caller that spins for its answer. */
static inline int fp_client_poll_spin(fp_client *c, fp_rep *out) {
    if (c->h == NULL)
        return 0;
    const fp_rep *r = fp_lay_rep(&c->L, c->ctl, c->rep_tail);
    const uint64_t want = c->rep_tail + 1;
    for (int i = 0; i < FP_RING_SPIN_LOADS; i++)
        if (FP_LOAD_RLX(&r->seq) == want)
            return fp_client_poll(c, out);
    FP_RING_PAUSE();
    return fp_client_poll(c, out);
}

/* Requests submitted whose replies have not been taken yet */
static inline uint64_t fp_client_outstanding(const fp_client *c) {
    return c->req_head - c->rep_tail;
}

/* Give the slot back; the worker drops what is left in the rings and frees it. A slot the
 * worker already freed is left alone: it may be the next client's by now. The client is
 * closed from here on: its calls return FP_RING_ERR_CLOSED (or 0: fp_client_poll*,
 * fp_client_owns) without touching the segment, which may be detached next. */
static inline void fp_client_close(fp_client *c) {
    if (c->h && fp_client_owns(c)) {
        uint32_t want = FP_CL_ACTIVE;
        __atomic_compare_exchange_n(&c->h->clients[c->idx].state, &want, FP_CL_CLOSING, 0,
                                    __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
    }
    c->h = NULL;
    c->ctl = NULL;
}

#endif
