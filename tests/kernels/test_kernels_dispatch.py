"""Kernel-set dispatch: an unknown set is a clear error, the dispatcher reports what the CPU
runs, FASTPATH_SIMD forces a set, and the bench probes (FMA throughput, op latency) answer
sanely."""
import numpy as np
import pytest

from fastpath import _engine as E, _kernels as K
from helpers.builders import ISAS


def test_unknown_isa_is_clear_error():
    with pytest.raises(ValueError, match="unknown kernel set"):
        K.kernel_zscore("sse9", np.ones(3, np.float32), np.ones(3, np.float32), np.ones(3, np.float32))


def test_dispatch_reports_cpu():
    """best_isa() is the widest set cpuid + XCR0 allow, and it is one supported_isas() lists."""
    f = E.cpu_features()
    avx2 = f["avx2"] and f["fma"]
    want = "avx512" if avx2 and f["avx512"] else "avx2" if avx2 else "scalar"
    assert E.best_isa() == want
    assert E.supported_isas()[0] == "scalar"
    assert E.best_isa() in E.supported_isas()
    assert E.supported_isas() == [s for s in E.all_isas() if s in E.supported_isas()]
    assert set(E.all_isas()) == {"scalar", "avx2", "avx512"}
    assert ("avx512" in E.supported_isas()) == bool(f["avx512"] and avx2)


def test_fastpath_simd_env(monkeypatch):
    """FASTPATH_SIMD names any set of the build; one this CPU cannot run is a ConfigError
    that names the variable and what the CPU has, never a silent fallback."""
    from fastpath import ConfigError
    from fastpath._resolve import resolve_simd
    for name in E.supported_isas():
        monkeypatch.setenv("FASTPATH_SIMD", name)
        assert resolve_simd("auto") == name
    monkeypatch.setenv("FASTPATH_SIMD", "avx512")
    import fastpath._resolve as resolve
    monkeypatch.setattr(resolve, "supported_isas", lambda: ["scalar", "avx2"])
    with pytest.raises(ConfigError, match="FASTPATH_SIMD=avx512.*cannot run"):
        resolve_simd("auto")
    monkeypatch.delenv("FASTPATH_SIMD")
    with pytest.raises(ConfigError, match="engine.simd = 'avx512'.*cannot run"):
        resolve_simd("avx512")


def test_bound_probes():
    """The bench's bounds: FMA rate of each vector set (0 for scalar, none to measure) and the
    streaming-read bandwidth; checked for sign and arguments, never for speed."""
    for isa in E.all_isas():
        r = K.fma_macs_per_ns(isa)
        assert (r > 0) == (isa in ISAS and isa != "scalar")
    assert K.read_gbps(1 << 16, 2) > 0
    with pytest.raises(ValueError, match="nbytes"):
        K.read_gbps(10)
    with pytest.raises(ValueError, match="unknown kernel set"):
        K.fma_macs_per_ns("sse9")


def test_op_latency_probe():
    """The op-latency probe (bench/scaling.py's latency bound) names what it measures: an
    unknown op is refused; on a CPU with AVX2+FMA every op takes a positive time, and without
    them the probe answers -1 (no figure rather than a wrong one)."""
    with pytest.raises(ValueError, match="op must be one of"):
        K.op_latency_ns("div")
    lat = {op: K.op_latency_ns(op, 20_000) for op in ("fma", "add", "mul", "max")}
    if "avx2" in E.supported_isas():
        assert all(v > 0 for v in lat.values()), lat
    else:
        assert all(v == -1.0 for v in lat.values()), lat
