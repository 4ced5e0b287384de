"""The module-level fastpath.step() runs a GPU default engine on the GPU, and a GPU tick with a
second thread stepping alongside."""

import threading

import numpy as np
import pytest

import fastpath
from fastpath import Engine, EngineBusyError
from fastpath.errors import BackendError
from helpers.fake_cuda import _head_model, _stream


def test_module_step_runs_a_gpu_default_engine_on_the_gpu(fake_gpu):
    """Defect guarded: fastpath.step() ran a GPU default engine's model on the CPU, and a closed
    GPU engine kept answering instead of raising BackendError."""
    rng = np.random.default_rng(3)
    m = _head_model(rng, "tanh_sigmoid")
    raws, _ = _stream(rng, 8)
    cfg = {"engine": {"n_symbols": 3}, "cache": {"enabled": False}}
    ge = Engine(m, backend="gpu", config=cfg)
    calls = []
    real = ge.gpu_backend.infer
    ge.gpu_backend.infer = lambda x: (calls.append(1), real(x))[1]
    cpu = Engine(m, backend="cpu", config=cfg)
    fastpath.set_default_engine(ge)
    try:
        r = fastpath.step(raws[0], 0, ts_ns=1)
        assert len(calls) == 1
        w = cpu.step(raws[0], 0, ts_ns=1)
        assert abs(r.signal - w.signal) < 1e-5
        ge.close()
        with pytest.raises(BackendError, match="closed"):
            fastpath.step(raws[1], 0, ts_ns=2)
        fastpath.set_default_engine(cpu)        # a CPU default again: its own fast tick
        twin = Engine(m, config=cfg)
        twin.step(raws[0], 0, ts_ns=1)
        assert fastpath.step(raws[1], 0, ts_ns=2).signal == twin.step(raws[1], 0, ts_ns=2).signal
        assert cpu.ticks == 2 and len(calls) == 1
    finally:
        fastpath.set_default_engine(None)


def test_gpu_tick_and_a_second_thread(fake_gpu):
    """Defect guarded: a second thread's tick during a GPU tick (GIL released around the device)
    rewrote the feature buffer and the first tick answered with the second's signal; the second
    is refused."""
    rng = np.random.default_rng(3)
    m = _head_model(rng, "tanh_sigmoid")
    raws, _ = _stream(rng, 8)
    cfg = {"engine": {"n_symbols": 3}, "cache": {"enabled": False}}
    want = Engine(m, config=cfg).step(raws[0], 0, ts_ns=10)
    ge = Engine(m, backend="gpu", config=cfg)
    real = ge.gpu_backend.infer
    inside, go = threading.Event(), threading.Event()

    def slow(x):
        inside.set()
        go.wait(10)
        return real(x)
    ge.gpu_backend.infer = slow
    out = {}

    def first():
        try:
            out["a"] = ge.step(raws[0], 0, ts_ns=10)
        except Exception as exc:     # noqa: BLE001 - reported below
            out["a"] = exc
    th = threading.Thread(target=first)
    th.start()
    assert inside.wait(10)
    ge.gpu_backend.infer = real
    try:
        with pytest.raises(EngineBusyError):
            ge.step(raws[1], 0, ts_ns=20)
        with pytest.raises(EngineBusyError):
            ge.step_batch(raws[1:2], [1], [20])
        with pytest.raises(EngineBusyError):
            ge.close()                   # the device memory stays until the tick is done
    finally:
        go.set()
        th.join(10)
    assert not isinstance(out["a"], Exception), out["a"]
    assert abs(out["a"].signal - want.signal) < 1e-5
    assert ge.step(raws[1], 0, ts_ns=20) is not None and ge.ticks == 2
    ge.close()
