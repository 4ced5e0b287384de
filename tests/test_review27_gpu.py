"""backend="auto"'s measurement (fastpath.gpu.auto_choice), shown where no GPU is: against the
stand-in pycuda driver of tests/test_gpu.py. Each test failed on the code before its fix.
"""
import numpy as np
import pytest

import fastpath
from fastpath._kernels import PackedMLP
from fastpath.errors import BackendError, ConfigError, InputError
from fastpath.gpu import AUTO_MEASURE, GpuBackend, auto_choice
from fastpath.gpu import _backend as B

from helpers.builders import random_model
from helpers.fake_cuda import FakeCuda, _tree_model, fake_fatbin  # noqa: F401 - fixture
from helpers.fake_cuda import fake_gpu  # noqa: F401 - fixture

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
    # the engine's GPU tick pays the whole GpuBackend.infer call (from Cython, between
    # fp_step_begin and fp_step_finish); auto read the path's Timing.total_ns instead, which
    # leaves host work of that call out (launch: the checks, the grid, the output copy;
    # persistent: everything but the C wait). Here the call takes 3 ms of host time and its
    # Timing says 1 us: a GPU that costs a tick 3 ms was taken over a 1 ms CPU forward
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
    # the empty timed region (the timer's own cost from Python, which the CPU figure's C
    # timer around a C call does not pay) is taken off the GPU's: a call of 500 ns is 500
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
    # a tree ensemble raised from PackedMLP([]) (no layers); a bf16 model was measured in fp32
    # on both sides (neither is what its engine runs); past the GPU kernels' 16 layers the
    # GPU's pack raised a ModelError out of auto_choice (a Model has at most 16: layers given
    # as a list)
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
    # a linear model (one dense layer, as sklearn / ONNX linear imports give) is measured on
    # both; so is a plain sequence of layers. Anything else is an InputError naming it
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
    # a tree ensemble was "the GPU kernels take 1..8 layers, got 0"; a bf16 model ran fp32
    # weights on the GPU without a word
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
