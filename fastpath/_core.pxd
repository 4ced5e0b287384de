# The Cython side of fastpath._core, the one extension that links the C core (csrc/): what
# the other modules cimport from it. Its cdef functions reach them through Cython's C-API
# table (one pointer load, on cold paths); the two argument checks a tick makes are inline,
# so their common case compiles into each caller.
cimport numpy as cnp
from fastpath._csrc cimport fp_engine, fp_isa, fp_mlp, fp_trees_desc

cdef extern from "Python.h":
    # declared without an exception spec: the caller checks the range (and clears the error)
    Py_ssize_t _long_as_ssize "PyLong_AsSsize_t"(object o)
    # no exception for an int (overflow is reported in *overflow), so no try block around it
    long long _long_as_ll_ovf "PyLong_AsLongLongAndOverflow"(object o, int *overflow)


cdef fp_engine *_make_engine(object model, object cfg, list keep) except NULL
cdef int _trees_desc(object t, fp_trees_desc *d, list keep) except -1
cdef int _pack_mlp(fp_mlp *m, weights, biases, activations, int wtype=*, fp_isa isa=*) except -1
cdef Py_ssize_t _symbol_slow(object symbol, Py_ssize_t n) except -1
cdef long long _ts_slow(object ts) except -2
cdef cnp.ndarray _levels_slow(object a, str name)
cdef double _trade_slow(object v, str name) except? -1.0


cdef inline Py_ssize_t _symbol_arg(object symbol, Py_ssize_t n) except -1:
    """symbol as an index in [0, n): a Python int (fast path) or any integer type with
    __index__ (numpy integers); anything else, or out of range, is an InputError."""
    cdef Py_ssize_t v
    # only the common call is inline; _symbol_slow (out of line) has the checks and messages
    if type(symbol) is int:
        v = _long_as_ssize(symbol)        # -1 with OverflowError set when it does not fit
        if 0 <= v < n:
            return v
    return _symbol_slow(symbol, n)


cdef inline long long _ts_arg(object ts) except -2:
    """ts_ns as ns >= 0, or -1 for None (the engine clock); InputError for anything else."""
    cdef long long v
    cdef int overflow = 0
    # inline: the two common calls; _ts_slow (out of line) has the checks and messages
    if type(ts) is int:
        v = _long_as_ll_ovf(ts, &overflow)
        if overflow == 0 and v >= 0:
            return v
    elif ts is None:
        return -1
    return _ts_slow(ts)


cdef inline cnp.ndarray _levels(object a, str name):
    """a book side (step_book's bid_px, bid_sz, ask_px, ask_sz) as float64 C-contiguous (10,):
    an exact ndarray that is one already in a few loads; _levels_slow converts anything else
    or raises an InputError naming the argument."""
    if (cnp.PyArray_CheckExact(a) and cnp.PyArray_TYPE(<cnp.ndarray>a) == cnp.NPY_FLOAT64
            and cnp.PyArray_NDIM(<cnp.ndarray>a) == 1 and cnp.PyArray_DIM(<cnp.ndarray>a, 0) == 10
            and cnp.PyArray_ISCARRAY_RO(<cnp.ndarray>a)
            and cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>a)):
        return <cnp.ndarray>a
    return _levels_slow(a, name)


cdef inline double _trade_arg(object v, str name) except? -1.0:
    """a trade field of step_book as a double: a Python float or int inline, anything else
    checked out of line (the C stage refuses a value that is not finite, or a negative count
    or size)"""
    if type(v) is float:
        return <double>v
    if type(v) is int and -9007199254740992 <= v <= 9007199254740992:
        return <double>v
    return _trade_slow(v, name)
