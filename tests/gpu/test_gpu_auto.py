"""backend="auto": the measurement (fastpath.gpu.auto_choice) counts the whole call a tick
makes, the rule gpu.auto = "measure" | "gpu", and the fall-back to the CPU for a model the GPU
stage does not serve, on the stand-in pycuda driver.
"""

import numpy as np
import pytest

import fastpath
from fastpath._kernels import PackedMLP
from fastpath.errors import BackendError, ConfigError, InputError
from fastpath.gpu import AUTO_MEASURE, GpuBackend, _backend as B, auto_choice, gpu_status

from helpers.builders import random_model
from helpers.fake_cuda import FakeCuda, _tree_model


def test_auto_choice_without_gpu_picks_cpu_and_says_why():
    ok, why = gpu_status()
    if ok:
        pytest.skip("a GPU is usable here")
    m = random_model(np.random.default_rng(0), [8, 4, 2])
    c = auto_choice(m, iters=5)
    assert c["backend"] == "cpu" and c["gpu_p50_ns"] is None and why in c["reason"]
    assert c["cpu_p50_ns"] > 0


def test_auto_choice_measures_both(fake_fatbin):
    m = random_model(np.random.default_rng(0), [8, 4, 2])
    c = auto_choice(m, "launch", iters=5, cuda=FakeCuda())
    # the stand-in's launch costs far more host time than an 8->4->2 forward on the CPU
    assert c["backend"] == "cpu" and c["gpu_p50_ns"] > c["cpu_p50_ns"] > 0
    assert "gpu launch" in c["reason"] and str(c["cpu_p50_ns"]) in c["reason"]
    bad = auto_choice(m, "launch", iters=5, cuda=FakeCuda(kernel_mode="fault"))
    assert bad["backend"] == "cpu" and "failed" in bad["reason"]


@pytest.mark.parametrize("what", ["trees", "bf16 model", "int8 config"])
def test_gpu_refuses_what_it_does_not_serve_and_auto_falls_back(fake_gpu, what):
    rng = np.random.default_rng(25)
    cfg = {"engine": {"n_symbols": 2}, "gpu": {"auto": "gpu"}}
    if what == "trees":
        m = _tree_model()
    elif what == "bf16 model":
        m = random_model(rng, [16, 16, 2]).with_weights("bf16")
    else:
        m = random_model(rng, [16, 16, 2])
        cfg["engine"]["weights"] = "int8"
    with pytest.raises(BackendError, match="the GPU stage serves fp32 MLPs only"):
        fastpath.Engine(m, backend="gpu", config=cfg)
    # auto with gpu.auto = "gpu" would take a usable GPU: the model keeps it on the CPU
    e = fastpath.Engine(m, backend="auto", config=cfg)
    assert e.backend == "cpu" and e.gpu_backend is None
    assert e.backend_reason.startswith("auto: cpu chosen") and "fp32 MLPs" in e.backend_reason
    assert not fake_gpu.launches


def test_auto_takes_the_gpu_by_rule_or_where_it_measures_faster(fake_gpu, monkeypatch):
    m = random_model(np.random.default_rng(26), [8, 4, 2])
    # gpu.auto = "gpu": a usable GPU and an fp32 MLP are enough
    with fastpath.Engine(m, backend="auto", config={"gpu": {"auto": "gpu"}}) as e:
        assert e.backend == "gpu" and e.gpu_backend is not None
        assert "auto: gpu chosen" in e.backend_reason
    # "measure" (default): the stand-in's launch costs far more than an 8->4->2 forward
    with fastpath.Engine(m, backend="auto") as e:
        assert e.backend == "cpu" and e.gpu_backend is None
        meas = e.backend_report["measured"]
        assert meas["gpu_p50_ns"] > meas["cpu_p50_ns"] > 0
        assert str(meas["cpu_p50_ns"]) in e.backend_reason
    # where the GPU measures faster, auto runs on it and reports both figures
    import fastpath.gpu as G
    real = G.auto_choice

    def gpu_wins(*a, **k):
        c = real(*a, **k)
        return dict(c, backend="gpu", gpu_p50_ns=1, reason="auto: gpu chosen (stand-in)")
    monkeypatch.setattr(G, "auto_choice", gpu_wins)
    with fastpath.Engine(m, backend="auto") as e:
        assert e.backend == "gpu" and e.gpu_backend is not None
        assert e.backend_report["measured"]["gpu_p50_ns"] == 1
        assert e.backend_report["gpu"]["device"] == "Fake GPU"
        e.step(np.ones(8, np.float32), 0)
    monkeypatch.setattr(G, "auto_choice", real)
    # the config's backend key is honoured too
    e = fastpath.Engine(m, backend=None, config={"engine": {"backend": "gpu"}})
    assert e.backend == "gpu"
    e.close()


# the CPU figure, held fixed: what is compared is what the GPU figure counts
CPU_NS = 1_000_000


class _FixedCpu:
    """PackedMLP whose forward the auto measurement times at CPU_NS."""

    def __init__(self, *a):
        self._m = PackedMLP(*a)
        self.n_in = self._m.n_in

    def time_forward(self, x, iters):
        return float(CPU_NS)


class _Clock:
    """A stand-in for fastpath.gpu's perf_counter_ns: each read costs READ ns, and work
    advances it by what it is said to take (the figures are then exact, not timed)."""
    READ = 100

    def __init__(self):
        self.now = 0

    def perf_counter_ns(self):
        self.now += self.READ
        return self.now


@pytest.fixture
def clock(monkeypatch):
    import types

    import fastpath.gpu as G
    c = _Clock()
    monkeypatch.setattr(G, "time", types.SimpleNamespace(perf_counter_ns=c.perf_counter_ns))
    return c


def test_auto_gpu_figure_is_the_whole_call_a_tick_makes(fake_fatbin, monkeypatch, clock):
    """auto compared the GPU path's Timing.total_ns, not the whole GpuBackend.infer call a tick
    pays."""
    # here the call takes 3 ms of host time and its Timing says 1 us, against a 1 ms CPU forward
    import fastpath._kernels as K
    monkeypatch.setattr(K, "PackedMLP", _FixedCpu)
    real = B.LaunchPath.infer

    def infer(self, x):
        clock.now += 3_000_000
        y, bad, t = real(self, x)
        return y, bad, t._replace(total_ns=1000)
    monkeypatch.setattr(B.LaunchPath, "infer", infer)
    m = random_model(np.random.default_rng(0), [8, 4, 2])
    c = auto_choice(m, "launch", iters=5, cuda=FakeCuda())
    assert c["cpu_p50_ns"] == CPU_NS
    # the call's 3 ms, the timer's own cost (one read) taken off
    assert c["gpu_p50_ns"] == 3_000_000
    assert c["backend"] == "cpu", c["reason"]
    # the reason says what both figures are and that they are the same kind of figure
    r = c["reason"]
    assert r.startswith("auto: cpu chosen (inference a cache miss pays, p50 of 5 single calls")
    assert "CLOCK_MONOTONIC" in r and "GpuBackend.infer" in r and "the C forward" in r
    assert f"cpu {CPU_NS} ns" in r and "gpu launch 3000000 ns" in r
    assert c["measure"] == AUTO_MEASURE


def test_auto_timer_cost_is_not_charged_to_the_gpu(fake_fatbin, monkeypatch, clock):
    """The empty timed region's cost (which the CPU figure's C timer does not pay) is taken off the
    GPU figure."""
    import fastpath.gpu as G
    calls = []

    class Timed:
        def __init__(self, *a, **k):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *e):
            pass

        def infer(self, x):
            calls.append(1)
            clock.now += 500
    monkeypatch.setattr(G, "GpuBackend", Timed)
    m = random_model(np.random.default_rng(0), [8, 4, 2])
    c = auto_choice(m, "launch", iters=200, cuda=FakeCuda())
    assert len(calls) == 250                           # 50 warm-up calls, 200 timed
    assert c["gpu_p50_ns"] == 500


@pytest.mark.parametrize("what", ["trees", "bf16", "17 layers"])
def test_auto_choice_on_a_model_the_gpu_does_not_run(fake_fatbin, what):
    """auto_choice raised on a tree ensemble or past 16 layers, and measured a bf16 model in
    fp32."""
    rng = np.random.default_rng(27)
    if what == "trees":
        m = _tree_model()
        want = "tree ensemble"
    elif what == "bf16":
        m = random_model(rng, [16, 16, 2]).with_weights("bf16")
        want = "weights = 'bf16'"
    else:
        from fastpath.model import Layer
        m = [Layer(rng.standard_normal((4, 4)).astype(np.float32), np.zeros(4, np.float32),
                   "relu") for _ in range(17)]
        want = "17 layers; the GPU kernels take 1..16"
    cu = FakeCuda()
    c = auto_choice(m, "launch", iters=5, cuda=cu)
    assert c["backend"] == "cpu" and c["gpu_p50_ns"] is None
    assert c["reason"].startswith("auto: cpu chosen (") and want in c["reason"]
    assert not cu.launches


def test_auto_choice_on_a_linear_model_and_on_layers(fake_fatbin):
    """A linear model and a plain sequence of layers are measured on both sides; anything else is
    an InputError."""
    m = random_model(np.random.default_rng(5), [8, 2])
    c = auto_choice(m, "launch", iters=5, cuda=FakeCuda())
    assert c["gpu_p50_ns"] > 0 and c["cpu_p50_ns"] > 0 and "8x2, 16 multiply-adds" in c["reason"]
    c = auto_choice(list(m.layers), "persistent", iters=5, cuda=FakeCuda())
    assert c["gpu_p50_ns"] > 0 and "gpu persistent" in c["reason"]
    with pytest.raises(InputError, match="fastpath.Model or a sequence of fastpath.model.Layer"):
        auto_choice("model.fpm", iters=5, cuda=FakeCuda())


@pytest.mark.parametrize("iters", [0, -1, 2.5, True])
def test_auto_choice_iters_is_checked(iters):
    m = random_model(np.random.default_rng(0), [8, 4, 2])
    with pytest.raises(ConfigError, match="iters must be an int >= 1"):
        auto_choice(m, iters=iters, cuda=FakeCuda())


@pytest.mark.parametrize("what", ["trees", "bf16"])
def test_gpu_backend_refuses_what_the_gpu_stage_does_not_serve(fake_fatbin, what):
    """GpuBackend took a tree ensemble for a model of no layers and ran a bf16 model's weights in
    fp32."""
    m = (_tree_model() if what == "trees"
         else random_model(np.random.default_rng(1), [16, 16, 2]).with_weights("bf16"))
    with pytest.raises(BackendError, match="GpuBackend: .*the GPU stage serves fp32 MLPs only"):
        GpuBackend(m, "launch", cuda=FakeCuda())
    # one layer runs fp32 whatever the model says (only hidden layers are packed reduced)
    one = random_model(np.random.default_rng(1), [16, 2]).with_weights("bf16")
    with GpuBackend(one, "launch", cuda=FakeCuda()) as be:
        assert be.infer(np.ones(16, np.float32))[0].shape == (2,)


def test_engine_auto_still_measures_and_reports(fake_gpu):
    m = random_model(np.random.default_rng(26), [8, 4, 2])
    with fastpath.Engine(m, backend="auto") as e:
        meas = e.backend_report["measured"]
        assert meas["cpu_p50_ns"] > 0 and meas["gpu_p50_ns"] > 0
        # backend_report says what the two figures are, as the reason does
        assert meas["measure"] == AUTO_MEASURE
        assert "inference a cache miss pays" in e.backend_reason
