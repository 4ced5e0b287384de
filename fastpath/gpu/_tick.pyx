# cython: language_level=3
"""The GPU tick: an Engine whose backend is "gpu" hands every tick and batch to its GpuStage.

Design: features and the cache stay in the C engine (fp_step_begin / fp_step_finish, the split
tick of csrc/fp_engine.h); the model runs on the GPU (fastpath.gpu.GpuBackend) on a miss only,
reading the engine's own feature buffer (no copy, no second computation). The kernel writes
the last dense layer's outputs (activations applied); the post transform (softmax, logistic2)
and the head run in C, exactly as on the CPU backend. Result.latency: infer_ns is the GPU's
kernel time plus the post transform and head, h2d_ns / d2h_ns the copies (launch mode: CUDA
events; persistent mode: the round trip outside the kernel is in h2d_ns). A tick holds the
engine busy for its whole length: the GPU call releases the GIL, and another thread's tick
would rewrite the feature buffer under it.
"""
cimport numpy as cnp
from libc.stdint cimport int32_t, int64_t, uint64_t
from libc.string cimport memcpy

from fastpath._csrc cimport *
from fastpath._core cimport _symbol_arg, _ts_arg
from fastpath._engine cimport Engine, ExternalStage, Result, _result_of

import numpy as np

from fastpath._batch import BatchResult, applied_note, partial_batch, stopped_note
from fastpath.errors import BackendError, FastpathError, InputError

cdef extern from "fp_engine.h" nogil:
    const float *fp_post_apply(fp_engine *e, const float *y)

cnp.import_array()


cdef class GpuStage(ExternalStage):
    """The model stage of `engine` on `backend` (a fastpath.gpu.GpuBackend for its model)."""
    cdef object _feat      # the engine's feature buffer as an array (private: dies with it)
    cdef readonly int width    # the last dense layer's width (what the GPU returns)

    def __cinit__(self, Engine engine, backend):
        layers = engine.model.layers
        # (compiled without wraparound: no negative indices)
        self.width = int(layers[len(layers) - 1].weight.shape[0])
        self._feat = np.asarray(<float[:engine.n_features]> engine._e.feat)
        self.backend = backend

    cdef int close(self) except -1:
        g, self.backend = self.backend, None
        self._feat = None
        if g is not None:
            g.close()
        return 0

    cdef Result step(self, Engine eng, object raw, object symbol, object ts_ns):
        cdef const float *p = eng._raw_ptr(raw)
        cdef Py_ssize_t sym = _symbol_arg(symbol, eng.n_symbols)
        cdef long long ts = _ts_arg(ts_ns)
        eng._check_free()
        # busy for the whole tick, as step_batch is: the GPU call between fp_step_begin and
        # fp_step_finish lets other threads run, and a second thread's tick then rewrote the
        # feature buffer this tick's GPU call reads (answering with that tick's signal)
        eng._busy = True
        try:
            return self._tick(eng, raw, p, <int32_t>sym, ts, -1)
        finally:
            eng._busy = False

    cdef Result _tick(self, Engine eng, object raw, const float *p, int32_t sym, long long ts,
                      Py_ssize_t row):
        cdef fp_result r
        cdef fp_pending pend
        cdef const float *out = NULL
        cdef cnp.ndarray ya
        cdef long long h2d = 0, d2h = 0, kern = -1
        cdef uint64_t t0
        if self.backend is None:
            raise BackendError("this GPU engine was closed; make a new Engine")
        cdef int rc = fp_step_begin(eng._e, p, sym, ts, &pend)
        if rc == FP_OK:
            if pend.reason != FP_HIT:
                # a BackendError here leaves the tick unapplied: fp_step_begin wrote no state
                y, bad, t = self.backend.infer(self._feat)
                h2d, kern, d2h = t.h2d_ns, t.infer_ns, t.d2h_ns
                t0 = fp_ticks()
                if not bad:
                    ya = np.ascontiguousarray(y, dtype=np.float32)
                    if ya.shape[0] != self.width:
                        raise BackendError(f"the GPU returned {ya.shape[0]} outputs, the model "
                                           f"has {self.width}")
                    out = fp_post_apply(eng._e, <const float *>cnp.PyArray_DATA(ya))
                else:
                    # a layer's float32 sums overflowed on the GPU: the CPU model on the same
                    # features (the engine's buffer), which re-sums such a layer in double and
                    # refuses only a pre-activation past float32's range, so both backends
                    # answer and refuse the same ticks
                    out = fp_infer_cpu(eng._e)
                kern += fp_ticks_to_ns(fp_ticks() - t0)
            # out NULL on a miss: refused as the CPU refuses a layer that overflowed
            rc = fp_step_finish(eng._e, &pend, out, kern, &r)
        if rc != FP_OK:
            eng._raise(rc, raw, sym, ts, row)
        res = _result_of(&r)
        res._h = h2d
        res._d = d2h
        return res

    cdef object step_batch(self, Engine eng, object raws, object symbols, object ts_ns):
        """Engine.step_batch on the GPU: every row validated first (as the CPU's step_batch),
        then each row through the GPU tick in order, one GPU call per miss. A row's features
        and lookup depend on the rows of its symbol before it, so rows are not batched into
        one launch here (fastpath.gpu.GpuEngine.step_batch does that where it is safe)."""
        cdef cnp.ndarray R, S, T
        R, S, T = eng._check_batch(raws, symbols, ts_ns)
        cdef Py_ssize_t n = cnp.PyArray_DIM(R, 0)
        cdef const int64_t *tp = NULL if T is None else <const int64_t *>cnp.PyArray_DATA(T)
        cdef const float *rp = <const float *>cnp.PyArray_DATA(R)
        cdef const int32_t *yp = <const int32_t *>cnp.PyArray_DATA(S)
        sig = np.empty(n, np.float32)
        conf = np.empty(n, np.float32)
        cached = np.empty(n, np.bool_)
        tot = np.empty(n, np.int64)
        cdef Result res
        cdef Py_ssize_t i
        eng._busy = True          # as step(): no other thread's tick between two of these
        try:
            for i in range(n):
                try:
                    res = self._tick(eng, R[i], rp + i * eng.raw_len, yp[i],
                                     tp[i] if tp != NULL else -1, i)
                except FastpathError as exc:
                    note = "; " + applied_note(i)
                    raise partial_batch(type(exc)(str(exc) + note), sig, conf, cached, tot,
                                         i) from None
                except BaseException as exc:
                    # a signal handler's exception (Ctrl-C's KeyboardInterrupt), raised in the
                    # Python of the GPU call: row i was not applied (fp_step_begin writes
                    # nothing), the rows before it were, as a refusal says
                    partial_batch(exc, sig, conf, cached, tot, i)
                    exc.add_note(stopped_note(i, n))
                    raise
                sig[i] = res.signal
                conf[i] = res.confidence
                cached[i] = res.cached
                tot[i] = res._t
        finally:
            eng._busy = False
        return BatchResult(sig, conf, cached, tot)


def post_apply(Engine eng, y):
    """The GPU kernel's outputs for one row of `eng`'s model (the last dense layer's width)
    -> the model's outputs, the post transform applied as the CPU backend applies it."""
    if not isinstance(eng._stage, GpuStage):
        raise BackendError("post_apply needs an engine whose backend is 'gpu'")
    cdef int width = (<GpuStage>eng._stage).width
    cdef cnp.ndarray ya = np.ascontiguousarray(y, dtype=np.float32)
    if ya.ndim != 1 or ya.shape[0] != width:
        raise InputError(f"y must hold the last layer's {width} outputs, got shape "
                         f"{np.shape(y)}")
    eng._check_free()
    out = np.empty(eng.n_outputs, np.float32)
    memcpy(cnp.PyArray_DATA(out), fp_post_apply(eng._e, <const float *>cnp.PyArray_DATA(ya)),
           sizeof(float) * eng.n_outputs)
    return out
