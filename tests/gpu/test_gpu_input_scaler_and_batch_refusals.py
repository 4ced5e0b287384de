"""The GPU engine with an input scaler and its batch refusals, on the stand-in driver: a row the
GPU flags is answered by the CPU model with the scaler applied once; a refusal before any row
of a batch carries .applied and an empty list; a persistent start refused after its check frees
its device memory."""
import numpy as np
import pytest

from fastpath import Engine, InputError
from helpers.builders import engine_cfg
from helpers.scalers import F, prices, scaler_mlp




def test_cpu_recompute_of_a_flagged_row_applies_the_scaler_once(isa):
    """fastpath.gpu answers a flagged row with the CPU model on Engine.features (the first
    layer's inputs, the scaler already in them): not through Engine.predict,
    which would apply the scaler a second time."""
    from fastpath.gpu import _cpu_outputs
    m = scaler_mlp()
    eng = Engine(m, config=engine_cfg(isa))
    nan = np.full(2, np.nan, F)
    for raw in prices(20):
        got = _cpu_outputs(eng, eng.features(raw, 0), nan)
        np.testing.assert_allclose(got, m.outputs(raw[None])[0], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got, eng.predict(raw), rtol=1e-6, atol=1e-6)
    # features that the CPU refuses too still give the NaN row (the engine refuses the tick)
    assert np.isnan(_cpu_outputs(eng, np.full(6, np.inf, F), nan)).all()
    with pytest.raises(InputError, match="6 features"):
        eng._predict_features(np.zeros(5, F))


def test_gpu_engine_batch_of_flagged_rows_matches_the_cpu_on_a_scaler_model(monkeypatch, isa):
    """The same through GpuEngine.step_batch on the stand-in driver, every row flagged: the
    signals are the CPU engine's (not tanh of doubly scaled outputs)."""
    from helpers.fake_cuda import FakeCuda, _fake_pycuda
    from fastpath.gpu import GpuBackend, GpuEngine, gpu_status

    _fake_pycuda(monkeypatch, FakeCuda())
    gpu_status.cache_clear()
    real_infer = GpuBackend.infer
    monkeypatch.setattr(GpuBackend, "infer_batch", lambda self, X: (
        np.full((len(X), 2), np.nan, F), np.ones(len(X), bool), [real_infer(self, X[0])[2]]))
    m = scaler_mlp(seed=3)
    cfg = engine_cfg(isa)
    raws = prices(8, seed=4)
    cpu = Engine(m, config=cfg)
    want = [cpu.step(r, 0, i + 1) for i, r in enumerate(raws)]
    try:
        with GpuEngine(m, cfg, mode="persistent") as ge:
            got = ge.step_batch(raws, np.zeros(8, np.int32), np.arange(1, 9))
        for g, w in zip(got, want):
            assert abs(g.signal - w.signal) < 1e-6 and abs(g.confidence - w.confidence) < 1e-6
    finally:
        gpu_status.cache_clear()





def test_gpu_engine_refusals_before_any_row_carry_applied_and_a_list(monkeypatch):
    """A refusal mid-batch carries .applied and .result (a list of GpuTicks); one before any
    row had no .applied (its own checks: AttributeError) or the Engine's BatchResult as
    .result (the engine's pre-check), so `exc.result` was of two types or missing."""
    from helpers.fake_cuda import FakeCuda, _fake_pycuda
    from fastpath.gpu import GpuEngine, gpu_status

    _fake_pycuda(monkeypatch, FakeCuda())
    gpu_status.cache_clear()
    m = scaler_mlp(seed=5)
    raws = prices(4, seed=6)
    try:
        with GpuEngine(m, {"engine": {"n_symbols": 2}}, mode="launch") as ge:
            ge.step(raws[0], 0, 100)
            cases = [(np.array([0, 1, 5, 0]), None, "out of range|symbol"),    # its own check
                     (np.zeros(4, np.int64), np.array([200, 50, 300, 400]), "earlier|before"),
                     (np.zeros(4, np.int64), np.array([10, 200, 300, 400]), "earlier")]
            for syms, ts, what in cases:
                with pytest.raises(InputError, match=what) as ei:
                    ge.step_batch(raws, syms, ts)
                assert ei.value.applied == 0 and ei.value.result == []
            assert ge.engine.ticks == 1
    finally:
        gpu_status.cache_clear()




def test_persistent_backend_refused_at_start_frees_its_device_memory(monkeypatch, fake_fatbin):
    """start() claims the room for its grid and refuses when the kernels already running
    took it. The refused path's device buffers were dropped unfreed (no finalizer covers a
    path that never ran) while the other backends kept the primary context: device memory
    lost per refusal. They are freed once the running kernels have stopped (a free beside a
    spinning kernel could wait on it)."""
    from helpers.fake_cuda import OccCuda, _wide
    from fastpath.errors import BackendError
    from fastpath.gpu import GpuBackend
    from fastpath.gpu import _backend as B
    cu = OccCuda(sm=4, fn={"NUM_REGS": 128})
    kw = dict(cuda=cu, timeout_ns=5 * 10**9, start=False)
    a = GpuBackend(_wide(1), "persistent", **kw)
    b = GpuBackend(_wide(2), "persistent", **kw)
    allocs = []
    real = cu.mem_alloc

    def tracked(n):
        allocs.append(real(n))
        return allocs[-1]

    monkeypatch.setattr(cu, "mem_alloc", tracked)
    c = GpuBackend(_wide(3), "persistent", **kw)
    try:
        a.start(), b.start()
        with pytest.raises(BackendError, match="cannot start another persistent GPU kernel"):
            c.start()
        assert allocs and c.path is None and cu.hazards == []
        assert B.resident_kernels(cu, 0).running() == [4, 4] and cu.depth == 0
    finally:
        a.close(), b.close()
    assert allocs and all(x.freed for x in allocs) and cu.hazards == []
    assert B.resident_kernels(cu, 0).running() == []
