# cython: language_level=3
"""The persistent GPU path's per-tick protocol (csrc/fp_gpu.c) on a slot in mapped memory.

Design: Slot wraps a slot at an address whose memory an owner object keeps alive (a pycuda
page-locked array on a GPU host, an aligned numpy buffer in the tests); request() is one C
call: write the features, publish the sequence number, spin for the answer until a deadline.
It keeps the GIL: the device is not a Python thread, and the wait is bounded.
CpuDevice is the persistent kernel's loop run by a CPU thread over the CPU MLP kernels: it
answers the same slot the same way, so the protocol (ordering, deadlines, stop, non-finite
status) is tested on machines without a GPU.
"""
from cpython.mem cimport PyMem_Malloc, PyMem_Free
cimport numpy as cnp
from libc.stdint cimport int64_t, uint64_t, uintptr_t

from fastpath._csrc cimport (FP_ISA_AVX2, FP_ISA_AVX512, FP_ISA_SCALAR, fp_aligned_alloc, fp_aligned_free,
                             fp_kernels, fp_kernels_for, fp_mlp, fp_mlp_forward, fp_mlp_free,
                             fp_mlp_init, FP_MAX_LAYERS)
from fastpath.gpu._fp_gpu cimport *
from fastpath._core cimport _pack_mlp

import numpy as np

from fastpath._core import _ACTS, _mlp_arrays
from fastpath.errors import InputError

cnp.import_array()

OK = FP_GPU_OK
NONFINITE = FP_GPU_NONFINITE
TIMEOUT = FP_GPU_TIMEOUT
STOPPED = FP_GPU_STOPPED
BADSEQ = FP_GPU_BADSEQ
BADARG = FP_GPU_BADARG
READY_RUNNING = FP_GPU_READY_RUNNING
READY_EXITED = FP_GPU_READY_EXITED
LINE = FP_GPU_LINE
HDR_BYTES = FP_GPU_HDR_BYTES

def slot_bytes(int n_in, int n_out):
    """Bytes of a slot for n_in features and n_out outputs (header + line-aligned arrays)."""
    if n_in < 1 or n_out < 1:
        raise InputError(f"slot widths must be >= 1, got n_in={n_in}, n_out={n_out}")
    return fp_gpu_slot_bytes(n_in, n_out)


def aligned_buffer(Py_ssize_t nbytes):
    """A zeroed uint8 numpy array of nbytes whose data starts on a 64-byte line."""
    raw = np.zeros(nbytes + FP_GPU_LINE, np.uint8)
    off = (-raw.ctypes.data) % FP_GPU_LINE
    return raw[off:off + nbytes]


cdef cnp.ndarray _f32_vec(object a, int n, str what, bint writable):
    if not (isinstance(a, np.ndarray) and a.dtype == np.float32 and a.ndim == 1
            and a.shape[0] == n and a.flags.c_contiguous and (a.flags.writeable or not writable)):
        raise InputError(f"{what} must be a {'writable ' if writable else ''}float32 "
                         f"C-contiguous array of {n} values, got {type(a).__name__} "
                         f"{getattr(a, 'dtype', '')} {getattr(a, 'shape', '')}")
    return <cnp.ndarray>a




cdef class Slot:
    """A request/response slot at `address` (64-byte aligned, slot_bytes(n_in, n_out) long),
    kept alive by `owner` (anything with .nbytes covering it). init=True zeroes it first."""
    cdef fp_gpu_slot *s
    cdef readonly object owner
    cdef readonly int n_in, n_out
    cdef readonly size_t nbytes

    def __cinit__(self, owner, uintptr_t address, int n_in, int n_out, bint init=True):
        need = slot_bytes(n_in, n_out)
        if address % FP_GPU_LINE:
            raise InputError(f"slot address must be {FP_GPU_LINE}-byte aligned, got {address:#x}")
        if getattr(owner, "nbytes", 0) < need:
            raise InputError(f"slot needs {need} bytes, the owner holds "
                             f"{getattr(owner, 'nbytes', 0)}")
        self.owner = owner
        self.s = <fp_gpu_slot *>address
        self.n_in = n_in
        self.n_out = n_out
        self.nbytes = need
        if init and fp_gpu_slot_init(<void *>address, n_in, n_out) != FP_GPU_OK:
            raise InputError("slot init refused its arguments")
        if not init and (self.s.n_in != n_in or self.s.n_out != n_out):
            # request() checks x and out against these widths, the C side copies the slot's
            # own: a mismatch would read past x and write past out
            raise InputError(f"the slot at {address:#x} was set up for {self.s.n_in} -> "
                             f"{self.s.n_out}, not {n_in} -> {n_out}")

    @staticmethod
    def on_buffer(buf, int n_in, int n_out):
        """A fresh slot at the start of a numpy buffer (aligned_buffer, or a page-locked array)."""
        return Slot(buf, <uintptr_t>buf.ctypes.data, n_in, n_out)

    def request(self, x, out, long long timeout_ns):
        """Send x (float32, n_in), wait up to timeout_ns for the answer into out (float32,
        n_out). Returns (rc, seq, device_ns, wait_ns); rc is OK, NONFINITE (out not usable),
        TIMEOUT, STOPPED or BADSEQ."""
        cdef cnp.ndarray xv = _f32_vec(x, self.n_in, "x", False)
        cdef cnp.ndarray ov = _f32_vec(out, self.n_out, "out", True)
        cdef uint64_t seq = 0, dev = 0
        cdef int64_t wait = 0
        if timeout_ns < 0:
            raise InputError(f"timeout_ns must be >= 0, got {timeout_ns}")
        rc = fp_gpu_request(self.s, <const float *>cnp.PyArray_DATA(xv),
                            <float *>cnp.PyArray_DATA(ov), timeout_ns, &seq, &dev, &wait)
        return rc, seq, dev, wait

    def stop(self):
        """Ask the device loop to return at its next poll."""
        fp_gpu_stop(self.s)

    def wait_ready(self, unsigned int want, long long timeout_ns):
        """OK once the device reports `want` (READY_RUNNING, READY_EXITED), else TIMEOUT."""
        with nogil:
            rc = fp_gpu_wait_ready(self.s, want, timeout_ns)
        return rc

    @property
    def state(self):
        """The slot's counters as the host sees them now (req_seq without its stop bit)."""
        return {"req_seq": self.s.req_seq & ~FP_GPU_REQ_STOP, "resp_seq": self.s.resp_seq,
                "status": self.s.status, "stop": self.s.stop, "ready": self.s.ready}


cdef struct _emu_ctx:
    const fp_kernels *k
    fp_mlp *m
    float *a
    float *b
    int n_out


cdef int _emu_forward(void *ctx, const float *x, float *out) noexcept nogil:
    cdef _emu_ctx *c = <_emu_ctx *>ctx
    cdef const float *y = fp_mlp_forward(c.k, c.m, x, c.a, c.b, 0)
    cdef int i
    if y == NULL:
        # the CPU stops at the first bad layer; the GPU computes through: neither output is used
        for i in range(c.n_out):
            out[i] = 0.0
        return 0
    for i in range(c.n_out):
        out[i] = y[i]
    return 1


cdef class CpuDevice:
    """The persistent kernel's loop on a CPU thread (tests of the protocol without a GPU):
    serve() answers a Slot with this MLP (the CPU kernel set `isa`) until stopped."""
    cdef fp_mlp m
    cdef float *a
    cdef float *b
    cdef _emu_ctx ctx
    cdef readonly int n_in, n_out

    def __cinit__(self, weights, biases, activations, str isa="scalar"):
        _pack_mlp(&self.m, weights, biases, activations)
        self.a = <float *>fp_aligned_alloc(sizeof(float) * (self.m.max_width + 8))
        self.b = <float *>fp_aligned_alloc(sizeof(float) * (self.m.max_width + 8))
        if self.a == NULL or self.b == NULL:
            raise MemoryError("cannot allocate MLP scratch")
        self.n_in = self.m.layers[0].in_
        self.n_out = self.m.layers[self.m.n_layers - 1].out
        isas = {"scalar": FP_ISA_SCALAR, "avx2": FP_ISA_AVX2, "avx512": FP_ISA_AVX512}
        if isa not in isas:
            raise InputError(f"kernel set must be one of {sorted(isas)}, got {isa!r}")
        self.ctx.k = fp_kernels_for(isas[isa])
        if self.ctx.k == NULL:
            raise InputError(f"kernel set {isa!r} is not supported by this CPU")
        self.ctx.m = &self.m
        self.ctx.a = self.a
        self.ctx.b = self.b
        self.ctx.n_out = self.n_out

    def __dealloc__(self):
        fp_mlp_free(&self.m)
        fp_aligned_free(self.a)
        fp_aligned_free(self.b)

    def serve(self, Slot slot, long long max_answers=2**62, long long delay_ns=0,
              long long idle_timeout_ns=10**10):
        """Answer requests on `slot` (GIL released), each after delay_ns, until it is stopped
        or idle for idle_timeout_ns; after max_answers answers stay silent, as a hung kernel
        would.
        Returns the number of answers given."""
        if slot.n_in != self.n_in or slot.n_out != self.n_out:
            raise InputError(f"slot is {slot.n_in}->{slot.n_out}, the model "
                             f"{self.n_in}->{self.n_out}")
        cdef int64_t n
        with nogil:
            n = fp_gpu_emulate_device(slot.s, _emu_forward, &self.ctx, max_answers,
                                      delay_ns, idle_timeout_ns)
        return n
