# cython: language_level=3
"""The serving worker: the segment owner with its own fp_engine, running the C loop
(fp_worker.c) without the GIL; the client side is fastpath._client.

Design: the worker never holds the GIL while it serves. It builds its own fp_engine from the
Model with the same parameter preparation as Engine (fastpath._core._make_engine), so a served
tick and a local Engine.step give the same answer.
"""
cimport cython
cimport numpy as cnp
from cpython.exc cimport PyErr_CheckSignals
from cpython.mem cimport PyMem_Malloc, PyMem_Free
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memset

from fastpath._csrc cimport *
from fastpath._core cimport _make_engine
from fastpath._ring cimport *

import errno as errno_names
import json
import os
import time
import weakref

import numpy as np

# the segment's file, the arena's smaps reader and the privileges below the worker, as
# modules: each function is looked up where it is used (a test replaces one in its module)
from fastpath import _memory
from fastpath import _privileges
from fastpath import _segment
from fastpath._client import Client  # noqa: F401 (fastpath._serve.Client, as before the split)
from fastpath._ring import _name_bytes, segment_path
from fastpath.errors import FastpathError, InputError, ServeError

cnp.import_array()

_IDLE = {"spin": FP_IDLE_SPIN, "yield": FP_IDLE_YIELD, "sleep": FP_IDLE_SLEEP}




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
    cdef readonly object model, config, replaced, segment, tick_sizes
    cdef list _keep
    cdef object _ident          # (st_dev, st_ino) of the segment file this worker made
    cdef bint _running, _closed
    cdef int _owner_pid         # the process that made the segment and runs the loop
    cdef object __weakref__

    def __cinit__(self, name, model, config, serve_cfg, memory_cfg=None, tick_sizes=None):
        """model, config: what fastpath._build.resolve returned; serve_cfg: ServeConfig;
        memory_cfg: MemoryConfig (huge pages and mlock for the segment; None: defaults
        without mlock); tick_sizes: {symbol: tick size} for the live books that book update
        requests step (checked by the caller: fastpath.serving.server.tick_sizes_arg)."""
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
        self.tick_sizes = dict(tick_sizes or {})
        for sym, tick in self.tick_sizes.items():
            rc = fp_engine_set_tick(self._e, <int32_t>sym, <double>tick)
            if rc == FP_ERR_NOMEM:
                raise MemoryError(f"no memory for symbol {sym}'s book")
            if rc != FP_OK:
                raise InputError(f"tick size {tick!r} for symbol {sym}: must be finite and > 0 "
                                 f"for a symbol in 0..{self.n_symbols - 1}")
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
            _segment.remove(self.path, self._ident)

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
                _segment.remove(self.path)     # a link to a hugetlbfs file that is gone
                return "dangling"
            return None
        if rc != FP_RING_OK:
            if _segment.initializing(self.path):
                # another server between creating the file and writing its header: removed
                # as a leftover, that server went on serving a file nobody could reach, and
                # two servers ran under one name
                raise ServeError(
                    f"{self.name!r}: another server is creating {self.path} (its header is not "
                    f"written yet); one name, one server: stop it first or pick another name "
                    f"(a file left by a server that crashed while starting is replaced once it "
                    f"is {_segment.INIT_GRACE_S:g} s old)")
            # not ours to judge (another version, a truncated file): a crashed run's leftovers
            _segment.remove(self.path, judged)
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
            if _segment.mapped_by(pid, self.path) is not False:
                raise ServeError(
                    f"{self.name!r} is held by pid {pid} ({self.path}), alive but its serving "
                    f"loop has not beaten for {age_s:.1f} s (stopped by a signal or a debugger?); "
                    f"replacing it would leave two servers under one name once it resumes: "
                    f"stop that process first (kill {pid}) or pick another name")
        _segment.remove(self.path, judged)
        return pid

    cdef _create(self, scfg, memory_cfg):
        cdef uint64_t size = fp_seg_bytes(self.raw_len, scfg.ring_slots, scfg.max_clients)
        cdef size_t map_bytes
        cdef void *p
        huge = memory_cfg.huge_pages if memory_cfg is not None else "auto"
        try:
            fd, map_bytes, method, tried = _segment.create(self.path, size, scfg.mode, huge)
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
            _segment.remove(self.path)
            raise
        os.close(fd)
        self._h = <fp_seg_header *>p
        self._size = map_bytes
        if method == "thp" and madvise(p, map_bytes, MADV_HUGEPAGE) != 0:
            tried[len(tried) - 1] = ["thp", f"madvise(MADV_HUGEPAGE): {os.strerror(_errno())}"]
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
        self.segment = {"bytes": int(map_bytes), "asked": huge, "tried": tried,
                        **_segment.backing(_memory.smaps_entry(<size_t>p), method)}
        if memory_cfg is not None and memory_cfg.mlock:
            if mlock(p, map_bytes) == 0:
                self.segment["mlock"] = "ok"
            else:
                # as the engine's own arena reports it (fastpath._memory.allocate): the errno,
                # what the kernel went by (capability, RLIMIT_MEMLOCK) and the fix; the bare
                # strerror said neither why nor what to change
                err = _errno()
                _, why = _privileges.read_privileges().memory_lock(map_bytes)
                self.segment["mlock"] = (
                    f"{errno_names.errorcode.get(err, err)}: {os.strerror(err)}: {why}; the "
                    f"segment may be paged out under memory pressure; fix: "
                    f"{_privileges.MEMLOCK_FIX}")

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
    cdef uint64_t beat = fp_atomic_load_u64(&h.heartbeat_ns)
    cdef int64_t until = fp_ring_now_ns() + <int64_t>min(h.dead_after_ms, 60000) * 1000000 + 1000000
    while fp_ring_now_ns() <= until:
        if fp_atomic_load_u64(&h.heartbeat_ns) != beat:
            return True
        time.sleep(0.0005)
    return fp_atomic_load_u64(&h.heartbeat_ns) != beat


def _remove_segment(path, ident):
    """_segment.remove(path, ident), finished even when an interrupt lands inside it (it is
    idempotent: tried again, then the interrupt raised). An OSError is a real failure and is
    raised at once."""
    interrupted = None
    for _ in range(16):
        try:
            _segment.remove(path, ident)
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


# the Workers of this process, for the fork handler below
_workers = weakref.WeakSet()


def _after_fork_in_child():
    for w in list(_workers):
        (<Worker>w)._forked()


os.register_at_fork(after_in_child=_after_fork_in_child)
