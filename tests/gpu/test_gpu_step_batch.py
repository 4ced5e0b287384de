"""GpuEngine.step_batch's refusals: a refused row (bad input, time going backwards) applies
no row and leaves no launch in flight, bad arguments are input errors, an empty batch is
answered.
"""

import numpy as np
import pytest

import fastpath
from fastpath.errors import InputError
from fastpath.gpu import GpuEngine

from helpers.builders import random_model, windowed_model


NOCACHE = {"enabled": False}


def _cpu_answers(m, cfg, raws, syms, ts=None):
    cpu = fastpath.Engine(m, backend="cpu", config=cfg)
    return [cpu.step(raws[i], int(syms[i]), ts_ns=None if ts is None else int(ts[i]))
            for i in range(len(raws))]


def test_step_batch_refused_row_does_not_leave_a_launch_in_flight(fake_gpu, isa):
    """A NaN in a batch's second launch left the first in flight and refused every later call."""
    # stateless features, launch mode, two launches of 4 rows
    rng = np.random.default_rng(1)
    m = random_model(rng, [6, 8, 2])
    cfg = {"engine": {"simd": isa, "n_symbols": 2}, "cache": NOCACHE}
    raws = rng.standard_normal((8, 6)).astype(np.float32)
    syms = np.zeros(8, np.int64)
    bad = raws.copy()
    bad[6, 2] = np.nan
    with GpuEngine(m, cfg, mode="launch", max_batch=4) as ge:
        with pytest.raises(InputError, match=r"row 6: raw contains 1 non-finite.*no row was "
                                             r"applied"):
            ge.step_batch(bad, syms)
        assert ge.engine.ticks == 0 and not ge.backend.path._inflight
        got = [ge.step(raws[i], 0).result for i in range(4)]
        got += [g for g in ge.step_batch(raws[4:], syms[4:])]
    want = _cpu_answers(m, cfg, raws, syms)
    for g, w in zip(got, want):
        assert abs(g.signal - w.signal) < 1e-5 and abs(g.confidence - w.confidence) < 1e-5


@pytest.mark.parametrize("mode", ["launch", "persistent"])
def test_step_batch_refused_row_applies_no_row(fake_gpu, mode, isa):
    """A refused row of a windowed batch left the rows of earlier launches applied, unsaid."""
    # windowed features: one tick per symbol per launch
    rng = np.random.default_rng(2)
    m = windowed_model(rng, hidden=(12,))
    cfg = {"engine": {"simd": isa, "n_symbols": 2}, "cache": NOCACHE}
    raws = rng.standard_normal((10, 40)).astype(np.float32)
    syms = np.zeros(10, np.int64)
    bad = raws.copy()
    bad[6, 0] = np.inf
    with GpuEngine(m, cfg, mode=mode, max_batch=4, timeout_ns=5 * 10**9) as ge:
        with pytest.raises(InputError, match="row 6.*no row was applied"):
            ge.step_batch(bad, syms, np.arange(10) * 1000)
        assert ge.engine.ticks == 0
        got = ge.step_batch(raws, syms, np.arange(10) * 1000)
    want = _cpu_answers(m, cfg, raws, syms, np.arange(10) * 1000)
    for g, w in zip(got, want):
        assert abs(g.signal - w.signal) < 1e-5, (g, w)


def test_step_batch_time_backwards_within_the_batch_applies_no_row(fake_gpu):
    rng = np.random.default_rng(3)
    m = windowed_model(rng, hidden=(12,))
    cfg = {"engine": {"n_symbols": 3}, "cache": NOCACHE}
    raws = rng.standard_normal((6, 40)).astype(np.float32)
    syms = np.array([0, 1, 0, 2, 1, 0])
    ts = np.array([10, 20, 30, 5, 15, 40])      # row 4: symbol 1 at 15 after its 20
    with GpuEngine(m, cfg, mode="launch") as ge:
        with pytest.raises(InputError, match=r"ts_ns row 4 is 15, before row 1's 20 for symbol "
                                             r"1.*no row was applied"):
            ge.step_batch(raws, syms, ts)
        assert ge.engine.ticks == 0
        # against the engine's state (row 0 before the last applied tick) it is the engine
        # that refuses, and the error says how far the batch went
        ge.step_batch(raws[:1], syms[:1], [100])
        with pytest.raises(InputError, match="no row was applied"):
            ge.step_batch(raws[:2], syms[:2], [50, 60])
        # a row behind the engine's last tick of its symbol is refused before any row goes
        # in, as Engine.step_batch refuses it
        with pytest.raises(InputError, match=r"row 1: ts_ns 60 .*no row was applied"):
            ge.step_batch(raws[1:3], syms[1:3], [200, 60])
        assert ge.engine.ticks == 1


@pytest.mark.parametrize("case", ["short symbols", "string symbols", "float symbols",
                                  "short ts", "float64 raws", "wrong width", "1-D raws",
                                  "fortran raws", "negative ts"])
def test_step_batch_bad_arguments_are_input_errors(fake_gpu, case):
    """Bad symbols or timestamps raised IndexError / ValueError or were truncated, not an
    InputError."""
    rng = np.random.default_rng(4)
    m = random_model(rng, [6, 8, 2])
    raws = rng.standard_normal((5, 6)).astype(np.float32)
    syms = np.zeros(5, np.int64)
    ts = None
    if case == "short symbols":
        syms = syms[:3]
    elif case == "string symbols":
        syms = np.array(["a"] * 5)
    elif case == "float symbols":
        syms = np.full(5, 0.7)
    elif case == "short ts":
        ts = np.arange(4)
    elif case == "negative ts":
        ts = np.array([1, 2, -3, 4, 5])
    elif case == "float64 raws":
        raws = raws.astype(np.float64)
    elif case == "wrong width":
        raws = rng.standard_normal((5, 7)).astype(np.float32)
    elif case == "1-D raws":
        raws = raws[0]
    elif case == "fortran raws":
        raws = np.asfortranarray(raws)
    with GpuEngine(m, {"engine": {"n_symbols": 2}, "cache": NOCACHE}, mode="launch") as ge:
        with pytest.raises(InputError) as ei:
            ge.step_batch(raws, syms, ts)
        assert ge.engine.ticks == 0
        what = {"short symbols": "symbols must be", "string symbols": "symbols must be",
                "float symbols": "symbols must be", "short ts": "ts_ns must be",
                "negative ts": "ts_ns must be >= 0", "float64 raws": "float32",
                "wrong width": "(n, 6)", "1-D raws": "(n, 6)", "fortran raws": "C-contiguous"}
        assert what[case] in str(ei.value)


def test_step_batch_empty(fake_gpu):
    m = random_model(np.random.default_rng(5), [6, 2])
    with GpuEngine(m, {"cache": NOCACHE}, mode="launch") as ge:
        assert ge.step_batch(np.zeros((0, 6), np.float32), []) == []
