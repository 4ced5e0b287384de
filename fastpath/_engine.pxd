# The compiled hot path, declared for other Cython modules: the result types (the serving
# client builds the same fastpath.Result from a worker's reply) and the Engine, whose C engine
# and split tick a model stage outside the C core (fastpath.gpu._tick) drives. Nothing but
# declarations.
cimport cython
cimport numpy as cnp

from fastpath._csrc cimport fp_engine, fp_result


cdef class Latency:
    cdef readonly long long feature_ns, cache_ns, infer_ns, h2d_ns, d2h_ns, total_ns, wait_ns
    # book_ns: the live book stage of Engine.step_book (0 for a tick stepped from a raw vector)
    cdef readonly long long book_ns


cdef class Result:
    cdef readonly double signal, confidence
    cdef readonly bint cached
    # seq and wait_ns: set for answers served through fastpath.connect(), 0 in-process
    cdef readonly unsigned long long seq
    cdef readonly long long wait_ns
    cdef int _reason
    cdef long long _f, _c, _i, _h, _d, _t, _b


cdef class Engine


cdef class ExternalStage:
    """The model stage of an engine whose model runs outside the C core (the GPU's,
    fastpath.gpu._tick.GpuStage): the engine hands it every tick and batch. backend: what
    runs the model (fastpath.gpu.GpuBackend), None once closed."""
    cdef readonly object backend
    cdef Result step(self, Engine eng, object raw, object symbol, object ts_ns)
    cdef object step_batch(self, Engine eng, object raws, object symbols, object ts_ns)
    cdef int close(self) except -1


# final: nothing subclasses Engine, and its cdef methods (_step, _raw_ptr, _check_free) are
# then direct calls the C compiler can inline instead of vtable calls
@cython.final
cdef class Engine:
    cdef fp_engine *_e
    cdef readonly int raw_len, n_features, n_outputs, n_symbols
    cdef readonly str simd, backend, backend_reason
    cdef readonly object model, config
    cdef object _scaler                 # model.input_scaler (Model is frozen), read per predict
    cdef object _out_scratch            # predict(x, out)'s scratch (n_outputs floats), or None
    cdef readonly object memory        # fastpath.control.memory.MemoryReport, or None
    cdef object _region                 # keeps the control plane's mapping alive
    cdef bint _busy
    # the thread that holds the engine busy through _hold() (fastpath.gpu.GpuEngine's
    # step_batch, whose own calls into the engine must pass); 0 for the engine's own busy
    # sections, which refuse every other call
    cdef unsigned long _busy_owner
    cdef ExternalStage _stage           # the GPU stage when backend == "gpu", else None
    cdef object _auto                   # backend="auto"'s measurement, or None
    cdef bint _on_gpu                   # backend == "gpu": stays set after close()

    cdef _create(self)
    cdef inline const float *_raw_ptr(self, object raw) except NULL
    cdef _raise(self, int rc, object raw, object symbol, long long ts, Py_ssize_t row=*)
    cdef str _not_probabilities(self)
    cdef _raise_row(self, int err, cnp.ndarray R, cnp.ndarray S, object T, Py_ssize_t row)
    cdef inline int _check_free(self) except -1
    cdef Result _step(self, object raw, object symbol, object ts_ns)
    cdef tuple _batch_args(self, raws, symbols, ts_ns)
    cdef cnp.ndarray _batch_raws(self, raws)
    cdef cnp.ndarray _predict_first_layer(self, cnp.ndarray xa, bint trees, object out)


# fp_step's answer as a Result (reused from two ticks ago where the caller dropped it): for a
# model stage outside this module, which runs the split tick itself
cdef Result _result_of(const fp_result *r)
# the default engine's step (fastpath._default) hands a tick to an Engine's C-level step
cdef Result _engine_step(object engine, object raw, object symbol, object ts_ns)
cdef bint _runs_on_cpu(object engine) except -1
