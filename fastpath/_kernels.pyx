# cython: language_level=3
"""Kernel shims for the tests and the bench: each C kernel of a named kernel set, callable
from Python on numpy arrays; the cache decision alone; the MLP kernel alone (PackedMLP); the
clock (the one fastpath._core calibrates at import, which the engine reads too); the FMA peak,
streaming-read bandwidth and jitter probes.

Design: nothing here is on the hot path, so every shim copies and checks its inputs and
allocates its outputs; the tests compare each against a numpy reference, per kernel set.
"""
cimport numpy as cnp
from libc.math cimport sqrt
from libc.stdint cimport int32_t, int64_t, uint64_t
from libc.string cimport memcpy, memset

from fastpath._csrc cimport *
from fastpath._core cimport _pack_mlp, _trees_desc

import numpy as np

from fastpath._core import _ACTS, _ISA_BY_NAME, _describe, supported_isas
from fastpath.errors import InputError
from fastpath.model.trees import TreeEnsemble

cnp.import_array()

# the live book stage alone, for book_stage_ns (the engine's fp_step_book runs it per tick)
cdef extern from "fp_book.h" nogil:
    ctypedef struct fp_book:
        pass
    fp_book *fp_book_create(double tick)
    void fp_book_free(fp_book *b)
    void fp_book_clear(fp_book *b)
    void fp_book_set_kernels(fp_book *b, const fp_kernels *k, int libm_log1p)
    int fp_book_compute(fp_book *b, const fp_book_update *u, const float **raw, int *where)
    void fp_book_commit(fp_book *b)

cdef const fp_kernels *_kernels(str isa) except NULL:
    if isa not in _ISA_BY_NAME:
        raise InputError(f"unknown kernel set {isa!r}; expected one of {sorted(_ISA_BY_NAME)}")
    cdef const fp_kernels *k = fp_kernels_for(_ISA_BY_NAME[isa])
    if k == NULL:
        raise InputError(f"kernel set {isa!r} is not supported by this CPU (has: {supported_isas()})")
    return k


def fma_ns_per_instr(long iters=20_000_000):
    """Measured ns per 8-lane FMA instruction at full throughput (12 chains); -1 without
    AVX2+FMA. Best of three runs."""
    cdef double best = 1e30, v
    for _ in range(3):
        with nogil:
            v = fp_fma_ns_per_instr(iters)
        best = min(best, v)
    return best


def fma512_ns_per_instr(long iters=10_000_000):
    """Measured ns per 16-lane FMA instruction at full throughput (12 chains); -1 where the
    avx512 kernel set cannot run. Best of three runs."""
    cdef double best = 1e30, v
    for _ in range(3):
        with nogil:
            v = fp_fma512_ns_per_instr(iters)
        best = min(best, v)
    return best


_LAT_OPS = {"fma": 0, "add": 1, "mul": 2, "max": 3}


def op_latency_ns(str op, long iters=2_000_000):
    """Measured ns from one op's inputs to its result (one dependent chain) on the widest
    vector set this CPU runs, for op in fma, add, mul, max; -1 without AVX2+FMA. Best of
    three runs."""
    if op not in _LAT_OPS:
        raise InputError(f"op must be one of {sorted(_LAT_OPS)}, got {op!r}")
    cdef int code = _LAT_OPS[op]
    cdef double best = 1e30, v
    for _ in range(3):
        with nogil:
            v = fp_op_latency_ns(code, iters)
        best = min(best, v)
    return best


def fma_macs_per_ns(str isa):
    """Multiply-adds per ns at the FMA bound of the named kernel set (lanes / ns per FMA
    instruction, measured now); 0.0 for scalar, which has no vector FMA to measure."""
    if isa not in _ISA_BY_NAME:
        raise InputError(f"unknown kernel set {isa!r}; expected one of {sorted(_ISA_BY_NAME)}")
    if isa == "avx512":
        ns = fma512_ns_per_instr()
        return 16.0 / ns if ns > 0 else 0.0
    if isa == "avx2":
        ns = fma_ns_per_instr()
        return 8.0 / ns if ns > 0 else 0.0
    return 0.0


def read_gbps(long long nbytes, int passes=5):
    """Streaming-read bandwidth in GB/s (1e9 bytes/s) over a buffer of nbytes, read `passes`
    times after a warm-up with the widest loads this CPU has (GIL released); best pass (past
    512 KB each pass also with software prefetch, the faster counting). Size the buffer as the
    weights: it measures the cache level (or memory) they stream from."""
    if not 256 <= nbytes <= (1 << 34):
        raise InputError(f"nbytes must be in [256, 2**34], got {nbytes}")
    if not 1 <= passes <= 1000:
        raise InputError(f"passes must be in [1, 1000], got {passes}")
    cdef double g
    cdef size_t n = <size_t>nbytes
    with nogil:
        g = fp_read_gbps(n, passes)
    if g < 0:
        raise MemoryError(f"cannot allocate {nbytes} bytes for the read probe")
    return g


def jitter_probe(double seconds, long long threshold_ns=1000):
    """Spin on the calling thread's core for `seconds`, reading the TSC back to back, and
    histogram every gap longer than threshold_ns (cyclictest-style, GIL released).
    Returns {"seconds", "reads", "gaps", "max_gap_ns", "threshold_ns", "histogram":
    [[lo_ns, hi_ns, count], ...]}."""
    if not 0 < seconds <= 3600:
        raise InputError(f"jitter seconds must be in (0, 3600], got {seconds}")
    if threshold_ns < 1:
        raise InputError(f"threshold_ns must be >= 1, got {threshold_ns}")
    cdef long long hist[40]
    cdef long long maxg = 0, reads = 0, gaps
    cdef long long dur = <long long>(seconds * 1e9)
    with nogil:
        gaps = fp_jitter_probe(dur, threshold_ns, hist, &maxg, &reads)
    return {"seconds": seconds, "reads": reads, "gaps": gaps, "max_gap_ns": maxg,
            "threshold_ns": threshold_ns, "clock": fp_clock_source().decode(),
            "histogram": [[1 << k, 1 << (k + 1), hist[k]] for k in range(40) if hist[k]]}


def _index_arg(v, Py_ssize_t n, str name):
    """v as contiguous int32 indices into n values, or an InputError: checked before the
    cast (np.int32 of 2**32 + 3 is 3, of 1.7 is 1: an index out of range or not whole read
    another value, silently)."""
    a = np.asarray(v)
    if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
        raise InputError(f"{name} must be a 1-d integer array, got {_describe(a)}")
    if a.size and (a.min() < 0 or a.max() >= n):
        raise InputError(f"{name} must index raw (0..{n - 1}), got values in "
                         f"[{a.min()}, {a.max()}]")
    return np.ascontiguousarray(a, dtype=np.int32)


cdef cnp.ndarray _f32(x, str name):
    a = np.asarray(x)
    if a.dtype != np.float32 or a.ndim != 1:
        raise InputError(f"{name} must be a 1-d float32 array, got {_describe(a)}")
    return np.ascontiguousarray(a)


def _zscore_args(raw, idx, mean, inv_std):
    """Checked, contiguous (raw, idx int32, mean, inv_std) for the z-score shims."""
    r, m, s = _f32(raw, "raw"), _f32(mean, "mean"), _f32(inv_std, "inv_std")
    ix = _index_arg(idx, len(r), "idx")
    n = len(ix)
    if len(m) != n or len(s) != n:
        raise InputError("idx, mean and inv_std must have one length and idx must index raw")
    return r, ix, m, s


def kernel_zscore_gather(str isa, raw, idx, mean, inv_std):
    """(raw[idx] - mean) * inv_std with the named kernel set."""
    cdef const fp_kernels *k = _kernels(isa)
    cdef cnp.ndarray r, ix, m, s
    r, ix, m, s = _zscore_args(raw, idx, mean, inv_std)
    n = len(ix)
    out = np.empty(n, np.float32)
    k.zscore_gather(<const float *>cnp.PyArray_DATA(r), <const int32_t *>cnp.PyArray_DATA(ix),
                    <const float *>cnp.PyArray_DATA(m), <const float *>cnp.PyArray_DATA(s),
                    <float *>cnp.PyArray_DATA(out), n)
    return out


def kernel_zscore_perm(str isa, raw, idx, mean, inv_std, bint steps=False, bint finite=False):
    """(raw[idx] - mean) * inv_std through a permute plan (what an AVX-512 engine runs);
    steps=True: (out, number of plan steps); finite=True adds the kernel's flag (True when
    every value of raw is finite: the plan loads all of it) as the last item."""
    cdef const fp_kernels *k = _kernels(isa)
    cdef cnp.ndarray r, ix, m, s
    r, ix, m, s = _zscore_args(raw, idx, mean, inv_std)
    cdef int n = len(ix)
    cdef int raw_len = len(r)
    cdef int cap = ((n + 15) // 16) * ((raw_len + 31) // 32)
    cdef fp_zstep *plan = <fp_zstep *>fp_aligned_alloc(32 * (cap if cap > 0 else 1))
    if plan == NULL:
        raise MemoryError()
    # the raw array exactly as long as raw_len (no slack: the kernel must not read past it),
    # out with a guard after the last output (the kernel must not write past it either)
    out = np.full(n + 16, np.float32(-7.0))
    cdef int ns, ok
    try:
        ns = fp_zperm_build(<const int32_t *>cnp.PyArray_DATA(ix), n, raw_len, plan)
        ok = k.zscore_perm(<const float *>cnp.PyArray_DATA(r), plan, ns,
                           <const float *>cnp.PyArray_DATA(m), <const float *>cnp.PyArray_DATA(s),
                           <float *>cnp.PyArray_DATA(out))
    finally:
        fp_aligned_free(plan)
    if (out[n:] != np.float32(-7.0)).any():
        raise AssertionError("zscore_perm wrote past its last output")
    res = (out[:n],) + ((ns,) if steps else ()) + ((bool(ok),) if finite else ())
    return res if len(res) > 1 else res[0]


def kernel_window_commit(str isa, raw, w_idx, sum_, sumsq, row, bint full, bint undo=False,
                         fresh=None, ref=None, fref=None, thr=None):
    """One tick into a window with the named kernel set: returns the new (sum, sumsq, row,
    fresh, heal) (float64, float64, float32, float64 (2 n_w: the sums since the ring last
    wrapped; zeros when fresh is None), bool); the inputs are not modified. thr: the heal
    flag's bounds on sum^2, n_w + 1 float64 (per field, then the factor of sumsq; +inf, never,
    when None). ref (the running
    sums' reference) and fref (the fresh sums'): n_w float32 each (ticks), zeros when None.
    undo=True: the kernel also writes its undo record, and (old sum, old sumsq, old fresh,
    old row) read back from it follow."""
    cdef const fp_kernels *k = _kernels(isa)
    r = np.ascontiguousarray(raw, np.float32)
    if r.ndim != 1:
        raise InputError(f"raw must be 1-d, got shape {r.shape}")
    ix = _index_arg(w_idx, len(r), "w_idx")
    cdef int n = len(ix)
    s = np.array(sum_, np.float64, copy=True)
    q = np.array(sumsq, np.float64, copy=True)
    w = np.array(row, np.float32, copy=True)
    if not (len(s) == len(q) == len(w) == n):
        raise InputError("sum, sumsq and row must have one value per window field")
    fr = np.zeros(2 * n, np.float64) if fresh is None else np.array(fresh, np.float64, copy=True)
    if len(fr) != 2 * n:
        raise InputError("fresh must have two values per window field")
    rf = np.concatenate([_refs(ref, n, "ref"), _refs(fref, n, "fref")])
    th = np.full(n + 1, np.inf) if thr is None else np.array(thr, np.float64, copy=True)
    if th.shape != (n + 1,):
        raise InputError("thr must have one value per window field and one more")
    # the record (36 n bytes) and 64 guard bytes after it, which must stay untouched
    rec = np.full(4 * n + (n + 1) // 2 + 8, np.nan)
    cdef double *u = <double *>cnp.PyArray_DATA(rec) if undo else NULL
    heal = k.window_commit(<const float *>cnp.PyArray_DATA(r), <const int32_t *>cnp.PyArray_DATA(ix),
                           n, <const float *>cnp.PyArray_DATA(rf),
                           <double *>cnp.PyArray_DATA(s), <double *>cnp.PyArray_DATA(q),
                           <float *>cnp.PyArray_DATA(w), full,
                           <const double *>cnp.PyArray_DATA(th), u, <double *>cnp.PyArray_DATA(fr))
    if not undo:
        return s, q, w, fr, bool(heal)
    b = rec.view(np.uint8)
    if (b[36 * n:] != np.full(1, np.nan).view(np.uint8)[np.arange(36 * n, b.size) % 8]).any():
        raise AssertionError("window_commit wrote past its undo record")
    return (s, q, w, fr, bool(heal), rec[:n].copy(), rec[n:2 * n].copy(),
            rec[2 * n:4 * n].copy(), b[32 * n:36 * n].view(np.float32).copy())


def kernel_window_sums(str isa, ring, ref):
    """A window's sums recomputed from its ring (rows x fields, float32) about ref (one float32
    per field) with the named kernel set: (sum, sumsq) of ring - ref per field, float64."""
    cdef const fp_kernels *k = _kernels(isa)
    rg = np.ascontiguousarray(ring, np.float32)
    if rg.ndim != 2:
        raise InputError(f"ring must be rows x fields, got shape {rg.shape}")
    cdef int rows = rg.shape[0], n = rg.shape[1]
    rf = _refs(ref, n, "ref")
    out = np.full(2 * n + 8, -7.0)
    k.window_sums(<const float *>cnp.PyArray_DATA(rg), rows, n, n,
                  <const float *>cnp.PyArray_DATA(rf), <double *>cnp.PyArray_DATA(out),
                  <double *>cnp.PyArray_DATA(out) + n)
    if (out[2 * n:] != -7.0).any():
        raise AssertionError("window_sums wrote past its outputs")
    return out[:n].copy(), out[n:2 * n].copy()


def kernel_zscore_runs(str isa, raw, idx, mean, inv_std):
    """(raw[idx] - mean) * inv_std through the runs kernel (idx split into consecutive runs)."""
    cdef const fp_kernels *k = _kernels(isa)
    cdef cnp.ndarray r, ix, m, s
    r, ix, m, s = _zscore_args(raw, idx, mean, inv_std)
    n = len(ix)
    cdef cnp.ndarray runs = np.zeros(3 * n + 3, np.int32)
    cdef int nr = fp_feature_runs(<const int32_t *>cnp.PyArray_DATA(ix), n,
                                  <int32_t *>cnp.PyArray_DATA(runs))
    # the kernel needs 8 floats of slack after out, mean and inv_std (see fp_simd.h)
    out = np.empty(n + 8, np.float32)
    mp = np.concatenate([m, np.zeros(8, np.float32)])
    sp = np.concatenate([s, np.zeros(8, np.float32)])
    k.zscore_runs(<const float *>cnp.PyArray_DATA(r), <const int32_t *>cnp.PyArray_DATA(runs), nr,
                  <const float *>cnp.PyArray_DATA(mp), <const float *>cnp.PyArray_DATA(sp),
                  <float *>cnp.PyArray_DATA(out))
    return out[:n]


def _refs(v, n, name):
    """n float32 references (ticks) for the window kernels (zeros when v is None)"""
    r = np.zeros(n, np.float32) if v is None else np.array(v, np.float32, copy=True)
    if r.shape != (n,):
        raise InputError(f"{name} must have one value per window field")
    return r


def kernel_window_stats(str isa, raw, w_idx, sum_, sumsq, old, double inv_n, ref=None):
    """(rolling mean, rolling std) with raw[w_idx] added to the running sums and `old`
    (None: nothing) removed, as the feature stage computes them; the sums are of values less
    ref (n_w float32, ticks; zeros when None)."""
    cdef const fp_kernels *k = _kernels(isa)
    cdef cnp.ndarray r = _f32(raw, "raw")
    cdef cnp.ndarray ix = _index_arg(w_idx, len(r), "w_idx")
    cdef cnp.ndarray s = np.ascontiguousarray(sum_, dtype=np.float64)
    cdef cnp.ndarray q = np.ascontiguousarray(sumsq, dtype=np.float64)
    cdef cnp.ndarray o = None if old is None else _f32(old, "old")
    n = len(ix)
    if len(s) != n or len(q) != n or (o is not None and len(o) != n) or (
            n and (ix.min() < 0 or ix.max() >= len(r))):
        raise InputError("w_idx, sum, sumsq and old must have one length and w_idx must index raw")
    pm = np.empty(n, np.float32)
    ps = np.empty(n, np.float32)
    cdef cnp.ndarray rf = _refs(ref, n, "ref")
    k.window_stats(<const float *>cnp.PyArray_DATA(r), <const int32_t *>cnp.PyArray_DATA(ix), n,
                   <const float *>cnp.PyArray_DATA(rf),
                   <const double *>cnp.PyArray_DATA(s), <const double *>cnp.PyArray_DATA(q),
                   NULL if o is None else <const float *>cnp.PyArray_DATA(o), inv_n,
                   <float *>cnp.PyArray_DATA(pm), <float *>cnp.PyArray_DATA(ps))
    return pm, ps


def kernel_zscore(str isa, x, mean, inv_std):
    """(x - mean) * inv_std with the named kernel set."""
    cdef const fp_kernels *k = _kernels(isa)
    cdef cnp.ndarray a = _f32(x, "x"), m = _f32(mean, "mean"), s = _f32(inv_std, "inv_std")
    n = len(a)
    if len(m) != n or len(s) != n:
        raise InputError("x, mean and inv_std must have one length")
    out = np.empty(n, np.float32)
    k.zscore(<const float *>cnp.PyArray_DATA(a), <const float *>cnp.PyArray_DATA(m),
             <const float *>cnp.PyArray_DATA(s), <float *>cnp.PyArray_DATA(out), n)
    return out


def kernel_dot_norm2(str isa, a, b):
    """(dot(a, b), |a|^2) in one pass with the named kernel set (summed in double)."""
    cdef const fp_kernels *k = _kernels(isa)
    cdef cnp.ndarray x = _f32(a, "a"), y = _f32(b, "b")
    if len(x) != len(y):
        raise InputError("a and b must have one length")
    cdef double d = 0, s = 0
    k.dot_norm2(<const float *>cnp.PyArray_DATA(x), <const float *>cnp.PyArray_DATA(y), len(x), &d, &s)
    return float(d), float(s)


def kernel_dot_norms_f32(str isa, a, b):
    """(dot(a, b), |a|^2, |b|^2) summed in float32 with the named kernel set: the cache's
    first look, whose rounding count fp_cache.h's error bound assumes."""
    cdef const fp_kernels *k = _kernels(isa)
    cdef cnp.ndarray x = _f32(a, "a"), y = _f32(b, "b")
    if len(x) != len(y):
        raise InputError("a and b must have one length")
    cdef float d = 0, s = 0, t = 0
    k.dot_norms_f32(<const float *>cnp.PyArray_DATA(x), <const float *>cnp.PyArray_DATA(y),
                    len(x), &d, &s, &t)
    return float(d), float(s), float(t)


def kernel_diff_norms_f32(str isa, a, b):
    """(|a - b|^2, sum (a - b)(a + b), |a|^2, |b|^2) summed in float32 with the named kernel
    set in one pass: the cache's first look, whose rounding count fp_cache.h's bound assumes."""
    cdef const fp_kernels *k = _kernels(isa)
    cdef cnp.ndarray x = _f32(a, "a"), y = _f32(b, "b")
    if len(x) != len(y):
        raise InputError("a and b must have one length")
    cdef float dd = 0, de = 0, s = 0, t = 0
    k.diff_norms_f32(<const float *>cnp.PyArray_DATA(x), <const float *>cnp.PyArray_DATA(y),
                     len(x), &dd, &de, &s, &t)
    return float(dd), float(de), float(s), float(t)


def kernel_dot_norms_f64(str isa, a, b):
    """(dot(a, b), |a|^2, |b|^2) summed in double with the named kernel set, in one pass."""
    cdef const fp_kernels *k = _kernels(isa)
    cdef cnp.ndarray x = _f32(a, "a"), y = _f32(b, "b")
    if len(x) != len(y):
        raise InputError("a and b must have one length")
    cdef double d = 0, s = 0, t = 0
    k.dot_norms_f64(<const float *>cnp.PyArray_DATA(x), <const float *>cnp.PyArray_DATA(y),
                    len(x), &d, &s, &t)
    return float(d), float(s), float(t)


def kernel_window_zscore(str isa, raw, w_idx, sum_, sumsq, old, double inv_n, mean, inv_std,
                         ref=None, thr=None):
    """Window features in one pass: z-scores of the rolling means (first n_w) and of the
    rolling stds (next n_w); mean and inv_std hold 2 n_w values; the sums are of values less
    ref (n_w float32, ticks; zeros when None). thr (n_w + 1 float64, the heal bounds): the
    features and whether committing the tick heals the window, (feat, bool)."""
    cdef const fp_kernels *k = _kernels(isa)
    cdef cnp.ndarray r = _f32(raw, "raw")
    cdef cnp.ndarray ix = _index_arg(w_idx, len(r), "w_idx")
    cdef cnp.ndarray s = np.ascontiguousarray(sum_, dtype=np.float64)
    cdef cnp.ndarray q = np.ascontiguousarray(sumsq, dtype=np.float64)
    cdef cnp.ndarray o = None if old is None else _f32(old, "old")
    cdef cnp.ndarray m = _f32(mean, "mean"), sd = _f32(inv_std, "inv_std")
    cdef cnp.ndarray th = None if thr is None else np.array(thr, np.float64, copy=True)
    if th is not None and (th.ndim != 1 or len(th) != len(ix) + 1):
        raise InputError("thr must have one value per window field and one more")
    n = len(ix)
    if len(s) != n or len(q) != n or (o is not None and len(o) != n) or (
            n and (ix.min() < 0 or ix.max() >= len(r))) or len(m) != 2 * n or len(sd) != 2 * n:
        raise InputError("w_idx, sum, sumsq and old must have one length n, mean and inv_std "
                         "2n, and w_idx must index raw")
    out = np.empty(2 * n, np.float32)
    cdef cnp.ndarray rf = _refs(ref, n, "ref")
    heal = k.window_zscore(<const float *>cnp.PyArray_DATA(r), <const int32_t *>cnp.PyArray_DATA(ix), n,
                    <const float *>cnp.PyArray_DATA(rf),
                    <const double *>cnp.PyArray_DATA(s), <const double *>cnp.PyArray_DATA(q),
                    NULL if o is None else <const float *>cnp.PyArray_DATA(o), inv_n,
                    <const float *>cnp.PyArray_DATA(m), <const float *>cnp.PyArray_DATA(sd),
                    <float *>cnp.PyArray_DATA(out),
                    NULL if th is None else <const double *>cnp.PyArray_DATA(th))
    return out if th is None else (out, bool(heal))


_REASONS = {FP_HIT: "hit", FP_MISS_COSINE: "cosine", FP_MISS_NORM: "norm"}


cdef fp_cache_policy _guards_only(double cos_threshold, double norm_tol):
    """A policy whose age and run guards never refuse: only direction and magnitude decide."""
    cdef fp_cache_policy p
    p.cos_threshold = cos_threshold
    p.norm_tol = norm_tol
    p.max_age_ns = 1LL << 62
    p.max_run = 0xFFFFFFFF
    p.enabled = 1
    return p


def kernel_cache_decide(str isa, f, cached, double cos_threshold, double norm_tol):
    """The cache's direction and magnitude guards alone, as fp_cache_lookup decides them for
    features f against a slot holding `cached` (stored as the engine stores it: the features
    and their norm from this kernel set). Returns "hit", "cosine" or "norm"."""
    cdef const fp_kernels *k = _kernels(isa)
    cdef cnp.ndarray x = _f32(f, "f"), c = _f32(cached, "cached")
    cdef int n = len(x)
    if len(c) != n or n < 1:
        raise InputError("f and cached must have one length >= 1")
    cdef fp_slot *s = <fp_slot *>fp_aligned_alloc(fp_slot_stride(n))
    if s == NULL:
        raise MemoryError("cannot allocate a cache slot")
    cdef fp_cache_policy p = _guards_only(cos_threshold, norm_tol)
    cdef double d, na2, norm
    cdef int reason
    try:
        memcpy(fp_slot_features(s), cnp.PyArray_DATA(c), sizeof(float) * n)
        k.dot_norm2(fp_slot_features(s), fp_slot_features(s), n, &d, &na2)
        s.norm = sqrt(na2)
        s.valid = 1
        reason = fp_cache_lookup(k, &p, s, <const float *>cnp.PyArray_DATA(x), n, 0, &norm)
    finally:
        fp_aligned_free(s)
    return _REASONS.get(reason, str(reason))


def kernel_cache_look_f32(str isa, f, cached, double cos_threshold, double norm_tol):
    """The cache lookup's float32 first look alone (fp_cache_look_f32 under the plan an engine
    makes for this policy and length): "hit", "cosine", "norm", or "undecided" where it
    leaves the decision to the double sums."""
    cdef const fp_kernels *k = _kernels(isa)
    cdef cnp.ndarray x = _f32(f, "f"), c = _f32(cached, "cached")
    cdef int n = len(x)
    if len(c) != n or n < 1:
        raise InputError("f and cached must have one length >= 1")
    cdef fp_cache_policy p = _guards_only(cos_threshold, norm_tol)
    cdef fp_cache_plan pl
    fp_cache_plan_init(&pl, &p, n)
    cdef int r = fp_cache_look_f32(k, &pl, <const float *>cnp.PyArray_DATA(x),
                                   <const float *>cnp.PyArray_DATA(c), n)
    if r == FP_CACHE_UNDECIDED:
        return "undecided"
    return _REASONS.get(r, str(r))


def kernel_dense(str isa, w, b, str act, x, bint reverse=False):
    """One dense layer through the named kernel set: (act(w @ x + b), finite) where finite
    is the kernel's flag that every pre-activation was finite; reverse picks the row-group
    order (the result must not depend on it)."""
    cdef const fp_kernels *k = _kernels(isa)
    if act not in _ACTS:
        raise InputError(f"unknown activation {act!r}; expected one of {sorted(_ACTS)}")
    W = np.ascontiguousarray(w, dtype=np.float32)
    B = np.ascontiguousarray(b, dtype=np.float32)
    cdef cnp.ndarray v = _f32(x, "x")
    # a layer of no inputs is refused here (the packer refuses it too, but as a MemoryError)
    if (W.ndim != 2 or B.shape != (W.shape[0],) or W.shape[1] != len(v) or W.shape[0] < 1
            or W.shape[1] < 1):
        raise InputError(f"w {W.shape}, b {B.shape} and x ({len(v)},) do not chain (a layer "
                         f"needs at least one input and one output)")
    cdef int n_out = W.shape[0], n_in = W.shape[1]
    dims = np.ascontiguousarray([n_in, n_out], dtype=np.intc)
    acts = np.ascontiguousarray([_ACTS[act]], dtype=np.intc)
    cdef cnp.ndarray wt = W, bt = B, dt = dims, at = acts
    cdef const float *wp = <const float *>cnp.PyArray_DATA(wt)
    cdef const float *bp = <const float *>cnp.PyArray_DATA(bt)
    cdef fp_mlp m
    if fp_mlp_init(&m, 1, <const int *>cnp.PyArray_DATA(dt), <const int *>cnp.PyArray_DATA(at),
                   &wp, &bp, NULL) != 0:
        raise MemoryError("cannot pack the layer")
    cdef float *y = <float *>fp_aligned_alloc(sizeof(float) * m.max_width)
    cdef int ok
    try:
        if y == NULL:
            raise MemoryError("cannot allocate the layer output")
        ok = k.dense(&m.layers[0], <const float *>cnp.PyArray_DATA(v), y, 1 if reverse else 0)
        out = np.empty(n_out, np.float32)
        memcpy(cnp.PyArray_DATA(out), y, sizeof(float) * n_out)
    finally:
        fp_aligned_free(y)
        fp_mlp_free(&m)
    return out, bool(ok)


def kernel_head(str isa, double out0, double out1):
    """(tanh(out0), sigmoid(out1)) with the named kernel set."""
    cdef const fp_kernels *k = _kernels(isa)
    cdef float o[2]
    cdef float sig = 0, conf = 0
    o[0] = <float>out0
    o[1] = <float>out1
    k.head(o, &sig, &conf)
    return float(sig), float(conf)


def kernel_allfinite(str isa, x):
    cdef const fp_kernels *k = _kernels(isa)
    cdef cnp.ndarray a = _f32(x, "x")
    return bool(k.allfinite(<const float *>cnp.PyArray_DATA(a), len(a)))



def kernel_log1p(str isa, x):
    """log1p of float64 x with the named kernel set's batch kernel (bit for bit glibc's FMA
    build of fdlibm's log1p, the C library's where log1p_libm_fused() is True)."""
    cdef const fp_kernels *k = _kernels(isa)
    cdef cnp.ndarray a = np.ascontiguousarray(x, np.float64)
    if a.ndim != 1 or a.shape[0] > 2 ** 30:
        raise InputError(f"x must be one row of at most 2**30 float64 values, got shape "
                         f"{np.shape(a)}")
    out = np.full(a.shape[0] + 8, -7.0)
    k.log1p(<const double *>cnp.PyArray_DATA(a), <double *>cnp.PyArray_DATA(out), a.shape[0])
    if (out[a.shape[0]:] != -7.0).any():
        raise AssertionError("log1p wrote past its output")
    return out[:a.shape[0]].copy()


def _ten_rows(rows, str name):
    """rows as float64 C-contiguous (k, 10), one book side or array of ten levels per row"""
    cdef cnp.ndarray a = np.ascontiguousarray(rows, np.float64)
    if a.ndim != 2 or a.shape[1] != 10:
        raise InputError(f"{name} must be float64 rows of 10 levels, shape (k, 10); got shape "
                         f"{np.shape(a)}")
    return a


def _ten_row_arrays(**named):
    """_ten_rows of each named array, all with as many rows"""
    arrs = [_ten_rows(v, name) for name, v in named.items()]
    if len({a.shape[0] for a in arrs}) != 1:
        raise InputError(f"{', '.join(named)} must have as many rows, got "
                         f"{[a.shape[0] for a in arrs]}")
    return arrs


def kernel_book_ok(str isa, bid_px, bid_sz, ask_px, ask_sz):
    """The named kernel set's check of one update's levels, for each of k updates (rows of 10
    levels): True where every price is finite and > 0, every size finite and >= 0, bid prices
    not rising and ask prices not falling from level to level."""
    cdef const fp_kernels *k = _kernels(isa)
    arrs = _ten_row_arrays(bid_px=bid_px, bid_sz=bid_sz, ask_px=ask_px, ask_sz=ask_sz)
    cdef const double *p[4]
    for j in range(4):
        p[j] = <const double *>cnp.PyArray_DATA(<cnp.ndarray>arrs[j])
    cdef Py_ssize_t i, n = arrs[0].shape[0]
    out = np.zeros(n, bool)
    for i in range(n):
        out[i] = k.book_ok(p[0] + 10 * i, p[1] + 10 * i, p[2] + 10 * i, p[3] + 10 * i) != 0
    return out


def kernel_book_diff(str isa, x0, x1, x2, x3, old):
    """The named kernel set's level differences for each of k rows: a uint64 with bit 10 a + i
    set where x_a[i] != old[10 a + i] (x0..x3: rows of 10 levels, old: rows of 40)."""
    cdef const fp_kernels *k = _kernels(isa)
    xs = [_ten_rows(v, f"x{j}") for j, v in enumerate((x0, x1, x2, x3))]
    cdef cnp.ndarray o = np.ascontiguousarray(old, np.float64)
    n = xs[0].shape[0]
    if any(a.shape[0] != n for a in xs) or o.ndim != 2 or o.shape[0] != n or o.shape[1] != 40:
        raise InputError(f"x0..x3 must be (k, 10) and old (k, 40) with the same k, got "
                         f"{[np.shape(a) for a in xs]} and {np.shape(o)}")
    cdef const double *p[4]
    for j in range(4):
        p[j] = <const double *>cnp.PyArray_DATA(<cnp.ndarray>xs[j])
    cdef const double *po = <const double *>cnp.PyArray_DATA(o)
    cdef Py_ssize_t i
    out = np.zeros(n, np.uint64)
    cdef uint64_t[::1] ov = out
    for i in range(n):
        ov[i] = k.book_diff(p[0] + 10 * i, p[1] + 10 * i, p[2] + 10 * i, p[3] + 10 * i,
                            po + 40 * i)
    return out


def kernel_book_prices(str isa, bid_px, ask_px, double mid, double tick):
    """The named kernel set's price fields of k books (rows of 10 levels), in ticks: (k, 102)
    float64 laid out as the raw vector's fields 0-101, the fields it does not write NaN."""
    cdef const fp_kernels *k = _kernels(isa)
    cdef cnp.ndarray b, a
    b, a = _ten_row_arrays(bid_px=bid_px, ask_px=ask_px)
    out = np.full((b.shape[0], 102), np.nan)
    cdef double[:, ::1] ov = out
    cdef Py_ssize_t i
    for i in range(b.shape[0]):
        k.book_prices(<const double *>cnp.PyArray_DATA(b) + 10 * i,
                      <const double *>cnp.PyArray_DATA(a) + 10 * i, mid, tick, &ov[i, 0])
    return out


def kernel_book_imbalance(str isa, b, a):
    """The named kernel set's imbalances of k rows of 10 levels: (b - a) / (b + a) where the
    sum is > 0, else 0."""
    cdef const fp_kernels *k = _kernels(isa)
    cdef cnp.ndarray vb, va
    vb, va = _ten_row_arrays(b=b, a=a)
    out = np.full((vb.shape[0], 10), np.nan)
    cdef double[:, ::1] ov = out
    cdef Py_ssize_t i
    for i in range(vb.shape[0]):
        k.book_imbalance(<const double *>cnp.PyArray_DATA(vb) + 10 * i,
                         <const double *>cnp.PyArray_DATA(va) + 10 * i, &ov[i, 0])
    return out


def log1p_libm_fused():
    """Whether this host's C library log1p is the build the log1p kernels reproduce (the
    probe the live book runs before it uses them)."""
    return bool(fp_log1p_libm_fused())


def book_stage_ns(str isa, tick, symbols, bid_px, bid_sz, ask_px, ask_sz, ts_ns, trade_vol,
                  trade_cnt, last_trade_sz, int passes=3, bint libm=False):
    """The live book stage alone (fp_book_compute then fp_book_commit, csrc/fp_book.c) over a
    stream of updates (the fields of a fastpath.lob.BookStream, one book per symbol, the
    named kernel set's log1p, or libm's value by value with libm=True), GIL released: ns of
    each update on each pass, (passes, n) int64, each pass from empty books. An update the
    stage refuses is an InputError."""
    cdef cnp.ndarray sy = np.ascontiguousarray(symbols, np.int64)
    cdef Py_ssize_t n = sy.shape[0], i, p
    cdef cnp.ndarray bp = np.ascontiguousarray(bid_px, np.float64)
    cdef cnp.ndarray bs = np.ascontiguousarray(bid_sz, np.float64)
    cdef cnp.ndarray ap = np.ascontiguousarray(ask_px, np.float64)
    cdef cnp.ndarray az = np.ascontiguousarray(ask_sz, np.float64)
    cdef cnp.ndarray ts = np.ascontiguousarray(ts_ns, np.int64)
    cdef cnp.ndarray tv = np.ascontiguousarray(trade_vol, np.float64)
    cdef cnp.ndarray tc = np.ascontiguousarray(trade_cnt, np.float64)
    cdef cnp.ndarray tl = np.ascontiguousarray(last_trade_sz, np.float64)
    for name, a, shape in (("bid_px", bp, (n, 10)), ("bid_sz", bs, (n, 10)), ("ask_px", ap, (n, 10)),
                           ("ask_sz", az, (n, 10)), ("ts_ns", ts, (n,)), ("trade_vol", tv, (n,)),
                           ("trade_cnt", tc, (n,)), ("last_trade_sz", tl, (n,))):
        if a.shape != shape:
            raise InputError(f"{name} must have shape {shape} (one row per update), got "
                             f"{np.shape(a)}")
    if n and (sy.min() < 0 or sy.max() >= 4096) or passes < 1:
        raise InputError("symbols must be in [0, 4096) and passes >= 1")
    cdef cnp.ndarray ticks = np.broadcast_to(np.asarray(tick, np.float64), (n,)).copy()
    cdef const fp_kernels *k = _kernels(isa)
    cdef int n_sym = int(sy.max()) + 1 if n else 0
    cdef fp_book **books = <fp_book **>fp_aligned_alloc(sizeof(fp_book *) * max(n_sym, 1))
    if books == NULL:
        raise MemoryError("no memory for the books")
    memset(books, 0, sizeof(fp_book *) * max(n_sym, 1))
    out = np.zeros((passes, n), np.int64)
    cdef int64_t[:, ::1] o = out
    cdef const int64_t *syp = <const int64_t *>cnp.PyArray_DATA(sy)
    cdef const double *tk = <const double *>cnp.PyArray_DATA(ticks)
    cdef fp_book_update u
    cdef const float *raw
    cdef int rc = 0, where = 0
    cdef uint64_t t0
    try:
        for i in range(n):
            if books[syp[i]] == NULL:
                books[syp[i]] = fp_book_create(tk[i])
                if books[syp[i]] == NULL:
                    raise InputError(f"tick size {tk[i]!r} of update {i}: expected finite and > 0")
                fp_book_set_kernels(books[syp[i]], k, libm)
        with nogil:
            for p in range(passes):
                for i in range(n_sym):
                    if books[i] != NULL:
                        fp_book_clear(books[i])
                for i in range(n):
                    u.bid_px = <const double *>cnp.PyArray_DATA(bp) + 10 * i
                    u.bid_sz = <const double *>cnp.PyArray_DATA(bs) + 10 * i
                    u.ask_px = <const double *>cnp.PyArray_DATA(ap) + 10 * i
                    u.ask_sz = <const double *>cnp.PyArray_DATA(az) + 10 * i
                    u.ts_ns = (<const int64_t *>cnp.PyArray_DATA(ts))[i]
                    u.trade_vol = (<const double *>cnp.PyArray_DATA(tv))[i]
                    u.trade_cnt = (<const double *>cnp.PyArray_DATA(tc))[i]
                    u.last_trade_sz = (<const double *>cnp.PyArray_DATA(tl))[i]
                    t0 = fp_ticks()
                    rc = fp_book_compute(books[syp[i]], &u, &raw, &where)
                    if rc != 0:
                        break
                    fp_book_commit(books[syp[i]])
                    o[p, i] = fp_ticks_to_ns(fp_ticks() - t0)
                if rc != 0:
                    break
        if rc != 0:
            raise InputError(f"update {i} refused by the book stage (FP_BOOK_ERR {rc}, where {where})")
    finally:
        for i in range(n_sym):
            fp_book_free(books[i])
        fp_aligned_free(books)
    return out


cdef class _PackedLayers:
    """An fp_mlp a subclass's __cinit__ packs and the two activation buffers a pass ping-pongs
    between: the part the fp32 and the reduced-precision shims share, freed here."""
    cdef fp_mlp m
    cdef float *a
    cdef float *b
    cdef readonly int n_in, n_out

    cdef int _buffers(self) except -1:
        """n_in / n_out from the packed layers, and the buffers (max_width floats each)."""
        self.n_in = self.m.layers[0].in_
        self.n_out = self.m.layers[self.m.n_layers - 1].out
        self.a = <float *>fp_aligned_alloc(sizeof(float) * self.m.max_width)
        self.b = <float *>fp_aligned_alloc(sizeof(float) * self.m.max_width)
        if self.a == NULL or self.b == NULL:
            raise MemoryError("cannot allocate MLP scratch")
        return 0

    def __dealloc__(self):
        fp_mlp_free(&self.m)
        fp_aligned_free(self.a)
        fp_aligned_free(self.b)


cdef class PackedMLP(_PackedLayers):
    """An MLP packed into the blocked arena, for testing and timing the MLP kernel alone."""
    cdef const fp_kernels *k
    cdef int parity         # row-group order of the next pass: this object's state, not the model's

    def __cinit__(self, weights, biases, activations, str isa="avx2"):
        self.k = _kernels(isa)
        _pack_mlp(&self.m, weights, biases, activations)
        self._buffers()

    @property
    def macs(self):
        return self.m.macs

    def forward(self, x):
        """MLP output (no head) for one float32 input vector; InputError when a layer's
        pre-activations are NaN/Inf (the engine refuses such a tick)."""
        cdef cnp.ndarray v = _f32(x, "x")
        if len(v) != self.n_in:
            raise InputError(f"x must have {self.n_in} values, got {len(v)}")
        self.parity ^= 1
        cdef const float *o = fp_mlp_forward(self.k, &self.m, <const float *>cnp.PyArray_DATA(v),
                                             self.a, self.b, self.parity)
        if o == NULL:
            raise InputError("a layer's pre-activations are NaN/Inf for this input")
        out = np.empty(self.n_out, np.float32)
        memcpy(cnp.PyArray_DATA(out), o, sizeof(float) * self.n_out)
        return out

    def time_forward(self, x, long long iters):
        """Mean ns per forward pass over `iters` back-to-back calls, GIL released."""
        cdef cnp.ndarray v = _f32(x, "x")
        if len(v) != self.n_in or iters < 1:
            raise InputError(f"x must have {self.n_in} values and iters >= 1")
        cdef const float *xp = <const float *>cnp.PyArray_DATA(v)
        cdef long long i
        cdef int64_t t0, t1
        cdef volatile float sink = 0
        cdef const float *o
        with nogil:
            t0 = fp_mono_ns()
            for i in range(iters):
                self.parity ^= 1
                o = fp_mlp_forward(self.k, &self.m, xp, self.a, self.b, self.parity)
                sink = o[0] if o != NULL else 0
            t1 = fp_mono_ns()
        return (t1 - t0) / <double>iters


def clock_ticks():
    """One raw timestamp of the latency clock (TSC ticks, or ns without an invariant TSC)."""
    return fp_ticks()


def clock_ticks_to_ns(uint64_t t0, uint64_t t1):
    """ns from timestamp t0 to t1 as the engine converts a stage's duration; 0 when t1 < t0."""
    return fp_ticks_to_ns(t1 - t0)


def clock_ticks_to_mono_ns(uint64_t t):
    """A timestamp as CLOCK_MONOTONIC ns (the engine clock), through the current anchor."""
    return fp_ticks_to_mono_ns(t)


def clock_mono_ns():
    """CLOCK_MONOTONIC ns, read directly."""
    return fp_mono_ns()


def clock_reanchor(bint force=True):
    """Re-take the clock's anchor (force) or only when it is due; True when one was published.
    GIL released, safe while other threads read the clock."""
    cdef int f = 1 if force else 0, r
    with nogil:
        r = fp_clock_reanchor(f)
    return bool(r)


def clock_info():
    """This module's clock: source, ns per tick, cost of one read, calibration samples and the
    widest bracket kept (ns), re-anchors published."""
    return {"source": fp_clock_source().decode(), "ns_per_tick": fp_clock.ns_per_tick,
            "read_cost_ns": fp_clock.read_cost_ns, "calibration_samples": fp_clock.cal_samples,
            "calibration_bracket_ns": fp_clock.cal_bracket_ns, "reanchors": fp_clock.reanchors,
            "steps": fp_clock.steps, "tsc_backs": fp_clock.tsc_backs}


def clock_monotonic_probe(long long n):
    """Read the engine clock n times back to back (GIL released): (largest step back in ns
    between consecutive readings, readings taken). Meant to run on several threads while
    another re-anchors."""
    if n < 1:
        raise InputError(f"n must be >= 1, got {n}")
    cdef long long i, back = 0
    cdef int64_t prev, v
    with nogil:
        prev = fp_ticks_to_mono_ns(fp_ticks())
        for i in range(n):
            v = fp_ticks_to_mono_ns(fp_ticks())
            if prev - v > back:
                back = prev - v
            prev = v
    return back, n


# ---------------------------------------------------------------- reduced-precision weights
# Shims for the bf16 / int8 layer kernels (csrc/fp_lowp.h): every variant by name (the engine
# picks one per kernel set by CPU bits, so the fallbacks are reachable only from here), and an
# MLP packed with reduced-precision hidden layers for tests and bench/weights.py.

_LOWP_TYPES = {"bf16": FP_WEIGHTS_BF16, "int8": FP_WEIGHTS_INT8}
_LOWP_VARIANTS = {"bf16": ("scalar", "avx2", "avx512", "avx512_bf16"),
                  "int8": ("scalar", "avx2", "avx2_vnni", "avx512", "avx512_vnni")}
_LOWP_ISAS = {"scalar": FP_ISA_SCALAR, "avx2": FP_ISA_AVX2, "avx512": FP_ISA_AVX512}


def _lowp_type(str weights):
    if weights not in _LOWP_TYPES:
        raise InputError(f"weights must be one of {sorted(_LOWP_TYPES)}, got {weights!r}")
    return _LOWP_TYPES[weights]


def lowp_variants(str weights):
    """(every variant name of this weight type, the ones this CPU runs)."""
    cdef int wt = _lowp_type(weights)
    names = _LOWP_VARIANTS[weights]
    return names, tuple(n for n in names if fp_lowp_variant(wt, n.encode()) != NULL)


def lowp_kernels(str isa):
    """(bf16 variant, int8 variant) an engine on kernel set `isa` runs, or None when this CPU
    cannot run that set."""
    if isa not in _LOWP_ISAS:
        raise InputError(f"unknown kernel set {isa!r}; expected one of {sorted(_LOWP_ISAS)}")
    cdef const fp_lowp_kernels *lk = fp_lowp_for(_LOWP_ISAS[isa])
    if lk == NULL:
        return None
    return lk.bf16_name.decode(), lk.int8_name.decode()


def kernel_lowp_dense(str weights, str variant, w, b, str act, x):
    """One dense layer packed as `weights` ("bf16" / "int8") through the named variant:
    (act(W x + b) as that format computes it, finite flag)."""
    cdef int wt = _lowp_type(weights)
    if variant not in _LOWP_VARIANTS[weights]:
        raise InputError(f"unknown {weights} variant {variant!r}; expected one of "
                         f"{list(_LOWP_VARIANTS[weights])}")
    cdef fp_lowp_dense_fn f = fp_lowp_variant(wt, variant.encode())
    if f == NULL:
        raise InputError(f"this CPU cannot run the {variant} {weights} kernel")
    if act not in _ACTS:
        raise InputError(f"unknown activation {act!r}; expected one of {sorted(_ACTS)}")
    cdef cnp.ndarray W = np.ascontiguousarray(w, dtype=np.float32)
    cdef cnp.ndarray B = np.ascontiguousarray(b, dtype=np.float32)
    cdef cnp.ndarray v = _f32(x, "x")
    if W.ndim != 2 or (<object>B).shape != (W.shape[0],) or W.shape[1] != len(v) or W.shape[0] < 1 \
            or W.shape[1] < 1:
        raise InputError(f"w {(<object>W).shape}, b {(<object>B).shape} and x ({len(v)},) do not "
                         f"chain (a layer needs at least one input and one output)")
    # a model's layers are at most 65536 wide; past FP_LOWP_INT8_MAX_IN inputs an int8 row's
    # int32 dot wraps (140000 inputs of 1 under weights of 1 answered -126288.5)
    if W.shape[0] > 65536 or W.shape[1] > 65536:
        raise InputError(f"w {(<object>W).shape}: a layer is at most 65536 wide either way")
    # as the model packer does: a NaN weight would be left out of its row's int8 scale and
    # round to a finite code, a silently wrong layer
    for name, arr in (("w", W), ("b", B)):
        if not np.isfinite(arr).all():
            bad = np.argwhere(~np.isfinite(arr))[0]
            raise InputError(f"{name}{list(bad)} = {arr[tuple(bad)]}: weights and biases must "
                             f"be finite")
    cdef int n_out = W.shape[0], n_in = W.shape[1]
    cdef fp_lowp_layer L
    cdef size_t ybytes = sizeof(float) * ((n_out + 15) // 16 * 16)
    cdef void *mem = fp_aligned_alloc(fp_lowp_layer_bytes(wt, n_in, n_out))
    cdef float *y = <float *>fp_aligned_alloc(ybytes)
    cdef void *scratch = fp_aligned_alloc(sizeof(float) * fp_lowp_scratch_floats(n_in))
    # x in its own buffer with NaN past the end: a kernel that reads past x[in) shows it
    cdef int xn = (n_in + 63) // 64 * 64 + 64
    cdef float *xp = <float *>fp_aligned_alloc(sizeof(float) * xn)
    cdef int ok, i
    try:
        if mem == NULL or y == NULL or scratch == NULL or xp == NULL:
            raise MemoryError("cannot allocate the layer")
        for i in range(xn):
            xp[i] = float("nan")
        memcpy(xp, cnp.PyArray_DATA(v), sizeof(float) * n_in)
        fp_lowp_pack(&L, wt, n_in, n_out, _ACTS[act], <const float *>cnp.PyArray_DATA(W),
                     <const float *>cnp.PyArray_DATA(B), mem)
        with nogil:
            ok = f(&L, xp, y, scratch)
        out = np.empty(n_out, np.float32)
        memcpy(cnp.PyArray_DATA(out), y, sizeof(float) * n_out)
    finally:
        fp_aligned_free(mem)
        fp_aligned_free(y)
        fp_aligned_free(scratch)
        fp_aligned_free(xp)
    return out, bool(ok)


cdef class LowpMLP(_PackedLayers):
    """An MLP whose hidden layers are packed as bf16 / int8 (the output layer stays fp32), run
    as an engine on kernel set `isa` runs it: for testing and timing the MLP stage alone."""
    cdef readonly str weights, variant
    cdef const fp_kernels *k

    def __cinit__(self, weights, biases, activations, str weight_type="int8", str isa="avx2"):
        if weight_type not in ("fp32", "bf16", "int8"):
            raise InputError(f"weight_type must be one of ['fp32', 'bf16', 'int8'], got {weight_type!r}")
        if isa not in _LOWP_ISAS:
            raise InputError(f"unknown kernel set {isa!r}; expected one of {sorted(_LOWP_ISAS)}")
        self.k = fp_kernels_for(_LOWP_ISAS[isa])
        if self.k == NULL:
            raise InputError(f"this CPU (or build) cannot run kernel set {isa!r}")
        cdef int wt = FP_WEIGHTS_FP32 if weight_type == "fp32" else _LOWP_TYPES[weight_type]
        _pack_mlp(&self.m, weights, biases, activations, wt, _LOWP_ISAS[isa])
        self.weights = weight_type
        names = lowp_kernels(isa)
        self.variant = ("fp32" if weight_type == "fp32" else
                        names[0] if weight_type == "bf16" else names[1])
        self._buffers()

    @property
    def arena_bytes(self):
        return self.m.arena_bytes

    def forward(self, x):
        """MLP output for one float32 input; InputError when a layer's pre-activations are
        NaN/Inf (the engine refuses such a tick)."""
        cdef cnp.ndarray v = _f32(x, "x")
        if len(v) != self.n_in:
            raise InputError(f"x must have {self.n_in} values, got {len(v)}")
        cdef const float *o = fp_mlp_forward(self.k, &self.m, <const float *>cnp.PyArray_DATA(v),
                                             self.a, self.b, 0)
        if o == NULL:
            raise InputError("a layer's pre-activations are NaN/Inf for this input")
        out = np.empty(self.n_out, np.float32)
        memcpy(cnp.PyArray_DATA(out), o, sizeof(float) * self.n_out)
        return out

    def time_forward(self, x, long long iters, long long passes=1):
        """ns per forward pass of `iters` samples (GIL released), as a float64 array: each
        sample is `passes` back-to-back passes between two clock reads, divided by `passes`.
        With passes=1 every sample carries the two clock reads (~40-50 ns here); a kernel of a
        few hundred ns needs passes > 1 for its figure to be the kernel's."""
        cdef cnp.ndarray v = _f32(x, "x")
        if len(v) != self.n_in or iters < 1 or passes < 1:
            raise InputError(f"x must have {self.n_in} values, iters >= 1 and passes >= 1")
        cdef const float *xp = <const float *>cnp.PyArray_DATA(v)
        cdef cnp.ndarray ts = np.empty(iters, np.float64)
        cdef double *t = <double *>cnp.PyArray_DATA(ts)
        cdef long long i, j
        cdef int64_t t0
        cdef volatile float sink = 0
        cdef const float *o
        with nogil:
            for i in range(iters):
                t0 = fp_mono_ns()
                for j in range(passes):
                    o = fp_mlp_forward(self.k, &self.m, xp, self.a, self.b, 0)
                    sink = o[0] if o != NULL else 0
                t[i] = (fp_mono_ns() - t0) / <double>passes
        return ts


_TREE_ISAS = {"scalar": FP_ISA_SCALAR, "avx2": FP_ISA_AVX2, "avx512": FP_ISA_AVX512}


def _tree_rows(x):
    """x as contiguous float32 features, or an InputError: text was numpy's ValueError, and a
    finite float64 beyond float32 (1e300) was cast to Inf and walked as one."""
    try:
        a = np.asarray(x)
    except (TypeError, ValueError) as exc:
        raise InputError(f"x must be numbers (float32 features): {exc}") from None
    if a.dtype.kind not in "fiub":
        raise InputError(f"x must be numbers (float32 features), got {_describe(a)}")
    if a.dtype.kind == "f" and a.dtype.itemsize > 4 and a.size:
        big = np.isfinite(a) & (np.abs(a) > np.finfo(np.float32).max)
        if big.any():
            raise InputError(f"x holds {float(a[big][0])!r}, beyond float32's range (the trees "
                             f"compare float32 features)")
    return np.ascontiguousarray(a, dtype=np.float32)


# the walks fp_trees_choose picks from: name -> (mode, gather)
_TREE_WALKS = {"compact": (0, 0), "lanes-rest": (1, 0), "gather-rest": (1, 1),
               "lanes-all": (2, 0), "gather-all": (2, 1)}
# fp_trees_choose's candidates in its order (fp_trees_lanes.c): (walk, perfect walk)
_TREE_CANDS = [("compact", "gather"), ("compact", "steps"), ("lanes-rest", "gather"),
               ("gather-rest", "gather"), ("lanes-rest", "steps"), ("gather-rest", "steps"),
               ("lanes-all", "gather"), ("gather-all", "gather")]


def tree_isas():
    """The tree-ensemble kernel sets this CPU can run, scalar first."""
    return [n for n, i in _TREE_ISAS.items() if fp_trees_eval_for(i) != NULL]


cdef class PackedTrees:
    """A fastpath.model.TreeEnsemble packed by the C core (csrc/fp_trees.c), evaluated by one
    named tree kernel set (scalar, avx2, avx512), one feature vector at a time."""
    cdef fp_trees t
    cdef fp_trees_eval_fn ev
    cdef readonly int n_features, n_outputs
    cdef readonly str isa

    def __cinit__(self, trees, str isa="scalar"):
        memset(&self.t, 0, sizeof(fp_trees))
        if isa not in _TREE_ISAS:
            raise InputError(f"unknown kernel set {isa!r}; expected one of {sorted(_TREE_ISAS)}")
        self.ev = fp_trees_eval_for(_TREE_ISAS[isa])
        if self.ev == NULL:
            raise InputError(f"kernel set {isa!r} is not supported by this CPU (has: {tree_isas()})")
        if not isinstance(trees, TreeEnsemble):
            raise InputError(f"trees must be a fastpath.model.TreeEnsemble, got "
                             f"{type(trees).__name__}")
        cdef fp_trees_desc d
        keep = []
        _trees_desc(trees, &d, keep)
        cdef int rc = fp_trees_init(&self.t, &d, NULL)
        if rc == -2:
            raise MemoryError("cannot allocate the tree arena")
        if rc != 0:
            raise InputError("the C packer refused the tree ensemble description")
        fp_trees_choose(&self.t, self.ev)
        self.isa = isa
        self.n_features = self.t.n_feat
        self.n_outputs = self.t.n_out

    def __dealloc__(self):
        fp_trees_free(&self.t)

    @property
    def layout(self):
        """How the trees were laid out: perfect depth, groups of 16, trees walked compactly."""
        return {"depth": self.t.depth, "groups": self.t.n_groups, "compact": self.t.n_rest,
                "arena_bytes": self.t.arena_bytes, "lane_walk": bool(self.t.walk_ok),
                "walk": self.walk, "perfect_walk": self.perfect_walk}

    @property
    def walk(self):
        """The walk this model runs, measured at load: "compact" (perfect groups, then the
        rest one tree at a time), "lanes-rest" (the rest 16 trees at a time) or "lanes-all"
        (every tree 16 at a time), "gather-*" the same with vector gathers (the scalar set
        steps instead). Settable, for tests and the bench; every walk gives the same bits."""
        if self.t.mode == 0:
            return "compact"
        return ("gather-" if self.t.gather else "lanes-") + ("rest" if self.t.mode == 1 else "all")

    @walk.setter
    def walk(self, str name):
        if name not in _TREE_WALKS:
            raise InputError(f"unknown walk {name!r}; expected one of {list(_TREE_WALKS)}")
        if name != "compact" and not self.t.walk_ok:
            raise InputError(f"walk {name!r} needs the lane layout, which this ensemble has not "
                             f"(multi-target leaves, EQ or strict splits, MIN / MAX, more than "
                             f"8192 trees or a tree of more than 65535 nodes)")
        self.t.mode, self.t.gather = _TREE_WALKS[name]

    @property
    def perfect_walk(self):
        """How the vector sets walk the perfect groups, measured at load: "gather" (vector
        gathers) or "steps" (scalar steps, 16 lanes interleaved; what the scalar set always
        runs). Settable, for tests and the bench; both give the same bits."""
        return "gather" if self.t.pgather else "steps"

    @perfect_walk.setter
    def perfect_walk(self, str name):
        if name not in ("gather", "steps"):
            raise InputError(f"unknown perfect walk {name!r}; expected 'gather' or 'steps'")
        self.t.pgather = name == "gather"

    @property
    def choice(self):
        """What the load measured: {(walk, perfect walk): median ns per row} for each
        candidate this model and kernel set have; the walk in use is the fastest."""
        cdef int c
        return {_TREE_CANDS[c]: self.t.choose_ns[c] for c in range(FP_TREES_CHOOSE_CANDS)
                if self.t.choose_ns[c] >= 0}

    def time_rows(self, x):
        """ns for one evaluation of each row of x (2-d, n_features columns), each row once in
        order, timed one by one in C with the GIL released: the walk alone on fresh rows,
        without Engine.predict's Python call (the clock read, ~20-30 ns, is included)."""
        a = _tree_rows(x)
        if a.ndim != 2 or a.shape[1] != self.n_features or a.shape[0] < 1:
            raise InputError(f"x must be a 2-d array of rows of {self.n_features} features, got "
                             f"{_describe(x)}")
        cdef cnp.ndarray v = np.ascontiguousarray(a, dtype=np.float32)
        cdef cnp.ndarray res = np.empty(a.shape[0], np.int64)
        cdef cnp.ndarray o = np.empty(max(self.n_outputs, 1), np.float32)
        cdef const float *xp = <const float *>cnp.PyArray_DATA(v)
        cdef float *op = <float *>cnp.PyArray_DATA(o)
        cdef int64_t *rp = <int64_t *>cnp.PyArray_DATA(res)
        cdef Py_ssize_t i, n = a.shape[0], nf = self.n_features
        cdef int64_t t0
        with nogil:
            for i in range(n):
                t0 = fp_mono_ns()
                self.ev(&self.t, xp + i * nf, op)
                rp[i] = fp_mono_ns() - t0
        return res

    def eval(self, x):
        """Outputs for one feature vector (NaN: a missing value) or each row of a 2-d array."""
        a = _tree_rows(x)
        if a.ndim == 1:
            a = a[None, :]
            one = True
        else:
            one = False
        if a.ndim != 2 or a.shape[1] != self.n_features:
            raise InputError(f"x must have {self.n_features} features per row, got {_describe(x)}")
        out = np.empty((a.shape[0], self.n_outputs), np.float32)
        cdef cnp.ndarray row
        cdef cnp.ndarray o = out
        cdef Py_ssize_t i
        for i in range(a.shape[0]):
            row = np.ascontiguousarray(a[i])
            self.ev(&self.t, <const float *>cnp.PyArray_DATA(row),
                    <float *>cnp.PyArray_DATA(o) + i * self.n_outputs)
        return out[0] if one else out

    def time_eval(self, x, long long iters):
        """Median over 5 runs of the mean ns per evaluation over `iters` back-to-back calls
        (GIL released), for the bench."""
        a = _tree_rows(x)
        if a.ndim != 1 or a.shape[0] != self.n_features or iters < 1:
            raise InputError(f"x must have {self.n_features} values and iters >= 1")
        cdef cnp.ndarray v = a
        cdef cnp.ndarray o = np.empty(max(self.n_outputs, 1), np.float32)
        cdef const float *xp = <const float *>cnp.PyArray_DATA(v)
        cdef float *op = <float *>cnp.PyArray_DATA(o)
        cdef long long i
        cdef int64_t t0, t1
        runs = []
        for _ in range(5):
            with nogil:
                t0 = fp_mono_ns()
                for i in range(iters):
                    self.ev(&self.t, xp, op)
                t1 = fp_mono_ns()
            runs.append((t1 - t0) / <double>iters)
        return sorted(runs)[2]

