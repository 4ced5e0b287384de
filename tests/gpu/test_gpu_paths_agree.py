"""The GPU backend on the stand-in driver answers as the CPU engine: streams through step and
step_batch per model kind, batch refusals that say what was applied, and set_default_engine."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import fastpath
from fastpath import Engine, InputError
from helpers.paths import (batch_greedy, batch_outcomes, cfg, counters, F, good_rows, hyp_stream,
                           make_model, make_stream, outcome, RAW_LEN, run_ticks, strip_refused,
                           TICK)


@pytest.mark.parametrize("kind", ["acts", "w3", "clf3_softmax", "clf2_logistic2", "regression",
                                  "clf3_of5_permuted", "tanh_sigmoid_of4"])
@pytest.mark.parametrize("mode", ["launch", "persistent"])
def test_gpu_backend_on_the_stand_in_agrees_with_the_cpu(fake_gpu, kind, mode):
    m = make_model(kind)
    raws, syms, ts, bad = make_stream(5)
    cpu = Engine(m, config=cfg())
    want = run_ticks(cpu.step, raws, syms, ts)
    gcfg = cfg(gpu={"mode": mode, "timeout_ms": 5000})

    def close(got, what):
        assert len(got) == len(want)
        for i, (g, w) in enumerate(zip(got, want)):
            assert (g == "refused") == (w == "refused"), (what, i, g, w)
            if g != "refused":
                assert g[2:] == w[2:], (what, i, g, w)          # cached, miss_reason
                assert abs(g[0] - w[0]) < 1e-5 and abs(g[1] - w[1]) < 1e-5, (what, i, g, w)

    with Engine(m, backend="gpu", config=gcfg) as ge:
        assert ge.backend == "gpu"
        close(run_ticks(ge.step, raws, syms, ts), "gpu step")
        assert counters(ge) == counters(cpu)
        fastpath.set_default_engine(ge)
        try:
            ge.reset()
            close(run_ticks(fastpath.step, raws, syms, ts), "fastpath.step on a gpu engine")
        finally:
            fastpath.set_default_engine(None)
        R, S, T = good_rows(raws, syms, ts, bad)
        for dt in (np.uint8, np.int32, np.uint64):
            ge.reset()
            with pytest.raises(InputError, match="no row was applied"):
                ge.step_batch(raws, syms.astype(dt), ts)
            assert ge.ticks == 0
            b = ge.step_batch(R, S.astype(dt), T)
            got = batch_outcomes(b)
            want_b = strip_refused(want)
            assert [g[2] for g in got] == [w[2] for w in want_b]
            np.testing.assert_allclose([g[0] for g in got], [w[0] for w in want_b], atol=1e-5)
            assert counters(ge) == counters(cpu)


def test_gpu_step_batch_refusals_say_what_was_applied(fake_gpu):
    """Defect guarded: a row refused on the GPU backend said only "engine state unchanged" (the
    CPU says "no row was applied") and carried no answers of the applied rows; both say what was
    applied, with its answers."""
    m = make_model("acts")
    raws, syms, ts, _ = make_stream(9, n=12, nan_every=0)
    cpu = Engine(m, config=cfg())
    want = run_ticks(cpu.step, raws, syms, ts)
    with Engine(m, backend="gpu", config=cfg(gpu={"mode": "launch"})) as ge:
        bad = raws.copy()
        bad[4, 2] = np.inf
        with pytest.raises(InputError, match="row 4: .*no row was applied") as ei:
            ge.step_batch(bad, syms, ts)
        assert ei.value.applied == 0 and ge.ticks == 0
        bad = raws.copy()
        bad[7] = F(3.4e38)
        with pytest.raises(InputError, match=r"row 7: .*rows 0\.\.6 were applied") as ei:
            ge.step_batch(bad, syms, ts)
        assert ei.value.applied == 7 and ge.ticks == 7
        np.testing.assert_allclose(ei.value.result.signal, [w[0] for w in want[:7]], atol=1e-5)
        assert list(ei.value.result.cached) == [w[2] for w in want[:7]]


@pytest.mark.parametrize("kind", ["acts", "clf2_logistic2", "regression"])
@pytest.mark.parametrize("mode", ["launch", "persistent"])
def test_gpu_engine_batches_answer_as_engine_step(fake_gpu, kind, mode):
    # fastpath.gpu.GpuEngine.step_batch (rows sent in launches): the stream in batches split
    # at the refused rows, as a caller would, answers as Engine.step tick for tick
    import re
    from fastpath.gpu import GpuEngine
    m = make_model(kind)
    raws, syms, ts, bad = make_stream(12)
    want = run_ticks(Engine(m, config=cfg()).step, raws, syms, ts)
    got, lo = [], 0
    with GpuEngine(m, cfg(), mode=mode, max_batch=4, timeout_ns=5 * 10**9) as ge:
        while lo < len(raws):
            try:
                got += [outcome(t) for t in ge.step_batch(raws[lo:], syms[lo:], ts[lo:])]
                break
            except InputError as exc:
                assert "no row was applied" in str(exc)
                k = int(re.match(r"row (\d+): ", str(exc)).group(1))
                got += [outcome(t) for t in ge.step_batch(raws[lo:lo + k],
                                                                 syms[lo:lo + k], ts[lo:lo + k])]
                got.append("refused")
                lo += k + 1
        assert ge.engine.ticks == int((~bad).sum())
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert (g == "refused") == (w == "refused"), (i, g, w)
        if g != "refused":
            assert g[2:] == w[2:] and abs(g[0] - w[0]) < 1e-5 and abs(g[1] - w[1]) < 1e-5, (i, g, w)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(ticks=st.lists(TICK, min_size=1, max_size=40), seed=st.integers(0, 2**16),
       kind=st.sampled_from(["acts", "w1", "clf3_softmax", "clf2_logistic2", "regression",
                             "tanh_sigmoid_of4", "deep16"]),
       mode=st.sampled_from(["launch", "persistent"]))
def test_hypothesis_streams_gpu_backend_agrees_with_the_cpu(fake_gpu, ticks, seed, kind, mode):
    raws, syms, ts = hyp_stream(ticks, seed)
    m = make_model(kind)
    cpu = Engine(m, config=cfg())
    want = run_ticks(cpu.step, raws, syms, ts)
    with Engine(m, backend="gpu", config=cfg(gpu={"mode": mode, "timeout_ms": 5000})) as ge:
        got = run_ticks(ge.step, raws, syms, ts)
        assert counters(ge) == counters(cpu)
        ge.reset()
        got_b = batch_greedy(ge, raws, syms, ts)
        assert counters(ge) == counters(cpu)
    for i, w in enumerate(want):
        for g in (got[i], got_b[i]):
            assert (g == "refused") == (w == "refused"), (i, g, w)
            if g != "refused":
                assert g[2] == w[2] and abs(g[0] - w[0]) < 1e-5 and abs(g[1] - w[1]) < 1e-5, \
                    (i, g, w)


def test_set_default_engine_names_a_gpu_engines_engine(fake_gpu):
    from fastpath.gpu import GpuEngine
    with GpuEngine(make_model("acts"), cfg(), mode="launch") as ge:
        with pytest.raises(InputError, match=r"got GpuEngine; a GpuEngine's Engine is its "
                                             r"\.engine"):
            fastpath.set_default_engine(ge)
        fastpath.set_default_engine(ge.engine)
        try:
            raw = np.zeros(RAW_LEN, F)
            want = Engine(make_model("acts"), config=cfg()).step(raw, 1, 5)
            got = fastpath.step(raw, 1, 5)
            assert abs(got.signal - want.signal) < 1e-5 and ge.engine.ticks == 1
        finally:
            fastpath.set_default_engine(None)
