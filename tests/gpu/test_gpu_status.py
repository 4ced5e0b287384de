"""gpu_status() and the GPU backend on a host without a usable GPU: the probe's answer for
each way pycuda or the driver can be missing, `import fastpath` never importing pycuda, and
backend="gpu" refused with the reason.
"""

import os
import subprocess
import sys
import types

import numpy as np
import pytest

import fastpath
from fastpath.errors import BackendError
from fastpath.gpu import GpuBackend, gpu_status

from helpers.builders import random_model
from helpers.fake_cuda import _fake_pycuda


def test_status_without_pycuda(monkeypatch):
    monkeypatch.setitem(sys.modules, "pycuda", None)
    monkeypatch.setitem(sys.modules, "pycuda.driver", None)
    gpu_status.cache_clear()
    try:
        ok, why = gpu_status()
        assert not ok and "pycuda not importable" in why
    finally:
        gpu_status.cache_clear()


@pytest.mark.parametrize("case", ["init_fails", "no_device", "ok"])
def test_status_when_init_fails_with_no_device_and_with_one(monkeypatch, case):
    class Error(Exception):
        pass

    drv = types.ModuleType("pycuda.driver")
    drv.Error = Error

    def init():
        if case == "init_fails":
            raise Error("cuInit failed: no CUDA-capable device is detected")
    drv.init = init
    drv.Device = type("Device", (), {"count": staticmethod(lambda: 0 if case == "no_device" else 1),
                                     "__init__": lambda self, i: None,
                                     "name": lambda self: "Fake H200"})
    _fake_pycuda(monkeypatch, drv)
    try:
        ok, why = gpu_status()
    finally:
        gpu_status.cache_clear()
    assert ok == (case == "ok")
    assert {"init_fails": "CUDA init failed", "no_device": "no CUDA device",
            "ok": "Fake H200"}[case] in why


def test_import_fastpath_never_imports_pycuda():
    code = ("import sys, fastpath, fastpath.gpu; fastpath.gpu.gpu_status(); "
            "import fastpath.gpu._backend; "
            "assert 'pycuda.compiler' not in sys.modules, 'compiler imported'; "
            "import fastpath as f; print(sorted(m for m in sys.modules if m.startswith('pycuda')))")
    # run where the imported (built) fastpath lives, not beside the source tree, which a
    # "-c" child would import first from its working directory
    here = os.path.dirname(os.path.dirname(os.path.abspath(fastpath.__file__)))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=here)
    assert out.returncode == 0, out.stderr
    code2 = "import sys, fastpath; assert not any(m.startswith('pycuda') for m in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code2], timeout=60, cwd=here).returncode == 0


def test_backend_without_gpu_is_clear():
    ok, why = gpu_status()
    if ok:
        pytest.skip("a GPU is usable here")
    m = random_model(np.random.default_rng(0), [4, 2])
    with pytest.raises(BackendError, match="no usable GPU"):
        GpuBackend(m)


def test_gpu_and_auto_without_a_gpu():
    ok, why = gpu_status()
    if ok:
        pytest.skip("a GPU is usable here")
    m = random_model(np.random.default_rng(27), [4, 2])
    with pytest.raises(BackendError, match="backend='gpu' is not available"):
        fastpath.Engine(m, backend="gpu")
    e = fastpath.Engine(m, backend="auto")
    assert e.backend == "cpu" and e.backend_reason == f"auto: cpu chosen ({why})"
    assert e.backend_report == {"backend": "cpu", "reason": e.backend_reason}
    e.close()      # nothing to release on the CPU
    e.step(np.ones(4, np.float32), 0)


def test_status_with_a_pycuda_that_breaks_at_import(tmp_path, monkeypatch):
    """A pycuda that raised anything but ImportError at import escaped gpu_status() and
    backend='auto'."""
    from fastpath.gpu import gpu_status
    pkg = tmp_path / "pycuda"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "driver.py").write_text("raise RuntimeError('CUDA driver version is insufficient "
                                   "for CUDA runtime version')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for k in ("pycuda", "pycuda.driver"):
        monkeypatch.delitem(sys.modules, k, raising=False)
    gpu_status.cache_clear()
    try:
        ok, why = gpu_status()
        assert not ok and "pycuda not importable (RuntimeError: CUDA driver version" in why
        m = random_model(np.random.default_rng(16), [4, 2])
        e = fastpath.Engine(m, backend="auto")
        assert e.backend == "cpu" and "RuntimeError" in e.backend_reason
        with pytest.raises(BackendError, match="not available.*RuntimeError"):
            fastpath.Engine(m, backend="gpu")
    finally:
        gpu_status.cache_clear()
        for k in ("pycuda", "pycuda.driver"):
            sys.modules.pop(k, None)
