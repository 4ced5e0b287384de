"""A row the GPU path flags (not answerable there) is answered as the CPU answers it."""
import numpy as np
import pytest

import fastpath
from fastpath.gpu import GpuBackend, GpuEngine, gpu_status
from helpers.fake_cuda import FakeCuda, _fake_pycuda, random_model


def test_a_row_the_gpu_flags_is_answered_as_the_cpu_answers_it(monkeypatch):
    """Regression: the GPU backend refused every row it flagged (float32 overflow) where the
    CPU answers them."""
    pytest.importorskip("helpers.fake_cuda")

    _fake_pycuda(monkeypatch, FakeCuda())
    gpu_status.cache_clear()
    real_infer = GpuBackend.infer

    def flagged(self, x):
        y, _, t = real_infer(self, x)
        return np.full_like(y, np.nan), True, t

    monkeypatch.setattr(GpuBackend, "infer", flagged)
    rng = np.random.default_rng(3)
    m = random_model(rng, [6, 5, 2], ["relu", "identity"])
    cfg = {"engine": {"n_symbols": 2}, "cache": {"enabled": False}}
    raws = rng.standard_normal((5, 6)).astype(np.float32)
    cpu = fastpath.Engine(m, backend="cpu", config=cfg)
    want = [cpu.step(r, 0, i + 1) for i, r in enumerate(raws)]
    ge = fastpath.Engine(m, backend="gpu", config=cfg)
    got = [ge.step(r, 0, i + 1) for i, r in enumerate(raws)]
    assert [(g.signal, g.confidence) for g in got] == [(w.signal, w.confidence) for w in want]
    ge.close()
    monkeypatch.setattr(GpuBackend, "infer_batch", lambda self, X: (
        np.full((len(X), 2), np.nan, np.float32), np.ones(len(X), bool),
        [real_infer(self, X[0])[2]]))
    ge = GpuEngine(m, cfg, mode="persistent")
    got = ge.step_batch(raws, np.zeros(5, np.int32), np.arange(1, 6))
    assert [(g.signal, g.confidence) for g in got] == [(w.signal, w.confidence) for w in want]
    ge.close()
    gpu_status.cache_clear()
