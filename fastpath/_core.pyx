# cython: language_level=3
"""fastpath._core: the C core (csrc/), linked into this one extension, and the Cython code the
other modules share through cimport (fastpath/_core.pxd).

Design: _engine, _kernels, _serve and gpu._protocol link against this shared object (found
beside them through their run path), so a process has one clock calibration (fp_clock) and one
kernel table, and the hot path still calls fp_step directly. Here: turning a Model and resolved
config into an fp_engine (so an in-process Engine and a serving worker built from the same
model answer tick for tick alike), the argument checks Engine.step and a serving client make
(so both refuse the same input with the same message), and packing MLPs and tree ensembles.
"""
from cpython.exc cimport PyErr_Clear
from cpython.mem cimport PyMem_Malloc, PyMem_Free
cimport numpy as cnp
from libc.stdint cimport int32_t, uint8_t
from libc.string cimport memset

from fastpath._csrc cimport *

import operator

import numpy as np

from fastpath._memory import allocate
from fastpath.errors import ConfigError, FastpathError, InputError

cnp.import_array()

fp_clock_init()

# every kernel set this build has, in order of what it needs from the CPU (scalar: nothing)
_ISA_BY_NAME = {"scalar": FP_ISA_SCALAR, "avx2": FP_ISA_AVX2, "avx512": FP_ISA_AVX512}
_ACTS = {"identity": 0, "relu": 1, "tanh": 2, "sigmoid": 3}
_POSTS = {"none": FP_POST_NONE, "softmax": FP_POST_SOFTMAX, "logistic2": FP_POST_LOGISTIC2}
_WEIGHT_TYPES = {"fp32": FP_WEIGHTS_FP32, "bf16": FP_WEIGHTS_BF16, "int8": FP_WEIGHTS_INT8}


# --- kernel sets and CPU features

def cpu_features():
    """CPU bits the dispatcher read (cpuid and the OS's saved register state): avx2, fma, avx512 (F+DQ+BW+VL), avx512_bf16, avx512_vnni, avx_vnni."""
    return {"avx2": bool(fp_cpu_has_avx2()), "fma": bool(fp_cpu_has_fma()),
            "avx512": bool(fp_cpu_has_avx512()), "avx512_bf16": bool(fp_cpu_has_avx512_bf16()),
            "avx512_vnni": bool(fp_cpu_has_avx512_vnni()), "avx_vnni": bool(fp_cpu_has_avx_vnni())}


def all_isas():
    """Every kernel set this build has, scalar first, whether or not this CPU runs it."""
    return list(_ISA_BY_NAME)


def best_isa():
    """Best kernel set this CPU can run: 'avx512' (F+DQ+BW+VL, FMA, OS ZMM and opmask state),
    else 'avx2' (AVX2 and FMA with OS YMM state), else 'scalar'."""
    cdef fp_isa b = fp_isa_best()
    for name, v in _ISA_BY_NAME.items():
        if v == b:
            return name
    return "scalar"


def supported_isas():
    """Every kernel set this CPU can run, scalar first."""
    return [name for name, v in _ISA_BY_NAME.items() if fp_isa_supported(v)]


# --- argument checks (Engine.step, a serving client); messages built only on the error path

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


# --- tree ensembles: a fastpath.model.TreeEnsemble as the C description fp_trees.c packs

_TREE_AGG = {"SUM": 0, "AVERAGE": 1, "MIN": 2, "MAX": 3}
_TREE_POST = {"NONE": 0, "LOGISTIC": 1, "SOFTMAX": 2, "SOFTMAX_ZERO": 3, "PROBIT": 4}


cdef cnp.ndarray _levels_slow(object a, str name):
    try:
        c = np.ascontiguousarray(a, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{name} must be 10 numbers (level 1 first), got {a!r:.80}: "
                         f"{exc}") from None
    if c.shape != (10,):
        raise InputError(f"{name} must have 10 levels, level 1 first (shape (10,)), got shape "
                         f"{c.shape}")
    return c


cdef double _trade_slow(object v, str name) except? -1.0:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise InputError(f"{name} must be a number, got {v!r:.80}")
    try:
        return float(v)
    except OverflowError:
        raise InputError(f"{name} {v} does not fit a double") from None


_BOOK_ARRAYS = ("bid_px", "bid_sz", "ask_px", "ask_sz")


def _book_refusal(int why, int where, long long sym, update, str no_tick):
    """The message for a book update the C stage refused (why: FP_BOOK_ERR_*, where: the
    field, as fp_step_book reports them; a serving reply carries the same codes), from update
    = (bid_px, bid_sz, ask_px, ask_sz, trade_vol, trade_cnt, last_trade_sz) as sent, or None
    when not at hand (the field and level alone). no_tick: what to do about a symbol with no
    tick size, which differs between an Engine and a server."""
    tail = f" (symbol {sym}; update not applied, book, window and cache unchanged)"
    if why in (FP_BOOK_ERR_PRICE, FP_BOOK_ERR_SIZE, FP_BOOK_ERR_ORDER):
        side, lv = where // 256, where % 256
        if not 0 <= side < 4 or not 0 <= lv < 10:
            return f"book update refused (code {why}, field {where}){tail}"
        name = _BOOK_ARRAYS[side]
        if update is None:
            return f"{name} level {lv + 1} refused (code {why}){tail}"
        p = [float(x) for x in update[side]]
        if why == FP_BOOK_ERR_PRICE:
            what = "must be a finite price > 0"
        elif why == FP_BOOK_ERR_SIZE:
            what = "must be a finite size >= 0"
        else:
            what = (f"is out of order: {'above' if name == 'bid_px' else 'below'} level "
                    f"{lv} ({p[lv - 1]:g}); levels go away from the touch")
        return f"{name} level {lv + 1} is {p[lv]:g}: {what}{tail}"
    if why == FP_BOOK_ERR_CROSSED:
        if update is None:
            return f"crossed or locked book; best bid must be below best ask{tail}"
        return (f"crossed or locked book: bid_px level 1 ({float(update[0][0]):g}) >= ask_px "
                f"level 1 ({float(update[2][0]):g}); best bid must be below best ask{tail}")
    if why == FP_BOOK_ERR_TRADE and 0 <= where <= 2:
        name = ("trade_vol", "trade_cnt", "last_trade_sz")[where]
        need = "finite" if where == 0 else "finite and >= 0"
        if update is None:
            return f"{name} refused: must be {need}{tail}"
        return f"{name} is {float(update[4 + where]):g}: must be {need}{tail}"
    if why == FP_BOOK_ERR_RANGE:
        return (f"raw field {where} (fastpath.lob.field_names()[{where}]) is beyond float32's "
                f"range; check the tick size and this update's prices and sizes{tail}")
    if why == FP_BOOK_ERR_NOTICK:
        return f"symbol {sym} has no tick size{no_tick}"
    return f"book update refused (code {why}){tail}"


cdef int _trees_desc(object t, fp_trees_desc *d, list keep) except -1:
    """Fill d from a fastpath.model.TreeEnsemble; the arrays it points into go to `keep`."""
    cdef cnp.ndarray a
    arrs = [np.ascontiguousarray(t.tree_offsets, dtype=np.int32),
            np.ascontiguousarray(t.feature, dtype=np.int32),
            np.ascontiguousarray(t.mode, dtype=np.int32),
            np.ascontiguousarray(t.true_child, dtype=np.int32),
            np.ascontiguousarray(t.false_child, dtype=np.int32),
            np.ascontiguousarray(t.nan_true, dtype=np.uint8),
            np.ascontiguousarray(t.threshold, dtype=np.float32),
            np.ascontiguousarray(t.weight_node, dtype=np.int32),
            np.ascontiguousarray(t.weight_target, dtype=np.int32),
            np.ascontiguousarray(t.weight_value, dtype=np.float32),
            np.ascontiguousarray(t.base_values, dtype=np.float32)]
    keep.extend(arrs)
    memset(d, 0, sizeof(fp_trees_desc))
    d.n_feat = t.n_features
    d.n_targets = t.n_targets
    d.n_trees = t.n_trees
    d.n_nodes = t.n_nodes
    d.n_weights = len(arrs[7])
    d.n_base = len(arrs[10])
    d.aggregate = _TREE_AGG[t.aggregate]
    d.post = _TREE_POST[t.post_transform]
    d.classifier = 1 if t.classifier else 0
    a = arrs[0]; d.tree_off = <const int32_t *>cnp.PyArray_DATA(a)
    a = arrs[1]; d.feat = <const int32_t *>cnp.PyArray_DATA(a)
    a = arrs[2]; d.mode = <const int32_t *>cnp.PyArray_DATA(a)
    a = arrs[3]; d.true_child = <const int32_t *>cnp.PyArray_DATA(a)
    a = arrs[4]; d.false_child = <const int32_t *>cnp.PyArray_DATA(a)
    a = arrs[5]; d.nan_true = <const uint8_t *>cnp.PyArray_DATA(a)
    a = arrs[6]; d.thr = <const float *>cnp.PyArray_DATA(a)
    a = arrs[7]; d.w_node = <const int32_t *>cnp.PyArray_DATA(a)
    a = arrs[8]; d.w_target = <const int32_t *>cnp.PyArray_DATA(a)
    a = arrs[9]; d.w_value = <const float *>cnp.PyArray_DATA(a)
    a = arrs[10]; d.base = <const float *>cnp.PyArray_DATA(a)
    return 0


# --- MLPs given as Python lists (the kernel shims, the GPU protocol's test device)

def _mlp_arrays(weights, biases, activations):
    """(float32 weights, biases, dims, activation codes) of an MLP given as lists; InputError
    when they do not chain. Shared with the reduced-precision shim (fastpath._kernels)."""
    try:
        n = (len(weights), len(biases), len(activations))
    except TypeError:
        raise InputError(f"weights, biases and activations must be lists (one entry a layer), "
                         f"got {type(weights).__name__}, {type(biases).__name__}, "
                         f"{type(activations).__name__}") from None
    cdef int L = n[0]
    if L < 1 or L > FP_MAX_LAYERS or n[1] != L or n[2] != L:
        raise InputError(f"need 1..{FP_MAX_LAYERS} layers with one bias and activation each")
    try:
        ws = [np.ascontiguousarray(w, dtype=np.float32) for w in weights]
        bs = [np.ascontiguousarray(b, dtype=np.float32) for b in biases]
    except (TypeError, ValueError) as exc:
        raise InputError(f"weights and biases must be numeric arrays: {exc}") from None
    for i in range(L):
        if ws[i].ndim != 2 or bs[i].shape != (ws[i].shape[0],) or (
                i and ws[i].shape[1] != ws[i - 1].shape[0]):
            raise InputError(f"layer {i}: weight {ws[i].shape} / bias {bs[i].shape} do not chain")
        # the C packer refuses these too, but only as a failed allocation would
        if not (1 <= ws[i].shape[0] <= 65536 and 1 <= ws[i].shape[1] <= 65536):
            raise InputError(f"layer {i}: weight shape {ws[i].shape} outside 1..65536")
        # a NaN/Inf weight is no weight: the int8 packer's max|row| skips a NaN, which then
        # rounds to -127 (a silent -max|row|), and bf16 makes every output NaN
        for what, a in (("weight", ws[i]), ("bias", bs[i])):
            if not np.all(np.isfinite(a)):
                at = tuple(int(j) for j in np.argwhere(~np.isfinite(a))[0])
                raise InputError(f"layer {i}: {what} holds {float(a[at])!r} at index {at}; "
                                 f"weights and biases must be finite")
        if not isinstance(activations[i], str) or activations[i] not in _ACTS:
            raise InputError(f"layer {i}: unknown activation {activations[i]!r}; expected one of "
                             f"{sorted(_ACTS)}")
    dims = np.ascontiguousarray([ws[0].shape[1]] + [w.shape[0] for w in ws], dtype=np.intc)
    acts = np.ascontiguousarray([_ACTS[a] for a in activations], dtype=np.intc)
    return ws, bs, dims, acts


cdef int _pack_mlp(fp_mlp *m, weights, biases, activations, int wtype=FP_WEIGHTS_FP32,
                   fp_isa isa=FP_ISA_SCALAR) except -1:
    """fp_mlp_init_ex over float32 copies of the layers: hidden layers in weight format
    wtype (FP_WEIGHTS_*), run by isa's kernels; InputError when they do not chain."""
    ws, bs, dims, acts = _mlp_arrays(weights, biases, activations)
    cdef int L = len(ws)
    cdef const float **wp = <const float **>PyMem_Malloc(sizeof(float *) * L)
    cdef const float **bp = <const float **>PyMem_Malloc(sizeof(float *) * L)
    cdef cnp.ndarray t
    cdef int rc
    if wp == NULL or bp == NULL:
        PyMem_Free(wp)
        PyMem_Free(bp)
        raise MemoryError()
    try:
        for i in range(L):
            t = ws[i]
            wp[i] = <const float *>cnp.PyArray_DATA(t)
            t = bs[i]
            bp[i] = <const float *>cnp.PyArray_DATA(t)
        rc = fp_mlp_init_ex(m, L, <const int *>cnp.PyArray_DATA(dims),
                            <const int *>cnp.PyArray_DATA(acts), wp, bp, NULL, wtype, isa)
    finally:
        PyMem_Free(wp)
        PyMem_Free(bp)
    if rc != 0:
        raise MemoryError("cannot pack the MLP")
    return 0


# --- the engine

cdef fp_engine *_make_engine(object model, object cfg, list keep) except NULL:
    """fp_engine_create from a fastpath.Model and a fastpath._build.ResolvedConfig. The
    control plane's memory region (weights arena + per-symbol state), when the config asks
    for one, is appended to `keep`: it must outlive the engine."""
    cdef fp_engine *e = NULL
    m = model
    fs = m.feature_spec     # the input scaler (when the model has one) runs after it, in C
    pol = cfg.cache
    layers = m.layers
    cdef int L = len(layers)
    cdef fp_engine_params p
    cdef fp_trees_desc td
    cdef int err = 0
    cdef size_t wbytes = 0, sbytes = 0
    z_idx = np.ascontiguousarray(fs.z_idx, dtype=np.int32)
    w_idx = np.ascontiguousarray(fs.w_idx, dtype=np.int32)
    mean = np.ascontiguousarray(fs.mean, dtype=np.float32)
    inv_std = np.ascontiguousarray(fs.inv_std, dtype=np.float32)
    sc = m.input_scaler
    in_off = None if sc is None else np.ascontiguousarray(sc.offset, dtype=np.float32)
    in_scale = None if sc is None else np.ascontiguousarray(sc.scale, dtype=np.float32)
    tree_keep = []
    if m.trees is not None:
        # the C core packs its own copy; these arrays only live through fp_engine_create
        _trees_desc(m.trees, &td, tree_keep)
        dims = np.ones(2, dtype=np.intc)
    else:
        dims = np.ascontiguousarray([layers[0].weight.shape[1]] + [l.weight.shape[0] for l in layers],
                                    dtype=np.intc)
    acts = np.ascontiguousarray([_ACTS[l.activation] for l in layers], dtype=np.intc)
    ws = [np.ascontiguousarray(l.weight, dtype=np.float32) for l in layers]
    bs = [np.ascontiguousarray(l.bias, dtype=np.float32) for l in layers]
    cdef const float **wp = <const float **>PyMem_Malloc(sizeof(float *) * max(L, 1))
    cdef const float **bp = <const float **>PyMem_Malloc(sizeof(float *) * max(L, 1))
    cdef cnp.ndarray a
    memset(&p, 0, sizeof(p))
    head = m.head_spec
    p.post = _POSTS[m.post]
    p.head_scale = head.scale
    if head.kind == "tanh_sigmoid":
        p.head = FP_HEAD_TANH_SIGMOID
        p.head_idx[0], p.head_idx[1] = head.outputs
    elif head.kind == "regression":
        p.head = FP_HEAD_REGRESSION
        p.head_idx[0] = head.outputs[0]
    else:
        p.head = FP_HEAD_CLASSIFIER
        p.head_idx[0] = head.outputs[0]
        p.head_idx[1] = head.outputs[1] if head.kind == "classifier3" else -1
        p.head_idx[2] = head.outputs[len(head.outputs) - 1]
    if wp == NULL or bp == NULL:
        PyMem_Free(wp)
        PyMem_Free(bp)
        raise MemoryError()
    try:
        for i in range(L):
            a = ws[i]
            wp[i] = <const float *>cnp.PyArray_DATA(a)
            a = bs[i]
            bp[i] = <const float *>cnp.PyArray_DATA(a)
        p.raw_len = fs.raw_len
        p.n_z = len(z_idx)
        p.n_w = len(w_idx)
        p.window = fs.window
        p.z_idx = <const int32_t *>cnp.PyArray_DATA(z_idx)
        p.w_idx = <const int32_t *>cnp.PyArray_DATA(w_idx)
        p.mean = <const float *>cnp.PyArray_DATA(mean)
        p.inv_std = <const float *>cnp.PyArray_DATA(inv_std)
        if sc is not None:
            a = in_off
            p.in_offset = <const float *>cnp.PyArray_DATA(a)
            a = in_scale
            p.in_scale = <const float *>cnp.PyArray_DATA(a)
        if m.trees is not None:
            p.model_kind = FP_MODEL_TREES
            p.trees = &td
        p.n_layers = L
        p.dims = <const int *>cnp.PyArray_DATA(dims)
        p.acts = <const int *>cnp.PyArray_DATA(acts)
        p.weights = wp
        p.biases = bp
        p.arena_mem = NULL
        p.state_mem = NULL
        p.n_symbols = cfg.n_symbols
        p.policy.enabled = 1 if pol.enabled else 0
        p.policy.cos_threshold = pol.cos_threshold   # the plan slackens it (fp_cache_cos_bound)
        p.policy.norm_tol = pol.norm_tol
        p.policy.max_age_ns = pol.max_age_ns
        p.policy.max_run = pol.max_run
        p.isa = _ISA_BY_NAME[cfg.simd_resolved]
        # [engine] weights, when set, overrides the model's own choice (fp32 unless set)
        wt = getattr(cfg.source, "weights", None) or m.weights
        if m.trees is not None and wt != "fp32":
            raise ConfigError(f"engine.weights = {wt!r} applies to an MLP's layers; this model is a "
                              f"tree ensemble, which runs its float32 thresholds (leave "
                              f"engine.weights unset or 'fp32')")
        p.weight_type = _WEIGHT_TYPES[wt]
        p.lat_capacity = cfg.latency_records
        mem_cfg = cfg.memory
        if mem_cfg is not None:
            # weights arena + per-symbol state in one mapping from the control plane
            fp_engine_sizes(&p, &wbytes, &sbytes)
            region = allocate(wbytes + sbytes, mem_cfg.huge_pages, mem_cfg.mlock)
            keep.append(region)
            p.arena_mem = <void *><size_t>region.addr
            p.state_mem = <void *>(<size_t>region.addr + wbytes)
        e = fp_engine_create(&p, &err)
    finally:
        PyMem_Free(wp)
        PyMem_Free(bp)
    if e == NULL:
        if err == FP_ERR_NOMEM:
            raise MemoryError(f"cannot allocate an engine for {cfg.n_symbols} symbols")
        raise FastpathError("engine parameters rejected by the C core (a bug: the Model and "
                            "config were validated in Python)")
    return e
