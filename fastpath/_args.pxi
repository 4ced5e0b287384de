# Included by _engine.pyx and _serve.pyx: the argument checks Engine.step and a serving
# client make, from one source, so both refuse the same input with the same message. The
# fast paths (_symbol_arg, _ts_arg) are inline C; the messages are built only on the error path.

cdef extern from "Python.h":
    # declared without an exception spec: the caller checks the range (and clears the error)
    Py_ssize_t _long_as_ssize "PyLong_AsSsize_t"(object o)
    # no exception for an int (overflow is reported in *overflow), so no try block around it
    long long _long_as_ll_ovf "PyLong_AsLongLongAndOverflow"(object o, int *overflow)


def _n_masked(obj):
    """How many values of a numpy masked array are masked (0 for anything else): a masked
    value is a missing one, and the array's data under it is whatever was there."""
    if isinstance(obj, np.ma.MaskedArray):
        return int(np.count_nonzero(np.ma.getmaskarray(obj)))
    return 0


def _describe(obj):
    """dtype/shape/layout of an object for error messages."""
    if isinstance(obj, np.ndarray):
        flags = []
        if _n_masked(obj):
            flags.append(f"masked array with {_n_masked(obj)} masked value(s)")
        if not obj.flags.c_contiguous:
            flags.append("non-contiguous")
        if not obj.flags.aligned:
            flags.append("unaligned")
        if not obj.dtype.isnative:
            flags.append("byte-swapped")
        extra = (" " + " ".join(flags)) if flags else ""
        return f"{obj.dtype} shape {obj.shape}{extra}"
    return f"{type(obj).__name__}"


_TO_F32 = "np.ascontiguousarray(x, dtype=np.float32)"


def _conversion_hint(obj):
    """How to turn what the caller passed into the float32 C-contiguous array step() takes."""
    if _n_masked(obj):
        return ("; a masked value is a missing one (the NaN policy: repair or drop the tick "
                "upstream, e.g. x.filled(value) once repaired)")
    if type(obj).__module__.split(".")[0] == "pandas":
        return "; convert with np.ascontiguousarray(x.to_numpy(), dtype=np.float32)"
    if isinstance(obj, np.ndarray):
        if (obj.dtype != np.float32 or not obj.dtype.isnative or not obj.flags.c_contiguous
                or not obj.flags.aligned):
            return f"; convert with {_TO_F32} (one copy)"
        return ""
    if isinstance(obj, (bytes, bytearray)):
        return "; convert with np.frombuffer(x, dtype=np.float32) (raw bytes of float32 values)"
    # memoryview and array.array hold a buffer numpy reads; they have no __array__
    if (isinstance(obj, (list, tuple, memoryview)) or hasattr(obj, "__array__")
            or hasattr(obj, "__buffer__") or type(obj).__module__ == "array"):
        return f"; convert with {_TO_F32}"
    return ""


def _bad_raw(obj, Py_ssize_t raw_len):
    return InputError(f"raw must be a float32 C-contiguous numpy array with {raw_len} values, "
                      f"got {_describe(obj)}{_conversion_hint(obj)}")


def _bad_symbol(symbol, Py_ssize_t n):
    """InputError for a symbol that is not an integer in [0, n) (called only on the error path)."""
    rng = f"an integer in 0..{n - 1}"
    if isinstance(symbol, (bool, np.bool_)):
        return InputError(f"symbol must be {rng}, got bool {symbol!r}")
    if isinstance(symbol, str):
        return InputError(f"symbol must be {rng}, got str {symbol!r}: fastpath identifies "
                          f"instruments by index; map names to indices once, outside the tick loop")
    if isinstance(symbol, (float, np.floating)):
        return InputError(f"symbol must be {rng}, got {type(symbol).__name__} {symbol!r}; pass "
                          f"int(symbol) if it holds a whole number")
    try:
        v = operator.index(symbol)
    except TypeError:
        return InputError(f"symbol must be {rng}, got {type(symbol).__name__} {symbol!r}")
    return InputError(f"symbol {v} out of range: this engine has {n} symbols (0..{n - 1}); raise "
                      f"engine.n_symbols in the config for more")


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


cdef Py_ssize_t _symbol_slow(object symbol, Py_ssize_t n) except -1:
    cdef Py_ssize_t v
    if type(symbol) is int:
        v = _long_as_ssize(symbol)
        if 0 <= v < n:
            return v
        PyErr_Clear()
        raise _bad_symbol(symbol, n)
    if isinstance(symbol, (bool, np.bool_, float, np.floating, str)) or not hasattr(symbol, "__index__"):
        raise _bad_symbol(symbol, n)
    try:
        as_int = operator.index(symbol)
    except TypeError:
        raise _bad_symbol(symbol, n) from None
    if type(as_int) is not int:     # a broken __index__; never loop
        raise _bad_symbol(symbol, n)
    return _symbol_slow(as_int, n)


def _bad_ts(ts):
    t = type(ts).__name__
    mod = type(ts).__module__.split(".")[0]
    if mod == "pandas" and hasattr(ts, "value"):
        hint = "pass ts.value (ns since the epoch, an int)"
    elif isinstance(ts, np.datetime64):
        hint = "pass int(ts.astype('datetime64[ns]').astype(np.int64))"
    elif t == "datetime":
        hint = "pass an int of ns, e.g. int(ts.timestamp() * 1e9) or a monotonic clock in ns"
    elif isinstance(ts, (float, np.floating)):
        hint = "pass an int (ns); floats lose precision beyond 2**53 ns (~104 days since the epoch)"
    else:
        hint = "pass an int (ns) or None for the engine clock"
    return InputError(f"ts_ns must be an int >= 0 (ns) or None, got {t} {ts!r}; {hint}")


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


cdef long long _ts_slow(object ts) except -2:
    cdef long long v
    if ts is None:
        return -1
    # any int (an IntEnum, an int subclass) or numpy integer, as symbol takes; not a bool
    if isinstance(ts, (int, np.integer)) and not isinstance(ts, (bool, np.bool_)):
        # the try block (saving and restoring the thread's exception state) only here
        try:
            v = ts
        except OverflowError:
            raise InputError(f"ts_ns {ts} does not fit a signed 64-bit int of ns") from None
        if v < 0:
            raise InputError(f"ts_ns must be >= 0 (ns), got {ts}")
        return v
    raise _bad_ts(ts)
