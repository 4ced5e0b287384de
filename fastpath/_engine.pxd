# The result types of the compiled hot path, declared for other Cython modules (the serving
# client builds the same fastpath.Result from a worker's reply): nothing but declarations.

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


# the default engine's step (fastpath._default) hands a tick to an Engine's C-level step
cdef Result _engine_step(object engine, object raw, object symbol, object ts_ns)
cdef bint _runs_on_cpu(object engine) except -1
