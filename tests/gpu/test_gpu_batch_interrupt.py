"""A GPU engine's step_batch interrupted by a signal inside a GPU call leaves the rows it says
it applied, and the engine usable."""

import signal

import numpy as np
import pytest

import fastpath
from helpers.fake_cuda import HIT_CACHE, _head_model, _stream as _gpu_stream


class Alarm(Exception):
    pass


def _alarm_on_call(k):
    """A wrapper of a function that raises SIGALRM (handler: Alarm) on its k-th call."""
    calls = []

    def wrap(real):
        def f(*a):
            calls.append(1)
            if len(calls) == k:
                signal.raise_signal(signal.SIGALRM)
            return real(*a)
        return f
    return wrap


def _raise_alarm(signum, frame):
    raise Alarm("time is up")


def test_gpu_engine_batch_interrupted_in_a_gpu_call(fake_gpu):
    rng = np.random.default_rng(23)
    m = _head_model(rng, "classifier3")
    raws, syms = _gpu_stream(rng)
    n = len(raws)
    ts = np.arange(n, dtype=np.int64) * 1000
    cfg = {"engine": {"n_symbols": 3}, "cache": HIT_CACHE}
    old = signal.signal(signal.SIGALRM, _raise_alarm)
    try:
        with fastpath.Engine(m, backend="gpu", config=cfg) as ge:
            be = ge.gpu_backend
            be.infer = _alarm_on_call(20)(be.infer)
            with pytest.raises(Alarm) as ei:
                ge.step_batch(raws, syms, ts)
            k = ei.value.applied
            assert 20 <= k < n and ge.ticks == k      # the 20th miss's row is not applied
            cpu = fastpath.Engine(m, backend="cpu", config=cfg)
            want = cpu.step_batch(raws[:k], syms[:k], ts[:k])
            got = ei.value.result
            np.testing.assert_array_equal(got.cached, want.cached)
            np.testing.assert_allclose(got.signal, want.signal, atol=1e-5)
            rest = ge.step_batch(raws[k:], syms[k:], ts[k:])        # not busy
            want = cpu.step_batch(raws[k:], syms[k:], ts[k:])
            np.testing.assert_array_equal(rest.cached, want.cached)
            assert ge.ticks == n
    finally:
        signal.signal(signal.SIGALRM, old)


def test_gpu_engine_wrapper_batch_interrupted(fake_gpu):
    from fastpath.gpu import GpuEngine
    rng = np.random.default_rng(24)
    m = _head_model(rng, "classifier3")
    raws, syms = _gpu_stream(rng, 40)
    n = len(raws)
    cfg = {"engine": {"n_symbols": 3}, "cache": {"enabled": False}}
    old = signal.signal(signal.SIGALRM, _raise_alarm)
    try:
        with GpuEngine(m, cfg, mode="launch", max_batch=8) as ge:
            path = ge.backend.path
            path.collect = _alarm_on_call(2)(path.collect)     # in the second launch
            with pytest.raises(Alarm) as ei:
                ge.step_batch(raws, syms)
            k = ei.value.applied
            assert 0 < k < n and ge.engine.ticks == k and len(ei.value.result) == k
            want = fastpath.Engine(m, backend="cpu", config=cfg).step_batch(raws, syms)
            np.testing.assert_allclose([r.signal for r in ei.value.result], want.signal[:k],
                                       atol=1e-5)
            # not busy, nothing left in flight: the rest goes in
            rest = ge.step_batch(raws[k:], syms[k:])
            np.testing.assert_allclose([r.signal for r in rest], want.signal[k:], atol=1e-5)
    finally:
        signal.signal(signal.SIGALRM, old)
