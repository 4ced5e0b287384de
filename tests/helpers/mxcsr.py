"""MXCSR's flush-to-zero and denormals-are-zero for a block of a test: what a thread runs with
after torch.set_flush_denormal(True), or after loading any shared library built with
-ffast-math. An underflowing float32 product is then 0, and a subnormal operand reads as 0."""
import contextlib
import ctypes
import ctypes.util
import functools
import platform
import sys

import numpy as np
import pytest


@functools.lru_cache(maxsize=1)
def _libm():
    return ctypes.CDLL(ctypes.util.find_library("m"))


@contextlib.contextmanager
def flush_to_zero():
    """MXCSR FTZ + DAZ on this thread (glibc x86-64: fenv_t holds MXCSR at byte 28)."""
    if platform.machine() not in ("x86_64", "AMD64") or not sys.platform.startswith("linux"):
        pytest.skip("sets MXCSR through glibc's x86-64 fenv_t")
    libm = _libm()
    saved = (ctypes.c_ubyte * 64)()
    if libm.fegetenv(saved) != 0:
        pytest.skip("fegetenv failed")
    env = bytearray(bytes(saved))
    mx = int.from_bytes(env[28:32], "little")
    env[28:32] = (mx | 0x8040).to_bytes(4, "little")
    libm.fesetenv((ctypes.c_ubyte * 64).from_buffer_copy(bytes(env)))
    try:
        tiny = np.array([2.0 ** -70], np.float32)   # its square, 2^-140, is subnormal
        assert float((tiny * tiny)[0]) == 0.0, "FTZ did not take effect"
        yield
    finally:
        libm.fesetenv(saved)
