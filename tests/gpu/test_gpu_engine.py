"""Engine(backend="gpu") on the stand-in pycuda driver answers as the CPU engine does, tick
for tick, in both modes: features from the engine's buffer, heads, non-finite refusals, a fault
mid-tick. On a GPU, the same against the real device.
"""

import dataclasses

import numpy as np
import pytest

import fastpath
from fastpath.errors import BackendError, ConfigError
from fastpath.gpu import GpuEngine, gpu_status

from helpers.builders import random_model, windowed_model
from helpers.fake_cuda import HIT_CACHE, _head_model, _stream


@pytest.mark.parametrize("kind", ["regression", "tanh_sigmoid", "classifier3", "logistic2"])
@pytest.mark.parametrize("mode", ["launch", "persistent"])
def test_gpu_engine_equals_cpu_engine_tick_for_tick(fake_gpu, kind, mode, isa):
    rng = np.random.default_rng(21)
    m = _head_model(rng, kind)
    raws, syms = _stream(rng)
    cfg = {"engine": {"simd": isa, "n_symbols": 3}, "cache": HIT_CACHE}
    cpu = fastpath.Engine(m, backend="cpu", config=cfg)
    want = [cpu.step(raws[i], int(syms[i]), ts_ns=i * 1000) for i in range(len(raws))]
    gcfg = dict(cfg, gpu={"mode": mode, "timeout_ms": 5000})
    with fastpath.Engine(m, backend="gpu", config=gcfg) as ge:
        assert ge.backend == "gpu" and ge.n_outputs == cpu.n_outputs
        be = ge.gpu_backend
        calls = []
        real = be.infer

        def counted(x):
            calls.append(1)
            return real(x)
        be.infer = counted
        got = [ge.step(raws[i], int(syms[i]), ts_ns=i * 1000) for i in range(len(raws))]
        assert ge.ticks == len(raws)
    hits = sum(w.cached for w in want)
    assert 0 < hits < len(raws), "the stream must give both hits and misses"
    for i, (w, g) in enumerate(zip(want, got)):
        assert g.cached == w.cached and g.miss_reason == w.miss_reason, i
        assert abs(g.signal - w.signal) < 1e-5 and abs(g.confidence - w.confidence) < 1e-5, i
    # the GPU runs on misses only, once each
    assert len(calls) == len(raws) - hits
    if mode == "launch":
        assert sum(1 for L in fake_gpu.launches if L[0] == "fp_mlp_batch") == len(calls)
    # GPU stages in the Result: the stand-in's events say 1 us a stage; a hit has none
    for g in got:
        L = g.latency
        if g.cached:
            assert L.h2d_ns == L.d2h_ns == L.infer_ns == 0
        elif mode == "launch":
            assert L.h2d_ns == 1000 and L.d2h_ns == 1000 and L.infer_ns >= 1000


def test_gpu_gets_the_features_of_this_tick_from_the_engine_buffer(fake_gpu, isa):
    # features are computed once a tick (by fp_step_begin) and handed over without a copy:
    # every GPU call reads the same buffer, and it holds what a CPU engine's features() gives
    rng = np.random.default_rng(22)
    m = _head_model(rng, "tanh_sigmoid")
    raws, syms = _stream(rng, 40)
    cfg = {"engine": {"simd": isa, "n_symbols": 3}, "cache": {"enabled": False}}
    cpu = fastpath.Engine(m, backend="cpu", config=cfg)
    with fastpath.Engine(m, backend="gpu", config=cfg) as ge:
        be = ge.gpu_backend
        seen = []
        real = be.infer

        def spy(x):
            seen.append((x.ctypes.data, x.copy()))
            return real(x)
        be.infer = spy
        for i in range(len(raws)):
            f = cpu.features(raws[i], int(syms[i]))
            cpu.step(raws[i], int(syms[i]), ts_ns=i)
            ge.step(raws[i], int(syms[i]), ts_ns=i)
            assert len(seen) == i + 1
            np.testing.assert_array_equal(seen[-1][1], f)
    assert len({a for a, _ in seen}) == 1


def test_gpu_engine_step_batch_equals_cpu(fake_gpu, isa):
    rng = np.random.default_rng(23)
    m = _head_model(rng, "classifier3")
    raws, syms = _stream(rng)
    ts = np.arange(len(raws), dtype=np.int64) * 1000
    cfg = {"engine": {"simd": isa, "n_symbols": 3}, "cache": HIT_CACHE}
    want = fastpath.Engine(m, backend="cpu", config=cfg).step_batch(raws, syms, ts)
    with fastpath.Engine(m, backend="gpu", config=cfg) as ge:
        got = ge.step_batch(raws, syms, ts)
        assert ge.ticks == len(raws)
    np.testing.assert_array_equal(got.cached, want.cached)
    np.testing.assert_allclose(got.signal, want.signal, atol=1e-5)
    np.testing.assert_allclose(got.confidence, want.confidence, atol=1e-5)
    # every row is checked before any is applied, as on the CPU
    bad = raws.copy()
    bad[7, 3] = np.nan
    with fastpath.Engine(m, backend="gpu", config=cfg) as ge:
        n_launches = len(fake_gpu.launches)
        with pytest.raises(fastpath.InputError, match="row 7"):
            ge.step_batch(bad, syms, ts)
        assert ge.ticks == 0 and len(fake_gpu.launches) == n_launches


@pytest.mark.parametrize("mode", ["launch", "persistent"])
def test_gpu_engine_wrapper_matches_cpu_engine(fake_gpu, mode, isa):
    rng = np.random.default_rng(11)
    m = windowed_model(rng, hidden=(24,))
    cfg = {"engine": {"simd": isa, "n_symbols": 4}, "cache": {"enabled": False}}
    raws = rng.standard_normal((40, 40)).astype(np.float32)
    syms = rng.integers(0, 4, 40)
    cpu = fastpath.Engine(m, backend="cpu", config=cfg)
    want = [cpu.step(raws[i], int(syms[i]), ts_ns=i * 1000) for i in range(40)]
    with GpuEngine(m, cfg, mode=mode, timeout_ns=5 * 10**9) as ge:
        got = [ge.step(raws[i], int(syms[i]), ts_ns=i * 1000) for i in range(20)]
        got += [g for g in ge.step_batch(raws[20:], syms[20:], np.arange(20, 40) * 1000)]
    for w, g in zip(want, got):
        r = getattr(g, "result", g)
        assert abs(r.signal - w.signal) < 1e-5 and abs(r.confidence - w.confidence) < 1e-5
    assert ge.engine.ticks == 40


def test_gpu_engine_wrapper_batch_applies_post_transform(fake_gpu):
    """The batched launch handed the engine the raw last layer, not the outputs after softmax."""
    rng = np.random.default_rng(24)
    m = _head_model(rng, "classifier3")
    raws, syms = _stream(rng, 40)
    cfg = {"engine": {"n_symbols": 3}, "cache": {"enabled": False}}
    want = fastpath.Engine(m, backend="cpu", config=cfg).step_batch(raws, syms)
    with GpuEngine(m, cfg, mode="launch") as ge:
        got = ge.step_batch(raws, syms)
    np.testing.assert_allclose([g.signal for g in got], want.signal, atol=1e-5)
    np.testing.assert_allclose([g.confidence for g in got], want.confidence, atol=1e-5)


def test_gpu_engine_mode_from_config(fake_gpu):
    m = random_model(np.random.default_rng(15), [4, 2])
    with GpuEngine(m, {"gpu": {"mode": "persistent"}, "engine": {"n_symbols": 2}},
                   timeout_ns=5 * 10**9) as ge:
        assert ge.mode == "persistent" and ge.engine.n_symbols == 2
        ge.step(np.ones(4, np.float32), 1)
    assert fake_gpu.launches[0][0] == "fp_mlp_persistent"
    # a TOML path or an EngineConfig works too; the keyword arguments override its [gpu]
    from fastpath._build import EXAMPLE_CONFIG
    from fastpath.control.config import load_config
    for cfg in (EXAMPLE_CONFIG, load_config({"gpu": {"mode": "persistent", "max_batch": 8}})):
        with GpuEngine(m, cfg, mode="launch", max_batch=4) as ge:
            assert ge.mode == "launch" and ge.backend.path.max_batch == 4
    with pytest.raises(ConfigError, match="gpu.max_batch"):
        GpuEngine(m, None, max_batch=0)
    with fastpath.Engine(m, backend="gpu", config={"gpu": {"mode": "persistent",
                                                           "timeout_ms": 5000}}) as e:
        r = e.backend_report
        assert r["backend"] == "gpu" and r["gpu"]["mode"] == "persistent"
        assert r["gpu"]["device"] == "Fake GPU" and "fatbin" in r["gpu"]["module"]
        e.step(np.ones(4, np.float32), 0)
    with pytest.raises(BackendError, match="closed"):
        e.step(np.ones(4, np.float32), 0)


def test_gpu_engine_refuses_nonfinite_like_cpu(fake_gpu):
    rng = np.random.default_rng(12)
    m = random_model(rng, [6, 4, 2], ["relu", "identity"])
    # model arrays are read-only: a model with other weights is a new model
    l0 = m.layers[0]
    m = dataclasses.replace(m, layers=(dataclasses.replace(l0, weight=np.full_like(l0.weight, 3e38)),)
                            + tuple(m.layers[1:]))
    cfg = {"engine": {"n_symbols": 2}, "cache": {"enabled": False}}
    for mk in (lambda: GpuEngine(m, cfg, mode="launch").engine,
               lambda: fastpath.Engine(m, backend="gpu", config=cfg)):
        ge = mk()
        with pytest.raises(fastpath.InputError) as gpu_err:
            ge.step(np.ones(6, np.float32), 0)
        assert ge.ticks == 0
        ge.close()
    with pytest.raises(fastpath.InputError) as cpu_err:
        fastpath.Engine(m, backend="cpu", config=cfg).step(np.ones(6, np.float32), 0)
    assert str(gpu_err.value) == str(cpu_err.value)


def test_gpu_fault_mid_tick_leaves_the_engine_unchanged(fake_gpu, isa):
    # the GPU fails between fp_step_begin and fp_step_finish: BackendError, the tick is not
    # applied (no window, slot or counter moves), and the engine goes on as if it never came
    rng = np.random.default_rng(29)
    m = _head_model(rng, "tanh_sigmoid")
    raws, syms = _stream(rng, 40)
    cfg = {"engine": {"simd": isa, "n_symbols": 3}, "cache": HIT_CACHE}
    cpu = fastpath.Engine(m, backend="cpu", config=cfg)
    with fastpath.Engine(m, backend="gpu", config=cfg) as ge:
        for i in range(10):
            cpu.step(raws[i], int(syms[i]), ts_ns=i)
            ge.step(raws[i], int(syms[i]), ts_ns=i)
        fake_gpu.kernel_mode = "fault"
        with pytest.raises(BackendError, match="illegal memory access"):
            ge.step(raws[10] + np.float32(5), int(syms[10]), ts_ns=10)
        assert ge.ticks == 10 and ge.stats()["misses"] == cpu.stats()["misses"]
        fake_gpu.kernel_mode = "ok"
        for i in range(10, len(raws)):
            w = cpu.step(raws[i], int(syms[i]), ts_ns=i)
            g = ge.step(raws[i], int(syms[i]), ts_ns=i)
            assert g.cached == w.cached and abs(g.signal - w.signal) < 1e-5, i


@pytest.mark.skipif(not gpu_status()[0], reason=gpu_status()[1])
@pytest.mark.parametrize("kind", ["regression", "tanh_sigmoid", "classifier3"])
@pytest.mark.parametrize("mode", ["launch", "persistent"])
def test_real_gpu_engine_equals_cpu_engine(kind, mode):
    rng = np.random.default_rng(28)
    m = _head_model(rng, kind)
    raws, syms = _stream(rng)
    cfg = {"engine": {"n_symbols": 3}, "cache": HIT_CACHE}
    cpu = fastpath.Engine(m, backend="cpu", config=cfg)
    want = [cpu.step(raws[i], int(syms[i]), ts_ns=i * 1000) for i in range(len(raws))]
    with fastpath.Engine(m, backend="gpu", config=dict(cfg, gpu={"mode": mode})) as ge:
        got = [ge.step(raws[i], int(syms[i]), ts_ns=i * 1000) for i in range(len(raws))]
    for w, g in zip(want, got):
        assert g.cached == w.cached
        assert abs(g.signal - w.signal) < 1e-5 and abs(g.confidence - w.confidence) < 1e-5
        assert (g.latency.infer_ns > 0) == (not g.cached)
