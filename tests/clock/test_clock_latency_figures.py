"""Every figure a user reads about time: Result.latency, latency_records(), stats()'s
percentiles, fastpath.clock_info() and the bench probes (fastpath._kernels).

No test here asserts on how long anything takes: the checks are on structure (a total that
contains its stages, a percentile that is numpy's of the same records, a record per applied
tick and none per refused one) and on what a probe's arithmetic does."""
import ctypes

import numpy as np
import pytest

import fastpath
from fastpath import Engine, InputError, _kernels as K
from helpers.builders import engine_cfg, random_model, windowed_model
from helpers.clock import _Clock

F32 = np.float32
QS = (50, 90, 99, 99.9)


def _np_stats(col):
    q = np.percentile(col.astype(np.float64), QS)
    return {"p50": float(q[0]), "p90": float(q[1]), "p99": float(q[2]), "p999": float(q[3]),
            "max": int(col.max()), "n": int(len(col))}


def _check_stats_against_records(eng):
    """stats()'s percentiles are numpy's (linear) of the same records, split by the record's
    infer column: a hit records infer 0, a miss more."""
    rec = eng.latency_records()
    st = eng.stats()
    assert st["latency_window"] == len(rec)
    if not len(rec):
        assert st["latency_ns"] == {}
        return rec, st
    missed = rec[:, 2] > 0
    want = {"feature": rec[:, 0], "cache": rec[:, 1], "total": rec[:, 3],
            "infer": rec[missed, 2], "total_hit": rec[~missed, 3], "total_miss": rec[missed, 3]}
    for name, col in want.items():
        if len(col):
            assert st["latency_ns"][name] == _np_stats(col), name
        else:
            assert name not in st["latency_ns"], name
    return rec, st


# ------------------------------------------------------------ Result.latency and its record

def test_external_inference_time_is_inside_total(isa):
    """The external path (GpuEngine.step_batch: the GPU ran the chunk before the row is applied,
    its share handed in as infer_ns) reported infer_ns = 1 ms inside a total_ns of a few
    microseconds: a total smaller than one of the stages it claims to contain. The total now
    adds the outside inference it reports, in the Result and in the record stats() reads."""
    rng = np.random.default_rng(1)
    m = random_model(rng, [8, 6, 2])
    eng = Engine(m, config=engine_cfg(isa))        # cache off: every tick a miss
    xs = rng.standard_normal((12, 8)).astype(F32)
    outside = 1_000_000
    for i, x in enumerate(xs):
        r = eng._step_external(x, 0, m.forward(eng.features(x, 0)), outside, ts_ns=i)
        L = r.latency
        assert not r.cached
        assert L.infer_ns >= outside
        assert L.feature_ns + L.cache_ns + L.infer_ns <= L.total_ns
        assert L.total_ns >= outside
        assert tuple(int(v) for v in eng.latency_records()[-1]) == (
            L.feature_ns, L.cache_ns, L.infer_ns, L.total_ns)
    st = eng.stats()
    assert st["latency_ns"]["total"]["p50"] >= outside
    assert st["latency_ns"]["total_miss"]["max"] >= st["latency_ns"]["infer"]["max"]


def test_external_hit_reports_no_inference(isa):
    """A hit on the external path ran no inference: infer_ns 0 and the outside time not in
    its total (the GPU time handed in belongs to no stage of a hit)."""
    rng = np.random.default_rng(2)
    m = random_model(rng, [8, 6, 2])
    eng = Engine(m, config=engine_cfg(isa, enabled=True, cos_threshold=0.9, norm_tol=0.5))
    x = rng.standard_normal(8).astype(F32)
    eng._step_external(x, 0, m.forward(eng.features(x, 0)), 5, ts_ns=0)
    # 10**15 ns handed in (11 days): a total that held it could not come from the tick itself
    r = eng._step_external(x, 0, m.forward(eng.features(x, 0)), 10**15, ts_ns=1)
    assert r.cached and r.latency.infer_ns == 0
    assert r.latency.total_ns < 10**15


def test_external_total_saturates_in_the_record(isa):
    """An outside inference of more than 4.29 s: the Result's total is exact, the uint32 record
    saturates (as a stall in C does) instead of wrapping to a small figure."""
    rng = np.random.default_rng(3)
    m = random_model(rng, [8, 6, 2])
    eng = Engine(m, config=engine_cfg(isa))
    x = rng.standard_normal(8).astype(F32)
    big = 5 * 10**9
    r = eng._step_external(x, 0, m.forward(eng.features(x, 0)), big, ts_ns=0)
    assert r.latency.total_ns >= big and r.latency.infer_ns >= big
    assert eng.latency_records()[-1][3] == np.iinfo(np.uint32).max
    assert eng.latency_records()[-1][2] == np.iinfo(np.uint32).max


def test_stages_within_total_and_zero_where_not_run(isa):
    """Every tick: stages non-negative, their sum within total_ns (each converted from the same
    timestamps, truncated); infer_ns 0 exactly on a hit; h2d/d2h/wait 0 on the CPU backend."""
    rng = np.random.default_rng(4)
    m = windowed_model(rng)
    eng = Engine(m, config=engine_cfg(isa, enabled=True, cos_threshold=0.999, norm_tol=0.05))
    raws = rng.standard_normal((200, m.raw_len)).astype(F32)
    raws[1::2] = raws[::2] + 1e-5
    seen = set()
    for i, x in enumerate(raws):
        r = eng.step(x, (i // 2) % 3, ts_ns=i + 1)
        L = r.latency
        seen.add(r.cached)
        assert min(L.feature_ns, L.cache_ns, L.infer_ns) >= 0
        assert L.feature_ns + L.cache_ns + L.infer_ns <= L.total_ns
        assert (L.infer_ns == 0) == bool(r.cached)
        assert L.h2d_ns == L.d2h_ns == L.wait_ns == 0
    assert seen == {True, False}


# ------------------------------------------------------------ latency_records / stats()

@pytest.mark.parametrize("cap", [8, 64])
def test_stats_percentiles_are_numpys_of_the_records(isa, cap):
    """Percentiles before the ring fills, at exactly full, after it wraps (oldest first, the
    last `cap` ticks), with few samples (p99 / p999 interpolated, never past the max)."""
    rng = np.random.default_rng(5)
    m = windowed_model(rng)
    cfg = engine_cfg(isa, enabled=True, cos_threshold=0.999, norm_tol=0.05)
    cfg["engine"]["latency_records"] = cap
    eng = Engine(m, config=cfg)
    raws = rng.standard_normal((3 * cap + 6, m.raw_len)).astype(F32)
    raws[1::2] = raws[::2] + 1e-5
    totals = []
    _check_stats_against_records(eng)
    for i, x in enumerate(raws):
        r = eng.step(x, 0, ts_ns=i + 1)
        totals.append(r.latency.total_ns)
        if i + 1 in (1, 2, cap - 1, cap, cap + 1, 2 * cap + 3, len(raws)):
            rec, st = _check_stats_against_records(eng)
            assert len(rec) == min(i + 1, cap)
            # oldest first: the last min(ticks, cap) totals, in order
            assert [int(v) for v in rec[:, 3]] == totals[-len(rec):]
            for q in st["latency_ns"].values():
                assert q["p50"] <= q["p90"] <= q["p99"] <= q["p999"] <= q["max"]
            assert st["ticks"] == i + 1 == st["hits"] + st["misses"]


def test_refused_tick_records_nothing(isa):
    """A refused tick (non-finite input, time going back, bad symbol) applies nothing: no
    record, no tick counted, the same stats as before it."""
    rng = np.random.default_rng(6)
    m = windowed_model(rng)
    eng = Engine(m, config=engine_cfg(isa))
    raws = rng.standard_normal((10, m.raw_len)).astype(F32)
    for i, x in enumerate(raws):
        eng.step(x, 0, ts_ns=100 + i)
    rec0 = eng.latency_records().copy()
    st0 = eng.stats()
    bad = raws[0].copy()
    bad[3] = np.nan
    with pytest.raises(InputError):
        eng.step(bad, 0, ts_ns=1000)
    with pytest.raises(InputError):
        eng.step(raws[1], 0, ts_ns=5)           # before the symbol's last tick
    with pytest.raises(InputError):
        eng.step(raws[1], 99, ts_ns=1000)
    with pytest.raises(InputError):
        eng.step_batch(np.stack([raws[2], bad]), [0, 0], [2000, 2001])
    assert np.array_equal(eng.latency_records(), rec0)
    assert eng.stats() == st0
    _check_stats_against_records(eng)


def test_reset_empties_the_records(isa):
    rng = np.random.default_rng(7)
    m = windowed_model(rng)
    cfg = engine_cfg(isa)
    cfg["engine"]["latency_records"] = 16
    eng = Engine(m, config=cfg)
    raws = rng.standard_normal((40, m.raw_len)).astype(F32)
    for i, x in enumerate(raws):
        eng.step(x, 0, ts_ns=i + 1)
    eng.reset(1)                                   # one symbol: counters and records stay
    assert len(eng.latency_records()) == 16 and eng.ticks == 40
    eng.reset()
    assert eng.ticks == 0 and len(eng.latency_records()) == 0
    st = eng.stats()
    assert st["latency_ns"] == {} and st["latency_window"] == 0
    totals = [eng.step(x, 0, ts_ns=i + 1).latency.total_ns for i, x in enumerate(raws[:5])]
    rec, _ = _check_stats_against_records(eng)
    assert [int(v) for v in rec[:, 3]] == totals


def test_batch_totals_are_the_records(isa):
    rng = np.random.default_rng(8)
    m = windowed_model(rng)
    eng = Engine(m, config=engine_cfg(isa, enabled=True, cos_threshold=0.999, norm_tol=0.05))
    raws = rng.standard_normal((30, m.raw_len)).astype(F32)
    b = eng.step_batch(raws, np.arange(30) % 4, np.arange(30) + 1)
    rec, _ = _check_stats_against_records(eng)
    assert np.array_equal(b.total_ns, rec[:, 3].astype(np.int64))
    assert (b.total_ns > 0).all()


# ------------------------------------------------------------ clock_info and the clock

def test_clock_info_is_the_engines_clock():
    """fastpath.clock_info() and the probes' module copy describe a clock of the same kind and
    rate (each module calibrates its own copy), with values a reader can take at face value."""
    a = fastpath.clock_info()
    b = K.clock_info()
    assert set(a) == set(b) == {"source", "ns_per_tick", "read_cost_ns", "calibration_samples",
                                "calibration_bracket_ns", "reanchors", "steps", "tsc_backs"}
    assert a["source"] == b["source"] in ("tsc", "clock_gettime(CLOCK_MONOTONIC)")
    assert a["read_cost_ns"] > 0
    if a["source"] == "tsc":
        # two calibrations of one TSC agree far better than 5 %
        assert abs(a["ns_per_tick"] / b["ns_per_tick"] - 1) < 0.05
        assert a["calibration_samples"] > 0 and a["calibration_bracket_ns"] > 0
    else:
        assert a["ns_per_tick"] == 1.0 and a["calibration_samples"] == 0


def test_converted_durations_are_monotonic_in_the_end_tick():
    """ticks -> ns is non-negative and never decreases as the end moves later (a duration that
    shrank as more time passed would reorder percentiles); a negative delta is 0."""
    t0 = K.clock_ticks()
    prev = -1
    for dt in [0, 1, 2, 3, 7, 10, 30, 100, 1000, 10**6, 10**9, 10**12]:
        ns = K.clock_ticks_to_ns(t0, t0 + dt)
        assert ns >= 0 and ns >= prev
        prev = ns
    assert K.clock_ticks_to_ns(t0 + 10, t0) == 0
    assert K.clock_ticks_to_ns(t0 + 2**62, t0) == 0      # huge wrap-around: a negative delta


# ------------------------------------------------------------ bench probes

def test_probes_refuse_or_answer_sanely():
    """Tiny iteration counts still give a figure (or -1 where the CPU lacks the set), never a
    negative time, a NaN or a division by zero; an unknown op is an error."""
    for op in ("fma", "add", "mul", "max"):
        v = K.op_latency_ns(op, 1)
        assert v == -1 or (v >= 0 and np.isfinite(v)), (op, v)
    with pytest.raises((InputError, ValueError, KeyError)):
        K.op_latency_ns("div", 10)
    v = K.read_gbps(256, 1)
    assert v > 0 and np.isfinite(v)


def test_fma_probes_with_no_iterations_answer_a_time():
    """Defect guarded: the FMA probes with iters < 1 timed no instruction and returned NaN or a
    negative time (read as "this CPU has no AVX2"); at least one loop trip is timed."""
    for f in (K.fma_ns_per_instr, K.fma512_ns_per_instr):
        for n in (0, -5):
            v = f(n)
            assert v == -1.0 or (0 <= v < 1e6), (f.__name__, n, v)


# ------------------------------------------------------------ through the C symbols
# _kernels' own copy of the clock and the probes' C entry points, reached with ctypes: a clock
# step cannot be made on demand, so the test moves the calibration's fit point instead (what a
# step between the two clocks looks like to the re-anchor), on the probes' copy of the clock
# (the engine's, in fastpath._engine, is not touched).


def _lib():
    return ctypes.CDLL(K.__file__)


@pytest.mark.parametrize("step", [0.3, -0.3, 0.01])
def test_reanchor_does_not_fold_a_clock_step_into_the_rate(step):
    """CLOCK_MONOTONIC stepping away from the TSC by 30% (or 1%) of the time since calibration
    (a VM paused or migrated, a suspend): the re-anchor refitted the rate over the whole
    baseline and, inside its 0.5x-2x band, took the step as a rate: every later duration
    (Result.latency, records, stats) read 30% long or short, silently. The rate must stay
    (the TSC's did not change), and the step stay out of later refits."""
    info = K.clock_info()
    if info["source"] != "tsc":
        pytest.skip("no invariant TSC: durations come from CLOCK_MONOTONIC itself")
    clk = _Clock.in_dll(_lib(), "fp_clock")
    saved = (clk.fit_tick, clk.fit_ns, clk.ns_per_tick, clk.map_ns_per_tick)
    try:
        k0 = clk.ns_per_tick
        baseline = K.clock_mono_ns() - clk.fit_ns
        clk.fit_ns -= int(step * baseline)
        published = any(K.clock_reanchor() for _ in range(50))
        assert published
        assert abs(clk.ns_per_tick / k0 - 1) < 1e-3, (step, clk.ns_per_tick / k0)
        t = K.clock_ticks()
        assert abs(K.clock_ticks_to_ns(t, t + 10**9) / (10**9 * k0) - 1) < 1e-3
        # the step is out of the fit: the next refit (a forced one, microseconds later) is
        # the rate again, over the long baseline
        assert abs(clk.fit_ns - saved[1]) < 1e-3 * baseline
        assert any(K.clock_reanchor() for _ in range(50))
        assert abs(clk.ns_per_tick / k0 - 1) < 1e-3
    finally:
        clk.fit_tick, clk.fit_ns, clk.ns_per_tick, clk.map_ns_per_tick = saved
        K.clock_reanchor()


def test_reanchor_still_tracks_a_slew():
    """A refit within NTP's slew (here 200 ppm) is a rate, taken as one."""
    if K.clock_info()["source"] != "tsc":
        pytest.skip("no invariant TSC")
    clk = _Clock.in_dll(_lib(), "fp_clock")
    saved = (clk.fit_tick, clk.fit_ns, clk.ns_per_tick, clk.map_ns_per_tick)
    try:
        k0 = clk.ns_per_tick
        baseline = K.clock_mono_ns() - clk.fit_ns
        clk.fit_ns -= int(2e-4 * baseline)
        assert any(K.clock_reanchor() for _ in range(50))
        assert 1e-4 < clk.ns_per_tick / k0 - 1 < 3e-4
    finally:
        clk.fit_tick, clk.fit_ns, clk.ns_per_tick, clk.map_ns_per_tick = saved
        K.clock_reanchor()


@pytest.mark.parametrize("op", [0, 1, 2, 3])
def test_op_latency_chain_stays_normal(op):
    """The latency probe times one op on a chain of values; a subnormal value times a
    microcode assist instead (~100 cycles on Intel cores). The mul chain multiplied by
    0.999999 each op and went subnormal past ~1.1e7 loop trips (0.999999**8.8e7 < 1.2e-38),
    against its own comment. Every chain's end value must be a normal float, and non-zero
    (the chain was computed)."""
    lib = _lib()
    if not hasattr(lib, "fp_op_latency_probe"):
        pytest.fail("no fp_op_latency_probe: the probe cannot say where its chain ended")
    f = lib.fp_op_latency_probe
    f.restype = ctypes.c_double
    f.argtypes = [ctypes.c_int, ctypes.c_long, ctypes.POINTER(ctypes.c_float)]
    end = ctypes.c_float()
    for iters in (1, 1000, 12_000_000 if op == 2 else 200_000):
        ns = f(op, iters, ctypes.byref(end))
        if ns == -1.0:
            pytest.skip("no AVX2+FMA")
        assert ns >= 0
        assert abs(end.value) >= np.finfo(np.float32).tiny, (op, iters, end.value)
    assert f(7, 10, ctypes.byref(end)) == -1.0
