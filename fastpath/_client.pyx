# cython: language_level=3
"""The serving client (fastpath.connect): validation, submit, spin for the reply over fp_ring.h.

Design: everything per request is C: the client validates exactly as Engine.step does (type,
dtype, shape, contiguity, symbol range, ts_ns, finiteness) before a byte reaches the ring,
then one inline call publishes it, and the reply becomes the same fastpath.Result. A book
update (step_book) is checked as Engine.step_book checks its arguments; the update itself is
checked by the worker's engine (fp_step_book), whose refusal the client words as
Engine.step_book does, from the update it sent (book_refusal).
"""
cimport cython
cimport numpy as cnp
from cpython.exc cimport PyErr_Clear, PyErr_CheckSignals
from cpython.mem cimport PyMem_Malloc, PyMem_Free
from cpython.pythread cimport PyThread_get_thread_ident
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memset

from fastpath._csrc cimport *
from fastpath._core cimport _levels, _symbol_arg, _trade_arg, _ts_arg
from fastpath._engine cimport Result
from fastpath._ring cimport *

import json
import operator
import os
import time
import weakref

import numpy as np

from fastpath._checks import check_seconds
from fastpath._core import _bad_raw, _book_refusal, _n_masked
from fastpath._ring import _name_bytes, segment_path
from fastpath.errors import FastpathError, InputError, ServerGone, RingFull, ServeError

cnp.import_array()


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
    # a book update's book stage (fp_rep_book_ns: -1 not measured); 0 for a raw vector
    res._b = fp_rep_book_ns(r)
    return res


def _reply_error(int err, unsigned long long seq, long long symbol, long long ts,
                 float lo=0.0, float hi=0.0, int why=0, int where=0):
    """The InputError Engine.step raises for the same code (the worker's engine refused it);
    lo / hi: a FP_REP_ERR_NOT_PROBABILITY reply's range of outputs (its signal / confidence);
    why / where: a FP_REP_ERR_BOOK reply's refusal (its reason / aux), for a book update
    whose values are not at hand (its answer taken by poll())."""
    if err == FP_REP_ERR_BOOK:
        return InputError(f"book update refused (request {seq}, symbol {symbol}): "
                          f"{book_refusal(why, where, symbol, None)}")
    if err == FP_REP_ERR_PARAM:
        return InputError(f"the server refused book update {seq}: its model does not read the "
                          f"256-value raw vector of fastpath.lob, or ts_ns was below 0")
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


cdef int _BOOK_RAW = 256      # the raw vector fastpath.lob makes from a book


def book_refusal(int why, int where, long long sym, update, server=None):
    """What Engine.step_book says of an update its engine refused (why: FP_REP_BOOK_*, the
    codes of fp_book.h; where: the field), from update = (bid_px, bid_sz, ask_px, ask_sz,
    trade_vol, trade_cnt, last_trade_sz) as sent, or None when not at hand (an answer taken
    by poll(): the field and level alone). server: the server's name, for a symbol it has no
    tick size for."""
    by = f"server {server!r}" if server is not None else "the server"
    return _book_refusal(why, where, sym, update, (
        f" on {by}: give it when serving (fastpath.serve(..., tick_sizes={{{sym}: tick_size}}),"
        f" or `fastpath serve --tick-size {sym}=TICK`)"))


cdef int _wait_ms(int ms) except -1:
    """Sleep ms between two looks at the segment, running signal handlers first: time.sleep
    runs them only when the signal interrupts the sleep itself, so one that landed in another
    thread, or between two sleeps, waited for the end of the whole wait (a Ctrl-C ignored
    until connect's timeout)."""
    PyErr_CheckSignals()
    time.sleep(ms / 1000)
    return 0


def _version_of(path):
    """": segment version V; this fastpath speaks version W (...)" for a segment of another
    version (its magic is fastpath's), else "" (not a segment at all, or unreadable)."""
    try:
        with open(path, "rb") as f:
            head = f.read(12)
    except OSError:
        return ""
    if len(head) < 12 or int.from_bytes(head[:8], "little") != 0x31474e4952535046:
        return ""
    v = int.from_bytes(head[8:12], "little")
    if v == FP_SEG_VERSION:
        return ""
    return (f": segment version {v}; this fastpath speaks version {FP_SEG_VERSION} (the server "
            f"and its clients must come from the same fastpath release; a C client is built "
            f"against the fp_ring.h of the server's)")


def _gone_why(int chk, int64_t stall_ns):
    if chk == FP_SRV_GONE_STOPPED:
        return "stopped"
    if chk == FP_SRV_GONE_DEAD:
        return "dead (its process is gone: killed or crashed)"
    if chk == FP_SRV_GONE_STALLED:
        return (f"not responding (its process lives but its loop has not beaten for over "
                f"{stall_ns / 1e9:g} s: stopped by a signal or a debugger?)")
    return "alive"


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
        timeout = check_seconds("timeout", timeout, lo_open=False)
        if stall_timeout is not None:
            stall_timeout = check_seconds("stall_timeout", stall_timeout, lo_open=True)
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
                    raise ServeError(f"{path} is not a fastpath serving segment of this "
                                     f"version{_version_of(path)}")
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
            _wait_ms(2)
        rc = fp_client_open(&self._s, &self._c)
        # a slot given back by close() is freed by the worker at its next heartbeat: a client
        # connecting right after another closed (max_clients = 1: reconnect) was refused
        # although the slot would be free within a millisecond. Wait for it up to timeout.
        while rc == FP_RING_ERR_NOSLOT and fp_ring_now_ns() <= deadline:
            _wait_ms(1)         # an interrupt here: __dealloc__ unmaps the segment
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
        if bad >= 0:
            arr = np.asarray(raw)
            n = int(np.count_nonzero(~np.isfinite(arr)))
            raise InputError(f"raw contains {n} non-finite value(s), first at index {bad} "
                             f"({arr[bad]}); ticks must be finite: repair or drop the tick "
                             f"(nothing was sent)")
        self._need()
        return self._send(p, NULL, <int32_t>sym, ts)

    cdef uint64_t _send(self, const float *p, const double **book, int32_t sym,
                        long long ts) except 0:
        """Publish one checked request: the raw vector p, or (p NULL) the book update book =
        its four level arrays and three trade values (as doubles, book[4][0..2]); waits for
        room or refuses as [serve] on_full says -> its seq."""
        cdef uint64_t seq = 0
        cdef fp_rep rep
        cdef long spins = 0
        cdef int rc
        while True:
            # fp_client_try_submit refuses (FP_RING_ERR_GONE) once the stop has begun
            if p != NULL:
                rc = fp_client_try_submit(&self._c, p, sym, ts, &seq)
            else:
                rc = fp_client_try_submit_book(&self._c, sym, book[0], book[1], book[2],
                                               book[3], ts, book[4][0], book[4][1],
                                               book[4][2], &seq)
            if rc == FP_RING_OK:
                self._sym_of[(seq - 1) & self._req_mask] = sym
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
                                    r.confidence, r.reason, r.aux))

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
        item = self._await(seq, &rep)
        if item is not None:
            return item
        if rep.err == FP_REP_OK:
            return _make(&rep)
        raise _reply_error(rep.err, seq, int(symbol), -1 if ts_ns is None else ts_ns,
                           rep.signal, rep.confidence)

    def step_book(self, symbol, bid_px, bid_sz, ask_px, ask_sz, ts_ns, trade_vol=0.0,
                  trade_cnt=0, last_trade_sz=0.0):
        """One order book update -> Result, as Engine.step_book on the server's engine (its
        live book of the symbol, with the tick size the server was given: fastpath.serve's
        tick_sizes), in one round trip, as step(). The arguments are Engine.step_book's,
        checked as it checks them before anything is sent; an update the server's engine
        refuses (a crossed or locked book, a bad price, size or order of levels, time going
        back, no tick size for the symbol) is the InputError Engine.step_book raises, with
        the server's book, window and cache of the symbol as they were. Result.latency.book_ns
        is the worker's book stage (saturated at 65534 ns)."""
        cdef Py_ssize_t sym = _symbol_arg(symbol, self.n_symbols)
        cdef long long ts = _ts_arg(ts_ns)
        cdef const double *book[5]
        cdef double trades[3]
        cdef fp_rep rep
        if ts < 0:
            raise InputError("step_book needs ts_ns (int ns >= 0): the book's times since the "
                             "last tick and trade are measured on it")
        bp, bs = _levels(bid_px, "bid_px"), _levels(bid_sz, "bid_sz")
        ap, az = _levels(ask_px, "ask_px"), _levels(ask_sz, "ask_sz")
        trades[0] = _trade_arg(trade_vol, "trade_vol")
        trades[1] = _trade_arg(trade_cnt, "trade_cnt")
        trades[2] = _trade_arg(last_trade_sz, "last_trade_sz")
        if self.raw_len != _BOOK_RAW:
            raise InputError(f"step_book needs a model over the 256-value raw vector of "
                             f"fastpath.lob (raw_len 256); this one reads {self.raw_len}")
        book[0] = <const double *>cnp.PyArray_DATA(bp)
        book[1] = <const double *>cnp.PyArray_DATA(bs)
        book[2] = <const double *>cnp.PyArray_DATA(ap)
        book[3] = <const double *>cnp.PyArray_DATA(az)
        book[4] = trades
        self._need()
        cdef uint64_t seq = self._send(NULL, book, <int32_t>sym, ts)
        item = self._await(seq, &rep)
        if item is not None:
            return item
        if rep.err == FP_REP_OK:
            return _make(&rep)
        if rep.err == FP_REP_ERR_BOOK:
            raise InputError(book_refusal(rep.reason, rep.aux, sym, (
                bp, bs, ap, az, trades[0], trades[1], trades[2]), self.name))
        if rep.err == FP_ERR_TIME_BACKWARDS:
            raise InputError(f"ts_ns {ts} is earlier than the last tick of symbol {sym}; "
                             f"timestamps must not go backwards per symbol (mixing ts_ns with "
                             f"the engine clock also trips this)")
        raise _reply_error(rep.err, seq, sym, ts, rep.signal, rep.confidence)

    cdef object _await(self, uint64_t seq, fp_rep *rep):
        """Spin for the answer to request seq: None with it in *rep, or the answer as poll()
        gives it (a Result, or the error raised) when a call made inside the wait (a signal
        handler's) took it off the ring first. Answers to other requests are kept for poll()."""
        cdef long spins = 0
        while True:
            if fp_client_poll_spin(&self._c, rep):
                if rep.seq == seq:
                    return None
                self._stash.append(self._as_item(rep))
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


# the Clients of this process, for the fork handler below
_clients = weakref.WeakSet()


def _after_fork_in_child():
    for c in list(_clients):
        (<Client>c)._forked()


os.register_at_fork(after_in_child=_after_fork_in_child)
