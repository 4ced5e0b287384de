"""GPU backend availability. `import fastpath` never needs pycuda, a driver or a GPU.

Design: one cached probe, gpu_status() -> (ok, reason). Without a driver,
`import pycuda.driver` raises ImportError (it links libcuda.so.1); with a
driver and no device, cuda.init() raises a pycuda.driver.Error subclass.
The GPU inference stage itself is not in this build: even where a device is
found, the reason says so, and backend="gpu" is refused with that reason.
"""
from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1)
def gpu_status() -> tuple:
    try:
        import pycuda.driver as cuda
    except ImportError as exc:
        return False, f"pycuda not importable ({exc}); install fastpath[gpu] on a host with a driver"
    try:
        cuda.init()
        n = cuda.Device.count()
    except Exception as exc:  # noqa: BLE001 - pycuda.driver.Error and subclasses
        return False, f"CUDA init failed ({type(exc).__name__}: {exc})"
    if n < 1:
        return False, "no CUDA device"
    return False, (f"{n} CUDA device(s) found ({cuda.Device(0).name()}), but this build has no GPU "
                   f"inference stage yet")
