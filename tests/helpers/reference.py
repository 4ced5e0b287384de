"""Numpy references for the C kernels (activations, bf16 quantisation, the cache decision in float64)."""
import numpy as np

from fastpath import _kernels as K


def double_decision(isa, f, c, thr, tol):
    """fp_cache_decide_f64's decision, rebuilt from the kernel's own double sums with the same
    double operations: the reference for the float32 look (kernel_cache_decide runs the look
    first, so wherever the look decides it would only be compared with itself)."""
    dot, na2, nb2 = K.kernel_dot_norms_f64(isa, f, c)
    if not (na2 <= np.finfo(np.float64).max):
        return "cosine"
    na, nb = float(np.sqrt(na2)), float(np.sqrt(nb2))
    if na == 0.0 or nb == 0.0:
        return "hit" if (na == 0.0 and nb == 0.0) else "cosine"
    if dot < thr * na * nb:
        return "cosine"
    if abs(na / nb - 1.0) > tol:
        return "norm"
    return "hit"


def act_ref(x, act):
    x = x.astype(np.float64)
    return {"identity": x, "relu": np.maximum(x, 0), "tanh": np.tanh(x),
            "sigmoid": 1 / (1 + np.exp(-x))}[act]


F32 = np.float32


# ------------------------------------------------------------------ numpy reference
def bf16(w):
    """fp32 -> bf16 (round to nearest even) -> fp32."""
    u = np.ascontiguousarray(w, F32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return r.astype(np.uint32).view(F32)


def act_np(v, act):
    if act == "relu":
        return np.maximum(v, F32(0))
    if act == "tanh":
        return np.tanh(v)
    if act == "sigmoid":
        return (1 / (1 + np.exp(-v.astype(np.float64)))).astype(F32)
    return v


def ref_bf16(w, b, x, act):
    v = (bf16(w).astype(np.float64) @ np.asarray(x, np.float64) + b).astype(F32)
    return act_np(v, act), np.abs(bf16(w)).astype(np.float64) @ np.abs(x).astype(np.float64)


def at_page_end(values):
    """values copied to the very end of a readable page followed by an unreadable one: a kernel
    that reads one float past the array faults (SIGSEGV) instead of passing by luck."""
    import ctypes
    import mmap
    page = mmap.PAGESIZE
    nbytes = values.nbytes
    size = (nbytes + page - 1) // page * page + page
    m = mmap.mmap(-1, size, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(m))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    assert libc.mprotect(ctypes.c_void_p(base + size - page), page, 0) == 0
    arr = np.frombuffer(m, np.float32, count=len(values), offset=size - page - nbytes)
    arr[:] = values
    return arr, m
