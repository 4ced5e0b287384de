"""A GPU engine's step_batch refuses a tick from another thread while it runs."""

import threading

import numpy as np

from fastpath import EngineBusyError
from helpers.builders import windowed_model
from helpers.fake_cuda import FakeCuda, _fake_pycuda


WAIT = 10.0     # seconds any wait of these tests may take before the test fails instead of hanging


def test_gpu_engine_batch_refuses_another_threads_tick_meanwhile(monkeypatch, fake_fatbin):
    from fastpath.gpu import GpuEngine, gpu_status
    _fake_pycuda(monkeypatch, FakeCuda())
    try:
        rng = np.random.default_rng(2)
        m = windowed_model(rng, hidden=(16,))
        cfg = {"engine": {"n_symbols": 2}, "cache": {"enabled": False}}
        raws = rng.standard_normal((6, 40)).astype(np.float32)
        syms = np.zeros(6, np.int64)
        other = rng.standard_normal(40).astype(np.float32)
        with GpuEngine(m, cfg, mode="launch") as ge:
            path = ge.backend.path
            collect = path.collect
            seen = {}

            def collect_with_a_tick_meanwhile():
                # what another thread's step() can do while this one waits for the GPU
                if "e" not in seen:
                    def tick():
                        try:
                            ge.engine.step(other, 0, 10**6)
                            seen["e"] = None
                        except Exception as exc:      # the engine's answer, judged below
                            seen["e"] = exc
                    t = threading.Thread(target=tick)
                    t.start()
                    t.join(WAIT)
                    assert not t.is_alive()
                return collect()
            monkeypatch.setattr(path, "collect", collect_with_a_tick_meanwhile)
            ge.step_batch(raws, syms, np.arange(6, dtype=np.int64) * 10**7)
        assert isinstance(seen.get("e"), EngineBusyError), seen
    finally:
        gpu_status.cache_clear()
