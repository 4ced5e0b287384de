# The serving segment (fp_ring.h, fp_worker.h) as the worker (fastpath._serve) and the client
# (fastpath._client) see it, and the helpers both use (fastpath/_ring.pyx).
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t

from fastpath._csrc cimport fp_engine

cdef extern from "fp_ring.h" nogil:
    enum:
        FP_SEG_HEADER_BYTES
        FP_SEG_MAX_CLIENTS
        FP_SEG_PLACEMENT_BYTES
        FP_SRV_STARTING
        FP_SRV_RUNNING
        FP_SRV_STOPPING
        FP_SRV_STOPPED
        FP_CL_FREE
        FP_CL_ACTIVE
        FP_REP_OK
        FP_REP_ERR_BAD_REQUEST
        FP_REP_ERR_NOT_PROBABILITY
        FP_REP_ERR_PARAM
        FP_REP_ERR_BOOK
        FP_REP_BOOK_PRICE
        FP_REP_BOOK_SIZE
        FP_REP_BOOK_ORDER
        FP_REP_BOOK_CROSSED
        FP_REP_BOOK_TRADE
        FP_REP_BOOK_RANGE
        FP_REP_BOOK_NOTICK
        FP_REQ_RAW
        FP_REQ_BOOK
        FP_RING_BOOK_LEVELS
        FP_SEG_VERSION
        FP_RING_OK
        FP_RING_FULL
        FP_RING_ERR_NOENT
        FP_RING_ERR_OPEN
        FP_RING_ERR_MAGIC
        FP_RING_ERR_NOSLOT
        FP_RING_ERR_GONE
        FP_RING_ERR_RECLAIMED
        FP_ON_FULL_SPIN
        FP_ON_FULL_REJECT
        FP_SEG_HUGE_NONE
        FP_SEG_HUGE_TLB
        FP_SEG_HUGE_THP
        FP_SRV_ALIVE
        FP_SRV_GONE_STOPPED
        FP_SRV_GONE_DEAD
        FP_SRV_GONE_STALLED
    ctypedef struct fp_rep:
        uint64_t seq
        float signal, confidence
        int32_t err
        uint8_t cached, reason
        uint16_t aux
        int64_t feature_ns, cache_ns, infer_ns, total_ns, wait_ns
    ctypedef struct fp_client_entry:
        uint32_t state
        int32_t pid
        uint64_t generation, served, rejected_full
    ctypedef struct fp_seg_header:
        uint64_t magic
        uint32_t version, header_bytes, raw_len, n_symbols, slots, max_clients
        uint32_t req_slot_bytes, rep_slot_bytes
        uint64_t client_region_bytes, total_bytes
        int32_t server_pid
        uint32_t on_full, heartbeat_ms, dead_after_ms, sent_clock, seg_flags, stall_ms
        uint64_t heartbeat_ns
        uint32_t state, stop
        uint64_t served, errors, idle_polls, clients_reaped, loops, busy_ns, rejected_full
        uint32_t placement_len
        char placement[1]
        fp_client_entry clients[1]
    ctypedef struct fp_seg_layout:
        uint64_t header_bytes, client_region_bytes, total_bytes
        uint32_t raw_len, n_symbols, slots, max_clients, req_slot_bytes, rep_slot_bytes
    ctypedef struct fp_seg:
        fp_seg_header *h
        size_t size
        fp_seg_layout L
    ctypedef struct fp_ring_ctl:
        pass
    ctypedef struct fp_client:
        fp_seg_header *h
        int idx
        uint64_t req_head, rep_tail, next_seq
    int64_t fp_ring_now_ns()
    int fp_seg_path(const char *name, char *out, size_t n)
    int fp_seg_attach(const char *name, fp_seg *s)
    void fp_seg_detach(fp_seg *s)
    int fp_ring_pid_dead(int32_t pid)
    int fp_seg_server_check(const fp_seg_header *h, int64_t now, int64_t stall_ns)
    int fp_client_server_check(const fp_client *c, int64_t now, int64_t stall_ns)
    int fp_seg_layout_read(const fp_seg_header *h, uint64_t size, fp_seg_layout *L)
    fp_ring_ctl *fp_lay_ctl(const fp_seg_layout *L, int idx)
    int fp_client_open(fp_seg *s, fp_client *c)
    int fp_client_try_submit(fp_client *c, const float *raw, int32_t symbol, int64_t ts_ns,
                             uint64_t *seq)
    int fp_client_try_submit_book(fp_client *c, int32_t symbol, const double *bid_px,
                                  const double *bid_sz, const double *ask_px,
                                  const double *ask_sz, int64_t ts_ns, double trade_vol,
                                  double trade_cnt, double last_trade_sz, uint64_t *seq)
    int64_t fp_rep_book_ns(const fp_rep *r)
    int fp_client_poll(fp_client *c, fp_rep *out)
    int fp_client_poll_spin(fp_client *c, fp_rep *out)
    uint64_t fp_client_outstanding(const fp_client *c)
    int fp_client_owns(const fp_client *c)
    void fp_client_close(fp_client *c)
    void FP_RING_PAUSE()

cdef extern from "fp_worker.h" nogil:
    enum:
        FP_IDLE_SPIN
        FP_IDLE_YIELD
        FP_IDLE_SLEEP
    enum:
        FP_LAT_FIELDS
    ctypedef struct fp_lat_rec:
        uint64_t stamp
    ctypedef struct fp_lat_ring:
        fp_lat_rec *rec
        uint64_t mask, count
    void fp_lat_begin(fp_lat_ring *L, fp_lat_rec **r, uint64_t *k)
    void fp_lat_end(fp_lat_ring *L, fp_lat_rec *r, uint64_t k)
    void fp_lat_put(fp_lat_ring *L, const uint32_t *v)
    size_t fp_lat_snapshot(const fp_lat_ring *L, uint32_t *out)
    ctypedef struct fp_worker_stats:
        uint64_t served, errors, busy_ns, idle_polls, loops, clients_reaped
        int64_t heartbeat_ns
        uint32_t state
        uint64_t client_served[FP_SEG_MAX_CLIENTS]
    ctypedef struct fp_worker_opts:
        int idle
        int64_t idle_spin_ns, idle_sleep_ns, drain_timeout_ns
        fp_lat_ring *lat
        uint64_t born_ticks
        fp_worker_stats *stats
        int64_t claim_grace_ns
    uint64_t fp_seg_bytes(uint32_t raw_len, uint32_t slots, uint32_t max_clients)
    void fp_seg_init(fp_seg_header *h, uint32_t raw_len, uint32_t n_symbols, uint32_t slots,
                     uint32_t max_clients, int32_t server_pid, uint32_t on_full,
                     uint32_t heartbeat_ms, uint32_t dead_after_ms, uint32_t stall_ms)
    void fp_worker_run(fp_seg_header *h, uint64_t size, fp_engine *e, const fp_worker_opts *o)
    int fp_worker_reap(fp_seg_header *h, uint64_t size)

cdef extern from "fp_engine.h" nogil:
    void fp_engine_set_stage_times(fp_engine *e, int on)
    int fp_engine_set_tick(fp_engine *e, int32_t symbol, double tick)

cdef extern from "<sys/mman.h>" nogil:
    void *mmap(void *addr, size_t length, int prot, int flags, int fd, long offset)
    int munmap(void *addr, size_t length)
    int madvise(void *addr, size_t length, int advice)
    int mlock(const void *addr, size_t length)
    int PROT_READ, PROT_WRITE, MAP_SHARED, MADV_HUGEPAGE
    void *MAP_FAILED

cdef extern from *:
    """
    static inline void fp_atomic_store_u32(uint32_t *p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
    static inline uint32_t fp_atomic_load_u32(const uint32_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
    /* *p = max(*p, v), atomically: a plain stop never undoes a forced one */
    static inline void fp_atomic_raise_u32(uint32_t *p, uint32_t v) {
        uint32_t cur = __atomic_load_n(p, __ATOMIC_ACQUIRE);
        while (cur < v && !__atomic_compare_exchange_n(p, &cur, v, 0, __ATOMIC_RELEASE,
                                                       __ATOMIC_ACQUIRE)) {}
    }
    static inline uint64_t fp_atomic_load_u64(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
    static inline void fp_atomic_add_u64(uint64_t *p, uint64_t v) { __atomic_add_fetch(p, v, __ATOMIC_RELAXED); }
    /* index of the first NaN/Inf (exponent bits all ones), or -1: no libm call, no FP compare */
    static inline int fp_first_nonfinite(const float *x, int n) {
        const uint32_t *u = (const uint32_t *)x;
        uint32_t acc = 0;
        for (int i = 0; i < n; i++)
            acc |= ((u[i] & 0x7f800000u) == 0x7f800000u);
        if (!acc) return -1;
        for (int i = 0; i < n; i++)
            if ((u[i] & 0x7f800000u) == 0x7f800000u) return i;
        return -1;
    }
    """
    void fp_atomic_store_u32(uint32_t *p, uint32_t v) nogil
    uint32_t fp_atomic_load_u32(const uint32_t *p) nogil
    void fp_atomic_raise_u32(uint32_t *p, uint32_t v) nogil
    uint64_t fp_atomic_load_u64(const uint64_t *p) nogil
    void fp_atomic_add_u64(uint64_t *p, uint64_t v) nogil
    int fp_first_nonfinite(const float *x, int n) nogil

cdef extern from "<errno.h>":
    int errno
    int EACCES


cdef inline int _errno() noexcept:
    return errno


cdef object _state_name(uint32_t st)
cdef object _pages_name(uint32_t seg_flags)
cdef void _read_published(fp_seg_header *h, const fp_seg_layout *L,
                          fp_worker_stats *S) noexcept nogil
cdef dict _header_stats(fp_seg_header *h, const fp_seg_layout *L, const fp_worker_stats *own)
