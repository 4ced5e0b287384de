# cython: language_level=3
"""The serving loop's bindings: the worker (segment owner + its own fp_engine + the C loop run
without the GIL) and the client (validation, submit, spin for the reply) over fp_ring.h.

Design: everything per request is C: the client validates exactly as Engine.step does (type,
dtype, shape, contiguity, symbol range, ts_ns, finiteness) before a byte reaches the ring,
then one inline call publishes it; the worker never holds the GIL. The worker builds its own
fp_engine from the Model with the same parameter preparation as Engine (fastpath._engine keeps
its pointer private), so a served tick and a local Engine.step give the same answer.
"""
cimport cython
cimport numpy as cnp
from cpython.mem cimport PyMem_Malloc, PyMem_Free
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memset

from fastpath._csrc cimport *
from fastpath._engine cimport Result
from fastpath._core cimport _make_engine, _symbol_arg, _ts_arg

import json
import operator
import os
import weakref

import numpy as np

from fastpath._core import _bad_raw, _n_masked
from fastpath.errors import FastpathError, InputError, ServerGone, RingFull, ServeError

cnp.import_array()

from cpython.exc cimport PyErr_Clear, PyErr_CheckSignals
from cpython.pythread cimport PyThread_get_thread_ident

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
    uint64_t fp_ticks()

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

_REASONS = ("hit", "cold", "age", "run", "cosine", "norm", "disabled")


cdef object _state_name(uint32_t st):
    """fp_seg_header.state as a name. Bounded: the field is in the live header, which any
    process mapping the segment can overwrite, and a tuple indexed by it without a check
    (Cython's boundscheck is off) read past the tuple: one store of 7 segfaulted stats()."""
    if st <= FP_SRV_STOPPED:
        return ("starting", "running", "stopping", "stopped")[st]
    return f"unknown ({st})"
_IDLE = {"spin": FP_IDLE_SPIN, "yield": FP_IDLE_YIELD, "sleep": FP_IDLE_SLEEP}


def segment_path(name):
    """The file under /dev/shm that holds the segment for `name`."""
    cdef char buf[512]
    b = _name_bytes(name)
    fp_seg_path(b, buf, sizeof(buf))
    return buf.decode()


def _name_bytes(name):
    try:
        b = name.encode() if isinstance(name, str) else None
    except UnicodeEncodeError:
        # a shell argument with a byte that is not UTF-8 arrives as a lone surrogate: it
        # raised UnicodeEncodeError from here, out of `fastpath serve` as a traceback
        raise InputError(f"server name must be UTF-8 text (it names a file under /dev/shm), "
                         f"got {name!r}") from None
    if b is None or not name or "/" in name or len(b) > 200 or "\0" in name:
        raise InputError(f"server name must be a non-empty str of at most 200 bytes without '/', "
                         f"got {name!r}")
    return b


# --------------------------------------------------------------------------- results
cdef inline Result _make(const fp_rep *r):
    """the reply as the fastpath.Result an in-process Engine.step returns, plus seq and wait_ns"""
    cdef Result res = Result.__new__(Result)
    res.seq = r.seq
    res.signal = r.signal
    res.confidence = r.confidence
    res.cached = r.cached
    res._reason = r.reason
    res._f = r.feature_ns
    res._c = r.cache_ns
    res._i = r.infer_ns
    res._t = r.total_ns
    res.wait_ns = r.wait_ns
    return res


def _reply_error(int err, unsigned long long seq, long long symbol, long long ts,
                 float lo=0.0, float hi=0.0):
    """The InputError Engine.step raises for the same code (the worker's engine refused it);
    lo / hi: a FP_REP_ERR_NOT_PROBABILITY reply's range of outputs (its signal / confidence)."""
    if err == FP_ERR_SYMBOL:
        return InputError(f"symbol {symbol} out of range for the server's engine (request {seq})")
    if err == FP_ERR_NONFINITE_INPUT:
        return InputError(f"raw contains non-finite values (request {seq}); ticks must be finite")
    if err == FP_ERR_TIME_BACKWARDS:
        when = f"ts_ns {ts}" if ts >= 0 else "the engine clock (no ts_ns given)"
        return InputError(f"{when} is earlier than the last tick of symbol {symbol} (request "
                          f"{seq}); timestamps must not go backwards per symbol (another client "
                          f"stepping the same symbol counts too)")
    if err == FP_ERR_NONFINITE_FEATURE:
        return InputError(f"the raw tick is finite but its features overflowed to NaN/Inf "
                          f"(request {seq}); the tick was not applied (engine state unchanged): "
                          f"check the feed for a corrupt value")
    if err == FP_ERR_NONFINITE_OUTPUT:
        return InputError(f"the model produced NaN/Inf for this tick (request {seq}); the tick "
                          f"was not applied (engine state unchanged)")
    if err == FP_REP_ERR_NOT_PROBABILITY:
        return InputError(f"the model's outputs for this tick (request {seq}) range from "
                          f"{lo:.6g} to {hi:.6g}: not class probabilities (each in [0, 1]), "
                          f"which the server model's classifier head reads; the tick was not "
                          f"applied (engine state unchanged): give the model a head for raw "
                          f"outputs (e.g. Head('regression', outputs=(i,)))")
    if err == FP_REP_ERR_BAD_REQUEST:
        return InputError(f"the server refused request {seq}: ts_ns below -1")
    return FastpathError(f"the server answered request {seq} with error code {err}")


# --------------------------------------------------------------------------- worker side


cdef class Worker:
    """The segment `name` (created, or replacing a stale one) and an engine to serve it with.
    run() blocks in the C loop without the GIL until stop() is called from anywhere."""
    cdef fp_seg_header *_h
    cdef size_t _size
    cdef fp_seg_layout _L             # the layout fp_seg_init wrote (fp_ring.h fp_seg_layout)
    cdef fp_engine *_e
    cdef fp_worker_opts _o
    # the loop's counts and state, in this process's memory: what stats() reports (the
    # header's copy is for clients, and any process mapping the segment can overwrite it)
    cdef fp_worker_stats _st
    cdef uint32_t _on_full, _seg_flags
    cdef fp_lat_ring _lat
    cdef readonly str name, path
    cdef readonly int raw_len, n_symbols
    cdef readonly object model, config, replaced, segment
    cdef list _keep
    cdef object _ident          # (st_dev, st_ino) of the segment file this worker made
    cdef bint _running, _closed
    cdef int _owner_pid         # the process that made the segment and runs the loop
    cdef object __weakref__

    def __cinit__(self, name, model, config, serve_cfg, memory_cfg=None):
        """model, config: what fastpath._build.resolve returned; serve_cfg: ServeConfig;
        memory_cfg: MemoryConfig (huge pages and mlock for the segment; None: defaults
        without mlock)."""
        self._h = NULL
        self._e = NULL
        self._lat.rec = NULL
        self._keep = []
        _name_bytes(name)    # an InputError for a bad name before the typed attribute's TypeError
        self.name = name
        self.path = segment_path(name)
        self.model = model
        self.config = config
        self.raw_len = model.feature_spec.raw_len
        self.n_symbols = config.n_symbols
        self.replaced = self._check_existing(serve_cfg)
        self._e = _make_engine(model, config, self._keep)
        # as Engine._create does: [engine] stage_times = false was ignored by the server
        # (its replies carried stage times an Engine of the same config leaves at -1, and
        # every served tick paid the stage clock reads the setting exists to save)
        fp_engine_set_stage_times(self._e, 1 if config.source.stage_times else 0)
        self._o.idle = _IDLE[serve_cfg.idle]
        self._o.idle_spin_ns = serve_cfg.idle_spin_ns
        self._o.idle_sleep_ns = serve_cfg.idle_sleep_ns
        self._o.drain_timeout_ns = <int64_t>serve_cfg.drain_timeout_ms * 1000000
        memset(&self._st, 0, sizeof(self._st))
        self._o.stats = &self._st
        # a client slot claimed without a pid (its claimant killed in between, with an older
        # fp_ring.h; a forged store) is taken back after this long: the time a live party may
        # go without a sign of life before it counts as gone, as clients judge the server
        self._o.claim_grace_ns = <int64_t>serve_cfg.stall_timeout_ms * 1000000
        _lat_ring_alloc(&self._lat, config.latency_records)
        self._o.lat = &self._lat
        try:
            self._create(serve_cfg, memory_cfg)
            self._owner_pid = os.getpid()
            _workers.add(self)
        except BaseException:
            # an interrupt once the file was made (a Ctrl-C while /proc/self/smaps was read for
            # the report) or an error after it: this Worker is never handed out and its
            # finalizer only unmaps, so the segment stayed in /dev/shm with a header naming
            # this live process (a serve under the name from here: "already served")
            self._unmake()
            raise

    cdef _unmake(self):
        """Undo _create: unmap, and remove the file it made (only that one)."""
        if self._h != NULL:
            munmap(self._h, self._size)
            self._h = NULL
        if self._ident is not None:
            from fastpath.serving.segment import remove
            remove(self.path, self._ident)

    cdef void _forked(self):
        """In a child made by fork(): the segment and its rings are the parent's server's.
        Unmapped here without a store into it: the child's exit (its atexit stop, this
        object's collection) wrote STOPPED and the stop flag into the parent's live segment,
        ending a healthy server for every client. No loop runs in the child."""
        if self._h != NULL:
            munmap(self._h, self._size)
            self._h = NULL
        self._running = False
        # the child's copy of the latency records stopped at the fork: latency_records()
        # returned them as if current (the parent's loop goes on writing its own)
        PyMem_Free(self._lat.rec)
        self._lat.rec = NULL

    cdef object _check_existing(self, scfg):
        """None, or the pid of the crashed server whose segment is being replaced; a live
        server under the same name is a ServeError."""
        cdef fp_seg s
        b = self.name.encode()
        from fastpath.serving.segment import remove
        # the file judged, so that only it is removed: two servers replacing one crashed
        # segment at once both removed "it", the second the segment the first had just made
        # (the first then served a file nobody could reach, two servers under one name)
        try:
            st = os.stat(self.path)
            judged = (st.st_dev, st.st_ino)
        except OSError:
            judged = ()         # none there (or a dangling link): removes nothing by ident
        rc = fp_seg_attach(b, &s)
        if rc == FP_RING_ERR_NOENT:
            if os.path.islink(self.path):
                remove(self.path)     # a link to a hugetlbfs file that is gone
                return "dangling"
            return None
        if rc != FP_RING_OK:
            from fastpath.serving.segment import INIT_GRACE_S, initializing
            if initializing(self.path):
                # another server between creating the file and writing its header: removed
                # as a leftover, that server went on serving a file nobody could reach, and
                # two servers ran under one name
                raise ServeError(
                    f"{self.name!r}: another server is creating {self.path} (its header is not "
                    f"written yet); one name, one server: stop it first or pick another name "
                    f"(a file left by a server that crashed while starting is replaced once it "
                    f"is {INIT_GRACE_S:g} s old)")
            # not ours to judge (another version, a truncated file): a crashed run's leftovers
            remove(self.path, judged)
            return "unreadable"
        pid = s.h.server_pid
        chk = fp_seg_server_check(s.h, fp_ring_now_ns(), <int64_t>scfg.stall_timeout_ms * 1000000)
        age_s = (fp_ring_now_ns() - <int64_t>fp_atomic_load_u64(&s.h.heartbeat_ns)) / 1e9
        fresh = age_s * 1000 <= s.h.dead_after_ms
        dead = fp_ring_pid_dead(pid)
        try:
            beating = dead and fresh and chk != FP_SRV_GONE_STOPPED and _still_beating(s.h)
        finally:
            fp_seg_detach(&s)       # a Ctrl-C in the wait too
        if beating:
            # the pid the header names is gone from here while its loop goes on beating: the
            # field overwritten (one store by any process mapping the segment), or a server in
            # another PID namespace. Judged by the pid alone, the live server's file was removed
            # and a second server ran under the name, the first one's clients on its old rings
            raise ServeError(f"{self.name!r} is already served ({self.path}): its loop is "
                             f"beating, though the pid its header names ({pid}) is not a live "
                             f"process here (another PID namespace, or a damaged header); stop "
                             f"that server first or pick another name")
        if not dead and fresh and chk == FP_SRV_ALIVE:
            raise ServeError(f"{self.name!r} is already served by pid {pid} ({self.path}); stop "
                             f"it first or pick another name")
        if not dead and chk != FP_SRV_GONE_STOPPED:
            # a live pid whose loop stopped beating (SIGSTOP, a debugger): replacing it would
            # leave two servers under one name once it resumes, its clients on the old rings
            # and new ones on ours. Only a pid that does not map the segment lets go of it:
            # the number reused after a crash by an unrelated process, or by this one (a
            # container restarted: the server is pid 1 again)
            from fastpath.serving.segment import mapped_by
            if mapped_by(pid, self.path) is not False:
                raise ServeError(
                    f"{self.name!r} is held by pid {pid} ({self.path}), alive but its serving "
                    f"loop has not beaten for {age_s:.1f} s (stopped by a signal or a debugger?); "
                    f"replacing it would leave two servers under one name once it resumes: "
                    f"stop that process first (kill {pid}) or pick another name")
        remove(self.path, judged)
        return pid

    cdef _create(self, scfg, memory_cfg):
        from fastpath.serving import segment as seg
        cdef uint64_t size = fp_seg_bytes(self.raw_len, scfg.ring_slots, scfg.max_clients)
        cdef size_t map_bytes
        cdef void *p
        huge = memory_cfg.huge_pages if memory_cfg is not None else "auto"
        try:
            fd, map_bytes, method, tried = seg.create(self.path, size, scfg.mode, huge)
        except FileExistsError:
            # another server made it between the check for a live one and now
            raise ServeError(f"{self.name!r}: another server created {self.path} at the same "
                             f"time; one name, one server: stop it first or pick another "
                             f"name") from None
        st = os.fstat(fd)
        self._ident = (st.st_dev, st.st_ino)
        try:
            p = mmap(NULL, map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
            if p == MAP_FAILED:
                raise OSError(_errno(), f"mmap of {map_bytes} bytes for {self.path} failed: "
                                        f"{os.strerror(_errno())}")
        except BaseException:
            os.close(fd)
            seg.remove(self.path)
            raise
        os.close(fd)
        self._h = <fp_seg_header *>p
        self._size = map_bytes
        if method == "thp" and madvise(p, map_bytes, MADV_HUGEPAGE) != 0:
            tried[-1] = ["thp", f"madvise(MADV_HUGEPAGE): {os.strerror(_errno())}"]
            tried.append(["normal", "ok"])
            method = "normal"
        # pre-fault every page now, not on the first request that lands on it
        memset(p, 0, map_bytes)
        # no client can stamp a request before the header below exists: the worker reads a
        # submit stamp older than this as garbage (fp_worker_opts.born_ticks)
        self._o.born_ticks = fp_ticks()
        self._on_full = FP_ON_FULL_REJECT if scfg.on_full == "reject" else FP_ON_FULL_SPIN
        fp_seg_init(self._h, self.raw_len, self.n_symbols, scfg.ring_slots, scfg.max_clients,
                    os.getpid(), self._on_full,
                    scfg.heartbeat_ms, scfg.dead_after_ms, scfg.stall_timeout_ms)
        self._st.heartbeat_ns = fp_ring_now_ns()
        # the worker and the stats address the segment by this copy (it holds what was just
        # written, so it checks out)
        if fp_seg_layout_read(self._h, map_bytes, &self._L) != 0:
            raise ServeError(f"{self.name!r}: the segment header just written does not check "
                             f"out (raw_len {self.raw_len}, ring_slots {scfg.ring_slots}, "
                             f"max_clients {scfg.max_clients})")
        self._seg_flags = (FP_SEG_HUGE_TLB if method.startswith("hugetlb") else
                           FP_SEG_HUGE_THP if method == "thp" else FP_SEG_HUGE_NONE)
        self._h.seg_flags = self._seg_flags
        from fastpath.control.memory import smaps_entry
        self.segment = {"bytes": int(map_bytes), "asked": huge, "tried": tried,
                        **seg.backing(smaps_entry(<size_t>p), method)}
        if memory_cfg is not None and memory_cfg.mlock:
            if mlock(p, map_bytes) == 0:
                self.segment["mlock"] = "ok"
            else:
                # as the engine's own arena reports it (control.memory.allocate): the errno,
                # what the kernel went by (capability, RLIMIT_MEMLOCK) and the fix; the bare
                # strerror said neither why nor what to change
                err = _errno()
                import errno as errno_names
                from fastpath.control.placement import MEMLOCK_FIX, read_privileges
                _, why = read_privileges().memory_lock(map_bytes)
                self.segment["mlock"] = (
                    f"{errno_names.errorcode.get(err, err)}: {os.strerror(err)}: {why}; the "
                    f"segment may be paged out under memory pressure; fix: {MEMLOCK_FIX}")

    def set_placement(self, report: dict):
        """Publish the placement report (JSON) for clients; call before run()."""
        self._need_open()
        b = json.dumps(report, default=str).encode()
        if len(b) >= FP_SEG_PLACEMENT_BYTES:
            b = json.dumps({"truncated": True, "core": report.get("core")}).encode()
        cdef char *dst = self._h.placement
        for i in range(len(b)):
            dst[i] = b[i]
        dst[len(b)] = 0
        fp_atomic_store_u32(&self._h.placement_len, len(b))

    cdef _need_open(self):
        if self._h == NULL:
            self._not_here()
            raise ServeError(f"server {self.name!r} is closed")

    cdef _not_here(self):
        if self._owner_pid and os.getpid() != self._owner_pid:
            # a forked child: "is closed" said the server had stopped, while it serves on
            raise ServeError(f"server {self.name!r} is run by process {self._owner_pid}; this "
                             f"process ({os.getpid()}) is a fork of it and does not own its "
                             f"loop: ask there, or fastpath.connect({self.name!r}) here")

    def run(self):
        """The serving loop, in the calling thread, GIL released; returns after stop() once
        what clients had published is answered."""
        self._need_open()
        if self._running:
            raise ServeError("the worker loop is already running")
        self._running = True
        try:
            with nogil:
                # the bytes mapped here, which the header's own total_bytes need not be
                fp_worker_run(self._h, self._size, self._e, &self._o)
        finally:
            self._running = False

    def stop(self, bint force=False):
        """Ask the loop to drain and return (from any thread or process, a signal handler
        included). force: end the drain at its next round, leaving what clients sent and
        have not been answered unanswered (their clients raise ServerGone). True when the
        loop had not ended yet (the request can still change what it does), else False."""
        if self._h == NULL:
            return False
        fp_atomic_raise_u32(&self._h.stop, 2 if force else 1)
        # the loop's own state, not the header's (any mapping process's to overwrite)
        return fp_atomic_load_u32(&self._st.state) != FP_SRV_STOPPED

    @property
    def state(self):
        self._need_open()
        return _state_name(fp_atomic_load_u32(&self._st.state))

    def stats(self):
        """The loop's counters. served, errors, busy_ns, idle_polls, clients_reaped, each
        client's served, state and heartbeat_age_ns: counted by the loop in this process's
        memory (no other process can change them). rejected_full: counted by the clients in
        the segment (only a client sees its ring full; any process mapping the segment can
        change it). clients (slot, pid) and queue depth: from the client table and ring cursors
        in the segment, as the clients wrote them (queued per client 0 to ring_slots)."""
        self._need_open()
        d = _header_stats(self._h, &self._L, &self._st)
        # what this worker set up, not the header's copy of it
        d["server_pid"] = self._owner_pid
        d["on_full"] = "reject" if self._on_full == FP_ON_FULL_REJECT else "spin"
        d["segment_pages"] = _pages_name(self._seg_flags)
        return d

    def latency_records(self):
        """(n, 5) uint32 ns of the last ticks answered (a refused one writes no record),
        oldest first: feature, cache, infer, total (in C, as Result.latency) and wait (submit
        to pickup); with stage_times off the first three are 0. Copied while the loop
        runs, each record whole: one being written or overwritten meanwhile is left out."""
        if self._lat.rec == NULL:
            self._not_here()
            raise ServeError(f"server {self.name!r} is closed")
        return _lat_snapshot(&self._lat)

    def close(self):
        """Unmap and remove the segment, free the engine (the loop must have returned)."""
        if self._running:
            raise ServeError("stop() the worker and wait for run() to return before close()")
        if self._h != NULL:
            # a client still attached sees STOPPED and raises ServerGone
            fp_atomic_store_u32(&self._h.state, FP_SRV_STOPPED)
            munmap(self._h, self._size)
            self._h = NULL
            # only the file this worker made: a server that replaced this one (after it was
            # judged gone) serves under the same path now. With _h gone nothing would remove
            # it later: a Ctrl-C (or a signal handler's exception) landing inside left the
            # file in /dev/shm, so the removal is finished first and the interrupt raised after
            _remove_segment(self.path, self._ident)
        if self._e != NULL:
            fp_engine_free(self._e)
            self._e = NULL
        PyMem_Free(self._lat.rec)
        self._lat.rec = NULL

    def __dealloc__(self):
        if self._h != NULL and not self._running:
            fp_atomic_store_u32(&self._h.state, FP_SRV_STOPPED)
            munmap(self._h, self._size)
            self._h = NULL
        if self._e != NULL and not self._running:
            fp_engine_free(self._e)
            self._e = NULL
        if not self._running:
            PyMem_Free(self._lat.rec)
            self._lat.rec = NULL


cdef bint _still_beating(const fp_seg_header *h):
    """Whether the heartbeat moves within dead_after_ms (capped at 60 s, the config's bound: the
    field is in the header): a live loop beats every heartbeat_ms (< dead_after_ms), so a
    heartbeat that stays put that long is a server that died a moment ago (kill -9)."""
    import time
    cdef uint64_t beat = fp_atomic_load_u64(&h.heartbeat_ns)
    cdef int64_t until = fp_ring_now_ns() + <int64_t>min(h.dead_after_ms, 60000) * 1000000 + 1000000
    while fp_ring_now_ns() <= until:
        if fp_atomic_load_u64(&h.heartbeat_ns) != beat:
            return True
        time.sleep(0.0005)
    return fp_atomic_load_u64(&h.heartbeat_ns) != beat


def _remove_segment(path, ident):
    """segment.remove(path, ident), finished even when an interrupt lands inside it (it is
    idempotent: tried again, then the interrupt raised). An OSError is a real failure and is
    raised at once."""
    interrupted = None
    for _ in range(16):
        try:
            from fastpath.serving.segment import remove
            remove(path, ident)
            break
        except OSError:
            raise
        except BaseException as exc:
            if interrupted is None:
                interrupted = exc
    if interrupted is not None:
        raise interrupted


cdef int _lat_ring_alloc(fp_lat_ring *L, size_t cap) except -1:
    L.rec = <fp_lat_rec *>PyMem_Malloc(cap * sizeof(fp_lat_rec))
    if L.rec == NULL:
        raise MemoryError(f"latency records: {cap} x {sizeof(fp_lat_rec)} bytes")
    memset(L.rec, 0, cap * sizeof(fp_lat_rec))
    L.mask = cap - 1
    L.count = 0
    return 0


cdef object _lat_snapshot(const fp_lat_ring *L):
    cdef size_t n
    cdef cnp.ndarray out = np.empty((L.mask + 1, FP_LAT_FIELDS), np.uint32)
    cdef uint32_t *dst = <uint32_t *>cnp.PyArray_DATA(out)
    with nogil:
        n = fp_lat_snapshot(L, dst)
    return out[:n]


cdef class _LatRing:
    """Test shim of the worker's latency records: a writer that can run in another thread
    without the GIL, and the snapshot the monitor takes."""
    cdef fp_lat_ring _L

    def __cinit__(self, size_t cap):
        self._L.rec = NULL
        if cap == 0 or cap & (cap - 1):
            raise ValueError("cap must be a power of two")
        _lat_ring_alloc(&self._L, cap)

    def write(self, uint64_t n):
        """n records, tick k with every field = k (low 32 bits), GIL released."""
        cdef uint32_t v[5]
        cdef uint64_t i
        cdef int j
        with nogil:
            for i in range(n):
                for j in range(FP_LAT_FIELDS):
                    v[j] = <uint32_t>self._L.count
                fp_lat_put(&self._L, v)

    def begin_only(self, uint32_t value):
        """Start the next record and change its first field, as a writer stopped mid-record
        leaves it."""
        cdef fp_lat_rec *r
        cdef uint64_t k
        fp_lat_begin(&self._L, &r, &k)
        (<uint32_t *>(<char *>r + 8))[0] = value

    @property
    def count(self):
        return self._L.count

    def snapshot(self):
        return _lat_snapshot(&self._L)

    def __dealloc__(self):
        PyMem_Free(self._L.rec)


cdef object _pages_name(uint32_t seg_flags):
    return ("hugetlb" if seg_flags == FP_SEG_HUGE_TLB else
            "thp" if seg_flags == FP_SEG_HUGE_THP else "normal")


cdef void _read_published(fp_seg_header *h, const fp_seg_layout *L,
                          fp_worker_stats *S) noexcept nogil:
    """The counts the loop publishes in the header for clients (fp_worker.c publish), read
    back into S."""
    S.state = fp_atomic_load_u32(&h.state)
    S.served = fp_atomic_load_u64(&h.served)
    S.errors = fp_atomic_load_u64(&h.errors)
    S.clients_reaped = fp_atomic_load_u64(&h.clients_reaped)
    S.busy_ns = fp_atomic_load_u64(&h.busy_ns)
    S.idle_polls = fp_atomic_load_u64(&h.idle_polls)
    S.heartbeat_ns = <int64_t>fp_atomic_load_u64(&h.heartbeat_ns)
    cdef uint32_t i
    for i in range(L.max_clients):
        S.client_served[i] = fp_atomic_load_u64(&h.clients[i].served)


cdef dict _header_stats(fp_seg_header *h, const fp_seg_layout *L, const fp_worker_stats *own):
    # own: the worker's counts in its process's memory (the server's stats()), or NULL: the
    # copy the worker published in the header (a client's server_stats(); any process that
    # maps the segment can overwrite it), read into a local copy first.
    # every value read into C locals first, the Python objects built after: building them
    # allocates, and what a gc pass runs then (a finalizer, a gc callback, a signal handler
    # one lets run) may close the client or the worker and unmap h: the next read segfaulted.
    # Addresses and counts come from L, the layout as checked (fp_seg_layout), not from h's
    # fields, which any process mapping the segment can overwrite
    cdef uint32_t n = 0, i, st
    cdef int32_t pid[FP_SEG_MAX_CLIENTS]
    cdef uint32_t slot[FP_SEG_MAX_CLIENTS]
    cdef uint64_t served[FP_SEG_MAX_CLIENTS]
    cdef uint64_t queued[FP_SEG_MAX_CLIENTS]
    cdef uint64_t depth = 0
    cdef uint64_t *cur
    cdef uint64_t head, tail
    cdef uint32_t m = L.max_clients
    cdef fp_worker_stats pub
    if own == NULL:
        _read_published(h, L, &pub)
        own = &pub
    for i in range(m):
        st = fp_atomic_load_u32(&h.clients[i].state)
        if st != FP_CL_ACTIVE:
            continue
        slot[n] = i
        pid[n] = h.clients[i].pid
        served[n] = fp_atomic_load_u64(&own.client_served[i])
        # queue depth: requests published and not yet taken. The worker's tail first, then
        # the client's head: read the other way round, a request published and taken
        # between the two reads put the tail past the head, and the unsigned difference
        # read as 2**64 - 1 requests queued (a slot freed between the reads does too: no
        # fewer than none)
        cur = <uint64_t *>fp_lay_ctl(L, i)
        tail = fp_atomic_load_u64(&cur[8])
        head = fp_atomic_load_u64(&cur[0])
        # and no more than a ring holds: both cursors are in the client's region, and a client
        # (a buggy C producer) storing req_head = 2^62 showed 2^62 requests queued
        queued[n] = min(head - tail, <uint64_t>L.slots) if head > tail else 0
        depth += queued[n]
        n += 1
    cdef uint32_t state = fp_atomic_load_u32(&own.state)
    cdef uint64_t h_served = fp_atomic_load_u64(&own.served)
    cdef uint64_t h_errors = fp_atomic_load_u64(&own.errors)
    cdef uint64_t h_reaped = fp_atomic_load_u64(&own.clients_reaped)
    cdef uint64_t h_busy = fp_atomic_load_u64(&own.busy_ns)
    cdef uint64_t h_idle = fp_atomic_load_u64(&own.idle_polls)
    cdef int64_t age = fp_ring_now_ns() - <int64_t>fp_atomic_load_u64(
        <const uint64_t *>&own.heartbeat_ns)
    # counted by the clients (only they see their rings full), in the segment either way
    cdef uint64_t h_rejected = fp_atomic_load_u64(&h.rejected_full)
    cdef int32_t server_pid = h.server_pid
    cdef uint32_t slots = L.slots, on_full = h.on_full, seg_flags = h.seg_flags
    # from here on, h is not read
    clients = []
    for i in range(n):
        clients.append({"slot": slot[i], "pid": pid[i], "served": served[i],
                        "queued": queued[i]})
    return {"state": _state_name(state),
            "served": int(h_served), "errors": int(h_errors),
            "rejected_full": int(h_rejected), "clients_reaped": int(h_reaped),
            "busy_ns": int(h_busy), "idle_polls": int(h_idle),
            "queue_depth": int(depth), "clients": clients,
            "heartbeat_age_ns": int(age),
            "server_pid": server_pid, "slots": slots, "on_full":
                "reject" if on_full == FP_ON_FULL_REJECT else "spin",
            "segment_pages": _pages_name(seg_flags)}


# --------------------------------------------------------------------------- client side
cdef class Client:
    """A connection to a served engine (fastpath.connect). Single-threaded: one thread per
    Client (each Client owns one SPSC ring pair); calls from a thread other than the one that
    connected are a ServeError (close() excepted)."""
    cdef fp_seg _s
    cdef fp_client _c
    cdef readonly str name
    cdef readonly int raw_len, n_symbols
    cdef int64_t _stall_ns
    cdef list _stash
    cdef bint _open
    # symbol and ts_ns of each request in flight, by (seq - 1) & _req_mask: a reply names only
    # its seq, and an error taken by poll() must still say which tick it was about. At most
    # 2 x slots are in flight (slots in the request ring, slots answered in the reply ring).
    cdef int32_t *_sym_of
    cdef int64_t *_ts_of
    cdef uint64_t _req_mask
    cdef int _pid
    cdef bint _forked_copy
    # the connecting thread: a Client shared by threads let one thread's poll()/step() take
    # another's answer off the ring, whose step() then waited for it forever holding the GIL
    # (the whole process frozen)
    cdef unsigned long _owner
    cdef object __weakref__

    def __cinit__(self, name, timeout=1.0, stall_timeout=None):
        """stall_timeout: seconds a live server's loop may go without a heartbeat before
        calls raise ServerGone; None takes the server's [serve] stall_timeout_ms."""
        cdef int rc
        cdef int64_t deadline
        self._open = False
        self._sym_of = NULL
        self._ts_of = NULL
        self._stash = []
        # checked as connect() checks them: made directly (fastpath.serving.client.Client), a
        # nan, inf or huge timeout overflowed the deadline (no wait at all, "no server is
        # serving"), a nan or negative stall_timeout called every live server stalled, and a
        # str raised a TypeError or ValueError naming no argument
        from fastpath.serving.client import _seconds
        timeout = _seconds("timeout", timeout, lo_open=False)
        if stall_timeout is not None:
            stall_timeout = _seconds("stall_timeout", stall_timeout, lo_open=True)
        self._stall_ns = -1 if stall_timeout is None else <int64_t>(<double>stall_timeout * 1e9)
        b = _name_bytes(name)
        self.name = name
        path = segment_path(name)
        deadline = fp_ring_now_ns() + <int64_t>(<double>timeout * 1e9)
        # a server being started may not have published its segment yet: retry until timeout
        starting = 0        # the pid of a server seen still starting
        while True:
            rc = fp_seg_attach(b, &self._s)
            err = _errno()      # now: the Python calls below may change errno
            if rc == FP_RING_OK:
                st = fp_atomic_load_u32(&self._s.h.state)
                if stall_timeout is None:
                    self._stall_ns = <int64_t>self._s.h.stall_ms * 1000000
                chk = fp_seg_server_check(self._s.h, fp_ring_now_ns(), self._stall_ns)
                if chk != FP_SRV_ALIVE:
                    fp_seg_detach(&self._s)
                    raise ServerGone(f"no server is serving {name!r}: {path} is left from a "
                                     f"server that is {_gone_why(chk, self._stall_ns)}")
                if st == FP_SRV_RUNNING:
                    break
                pid = self._s.h.server_pid
                fp_seg_detach(&self._s)
                if st != FP_SRV_STARTING:
                    # draining: it takes no new client and never runs again; waiting out the
                    # timeout ended in "no server is serving" while one was there
                    raise ServerGone(f"server {name!r} (pid {pid}) is stopping: it takes no new "
                                     f"clients; connect again once a server runs under the "
                                     f"name")
                starting = pid
                rc = FP_RING_ERR_NOENT
            if fp_ring_now_ns() > deadline:
                if rc == FP_RING_ERR_NOENT and starting:
                    raise ServeError(f"server {name!r} (pid {starting}) did not start serving "
                                     f"within {timeout:g} s (still placing its worker thread?); "
                                     f"connect with a longer timeout")
                if rc == FP_RING_ERR_NOENT:
                    raise ServeError(f"no server is serving {name!r} (no running segment at "
                                     f"{path}); start one with `fastpath serve --name {name}` "
                                     f"or fastpath.serve({name!r})")
                if rc == FP_RING_ERR_MAGIC:
                    raise ServeError(f"{path} is not a fastpath serving segment of this version")
                hint = ""
                if err == EACCES:
                    try:
                        st_ = os.stat(path)
                        hint = (f" (mode {oct(st_.st_mode & 0o777)}, owner uid {st_.st_uid}, this "
                                f"process uid {os.geteuid()}): the server's [serve] mode must "
                                f"let this user read and write the segment, e.g. mode = 0o660 "
                                f"with a group both users are in, or connect as the server's user")
                    except OSError:
                        pass
                raise ServeError(f"cannot open {path}: {os.strerror(err)}{hint}")
            import time
            time.sleep(0.002)
        rc = fp_client_open(&self._s, &self._c)
        # a slot given back by close() is freed by the worker at its next heartbeat: a client
        # connecting right after another closed (max_clients = 1: reconnect) was refused
        # although the slot would be free within a millisecond. Wait for it up to timeout.
        while rc == FP_RING_ERR_NOSLOT and fp_ring_now_ns() <= deadline:
            import time
            time.sleep(0.001)
            rc = fp_client_open(&self._s, &self._c)
        if rc != FP_RING_OK:
            # read before the detach, which clears the header pointer
            max_clients = self._s.L.max_clients
            fp_seg_detach(&self._s)
            if rc == FP_RING_ERR_NOSLOT:
                raise ServeError(f"server {name!r} has all its {max_clients} client slots taken "
                                 f"(a slot is freed when its client closes, or a few "
                                 f"heartbeats after its process exits); raise serve.max_clients")
            raise ServerGone(f"server {name!r} is stopping")
        self._pid = os.getpid()
        self._owner = PyThread_get_thread_ident()
        cdef uint64_t n_track = 2 * <uint64_t>self._s.L.slots
        self._sym_of = <int32_t *>PyMem_Malloc(n_track * sizeof(int32_t))
        self._ts_of = <int64_t *>PyMem_Malloc(n_track * sizeof(int64_t))
        if self._sym_of == NULL or self._ts_of == NULL:
            self._release()
            raise MemoryError(f"client of {name!r}: request records for {n_track} requests")
        self._req_mask = n_track - 1
        self.raw_len = self._s.L.raw_len
        self.n_symbols = self._s.L.n_symbols
        self._open = True
        _clients.add(self)

    cdef void _forked(self):
        """In a child made by fork(): the ring pair is the parent's (single producer, single
        consumer). A child that went on using it published requests under seqs the parent
        also uses and took the parent's replies as its own (the parent then got the child's
        answer for its next tick), and the child's close() handed the parent's slot back.
        Unmapped here without a store into it; every call then says to connect again."""
        self._forked_copy = True
        if self._open:
            self._open = False
            fp_seg_detach(&self._s)

    cdef void _release(self):
        """Give the slot back (fp_client_close leaves it alone when the worker already took
        it: it may be another client's by now) and unmap."""
        if self._s.h == NULL:
            return
        fp_client_close(&self._c)
        fp_seg_detach(&self._s)

    cdef inline int _need(self) except -1:
        if not self._open:
            if self._forked_copy:
                raise ServeError(
                    f"client of {self.name!r} was connected by process {self._pid}; this "
                    f"process ({os.getpid()}) is a fork of it and may not use its rings: call "
                    f"fastpath.connect({self.name!r}) in this process")
            raise ServeError(f"client of {self.name!r} is closed")
        if PyThread_get_thread_ident() != self._owner:
            raise ServeError(f"client of {self.name!r} was connected by another thread; a Client "
                             f"is single-threaded (one ring pair: a second thread could take "
                             f"the first one's answers): call fastpath.connect({self.name!r}) "
                             f"in each thread")
        return 0

    cdef int _check_server(self) except -1:
        """ServerGone when the server is dead, stopped or stalled; ServeError when it took this
        client's rings back (judged its process gone): waiting on them would never end."""
        cdef int chk
        if not self._open:
            # closed by what ran inside this call's wait: a signal handler (run by the
            # wait's own signal check) that called close() and returned. The rings are
            # unmapped: the next read of them was a segfault
            raise ServeError(f"client of {self.name!r} was closed while this call waited "
                             f"(by a signal handler?); connect again")
        if not fp_client_owns(&self._c):
            lost = fp_client_outstanding(&self._c)
            self._open = False
            # the slot is not ours any more: unmap without touching it
            fp_seg_detach(&self._s)
            raise ServeError(
                f"server {self.name!r} took this client's rings back (slot {self._c.idx}): it "
                f"judged process {self._pid} gone, or found another pid stored into the slot. "
                f"{lost} request(s) in flight are lost and this client is closed. A client "
                f"whose pid the server cannot see (another PID namespace: a container without "
                f"--pid=host) is judged gone: run both in one PID namespace; a C client built "
                f"against an older fp_ring.h, stalled in its connect, stores its pid into the "
                f"slot it lost: rebuild it. Then connect again")
        # alive while an answer waits in this client's ring: see fp_client_server_check
        chk = fp_client_server_check(&self._c, fp_ring_now_ns(), self._stall_ns)
        if chk != FP_SRV_ALIVE:
            raise ServerGone(f"server {self.name!r} (pid {self._s.h.server_pid}) is "
                             f"{_gone_why(chk, self._stall_ns)}")
        return 0

    cdef inline const float *_raw_ptr(self, object raw) except NULL:
        cdef cnp.ndarray a
        # a masked array's masked values are not data: refused (_bad_raw says how many)
        if cnp.PyArray_CheckExact(raw) or (cnp.PyArray_Check(raw) and not _n_masked(raw)):
            a = <cnp.ndarray>raw
            if (cnp.PyArray_TYPE(a) == cnp.NPY_FLOAT32 and cnp.PyArray_NDIM(a) == 1
                    and cnp.PyArray_DIM(a, 0) == self.raw_len and cnp.PyArray_ISCARRAY_RO(a)
                    and cnp.PyArray_ISNOTSWAPPED(a)):
                return <const float *>cnp.PyArray_DATA(a)
        raise _bad_raw(raw, self.raw_len)

    cdef uint64_t _submit(self, object raw, object symbol, object ts_ns) except 0:
        cdef const float *p = self._raw_ptr(raw)
        cdef Py_ssize_t sym = _symbol_arg(symbol, self.n_symbols)
        cdef long long ts = _ts_arg(ts_ns)
        cdef int bad = fp_first_nonfinite(p, self.raw_len)
        cdef uint64_t seq = 0
        cdef fp_rep rep
        cdef long spins = 0
        if bad >= 0:
            arr = np.asarray(raw)
            n = int(np.count_nonzero(~np.isfinite(arr)))
            raise InputError(f"raw contains {n} non-finite value(s), first at index {bad} "
                             f"({arr[bad]}); ticks must be finite: repair or drop the tick "
                             f"(nothing was sent)")
        self._need()
        while True:
            # fp_client_try_submit refuses (FP_RING_ERR_GONE) once the stop has begun
            rc = fp_client_try_submit(&self._c, p, <int32_t>sym, ts, &seq)
            if rc == FP_RING_OK:
                self._sym_of[(seq - 1) & self._req_mask] = <int32_t>sym
                self._ts_of[(seq - 1) & self._req_mask] = ts
                return seq
            if rc == FP_RING_ERR_RECLAIMED:
                self._check_server()          # raises: the slot is not this client's any more
            if rc == FP_RING_ERR_GONE:
                why = " (it was waiting for room in a full ring)" if spins else ""
                try:
                    self._check_server()      # stopped or dead: says which
                except ServerGone as exc:
                    # the drain may have ended before this thread looked (preempted on a
                    # busy host): "is stopped" alone left open whether the tick was sent
                    raise ServerGone(f"{exc}: request not sent{why}") from None
                raise ServerGone(f"server {self.name!r} is stopping: request not sent{why}")
            if self._s.h.on_full == FP_ON_FULL_REJECT:
                # fp_client_try_submit counted it in rejected_full (for C clients too)
                raise RingFull(f"request ring of server {self.name!r} is full ({self._s.L.slots} "
                               f"requests waiting; [serve] on_full = \"reject\"): the tick was "
                               f"not sent; take replies with poll() or slow down")
            # spin: take replies meanwhile (a full reply ring holds the worker back); _open
            # each time, as in poll()
            while self._open and fp_client_poll(&self._c, &rep):
                self._stash.append(self._as_item(&rep))
            if not self._open:
                self._check_server()      # raises: closed while this call waited
            # a stop beginning meanwhile: the next try refuses the tick (the drain makes room,
            # and a tick sent then held the drain open or came after it, never answered)
            spins += 1
            if (spins & 1023) == 0:
                PyErr_CheckSignals()      # Ctrl-C (or an alarm) ends a wait, as it would a sleep
                self._check_server()
            FP_RING_PAUSE()

    cdef object _as_item(self, fp_rep *r):
        cdef uint64_t k
        if r.err == FP_REP_OK:
            return (r.seq, _make(r))
        k = (r.seq - 1) & self._req_mask
        return (r.seq, _reply_error(r.err, r.seq, self._sym_of[k], self._ts_of[k], r.signal,
                                    r.confidence))

    def submit(self, raw, symbol=0, ts_ns=None):
        """Send one tick (validated as Engine.step validates it) -> its seq; take the answer
        with poll(). A full ring: RingFull (on_full = "reject") or wait (on_full = "spin")."""
        return self._submit(raw, symbol, ts_ns)

    def poll(self):
        """Answers that have arrived, in submission order: [(seq, Result)], where a tick the
        server's engine refused carries the InputError instead of a Result."""
        cdef fp_rep rep
        self._need()
        out = self._stash
        self._stash = []
        # _open each time: what runs inside the loop's allocations (a finalizer, a gc
        # callback, the signal handler one runs) may close this client and unmap its rings
        while self._open and fp_client_poll(&self._c, &rep):
            out.append(self._as_item(&rep))
        if not out and fp_client_outstanding(&self._c):
            self._check_server()
        return out

    def step(self, raw, symbol=0, ts_ns=None):
        """Submit one tick and spin for its answer -> Result (with seq and wait_ns). Answers to
        earlier submit() calls that arrive meanwhile are kept for poll(). A dead or stopped
        server raises ServerGone (found by its heartbeat within ~dead_after_ms). A Ctrl-C
        (or a signal handler's exception) during the wait carries the tick's .seq: the tick
        was sent, and its answer comes through poll()."""
        cdef uint64_t seq = self._submit(raw, symbol, ts_ns)
        cdef fp_rep rep
        cdef long spins = 0
        while True:
            if fp_client_poll_spin(&self._c, &rep):
                if rep.seq == seq:
                    if rep.err == FP_REP_OK:
                        return _make(&rep)
                    raise _reply_error(rep.err, seq, int(symbol), -1 if ts_ns is None else ts_ns,
                                       rep.signal, rep.confidence)
                self._stash.append(self._as_item(&rep))
                if self._open:
                    continue
                spins = 1023    # closed inside the line above (as in poll()): said just below
            spins += 1
            if (spins & 1023) == 0:
                try:
                    PyErr_CheckSignals()  # Ctrl-C (or an alarm) ends a wait, as it would a sleep
                except BaseException as exc:
                    # the tick is in the ring and its answer still comes, through poll(),
                    # under a seq the caller was never given: it goes with the exception
                    exc.seq = seq
                    exc.add_note(f"the tick was sent as seq {seq}: its answer comes through "
                                 f"poll()")
                    raise
                if self._open and self._c.rep_tail >= seq:
                    # a signal handler run by the check above took this tick's answer off
                    # the ring (its poll() or step()): waiting for it here never ended
                    return self._taken_meanwhile(seq)
                try:
                    # alive while an answer waits in the ring: the drain's last answers,
                    # published before it says stopped (fp_client_server_check)
                    self._check_server()
                except ServeError as exc:
                    # the tick was in the ring: which one, and that it went unanswered (a
                    # server that resumes from a stall may still answer it, through poll())
                    exc.seq = seq
                    exc.add_note(f"the tick was sent as seq {seq} and its answer had not "
                                 f"come")
                    raise

    cdef object _taken_meanwhile(self, uint64_t seq):
        """step()'s answer, taken off the ring by a call made inside its wait: from the stash
        (a nested step() or a spinning submit() kept it), else a ServeError (a poll() returned
        it to its caller)."""
        for k, (s, item) in enumerate(self._stash):
            if s == seq:
                del self._stash[k]
                if isinstance(item, BaseException):
                    raise item
                return item
        exc = ServeError(f"the answer to tick {seq} was taken by a poll() on this client "
                         f"while step() waited for it (in a signal handler?): that poll() "
                         f"returned it")
        exc.seq = seq
        raise exc

    @property
    def outstanding(self):
        """Requests submitted whose answers have not been taken by poll() or step()."""
        return int(fp_client_outstanding(&self._c)) + len(self._stash)

    @property
    def placement(self):
        """The worker's placement report (dict), as the server published it."""
        self._need()
        cdef uint32_t n = fp_atomic_load_u32(&self._s.h.placement_len)
        if n == 0:
            return None
        # the length is in the live header: copied as it stood, a stray store of 4e9 read
        # gigabytes past the report's field and the mapping (a segfault)
        if n >= FP_SEG_PLACEMENT_BYTES:
            raise ServeError(f"server {self.name!r}: the segment's placement report length {n} "
                             f"is past its {FP_SEG_PLACEMENT_BYTES - 1} bytes (the header was "
                             f"overwritten)")
        b = self._s.h.placement[:n]
        try:
            return json.loads(b.decode())
        except ValueError as exc:       # UnicodeDecodeError, JSONDecodeError
            raise ServeError(f"server {self.name!r}: the segment's placement report is not "
                             f"the JSON the server wrote (the header was overwritten?): "
                             f"{exc}") from None

    @property
    def stall_timeout(self):
        """Seconds a live server's loop may go without a heartbeat before calls raise
        ServerGone (connect(stall_timeout=), else the server's [serve] stall_timeout_ms)."""
        return self._stall_ns / 1e9

    @property
    def server_pid(self):
        self._need()
        return self._s.h.server_pid

    def server_stats(self):
        """The server's counters (served, errors, rejected_full, queue_depth, clients, ...),
        as published by the server in the segment about once a heartbeat (and when it stops):
        forgeable by any process that maps the segment. rejected_full is counted by the
        clients themselves, pid and queued per client from what the clients wrote. The
        server's own figures: Server.stats() in its process."""
        self._need()
        return _header_stats(self._s.h, &self._s.L, NULL)

    def close(self):
        """Give the ring pair back; answers not yet taken are dropped."""
        if self._open:
            self._open = False
            self._release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __dealloc__(self):
        if self._open:
            self._release()
        elif self._s.h != NULL:
            # mapped without a slot: a connect interrupted (Ctrl-C) while it waited for one
            # kept the segment mapped, and its memory in /dev/shm taken, until the process exit
            fp_seg_detach(&self._s)
        PyMem_Free(self._sym_of)
        PyMem_Free(self._ts_of)


# the Workers and Clients of this process, for the fork handler below
_workers = weakref.WeakSet()
_clients = weakref.WeakSet()


def _after_fork_in_child():
    for w in list(_workers):
        (<Worker>w)._forked()
    for c in list(_clients):
        (<Client>c)._forked()


os.register_at_fork(after_in_child=_after_fork_in_child)


cdef extern from "<errno.h>":
    int errno
    int EACCES

cdef int _errno():
    return errno


def _gone_why(int chk, int64_t stall_ns):
    if chk == FP_SRV_GONE_STOPPED:
        return "stopped"
    if chk == FP_SRV_GONE_DEAD:
        return "dead (its process is gone: killed or crashed)"
    if chk == FP_SRV_GONE_STALLED:
        return (f"not responding (its process lives but its loop has not beaten for over "
                f"{stall_ns / 1e9:g} s: stopped by a signal or a debugger?)")
    return "alive"


# ------------------------------------------------ argument checks, as Engine.step makes them
