"""The engine reaches the GPU stage only through what fastpath.gpu registers when imported: the
engine never imports the GPU package, and without a registered stage backend="gpu" is a clear
BackendError and backend="auto" runs on the CPU, saying why."""
import numpy as np
import pytest

import fastpath
import fastpath.gpu as G
from fastpath import _resolve
from fastpath.errors import BackendError
from fastpath.gpu import _tick

from helpers.builders import random_model
from helpers.fake_cuda import _stream


def test_the_gpu_package_registers_its_stage():
    hooks = _resolve._gpu_stage
    assert hooks is not None
    assert hooks.resolve_backend is G.resolve_backend and hooks.open_stage is G.open_stage


def test_without_a_registered_stage_gpu_is_refused_and_auto_runs_on_the_cpu(monkeypatch):
    """Defect guarded: the engine imported fastpath.gpu at call time (an import circle); with
    no stage registered it must say so instead of reaching up for one."""
    m = random_model(np.random.default_rng(3), [8, 4, 1])
    monkeypatch.setattr(_resolve, "_gpu_stage", None)
    with pytest.raises(BackendError, match=r"backend='gpu' is not available: the GPU stage "
                                           r"\(fastpath.gpu\) is not loaded"):
        fastpath.Engine(m, backend="gpu")
    e = fastpath.Engine(m, backend="auto")
    assert e.backend == "cpu" and e.gpu_backend is None
    assert e.backend_reason == "auto: cpu chosen (the GPU stage (fastpath.gpu) is not loaded)"
    assert e.step(np.zeros(8, np.float32)).signal == e.step(np.zeros(8, np.float32)).signal


def test_a_gpu_engine_runs_its_ticks_through_the_gpu_stage(fake_gpu, isa, monkeypatch):
    rng = np.random.default_rng(5)
    m = random_model(rng, [40, 16, 1])
    raws, syms = _stream(rng, n=16, n_sym=2)
    cfg = {"engine": {"simd": isa, "n_symbols": 2}}
    opened = []

    def open_stage(engine):
        opened.append(G.open_stage(engine))
        return opened[-1]
    monkeypatch.setattr(_resolve, "_gpu_stage", _resolve.GpuStageHooks(G.resolve_backend,
                                                                        open_stage))
    cpu = fastpath.Engine(m, backend="cpu", config=cfg)
    with fastpath.Engine(m, backend="gpu", config=cfg) as ge:
        assert len(opened) == 1 and isinstance(opened[0], _tick.GpuStage)
        assert opened[0].backend is ge.gpu_backend and opened[0].width == 1
        for i in range(len(raws)):
            g, c = ge.step(raws[i], int(syms[i]), i), cpu.step(raws[i], int(syms[i]), i)
            assert abs(g.signal - c.signal) < 1e-5
        y = np.array([0.25], np.float32)
        assert _tick.post_apply(ge, y).shape == (ge.n_outputs,)
    assert opened[0].backend is None and ge.gpu_backend is None
    with pytest.raises(BackendError, match="closed"):
        ge.step(raws[0], 0)
    with pytest.raises(BackendError, match="backend is 'gpu'"):
        _tick.post_apply(cpu, y)
