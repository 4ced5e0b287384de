"""What users actually pass: numpy scalars, floats, pandas objects, float64 arrays, lists.

Each wrong type is an InputError that names the parameter and says how to convert, and the
engine is left exactly as it was; integer types that mean the same thing are accepted.
"""
import datetime
import threading
import time

import numpy as np
import pytest

import fastpath
from fastpath import EngineBusyError, Engine, InputError
from helpers.builders import engine_cfg, windowed_model
from helpers.engine_state import assert_same_state, good, pair  # noqa: F401 - pair is a fixture


@pytest.mark.parametrize("ts, hint", [
    (1.5e9, "pass an int"),
    (np.float64(1e9), "pass an int"),
    ("2024-08-08", "pass an int"),
    (np.datetime64("2024-08-08T00:00:00", "ns"), "astype"),
    (datetime.datetime(2024, 8, 8), "timestamp"),
    (True, "pass an int"),
    (2**64, "signed 64-bit"),
])
def test_ts_wrong_type(pair, ts, hint):
    a, b, rng = pair
    with pytest.raises(InputError, match="ts_ns") as e:
        a.step(good(a), 0, ts_ns=ts)
    assert hint in str(e.value)
    assert_same_state(a, b, rng)


def test_pandas_timestamp_says_use_value(pair):
    pd = pytest.importorskip("pandas")
    a, b, rng = pair
    ts = pd.Timestamp("1970-01-01 00:00:00.000000800")
    with pytest.raises(InputError, match=r"ts_ns .*Timestamp.*ts\.value"):
        a.step(good(a), 0, ts_ns=ts)
    a.step(good(a), 0, ts_ns=ts.value)        # what the message says works
    b.step(good(b), 0, ts_ns=800)
    assert_same_state(a, b, rng)


@pytest.mark.parametrize("ts", [np.int64(800), np.uint32(800), np.int32(800)])
def test_numpy_integer_ts_is_accepted(pair, ts):
    a, b, rng = pair
    a.step(good(a), 1, ts_ns=ts)
    b.step(good(b), 1, ts_ns=800)
    assert_same_state(a, b, rng)


CONVERT = "np.ascontiguousarray(x, dtype=np.float32)"


@pytest.mark.parametrize("make", [
    lambda n: np.zeros(n, np.float64),
    lambda n: [0.0] * n,
    lambda n: tuple([0.0] * n),
    lambda n: np.zeros(2 * n, np.float32)[::2],
    lambda n: np.zeros(n, ">f4"),
])
def test_raw_error_says_how_to_convert(pair, make):
    a, b, rng = pair
    x = make(a.raw_len)
    with pytest.raises(InputError, match="raw must be a float32") as e:
        a.step(x, 0)
    assert CONVERT in str(e.value)
    a.step(np.ascontiguousarray(x, dtype=np.float32), 0, ts_ns=900)   # the advice works
    b.step(good(b), 0, ts_ns=900)
    assert_same_state(a, b, rng)


def test_raw_wrong_length_has_no_conversion_advice(pair):
    a, b, rng = pair
    with pytest.raises(InputError, match=r"with 40 values, got float32 shape \(39,\)$"):
        a.step(np.zeros(a.raw_len - 1, np.float32), 0)


def test_pandas_raw_and_batch_say_to_numpy(pair):
    pd = pytest.importorskip("pandas")
    a, b, rng = pair
    s = pd.Series(np.zeros(a.raw_len))
    with pytest.raises(InputError, match=r"to_numpy\(\)"):
        a.step(s, 0)
    df = pd.DataFrame(np.zeros((3, a.raw_len)))
    with pytest.raises(InputError, match=r"raws must be .*to_numpy\(\)"):
        a.step_batch(df, np.zeros(3, np.int64))
    idx = pd.date_range("2024-08-08", periods=3, freq="s")
    with pytest.raises(InputError, match=r"ts_ns must be an integer array.*view\(np.int64\)"):
        a.step_batch(np.zeros((3, a.raw_len), np.float32), np.zeros(3, np.int64),
                     idx.to_numpy())
    assert_same_state(a, b, rng)


def test_batch_float64_and_list_say_how_to_convert(pair):
    a, b, rng = pair
    for raws in (np.zeros((2, a.raw_len)), [[0.0] * a.raw_len] * 2):
        with pytest.raises(InputError, match=r"raws must be .*ascontiguousarray"):
            a.step_batch(raws, [0, 1])
    with pytest.raises(InputError, match="symbols must be an integer array.*map names"):
        a.step_batch(np.zeros((2, a.raw_len), np.float32), ["BTC", "ETH"])
    with pytest.raises(InputError, match="ts_ns must be an integer array.*floats"):
        a.step_batch(np.zeros((2, a.raw_len), np.float32), [0, 1], [1.0, 2.0])
    with pytest.raises(InputError, match="does not fit a signed 64-bit"):
        a.step_batch(np.zeros((2, a.raw_len), np.float32), [0, 1],
                     np.array([1, 2**64 - 1], np.uint64))
    assert_same_state(a, b, rng)


def test_module_step_validates_the_same_way():
    fastpath.set_default_engine(None)
    raw = np.zeros(fastpath.get_default_engine().raw_len, np.float32)
    try:
        with pytest.raises(InputError, match="symbol must be an integer"):
            fastpath.step(raw, "BTCUSDT")
        with pytest.raises(InputError, match="ts_ns"):
            fastpath.step(raw, 0, ts_ns=1.0)
        with pytest.raises(InputError, match=CONVERT.replace("(", r"\(").replace(")", r"\)")):
            fastpath.step(raw.astype(np.float64), 0)
        assert fastpath.get_default_engine().ticks == 0
        assert np.isfinite(fastpath.step(raw, np.int64(3)).signal)
    finally:
        fastpath.set_default_engine(None)


def test_readers_refuse_while_step_batch_runs(isa):
    """ticks, stats() and latency_records() are written without the GIL during step_batch:
    reading them then is refused, not torn."""
    rng = np.random.default_rng(5)
    m = windowed_model(rng, hidden=(256, 256))
    eng = Engine(m, config=engine_cfg(isa, enabled=False))
    raws = rng.standard_normal((5_000, m.raw_len)).astype(np.float32)
    syms = np.zeros(len(raws), np.int64)
    stop, refused = threading.Event(), []

    def reader():
        while not stop.is_set():
            for read in (lambda: eng.ticks, eng.stats, eng.latency_records):
                try:
                    read()
                except EngineBusyError as exc:
                    refused.append(str(exc))
                    return

    t = threading.Thread(target=reader)
    t.start()
    # batches until the reader has met one running (a generous deadline for a loaded host)
    batches, deadline = 0, time.monotonic() + 120
    try:
        while not refused and time.monotonic() < deadline:
            eng.step_batch(raws, syms, np.arange(len(raws)) + batches * len(raws))
            batches += 1
    finally:
        stop.set()
        t.join()
    assert refused, "the reader never overlapped a batch in 120 s"
    assert "once step_batch has returned" in refused[0]
    assert eng.ticks == batches * len(raws) and eng.stats()["ticks"] == batches * len(raws)


def test_stats_say_which_cache_policy_is_in_force():
    fastpath.set_default_engine(None)
    demo = fastpath.get_default_engine().stats()["cache_policy"]
    assert demo["enabled"] and demo["origin"].startswith("fitted (max error")
    m = windowed_model(np.random.default_rng(1))
    off = Engine(m.with_cache_policy(fastpath.CachePolicy()), config=engine_cfg("scalar"))
    assert off.stats()["cache_policy"]["origin"] == "off (not fitted)"
    on = Engine(m.with_cache_policy(fastpath.CachePolicy()),
                config={"cache": {"enabled": True, "cos_threshold": 0.9999}})
    st = on.stats()["cache_policy"]
    assert st["enabled"] and st["origin"] == "config" and st["cos_threshold"] == 0.9999


def test_reset_one_symbol_forgets_only_that_symbol(isa):
    """A halt or feed gap on one instrument: reset(symbol) empties its slot, window and last
    timestamp; the other symbols and the counters are untouched."""
    rng = np.random.default_rng(9)
    m = windowed_model(rng)
    a = Engine(m, config=engine_cfg(isa, max_run=1000, max_age_ns=10**12))
    fresh = Engine(m, config=engine_cfg(isa, max_run=1000, max_age_ns=10**12))
    same = Engine(m, config=engine_cfg(isa, max_run=1000, max_age_ns=10**12))
    ticks = rng.standard_normal((20, m.raw_len)).astype(np.float32)
    for i, x in enumerate(ticks):
        for s in (0, 1):
            a.step(x, s, ts_ns=1000 + i)
            same.step(x, s, ts_ns=1000 + i)
        fresh.step(x, 0, ts_ns=1000 + i)    # symbol 0 only: what symbol 1 looks like never seen
    before = a.stats()
    a.reset(np.int64(1))
    after = a.stats()
    assert {k: after[k] for k in ("ticks", "hits", "misses")} == \
        {k: before[k] for k in ("ticks", "hits", "misses")}
    # symbol 1 starts cold: its window holds only the new tick, its slot is empty, and a
    # timestamp earlier than its old last tick is accepted again
    y = ticks[3]
    r1 = a.step(y, 1, ts_ns=5)
    assert r1.miss_reason == "cold"
    cold = Engine(m, config=engine_cfg(isa)).step(y, 1, ts_ns=5)
    assert r1.signal == cold.signal
    np.testing.assert_array_equal(a.features(y, 1), Engine(m, config=engine_cfg(isa)).features(y, 1))
    # symbol 0 kept everything: same features and the same cache decision as an engine that
    # was never reset
    np.testing.assert_array_equal(a.features(y, 0), same.features(y, 0))
    r0a, r0b = a.step(ticks[-1], 0, ts_ns=2000), same.step(ticks[-1], 0, ts_ns=2000)
    assert (r0a.signal, r0a.cached, r0a.miss_reason) == (r0b.signal, r0b.cached, r0b.miss_reason)
    assert r0a.miss_reason != "cold"
    with pytest.raises(InputError, match="symbol 99 out of range"):
        a.reset(99)
    with pytest.raises(InputError, match="symbol must be an integer"):
        a.reset("BTC")


def test_step_with_outside_outputs_matches_step(isa):
    """The path another backend (a GPU) takes: the engine validates, extracts features, looks
    up the cache, and applies the head, store and window commit around outputs computed
    elsewhere; the answer equals the engine's own step, and bad outputs are refused."""
    rng = np.random.default_rng(4)
    m = windowed_model(rng)
    eng = Engine(m, config=engine_cfg(isa, enabled=False))
    ref = Engine(m, config=engine_cfg(isa, enabled=False))
    for i in range(50):
        x = rng.standard_normal(m.raw_len).astype(np.float32)
        want = ref.step(x, 0, ts_ns=i)
        r = eng._step_external(x, 0, m.forward(eng.features(x, 0)), 0, ts_ns=i)
        assert abs(r.signal - want.signal) < 1e-5 and r.latency.infer_ns >= 0
    before = eng.stats()["ticks"]
    with pytest.raises(InputError, match="2 outputs"):
        eng._step_external(x, 0, np.zeros(3, np.float32), 0, ts_ns=100)
    with pytest.raises(InputError, match="not applied"):
        eng._step_external(x, 0, np.array([np.nan, 0], np.float32), 0, ts_ns=100)
    assert eng.stats()["ticks"] == before
