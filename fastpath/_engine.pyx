# cython: language_level=3
"""The compiled hot path: Engine and Result (fastpath.step and the default engine are in
fastpath._default, the C core and the code shared with serving in fastpath._core, the GPU tick
in fastpath.gpu._tick, which drives the split tick of this module's Engine as an
ExternalStage).

Design: Engine.step checks the raw buffer once through numpy's C API (type,
dtype, byte order, shape, contiguity: a handful of loads, no buffer
acquisition), then makes one C call, fp_step(), that runs every stage. The
only Python object a tick needs is the Result (the one from two ticks ago when
the caller has dropped it, else from a freelist); its Latency is built only
when asked for. step_batch validates the whole batch,
then applies it, in C loops with the GIL released: pieces of ~50 ms, the GIL
taken back between two to let Ctrl-C in; a busy flag (read and written under
the GIL) makes a second thread's call fail cleanly instead of racing.
"""
cimport cython
from cpython.exc cimport PyErr_Clear, PyErr_CheckSignals
from cpython.ref cimport PyObject

cimport numpy as cnp
from cpython.mem cimport PyMem_Malloc, PyMem_Free
from cpython.pythread cimport PyThread_get_thread_ident
from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t, INT64_MAX
from libc.string cimport memcpy, memset

from fastpath._csrc cimport *
from fastpath._core cimport _levels, _make_engine, _symbol_arg, _trade_arg, _ts_arg

cdef extern from "fp_engine.h" nogil:
    int64_t fp_batch_check(fp_engine *e, const float *raws, int64_t row_stride,
                           const int32_t *symbols, const int64_t *ts, int64_t n, int *err)
    ctypedef struct fp_batch_pos:
        int64_t checked, applied, now0
        int begun
    int64_t fp_step_batch_piece(fp_engine *e, const float *raws, int64_t row_stride,
                                const int32_t *symbols, const int64_t *ts, int64_t n,
                                int64_t budget_ns, fp_batch_pos *pos, float *signal,
                                float *confidence, uint8_t *cached, int64_t *total_ns, int *err)

cdef extern from "fp_engine.h" nogil:
    # the live book (csrc/fp_book.h) and its step (Engine.step_book)
    enum:
        FP_ERR_BOOK
        FP_BOOK_LEVELS
    ctypedef struct fp_book_state:
        double bpx[10]
        double apx[10]
        double bsz[10]
        double asz[10]
        double o[256]
        int64_t n, last_move
        double ts, mid
        int have_trade
        double trade_sign, trade_logsz, trade_ts
    ctypedef struct fp_book:
        fp_book_state st[2]
        float *raw[2]
        double tick
        int cur
    int fp_engine_set_tick(fp_engine *e, int32_t symbol, double tick)
    fp_book *fp_engine_book(fp_engine *e, int32_t symbol)
    int fp_step_book(fp_engine *e, int32_t symbol, const fp_book_update *u, fp_result *r,
                     int64_t *book_ns, int *why, int *where)

import operator
import os
import threading

import numpy as np

from fastpath._batch import BatchResult, applied_note, no_row, partial_batch, stopped_note
from fastpath._resolve import open_gpu_stage, resolve
from fastpath._core import (_ISA_BY_NAME, _bad_raw, _book_refusal, _conversion_hint,
                            _describe, _n_masked, all_isas, best_isa, cpu_features, supported_isas)
from fastpath.errors import InputError, EngineBusyError, FastpathError, BackendError

cnp.import_array()

_REASONS = ("hit", "cold", "age", "run", "cosine", "norm", "disabled")


def clock_info():
    """The clock behind the latency figures: source, ns per tick, cost of one read in ns, and
    how the TSC rate was calibrated (bracketed samples taken, the tightest at each end of the
    baseline kept; the wider of those two brackets in ns, the calibration's error; how many
    times it has re-anchored to CLOCK_MONOTONIC since import; of those, how many found the two
    clocks stepped apart (a VM paused, a suspend: the rate kept) and how many found the TSC
    gone back (reset on resume, a migration: the mapping restarted, never going back))."""
    return {"source": fp_clock_source().decode(), "ns_per_tick": fp_clock.ns_per_tick,
            "read_cost_ns": fp_clock.read_cost_ns,
            "calibration_samples": fp_clock.cal_samples,
            "calibration_bracket_ns": fp_clock.cal_bracket_ns,
            "reanchors": fp_clock.reanchors, "steps": fp_clock.steps,
            "tsc_backs": fp_clock.tsc_backs}


def monotonic_ns():
    """CLOCK_MONOTONIC in ns: the clock the cache age uses when step() gets no ts_ns."""
    return fp_mono_ns()


# step_batch in pieces of this much time (fp_step_batch_piece: the C side reads the clock
# every 256 rows), the GIL taken back between two for PyErr_CheckSignals, so that Ctrl-C
# stops a long batch. 50 ms: a KeyboardInterrupt is seen within ~50 ms (a person does not
# notice), and a piece costs ~1 us of GIL hand-over and signal check (0.002%). A fixed count
# of rows would have been ~20 ms for the demo model but seconds for a model 100x slower. Not
# shorter: taking the GIL back waits up to one switch interval (5 ms) when another thread
# runs Python meanwhile, 10% of a piece in that case; and a batch off the main thread
# (Python runs signal handlers only there) stays one piece, as before.
cdef int64_t _BATCH_PIECE_NS = 50_000_000
# the thread Python runs signal handlers in (the forking thread, in a child after fork)
cdef unsigned long _main_ident = threading.main_thread().ident


def _note_main_thread():
    global _main_ident
    _main_ident = PyThread_get_thread_ident()


os.register_at_fork(after_in_child=_note_main_thread)


def _batch_piece_ns(budget_ns=None):
    """Tests: step_batch's piece budget in ns on the main thread, as it was before this call;
    a given one replaces it (1: pieces of 256 rows, the least the C side runs; <= 0: none)."""
    global _BATCH_PIECE_NS
    old = _BATCH_PIECE_NS
    if budget_ns is not None:
        _BATCH_PIECE_NS = budget_ns
    return old


# the largest infer_ns _step_external takes: the engine adds the head's time to it (and the
# total to it) in int64
cdef long long _EXTERN_INFER_MAX = 4611686018427387904   # 2**62


@cython.final
@cython.freelist(32)
cdef class Latency:
    """Nanoseconds per stage of one tick; 0 where a stage did not run.

    Measured inside the C call with the TSC (see fastpath.clock_info()):
    total_ns covers validation, features, cache, inference and store, not the
    Python call around them. With [engine] stage_times = false only total_ns is measured
    (two clock reads a tick instead of up to five) and feature_ns, cache_ns and infer_ns
    are -1. wait_ns: for an answer served through fastpath.connect(), from
    submit to the worker picking the request up (0 in-process). book_ns: Engine.step_book's
    live book stage (0 for a raw vector's tick; total_ns includes it). Fields:
    fastpath/_engine.pxd."""

    def __repr__(self):
        return (f"Latency(feature_ns={self.feature_ns}, cache_ns={self.cache_ns}, "
                f"infer_ns={self.infer_ns}, h2d_ns={self.h2d_ns}, d2h_ns={self.d2h_ns}, "
                f"total_ns={self.total_ns}, wait_ns={self.wait_ns}, book_ns={self.book_ns})")


@cython.final
@cython.freelist(32)
cdef class Result:
    """One tick's answer: signal in [-1, 1], confidence in [0, 1], whether it came from the cache
    (and, for a served answer, its seq and wait_ns). Fields: fastpath/_engine.pxd."""

    @property
    def miss_reason(self):
        """'hit', or why the cache missed: cold, age, run, cosine, norm, disabled."""
        return _REASONS[self._reason] if 0 <= self._reason < len(_REASONS) else "?"

    @property
    def latency(self):
        cdef Latency L = Latency.__new__(Latency)
        L.feature_ns = self._f
        L.cache_ns = self._c
        L.infer_ns = self._i
        L.h2d_ns = self._h
        L.d2h_ns = self._d
        L.total_ns = self._t
        L.wait_ns = self.wait_ns
        L.book_ns = self._b
        return L

    def __repr__(self):
        wait = f", seq={self.seq}, wait_ns={self.wait_ns}" if self.seq else ""
        return (f"Result(signal={self.signal:.6f}, confidence={self.confidence:.6f}, "
                f"cached={bool(self.cached)}, total_ns={self._t}{wait})")


cdef extern from *:
    # Reusing a Result relies on its reference count being exact; a free-threaded build's
    # is not (biased counts, other threads' references), so there a Result is always new.
    """
    #ifdef Py_GIL_DISABLED
    #define FP_RESULT_REUSE 0
    #else
    #define FP_RESULT_REUSE 1
    #endif
    """
    const bint FP_RESULT_REUSE
    Py_ssize_t _refcnt "Py_REFCNT"(PyObject *o)

# The last two Results _make_result handed out. In the usual loop, `r = step(...)`, the one
# from two calls ago has been dropped by the caller by the time of the next call: only this
# slot holds it, and it is filled again instead of allocating a new one (a freelist pop,
# a memset and PyObject_Init, and on the caller's side its dealloc). A Result anything else
# still references is never touched.
cdef Result _spare_old = None
cdef Result _spare_new = None


cdef inline Result _new_result():
    global _spare_old, _spare_new
    cdef Result res
    if FP_RESULT_REUSE and _spare_old is not None and _refcnt(<PyObject *>_spare_old) == 1:
        res = _spare_old
        # the fields _make_result does not write, as a new Result has them
        res.seq = 0
        res.wait_ns = 0
        res._h = 0
        res._d = 0
        res._b = 0
    else:
        res = Result.__new__(Result)
    _spare_old = _spare_new
    _spare_new = res
    return res


cdef extern from *:
    # A compiler barrier: the loads on either side stay separate instructions
    """
    #if defined(__GNUC__)
    #define FP_SEPARATE_LOADS() __asm__ __volatile__("" ::: "memory")
    #else
    #define FP_SEPARATE_LOADS() ((void)0)
    #endif
    """
    void _separate_loads "FP_SEPARATE_LOADS"() noexcept nogil


cdef inline Result _make_result(const fp_result *r):
    cdef Result res = _new_result()
    # fp_step has just stored these fields one by one; a wider load spanning two of those
    # stores (the compiler pairs signal+confidence and feature_ns+cache_ns) cannot take its
    # data from the store buffer and waits for both stores to reach the cache. One load per
    # field forwards.
    res._f = r.feature_ns
    _separate_loads()
    res._c = r.cache_ns
    _separate_loads()
    res._i = r.infer_ns
    _separate_loads()
    res._t = r.total_ns
    res.signal = r.signal
    _separate_loads()
    res.confidence = r.confidence
    res.cached = r.cached
    res._reason = r.reason
    return res


cdef Result _result_of(const fp_result *r):
    return _make_result(r)


cdef class ExternalStage:
    """The model stage of a backend outside the C core (fastpath.gpu._tick.GpuStage): an
    engine with one hands it every tick and batch. This base runs nothing."""

    cdef Result step(self, Engine eng, object raw, object symbol, object ts_ns):
        raise BackendError(f"{type(self).__name__} runs no tick")

    cdef object step_batch(self, Engine eng, object raws, object symbols, object ts_ns):
        raise BackendError(f"{type(self).__name__} runs no batch")

    cdef int close(self) except -1:
        self.backend = None
        return 0


cdef extern from "fp_engine.h":
    void fp_engine_set_stage_times(fp_engine *e, int on)
    int fp_engine_stage_times(const fp_engine *e)


# Engine() / Engine(config=...) without a model: a default that says what is missing
_NO_MODEL = object()
_NO_MODEL_MSG = (
    "Engine needs a model: Engine(model, backend=None, config=None), model a path to an "
    ".onnx file or a .fpm bundle, or a fastpath.Model (got none); the embedded demo model "
    "runs behind fastpath.step(), and fastpath.configure(config) rebuilds that engine with a "
    "config")


cdef inline int _check_out(object out, int n_out) except -1:
    """predict's out: an exact float32 ndarray of n_out values, C-contiguous, writeable, in
    native byte order; anything else is an InputError saying what it must be"""
    if (type(out) is cnp.ndarray and cnp.PyArray_TYPE(<cnp.ndarray>out) == cnp.NPY_FLOAT32
            and cnp.PyArray_NDIM(<cnp.ndarray>out) == 1
            and cnp.PyArray_DIM(<cnp.ndarray>out, 0) == n_out
            and cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>out)
            and cnp.PyArray_ISWRITEABLE(<cnp.ndarray>out)
            and cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>out)):
        return 0
    why = ""
    if isinstance(out, np.ndarray):
        why = (" (read-only)" if not out.flags.writeable else
               f" (a {type(out).__name__}, a subclass)" if type(out) is not np.ndarray else "")
    raise InputError(f"out must be a writeable, C-contiguous float32 numpy.ndarray (not a "
                     f"subclass, native byte order) of shape ({n_out},) (the model's outputs), "
                     f"got {_describe(out)}{why}")


# final (fastpath/_engine.pxd, where the attributes are declared): nothing subclasses Engine,
# and its cdef methods (_step, _raw_ptr, _check_free) are then direct calls the C compiler can
# inline instead of vtable calls. The docstring opens with the signature in Argument Clinic's
# form ("--" after it): inspect.signature(Engine) and help() read a builtin type's signature
# from there and nowhere else (it raised ValueError)
@cython.final
cdef class Engine:
    """Engine(model, backend=None, config=None)
--

A model, its feature spec and cache, ready to step ticks.

    Engine(model, backend=None, config=None): model is a path (.onnx or a
    .fpm bundle) or a fastpath.Model; config is None, a dict, a TOML path or
    a fastpath.control.config.EngineConfig; backend "cpu", "gpu" or "auto"
    (None: the config's [engine] backend, "cpu" unless it says otherwise)."""

    # backend=None: the config's [engine] backend decides ("cpu" by default), so a config
    # file's backend = "auto" or "gpu" is not overridden by the argument's default
    def __cinit__(self, model=_NO_MODEL, backend=None, config=None):
        self._e = NULL
        if model is _NO_MODEL:
            # Cython's own message would name neither the class nor what it needs
            raise TypeError(_NO_MODEL_MSG)
        model, cfg, backend, reason, self._auto = resolve(model, backend, config, report=True)
        self.model = model
        self._scaler = getattr(model, "input_scaler", None)
        self.config = cfg
        self.backend = backend
        self.backend_reason = reason
        self.simd = cfg.simd_resolved
        self._create()
        if backend == "gpu":
            try:
                # the GPU package's stage (fastpath.gpu registers its opener when imported)
                self._stage = open_gpu_stage(self)
                self._on_gpu = True
            except BackendError as exc:
                # backend="auto" that chose the GPU (gpu.auto = "gpu", or it measured faster)
                # and then could not set it up runs on the CPU and says why, as it does where
                # the GPU is not usable at all; backend="gpu" raises
                if not reason.startswith("auto:"):
                    raise
                self.backend = "cpu"
                self.backend_reason = (f"auto: cpu chosen (the GPU {cfg.source.gpu.mode} path "
                                       f"failed: {exc})")

    cdef _create(self):
        keep = []
        self._e = _make_engine(self.model, self.config, keep)
        if keep:
            self._region = keep[0]
            self.memory = self._region.report
        fs = self.model.feature_spec
        self.raw_len = fs.raw_len
        self.n_features = fs.n_feat
        self.n_outputs = self._e.n_out
        self.n_symbols = self.config.n_symbols
        fp_engine_set_stage_times(self._e, 1 if self.config.source.stage_times else 0)

    @property
    def stage_times(self):
        """Whether each tick's stages are timed ([engine] stage_times); off, only total_ns."""
        return bool(fp_engine_stage_times(self._e))

    def __dealloc__(self):
        if self._stage is not None:
            # a persistent kernel must not outlive its engine; close() is the clean way
            try:
                self._stage.close()
            except Exception:
                pass
            self._stage = None
        if self._e != NULL:
            fp_engine_free(self._e)
            self._e = NULL

    cdef inline const float *_raw_ptr(self, object raw) except NULL:
        cdef cnp.ndarray a
        # an exact ndarray (the common call) in one type compare; a subclass also when it is
        # not a masked array hiding missing values (its data under a mask was stepped as if
        # valid, silently)
        if cnp.PyArray_CheckExact(raw) or (cnp.PyArray_Check(raw) and not _n_masked(raw)):
            a = <cnp.ndarray>raw
            if (cnp.PyArray_TYPE(a) == cnp.NPY_FLOAT32 and cnp.PyArray_NDIM(a) == 1
                    and cnp.PyArray_DIM(a, 0) == self.raw_len and cnp.PyArray_ISCARRAY_RO(a)
                    and cnp.PyArray_ISNOTSWAPPED(a)):
                return <const float *>cnp.PyArray_DATA(a)
        raise _bad_raw(raw, self.raw_len)

    # symbol: an object, as step_batch's row may hold any uint64 (as a Py_ssize_t, 2**63 and
    # up raised OverflowError instead of this InputError)
    cdef _raise(self, int rc, object raw, object symbol, long long ts, Py_ssize_t row=-1):
        where = f"row {row}: " if row >= 0 else ""
        if rc == FP_ERR_SYMBOL:
            raise InputError(f"{where}symbol {symbol} out of range: this engine has "
                             f"{self.n_symbols} symbols (0..{self.n_symbols - 1}); raise "
                             f"engine.n_symbols in the config for more")
        if rc == FP_ERR_NONFINITE_INPUT:
            arr = np.asarray(raw)
            bad = np.flatnonzero(~np.isfinite(arr))
            i = int(bad[0]) if len(bad) else -1
            raise InputError(f"{where}raw contains {len(bad)} non-finite value(s), first at index "
                             f"{i} ({arr[i] if i >= 0 else '?'}); ticks must be finite: repair or "
                             f"drop the tick (engine state unchanged)")
        if rc == FP_ERR_TIME_BACKWARDS:
            when = f"ts_ns {ts}" if ts >= 0 else "the engine clock (no ts_ns given)"
            raise InputError(f"{where}{when} is earlier than the last tick of symbol {symbol}; "
                             f"timestamps must not go backwards per symbol (mixing ts_ns with the "
                             f"engine clock also trips this)")
        if rc == FP_ERR_NONFINITE_FEATURE:
            raise InputError(f"{where}the raw tick is finite but its features overflowed to "
                             f"NaN/Inf (a value too large for the feature spec's mean/std or "
                             f"rolling window); the tick was not applied (engine state "
                             f"unchanged): check the feed for a corrupt value")
        if rc == FP_ERR_NOT_PROBABILITY:
            raise InputError(f"{where}{self._not_probabilities()}; the tick was not applied "
                             f"(engine state unchanged)")
        if rc == FP_ERR_NONFINITE_OUTPUT and self._e.model_kind == FP_MODEL_TREES:
            raise InputError(f"{where}the model produced NaN/Inf for this tick (the tree "
                             f"ensemble's leaf values summed past float32's range, or its post "
                             f"transform left its range: a PROBIT of a score outside (0, 1), "
                             f"or SOFTMAX_ZERO of all-zero scores); the tick was not applied "
                             f"(engine state unchanged)")
        if rc == FP_ERR_NONFINITE_OUTPUT:
            raise InputError(f"{where}the model produced NaN/Inf for this tick (a hidden layer "
                             f"or the output overflowed: raw values too large for the model); "
                             f"the tick was not applied (engine state unchanged)")
        raise FastpathError(f"fp_step failed with code {rc}")

    cdef str _not_probabilities(self):
        """What FP_ERR_NOT_PROBABILITY says: the outputs the classifier head refused (the C
        core leaves them in e->out) and what the head reads."""
        cdef Py_ssize_t n = self._e.n_out
        out = [float(self._e.out[i]) for i in range(n)]
        h = self.model.head_spec
        bad = [i for i, v in enumerate(out) if not -1e-4 <= v <= 1.0 + 1e-4]
        shown = ", ".join(f"{v:.6g}" for v in out[:8]) + (", ..." if n > 8 else "")
        first = f"output {bad[0]} is {out[bad[0]]:.6g}" if bad else "an output is out of range"
        return (f"the model's outputs [{shown}] are not class probabilities ({first}; each "
                f"must be in [0, 1]): the head {h.kind!r} (outputs {tuple(h.outputs)}) reads "
                f"them as probabilities (signal = p(up) - p(down), confidence = the largest), "
                f"and margins or scores would give a signal outside [-1, 1] or a meaningless one "
                f"inside; give a head for raw outputs (e.g. Head('regression', outputs=(i,)) or "
                f"Head('tanh_sigmoid', outputs=(a, b))) or a model with a softmax / logistic "
                f"output")

    cdef _raise_row(self, int err, cnp.ndarray R, cnp.ndarray S, object T, Py_ssize_t row):
        """_raise for a batch's row. Its timestamp behind an earlier row of its symbol in the
        batch names that row: the message blamed "the last tick of symbol s", which the
        engine had not seen (no row was applied), nor would have where the model stage
        refuses that earlier row."""
        cdef long long ts = int(T[row]) if T is not None else -1
        if err == FP_ERR_TIME_BACKWARDS and T is not None:
            sym = int(S[row])
            ahead = np.flatnonzero((S[:row] == sym) & (T[:row] > ts))
            if len(ahead):
                j = int(ahead[0])
                raise InputError(f"row {row}: ts_ns {ts} is earlier than the last tick of "
                                 f"symbol {sym}, row {j} of this batch (ts_ns {int(T[j])}); "
                                 f"timestamps must not go backwards per symbol")
        self._raise(err, R[row], int(S[row]), ts, row)

    cdef inline int _check_free(self) except -1:
        if self._busy and (self._busy_owner == 0
                           or self._busy_owner != PyThread_get_thread_ident()):
            raise EngineBusyError("engine is busy on another thread (in step_batch, or in a "
                                  "GPU tick waiting for the device); an Engine is "
                                  "single-writer: step it from one thread (or give each thread "
                                  "its own Engine) and read ticks / stats() / "
                                  "latency_records() once step_batch has returned (or "
                                  "the GPU tick)")
        return 0

    cdef Result _step(self, object raw, object symbol, object ts_ns):
        cdef fp_result r
        cdef const float *p = self._raw_ptr(raw)
        cdef Py_ssize_t sym = _symbol_arg(symbol, self.n_symbols)
        cdef long long ts = _ts_arg(ts_ns)
        self._check_free()
        cdef int rc = fp_step(self._e, p, <int32_t>sym, ts, &r)
        if rc != FP_OK:
            self._raise(rc, raw, sym, ts)
        return _make_result(&r)

    def step(self, raw, symbol=0, ts_ns=None):
        """One tick -> Result. raw: float32 C-contiguous (raw_len,); symbol: int in
        [0, n_symbols); ts_ns: int >= 0 (ns) drives the cache age, as in a replay, None uses
        the engine clock (CLOCK_MONOTONIC ns). Anything else is an InputError, state unchanged."""
        if self._on_gpu: return self._stage.step(self, raw, symbol, ts_ns)
        return self._step(raw, symbol, ts_ns)

    def _step_external(self, raw, symbol, outputs, long long infer_ns, ts_ns=None,
                       list into=None):
        """One tick whose model outputs come from outside the engine (another backend): the
        engine's own validation, features, cache lookup, head, store and window commit around
        `outputs` (float32 (n_outputs,), after the post transform, used only on a miss), with `infer_ns` reported as the time the
        outside inference took (the head's time is added to it; on a miss total_ns includes
        it too, as it ran before this call). The path a GPU backend takes. into: a list the
        Result is appended to before this returns (a batch's answers: a KeyboardInterrupt
        raised as the call returns lost an applied row's answer from `out.append(...)`)."""
        cdef fp_result r
        cdef fp_pending pend
        cdef const float *p = self._raw_ptr(raw)
        cdef Py_ssize_t sym = _symbol_arg(symbol, self.n_symbols)
        cdef long long ts = _ts_arg(ts_ns)
        out = np.ascontiguousarray(outputs, dtype=np.float32)
        if out.shape != (self.n_outputs,):
            raise InputError(f"outputs must hold the model's {self.n_outputs} outputs, got "
                             f"shape {out.shape}")
        if infer_ns < 0 or infer_ns > _EXTERN_INFER_MAX:
            raise InputError(f"infer_ns must be in [0, 2**62], got {infer_ns}")
        self._check_free()
        cdef int rc = fp_step_begin(self._e, p, <int32_t>sym, ts, &pend)
        cdef fp_lat *rec
        if rc == FP_OK:
            rc = fp_step_finish(self._e, &pend, <const float *>cnp.PyArray_DATA(out), infer_ns, &r)
        if rc != FP_OK:
            self._raise(rc, raw, sym, ts)
        if not r.cached:
            # the outside inference ran before this call, outside the in-C total that
            # fp_step_finish measured (on the GPU tick's path, fastpath.gpu._tick, it runs
            # between begin and finish, inside it): a total without it was smaller than the
            # infer_ns it contains
            r.total_ns += infer_ns
            rec = &self._e.lat[(self._e.ticks - 1) & self._e.lat_mask]
            rec.total = <uint32_t>min(<long long>rec.total + infer_ns, <long long>0xFFFFFFFF)
        res = _make_result(&r)
        if into is not None:
            into.append(res)
        return res

    cdef tuple _batch_args(self, raws, symbols, ts_ns):
        """step_batch's arguments checked and made contiguous: (raws float32 (n, raw_len),
        symbols int32 (n,), ts_ns int64 (n,) or None), with the errors a user reads."""
        cdef cnp.ndarray R, S, T
        cdef Py_ssize_t n
        R = self._batch_raws(raws)
        n = cnp.PyArray_DIM(R, 0)
        sy = np.asarray(symbols)
        if n == 0 and isinstance(symbols, (list, tuple)) and not symbols:
            sy = np.empty(0, np.int32)      # [] is float64 to numpy: an empty batch's symbols
        if sy.ndim != 1 or sy.shape[0] != n or sy.dtype.kind not in "iu":
            hint = ("; symbols are indices 0..n_symbols-1: map names to indices once"
                    if sy.dtype.kind in "USO" else "")
            orow = _first_int_outside(sy, n, 0, self.n_symbols - 1)
            if orow >= 0:
                # integers numpy kept as objects (one past int64): the value is what is wrong
                try:
                    self._raise(FP_ERR_SYMBOL, None, sy[orow], -1, orow)
                except InputError as exc:
                    raise no_row(exc, True) from None
            if orow == -1:
                hint = "; convert with np.asarray(symbols, dtype=np.int64)"
            raise no_row(InputError(f"symbols must be an integer array of shape ({n},), got "
                                     f"{_describe(sy)}{hint}"))
        cdef Py_ssize_t row
        if sy.dtype == np.int32:
            # the common case checked and passed as it is (no int64 copy and back)
            S = np.ascontiguousarray(sy)
            row = _first_outside32(S, self.n_symbols - 1)
        else:
            S = _as_int64(sy)
            row = _first_outside(S, 0, self.n_symbols - 1)
        if row >= 0:
            try:
                self._raise(FP_ERR_SYMBOL, None, int(sy[row]), -1, row)
            except InputError as exc:
                raise no_row(exc, True) from None
        if S.dtype != np.int32:
            S = S.astype(np.int32)
        T = None
        if ts_ns is not None:
            ts = np.asarray(ts_ns)
            if n == 0 and isinstance(ts_ns, (list, tuple)) and not ts_ns:
                ts = np.empty(0, np.int64)
            if ts.ndim != 1 or ts.shape[0] != n or ts.dtype.kind not in "iu":
                hint = ""
                if ts.dtype.kind == "M":
                    hint = "; pass ts.astype('datetime64[ns]').view(np.int64) (ns since the epoch)"
                elif ts.dtype.kind == "f":
                    hint = "; pass integer ns (np.int64), floats lose precision beyond 2**53 ns"
                else:
                    orow = _first_int_outside(ts, n, 0, INT64_MAX)
                    if orow >= 0:
                        if ts[orow] < 0:
                            raise no_row(InputError(f"ts_ns must be >= 0, row {orow} is "
                                                     f"{ts[orow]}"))
                        raise no_row(InputError(f"ts_ns row {orow} is {ts[orow]}, which does "
                                                 f"not fit a signed 64-bit int of ns"))
                    if orow == -1:
                        hint = "; convert with np.asarray(ts_ns, dtype=np.int64)"
                raise no_row(InputError(f"ts_ns must be an integer array of shape ({n},), got "
                                         f"{_describe(ts)}{hint}"))
            T = _as_int64(ts)
            row = _first_outside(T, 0, INT64_MAX)
            if row >= 0:
                # the first bad row, as every other refusal of a batch names it
                if ts[row] < 0:
                    raise no_row(InputError(f"ts_ns must be >= 0, row {row} is {ts[row]}"))
                raise no_row(InputError(f"ts_ns row {row} is {ts[row]}, which does not fit a "
                                         f"signed 64-bit int of ns"))
        return R, S, T

    def step_batch(self, raws, symbols, ts_ns=None):
        """Many ticks in one call, in order, GIL released: raws float32 (n, raw_len), symbols
        int (n,), ts_ns optional int64 (n,). Every row's arguments are validated before any
        is applied (symbols, finite raws, timestamps); a row the model stage refuses (its
        features or outputs overflowed, which depends on the rows before it) stops the batch
        there, the rows before it applied, as the InputError says: its .applied is how many
        rows were and its .result their BatchResult (0 and an empty one when no row was).
        On the main thread a long batch stops for Ctrl-C (within ~50 ms): the
        KeyboardInterrupt (or what another signal handler raised) carries the same .applied
        and .result, the rows applied staying applied (step_batch(raws[k:], ...) with
        k = .applied goes on where it stopped).
        Returns a BatchResult with signal, confidence (float32), cached (bool), total_ns (int64)."""
        if self._on_gpu: return self._stage.step_batch(self, raws, symbols, ts_ns)
        cdef cnp.ndarray R, S, T
        R, S, T = self._batch_args(raws, symbols, ts_ns)
        cdef Py_ssize_t n = cnp.PyArray_DIM(R, 0)
        cdef const int64_t *tp = NULL if T is None else <const int64_t *>cnp.PyArray_DATA(T)
        cdef cnp.npy_intp dim = n
        sig = cnp.PyArray_EMPTY(1, &dim, cnp.NPY_FLOAT32, 0)
        conf = cnp.PyArray_EMPTY(1, &dim, cnp.NPY_FLOAT32, 0)
        cached = cnp.PyArray_EMPTY(1, &dim, cnp.NPY_BOOL, 0)
        tot = cnp.PyArray_EMPTY(1, &dim, cnp.NPY_INT64, 0)
        cdef float *sp = <float *>cnp.PyArray_DATA(sig)
        cdef float *cp = <float *>cnp.PyArray_DATA(conf)
        cdef uint8_t *hp = <uint8_t *>cnp.PyArray_DATA(cached)
        cdef int64_t *op = <int64_t *>cnp.PyArray_DATA(tot)
        cdef const float *rp = <const float *>cnp.PyArray_DATA(R)
        cdef const int32_t *yp = <const int32_t *>cnp.PyArray_DATA(S)
        cdef int err = 0
        cdef int64_t bad
        cdef fp_batch_pos pos
        memset(&pos, 0, sizeof(pos))
        # pieces on the main thread only: elsewhere PyErr_CheckSignals has nothing to run
        cdef int64_t budget = (_BATCH_PIECE_NS if PyThread_get_thread_ident() == _main_ident
                               else 0)
        self._check_free()
        self._busy = True
        try:
            with nogil:
                bad = fp_step_batch_piece(self._e, rp, self.raw_len, yp, tp, n, budget, &pos,
                                          sp, cp, hp, op, &err)
            while bad < 0:
                # also after the last piece: a Ctrl-C during it raised on return, and the
                # answers of the rows it applied were lost with the arrays
                if n:
                    PyErr_CheckSignals()
                if pos.applied == n:
                    break
                with nogil:
                    bad = fp_step_batch_piece(self._e, rp, self.raw_len, yp, tp, n, budget,
                                              &pos, sp, cp, hp, op, &err)
        except BaseException as exc:
            # a signal handler's exception (KeyboardInterrupt) between two pieces, or an
            # EngineBusyError of a handler that stepped this engine: the rows applied stay
            # applied, their answers with the exception, as a refusal's
            applied = pos.applied
            partial_batch(exc, sig, conf, cached, tot, applied)
            exc.add_note(stopped_note(applied, n))
            raise
        finally:
            self._busy = False
        if bad >= 0:
            applied = pos.applied
            note = "; " + applied_note(applied)
            try:
                self._raise_row(err, R, S, T, bad)
            except InputError as exc:
                raise partial_batch(InputError(str(exc) + note), sig, conf, cached, tot,
                                     applied) from None
        return _batch_result(sig, conf, cached, tot)

    cdef cnp.ndarray _batch_raws(self, raws):
        if (isinstance(raws, np.ndarray) and raws.dtype == np.float32 and raws.dtype.isnative
                and raws.ndim == 2 and raws.shape[1] == self.raw_len
                and raws.flags.c_contiguous and raws.flags.aligned
                and (type(raws) is np.ndarray or not _n_masked(raws))):
            return raws
        raise no_row(InputError(f"raws must be a float32 C-contiguous numpy array of shape "
                                 f"(n, {self.raw_len}), got {_describe(raws)}"
                                 f"{_conversion_hint(raws)}"))

    def predict(self, x, out=None):
        """The model's outputs for one feature vector x (n_features values), as onnxruntime
        returns them for the same model (regressors: the values; classifiers: the class
        probabilities), before the head. No feature stage, no cache, no state touched.
        out: a float32 numpy.ndarray of n_outputs values (C-contiguous, writeable, native
        byte order) to write them into and return, instead of a new array each call; on an
        error it is left as it was.
        x must be finite (InputError otherwise), except for a tree ensemble, which reads a NaN
        as a missing value as the ONNX spec does; a model that overflows on x is an
        InputError. x is the model's input: a model with an input scaler (an imported ONNX
        pipeline's leading Scaler) reads it through it first, and a finite x that the scaler
        takes past float32's range is an InputError, as step() refuses such a tick."""
        cdef cnp.ndarray xa
        cdef bint trees = self._e.model_kind == FP_MODEL_TREES
        # the common case (what a strategy holds: a float32 vector of the right length) is
        # checked with a few C tests and used in place; anything else goes through numpy
        # (byte order too: NPY_FLOAT32 is also the type of a big-endian float32 array, whose
        # bytes were read as native floats, a silently wrong prediction)
        if (type(x) is cnp.ndarray and cnp.PyArray_TYPE(<cnp.ndarray>x) == cnp.NPY_FLOAT32
                and cnp.PyArray_NDIM(<cnp.ndarray>x) == 1
                and cnp.PyArray_DIM(<cnp.ndarray>x, 0) == self.n_features
                and cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>x)
                and cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>x)):
            xa = <cnp.ndarray>x
        else:
            if _n_masked(x):
                # np.asarray drops the mask: the data under it was predicted on as if valid
                raise InputError(f"x must be a numeric vector of {self.n_features} values, got "
                                 f"{_describe(x)}{_conversion_hint(x)}")
            try:
                a = np.asarray(x)
            except Exception:
                raise InputError(f"x must be a numeric vector of {self.n_features} values, got "
                                 f"{_describe(x)}") from None
            if a.ndim != 1 or a.shape[0] != self.n_features or a.dtype.kind not in "fiub":
                raise InputError(f"x must be a numeric vector of {self.n_features} values, got "
                                 f"{_describe(x)}")
            with np.errstate(over="ignore", invalid="ignore"):
                xa = np.ascontiguousarray(a, dtype=np.float32)
            if not trees and a.dtype.kind == "f" and a.dtype.itemsize > 4:
                # a finite float64 past float32's range became +-Inf in the cast: say so
                # (the message said the caller's finite vector held non-finite values)
                wide = np.flatnonzero(np.isfinite(a) & ~np.isfinite(xa))
                if len(wide):
                    i = int(wide[0])
                    raise InputError(f"x[{i}] = {float(a[i])!r} is beyond float32's range (+-3.4e38), "
                                     f"which the model computes in; scale the features")
        # a tree ensemble reads NaN as a missing value (ONNX's missing-value tracks)
        if not trees and not self._e.k.allfinite(<const float *>cnp.PyArray_DATA(xa),
                                                 <int>self.n_features):
            i = int(np.flatnonzero(~np.isfinite(xa))[0])
            raise InputError(f"x contains non-finite values, first at index {i} ({xa[i]}); "
                             f"predict takes finite feature vectors, as step() does")
        sc = self._scaler
        if sc is not None:
            # x is the model's input (what onnxruntime reads); the first layer reads it
            # through the input scaler, which the feature stage runs for step(): the same
            # float32 ops, (x - offset) * scale
            with np.errstate(all="ignore"):
                # numpy's overflow warning was the caller's error under -W error (not an
                # InputError), and is said below
                ya = np.ascontiguousarray(sc.apply(xa), dtype=np.float32)
            # a finite input the scaler takes past float32's range: step() refuses such a
            # tick (its features overflowed); here the message blamed "a layer", and a tree
            # ensemble walked the Inf and answered
            wide = np.flatnonzero(np.isfinite(xa) & ~np.isfinite(ya))
            if len(wide):
                i = int(wide[0])
                raise InputError(f"x[{i}] = {float(xa[i]):.9g} read through the model's input "
                                 f"scaler ((x - {float(sc.offset[i]):.9g}) * "
                                 f"{float(sc.scale[i]):.9g}) is {float(ya[i])}, beyond float32's "
                                 f"range; step() refuses such a tick too (its features "
                                 f"overflow)")
            xa = ya
        return self._predict_first_layer(xa, trees, out)

    def _predict_features(self, x):
        """The model's outputs for the first layer's inputs x (float32, n_features values, as
        Engine.features returns them: an input scaler already applied), for a caller that
        holds those (fastpath.gpu's CPU recompute of a row the GPU flagged); predict() takes
        the model's input and applies the scaler itself."""
        cdef cnp.ndarray xa = np.ascontiguousarray(x, dtype=np.float32)
        if xa.ndim != 1 or xa.shape[0] != self.n_features:
            raise InputError(f"x must be a vector of {self.n_features} features, got "
                             f"{_describe(x)}")
        cdef bint trees = self._e.model_kind == FP_MODEL_TREES
        if not trees and not self._e.k.allfinite(<const float *>cnp.PyArray_DATA(xa),
                                                 <int>self.n_features):
            i = int(np.flatnonzero(~np.isfinite(xa))[0])
            raise InputError(f"x contains non-finite values, first at index {i} ({xa[i]})")
        return self._predict_first_layer(xa, trees, None)

    cdef cnp.ndarray _predict_first_layer(self, cnp.ndarray xa, bint trees, object out):
        """fp_predict into a new array, or into out through a scratch copied over it on
        success, so a refused input leaves the caller's array as it was. out is checked
        here, after every step that can run the caller's code (x's conversion), so nothing
        can resize it or make it read-only between the check and the copy."""
        self._check_free()
        cdef cnp.npy_intp n_out = self.n_outputs
        # what fp_predict writes: a new array, or for out the engine's own scratch (made at
        # the first such call)
        cdef cnp.ndarray res
        if out is None:
            res = cnp.PyArray_EMPTY(1, &n_out, cnp.NPY_FLOAT32, 0)
        else:
            _check_out(out, n_out)
            if self._out_scratch is None:
                self._out_scratch = cnp.PyArray_EMPTY(1, &n_out, cnp.NPY_FLOAT32, 0)
            res = self._out_scratch
        cdef int rc = fp_predict(self._e, <const float *>cnp.PyArray_DATA(xa),
                                 <float *>cnp.PyArray_DATA(res))
        if rc == FP_OK:
            if out is None:
                return res
            memcpy(cnp.PyArray_DATA(<cnp.ndarray>out), cnp.PyArray_DATA(res),
                   sizeof(float) * n_out)
            return <cnp.ndarray>out
        if trees:
            raise InputError("the model produced NaN/Inf for this input (the tree "
                             "ensemble's leaf values summed past float32's range, or its "
                             "post transform left its range, e.g. a PROBIT of a score "
                             "outside (0, 1))")
        raise InputError("the model produced NaN/Inf for this input (a layer overflowed: "
                         "values too large for the model)")

    def features(self, raw, symbol=0):
        """The feature vector this tick would get (windows include it), without applying it.
        A tick step() would refuse for its features (finite raw, features overflowed to
        NaN/Inf) is refused here with the same InputError. These are the first layer's
        inputs: on a model with an input scaler (an imported ONNX pipeline's leading
        Scaler) the scaler is already applied, so they are not predict()'s input, which
        is the model's input before the scaler, as onnxruntime reads it."""
        cdef const float *p = self._raw_ptr(raw)
        cdef Py_ssize_t sym = _symbol_arg(symbol, self.n_symbols)
        self._check_free()
        cdef fp_pending pend
        # a timestamp no tick's can pass (ts_ns takes any int64 >= 0: with 2**62 here a
        # symbol stepped at a later ts_ns made features() an InputError, time going
        # backwards); the lookup it feeds changes nothing
        cdef int rc = fp_step_begin(self._e, p, <int32_t>sym, 0x7FFFFFFFFFFFFFFFLL, &pend)
        if rc != FP_OK:
            self._raise(rc, raw, sym, -1)
        # fp_step_begin leaves NaN/Inf features for the model stage to refuse; step() never
        # answers with them, so neither does this (they were returned as if valid)
        if not self._e.k.allfinite(self._e.feat, <int>self.n_features):
            self._raise(FP_ERR_NONFINITE_FEATURE, raw, sym, -1)
        out = np.empty(self.n_features, np.float32)
        memcpy(cnp.PyArray_DATA(out), self._e.feat, sizeof(float) * self.n_features)
        return out

    def latency_records(self):
        """(n, 4) uint32 in-C ns per tick, oldest first: feature, cache, infer, total, for the
        last min(ticks, latency_records) ticks. With stage_times off the first three columns
        are 0 (not measured)."""
        self._check_free()
        cdef fp_engine *e = self._e
        cdef Py_ssize_t cap = e.lat_mask + 1
        cdef Py_ssize_t n = min(e.ticks, cap)
        lat = np.empty((cap, 4), np.uint32)
        memcpy(cnp.PyArray_DATA(lat), e.lat, sizeof(fp_lat) * cap)
        if e.ticks <= cap:
            return lat[:n].copy()
        start = e.ticks % cap
        return np.vstack([lat[start:], lat[:start]])

    @property
    def mlp_padded_macs(self):
        """Multiply-adds the blocked kernel executes (rows padded to blocks of 8)."""
        cdef long long t = 0
        for i in range(self._e.mlp.n_layers):
            t += <long long>self._e.mlp.layers[i].nb * 8 * self._e.mlp.layers[i].in_
        return t

    def reset(self, symbol=None):
        """reset(): empty every cache slot, window and counter. reset(symbol): forget one
        symbol (a trading halt, a feed gap): its cached result, its rolling window, its last
        timestamp and its live book (step_book; the tick size stays), so the next tick starts
        it cold; counters and other symbols are untouched."""
        cdef Py_ssize_t sym
        if symbol is None:
            self._check_free()
            fp_engine_reset(self._e)
            return
        sym = _symbol_arg(symbol, self.n_symbols)
        self._check_free()
        fp_engine_reset_symbol(self._e, <int32_t>sym)

    # --- the live book: one book update -> signal (csrc/fp_book.c, fp_step_book) ----------

    def set_tick_size(self, symbol, tick_size):
        """The symbol's tick size (price units per tick, finite and > 0), once per symbol
        before its first step_book: the raw vector's prices are in ticks from mid. Setting it
        again to another value needs reset(symbol) first (the book's averages are in ticks)."""
        cdef Py_ssize_t sym = _symbol_arg(symbol, self.n_symbols)
        if isinstance(tick_size, (bool, np.bool_)) or not isinstance(
                tick_size, (int, float, np.integer, np.floating)):
            raise InputError(f"tick_size must be a number, got {tick_size!r}")
        cdef double t = float(tick_size)
        if not (0 < t < float("inf")):
            raise InputError(f"tick_size must be finite and > 0, got {tick_size!r}")
        self._check_free()
        cdef fp_book *b = fp_engine_book(self._e, <int32_t>sym)
        if b != NULL and b.st[b.cur].n > 0 and b.tick != t:
            raise InputError(f"symbol {sym} already has tick size {b.tick:g} and a book; "
                             f"reset({sym}) before setting {t:g} (its averages are in ticks)")
        cdef int rc = fp_engine_set_tick(self._e, <int32_t>sym, t)
        if rc == FP_ERR_NOMEM:
            raise MemoryError(f"no memory for symbol {sym}'s book")
        if rc != FP_OK:
            raise FastpathError(f"fp_engine_set_tick failed with code {rc}")

    def step_book(self, symbol, bid_px, bid_sz, ask_px, ask_sz, ts_ns, trade_vol=0.0,
                  trade_cnt=0, last_trade_sz=0.0):
        """One book update -> Result, as step() on the raw vector fastpath.lob.raw_from_book
        makes from the symbol's updates so far. bid_px, bid_sz, ask_px, ask_sz: the top 10
        levels, float64 (10,), level 1 first; ts_ns: int >= 0; trade_vol, trade_cnt,
        last_trade_sz: the trades since the symbol's previous update (signed volume, count,
        size of the last one). Result.latency.book_ns is the book stage. A bad update (crossed
        or locked, a price not finite or <= 0, a negative size, levels out of order, time going
        back, a field past float32) is an InputError naming the field and level, with the
        book, window and cache as they were. The model must read the 256-value raw vector."""
        cdef fp_book_update u
        cdef fp_result r
        cdef int64_t book_ns = 0
        cdef int why = 0, where = 0
        cdef Py_ssize_t sym = _symbol_arg(symbol, self.n_symbols)
        cdef long long ts = _ts_arg(ts_ns)
        if ts < 0:
            raise InputError("step_book needs ts_ns (int ns >= 0): the book's times since the "
                             "last tick and trade are measured on it")
        bp, bs = _levels(bid_px, "bid_px"), _levels(bid_sz, "bid_sz")
        ap, az = _levels(ask_px, "ask_px"), _levels(ask_sz, "ask_sz")
        u.bid_px = <const double *>cnp.PyArray_DATA(bp)
        u.bid_sz = <const double *>cnp.PyArray_DATA(bs)
        u.ask_px = <const double *>cnp.PyArray_DATA(ap)
        u.ask_sz = <const double *>cnp.PyArray_DATA(az)
        u.ts_ns = ts
        u.trade_vol = _trade_arg(trade_vol, "trade_vol")
        u.trade_cnt = _trade_arg(trade_cnt, "trade_cnt")
        u.last_trade_sz = _trade_arg(last_trade_sz, "last_trade_sz")
        self._check_free()
        if self._on_gpu:
            raise BackendError("step_book runs on the CPU backend; this engine's backend is "
                               "the GPU")
        cdef int rc = fp_step_book(self._e, <int32_t>sym, &u, &r, &book_ns, &why, &where)
        if rc == FP_ERR_BOOK:
            raise InputError(_book_refusal(why, where, sym, _sent(&u), f": call set_tick_size("
                                           f"{sym}, tick_size) before its first step_book"))
        if rc == FP_ERR_PARAM:
            raise InputError(f"step_book needs a model over the 256-value raw vector of "
                             f"fastpath.lob (raw_len 256); this one reads {self.raw_len}")
        if rc != FP_OK:
            self._raise(rc, np.zeros(self.raw_len, np.float32), sym, ts)
        cdef Result res = _make_result(&r)
        res._b = book_ns
        return res

    def book_state(self, symbol):
        """The symbol's live book as a dict (None before set_tick_size): tick_size, updates
        (book changes so far), ts_ns of the last change, its book (bid_px, bid_sz, ask_px,
        ask_sz, tuples level 1 first), mid, the last trade (sign, log1p size, ts_ns; None when
        none yet), last_move (the change at which the mid last moved), ewma (13 series x 8
        half-lives, series-major) and raw (the last raw vector, 256 floats)."""
        cdef Py_ssize_t sym = _symbol_arg(symbol, self.n_symbols)
        self._check_free()
        cdef fp_book *b = fp_engine_book(self._e, <int32_t>sym)
        if b == NULL:
            return None
        cdef fp_book_state *s = &b.st[b.cur]
        cdef Py_ssize_t i
        return {
            "tick_size": b.tick, "updates": s.n, "ts_ns": int(s.ts) if s.n else None,
            "bid_px": tuple(s.bpx[i] for i in range(10)),
            "bid_sz": tuple(s.bsz[i] for i in range(10)),
            "ask_px": tuple(s.apx[i] for i in range(10)),
            "ask_sz": tuple(s.asz[i] for i in range(10)),
            "mid": s.mid,
            "last_trade": ((s.trade_sign, s.trade_logsz, int(s.trade_ts)) if s.have_trade
                           else None),
            "last_move": s.last_move,
            # series-major (series i, half-life j at i * 8 + j): raw fields 140-203, 212-251
            "ewma": tuple(s.o[140 + i + (8 if i >= 64 else 0)] for i in range(104)),
            "raw": tuple(b.raw[b.cur][i] for i in range(256)),
        }

    @property
    def ticks(self):
        """Ticks applied since creation or the last reset() (EngineBusyError during step_batch
        on another thread: the count is moving)."""
        self._check_free()
        return self._e.ticks

    @property
    def feature_path(self):
        """How the z-scored fields are read from the tick: 'permute' (a plan of two-table
        permutes over 32-float windows, AVX-512), 'runs' (contiguous loads over runs of
        consecutive fields) or 'gather'."""
        if self._e.fs.n_zsteps:
            return "permute"
        return "runs" if self._e.fs.n_runs else "gather"

    @property
    def mlp_macs(self):
        """Multiply-adds in one forward pass."""
        return self._e.mlp.macs

    def stats(self):
        """Counters and per-stage latency percentiles over the last latency_records ticks
        (with stage_times off, only "total": stages, hits and misses are not told apart).
        Raises EngineBusyError while step_batch runs on another thread (the counters and
        records are being written without the GIL; a copy taken then would be torn)."""
        self._check_free()
        cdef fp_engine *e = self._e
        lat = self.latency_records()
        n = len(lat)
        reasons = {_REASONS[i]: int(e.miss_reason[i]) for i in range(1, FP_MISS_NREASONS)}
        out = {
            "ticks": int(e.ticks), "hits": int(e.hits), "misses": int(e.misses),
            "hit_rate": (<double>e.hits / e.ticks) if e.ticks else 0.0,
            "miss_reasons": reasons,
            "forced_refreshes": reasons["age"] + reasons["run"],
            "simd": self.simd, "backend": self.backend, "backend_reason": self.backend_reason,
            # the policy in force and where it came from: fitted to an error budget, set in the
            # config, or off because nothing was fitted
            "cache_policy": {"enabled": bool(self.config.cache.enabled),
                             "cos_threshold": float(self.config.cache.cos_threshold),
                             "norm_tol": float(self.config.cache.norm_tol),
                             "max_age_ns": int(self.config.cache.max_age_ns),
                             "max_run": int(self.config.cache.max_run),
                             "origin": self.config.cache_origin},
            "latency_ns": {},
            "latency_window": int(n),
            "stage_times": bool(fp_engine_stage_times(e)),
        }
        missed = lat[:, 2] > 0
        cols = ((0, "feature", None), (1, "cache", None), (2, "infer", missed),
                (3, "total", None), (3, "total_hit", ~missed), (3, "total_miss", missed))
        if not fp_engine_stage_times(e):
            # a record holds no stage, so nothing tells a hit's total from a miss's
            cols = ((3, "total", None),)
        for j, name, sel in cols:
            col = lat[:, j] if sel is None else lat[sel, j]
            if len(col):
                q = np.percentile(col, [50, 90, 99, 99.9])
                out["latency_ns"][name] = {"p50": float(q[0]), "p90": float(q[1]),
                                           "p99": float(q[2]), "p999": float(q[3]),
                                           "max": int(col.max()), "n": int(len(col))}
        return out


    # ------------------------------------------------------------ a stage outside the core
    # backend == "gpu": features and the cache stay here (fp_step_begin / fp_step_finish), the
    # model runs in the GPU stage (fastpath.gpu._tick.GpuStage, this engine's _stage) on a
    # miss only; see that module for the tick and the batch. The methods below are what such a
    # stage, and fastpath.gpu.GpuEngine, call back: _step_external, _hold / _release,
    # _check_batch, features() and _predict_features().

    @property
    def gpu_backend(self):
        """The fastpath.gpu.GpuBackend running the model (backend == "gpu"), else None."""
        return self._stage.backend if self._stage is not None else None

    @property
    def backend_report(self):
        """What runs the model and why: backend, reason, and for the GPU its mode, device,
        driver, NUMA node and which kernel module loaded; for backend="auto" what was measured
        (p50 ns of the inference a cache miss pays on the CPU and on the GPU, and what those
        figures are: "measure", fastpath.gpu.AUTO_MEASURE)."""
        out = {"backend": self.backend, "reason": self.backend_reason}
        if self._auto is not None:
            out["measured"] = {k: self._auto.get(k) for k in ("cpu_p50_ns", "gpu_p50_ns", "mode",
                                                              "measure")}
        g = self.gpu_backend
        if g is not None:
            out["gpu"] = dict(g.info, mode=g.mode, module=g.module_origin, macs=g.macs)
        return out

    def close(self):
        """Release what the engine holds outside this process's memory: the GPU backend's
        device memory and, in persistent mode, its running kernel. A CPU engine has nothing
        to release. Stepping a closed GPU engine is a BackendError. EngineBusyError while
        another thread's tick runs (its device call would lose its memory under it)."""
        self._check_free()
        if self._stage is not None:
            self._stage.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __reduce_ex__(self, protocol):
        # Cython's own refusal said "no default __reduce__ due to non-trivial __cinit__". A
        # copy rebuilt from the model and config would be silently cold (no windows, no
        # cached results, no last timestamps) and answer the next tick differently.
        raise TypeError("a fastpath.Engine cannot be pickled or copied: its per-symbol state "
                        "(rolling windows, cached results, last timestamps) lives in native "
                        "memory; build an engine where it is needed with "
                        "Engine(engine.model, config=engine.config.source) (it starts cold)")

    def _hold(self):
        """Busy for every other thread until _release(), the calling thread's calls passing:
        for fastpath.gpu.GpuEngine.step_batch, which applies its rows through features() /
        _step_external() while a launch is on the GPU (the GIL released). Left free there,
        another thread's tick that hit moved the windows between the launch's features and
        the rows' application, and one that missed got the GPU path's "a batch is already in
        flight". EngineBusyError where the engine is busy already."""
        self._check_free()
        self._busy = True
        self._busy_owner = PyThread_get_thread_ident()

    def _release(self):
        """The end of _hold()."""
        self._busy_owner = 0
        self._busy = False

    def _check_batch(self, raws, symbols, ts_ns=None):
        """step_batch's checks of a batch, no row applied: (raws float32 (n, raw_len), symbols
        int32 (n,), ts_ns int64 (n,) or None), contiguous, or the InputError step_batch raises
        for the first row it refuses before applying any (a symbol out of range, a non-finite
        raw, a timestamp behind the batch's earlier rows of its symbol or behind the engine's
        last tick of it). For a caller that applies the rows itself (fastpath.gpu.GpuEngine):
        a check of its own that sees time going backwards within the batch only applies the
        rows before a row that is behind the engine's last tick of its symbol, then refuses it."""
        cdef cnp.ndarray R, S, T
        R, S, T = self._batch_args(raws, symbols, ts_ns)
        cdef Py_ssize_t n = cnp.PyArray_DIM(R, 0)
        cdef const int64_t *tp = NULL if T is None else <const int64_t *>cnp.PyArray_DATA(T)
        cdef const float *rp = <const float *>cnp.PyArray_DATA(R)
        cdef const int32_t *yp = <const int32_t *>cnp.PyArray_DATA(S)
        cdef int err = 0
        self._check_free()
        cdef int64_t bad = fp_batch_check(self._e, rp, self.raw_len, yp, tp, n, &err)
        if bad >= 0:
            # as the CPU's step_batch says it: the caller of a batch needs to know how many
            # rows went in (the message said only "engine state unchanged", the row's own)
            try:
                self._raise_row(err, R, S, T, bad)
            except InputError as exc:
                raise partial_batch(InputError(str(exc) + "; no row was applied"), None, None,
                                     None, None, 0) from None
        return R, S, T


# ------------------------------------------------------------ batch arguments and answers
cdef object _batch_result(sig, conf, cached, tot):
    return BatchResult(sig, conf, cached, tot)


cdef cnp.ndarray _as_int64(cnp.ndarray a):
    """An integer array as contiguous int64; uint64 is viewed, not converted, so a value past
    int64 reads negative (and fails a >= 0 check) instead of raising or wrapping silently."""
    if a.dtype.kind == "u" and a.dtype.itemsize == 8:
        # native order first: a big-endian uint64 viewed as it is reads garbage
        return np.ascontiguousarray(a, dtype=np.uint64).view(np.int64)
    return np.ascontiguousarray(a, dtype=np.int64)


def _first_int_outside(a, Py_ssize_t n, lo, hi):
    """For an object array of shape (n,) holding only integers (not bools), the first row
    outside [lo, hi], else -1; -2 when a is anything else (step_batch's error path only)."""
    if a.dtype.kind != "O" or a.ndim != 1 or a.shape[0] != n:
        return -2
    for v in a:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            return -2
    for i in range(n):
        if not lo <= a[i] <= hi:
            return i
    return -1


cdef Py_ssize_t _first_outside(cnp.ndarray a, int64_t lo, int64_t hi):
    """The first row of a (contiguous int64) outside [lo, hi], or -1: one C pass (numpy's
    min() and max() cost ~0.8 us each a call however short the batch)."""
    cdef const int64_t *p = <const int64_t *>cnp.PyArray_DATA(a)
    cdef Py_ssize_t i, n = cnp.PyArray_DIM(a, 0)
    for i in range(n):
        if p[i] < lo or p[i] > hi:
            return i
    return -1


cdef Py_ssize_t _first_outside32(cnp.ndarray a, int32_t hi):
    """_first_outside for a contiguous native int32 array and the range [0, hi]."""
    cdef const int32_t *p = <const int32_t *>cnp.PyArray_DATA(a)
    cdef Py_ssize_t i, n = cnp.PyArray_DIM(a, 0)
    for i in range(n):
        if p[i] < 0 or p[i] > hi:
            return i
    return -1


# ------------------------------------------------------------ for fastpath._default
cdef Result _engine_step(object engine, object raw, object symbol, object ts_ns):
    return (<Engine>engine)._step(raw, symbol, ts_ns)


cdef bint _runs_on_cpu(object engine) except -1:
    return not (<Engine>engine)._on_gpu


cdef tuple _sent(const fp_book_update *u):
    """the update as _book_refusal reads it: the four sides, then the three trade fields"""
    cdef Py_ssize_t i
    return ([u.bid_px[i] for i in range(10)], [u.bid_sz[i] for i in range(10)],
            [u.ask_px[i] for i in range(10)], [u.ask_sz[i] for i in range(10)],
            u.trade_vol, u.trade_cnt, u.last_trade_sz)
