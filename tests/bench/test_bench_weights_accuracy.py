"""bench/weights.py: the signal error that bf16 and int8 weights cost on the bench's order-book
stream (the demo model and a 1024-wide MLP), its end-to-end run, and the timing samples it takes
(LowpMLP.time_forward: several passes per sample)."""
import sys

import numpy as np
import pytest

from fastpath import InputError, Model, lob
from fastpath._kernels import LowpMLP
from helpers.builders import BENCH

sys.path.insert(0, BENCH)           # bench/weights.py, imported as `weights` by the tests


@pytest.fixture(scope="module")
def stream():
    bs = lob.generate_stream(20_000, n_symbols=8, seed=11)
    return bs, lob.raw_from_book(bs)


def test_accuracy_demo_model_on_the_bench_stream(stream):
    import weights as W
    bs, raws = stream
    demo = Model.load(W.DEMO_MODEL)
    ref = W.stream_signals(demo, "fp32", raws, bs.symbols, bs.ts_ns)
    e16 = W.signal_errors(W.stream_signals(demo, "bf16", raws, bs.symbols, bs.ts_ns), ref)
    e8 = W.signal_errors(W.stream_signals(demo, "int8", raws, bs.symbols, bs.ts_ns), ref)
    # the demo model is sensitive to its weights: rounding them alone (exact activations)
    # moves its signal by ~0.01 (bf16) and ~0.027 (int8) on this stream; the kernels add
    # next to nothing to that (bench/weights.py prints the full-stream figures)
    assert e16["max_abs"] <= 0.015 and e16["mean_abs"] <= 0.002
    assert e8["max_abs"] <= 0.04 and e8["mean_abs"] <= 0.006
    assert e16["sign_flips"] <= 0.01 * len(ref) and e8["sign_flips"] <= 0.02 * len(ref)


def test_accuracy_1024_model_on_stream_inputs(stream):
    import weights as W
    bs, raws = stream
    demo = Model.load(W.DEMO_MODEL)
    big = W.random_mlp(W.BIG)
    x = W.stream_inputs_1024(demo, raws, bs.symbols, 150)
    ref = W.predict_signals(big, "fp32", x)
    assert W.signal_errors(W.predict_signals(big, "bf16", x), ref)["max_abs"] <= 0.01
    assert W.signal_errors(W.predict_signals(big, "int8", x), ref)["max_abs"] <= 0.03


def test_bench_weights_runs_end_to_end(capsys):
    import weights as W
    assert W.main(["--quick", "--ticks", "2000"]) == 0
    out = capsys.readouterr().out
    for what in ("demo bf16", "1024x1024x1024x2 int8", "MLP stage alone", "targets:"):
        assert what in out


def test_time_forward_samples_of_several_passes():
    """LowpMLP.time_forward gives one float64 ns-per-pass figure per sample, a sample being
    `passes` back-to-back passes between two clock reads (bench/weights.py times a ~250 ns
    kernel that way, so the clock reads are not a fifth of its figure); bad counts are an
    InputError, not a sample of nothing."""
    import weights as W
    demo = Model.load(W.DEMO_MODEL)
    m = LowpMLP([L.weight for L in demo.layers], [L.bias for L in demo.layers],
                [L.activation for L in demo.layers], "int8", "scalar")
    x = np.ones(m.n_in, np.float32)
    t = m.time_forward(x, 5, 4)
    assert t.shape == (5,) and t.dtype == np.float64 and (t > 0).all()
    assert m.time_forward(x, 3).shape == (3,)
    for iters, passes in ((0, 1), (1, 0), (2, -3)):
        with pytest.raises(InputError, match="passes >= 1"):
            m.time_forward(x, iters, passes)
    with pytest.raises(InputError):
        m.time_forward(np.ones(m.n_in + 1, np.float32), 1, 1)


def test_weights_bench_times_samples_not_single_passes():
    import weights as W
    demo = Model.load(W.DEMO_MODEL)
    r = W.time_mlp(demo, "fp32", "scalar", iters=5)
    assert r["passes_per_sample"] >= 1 and r["p50_ns"] > 0
