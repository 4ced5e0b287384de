"""A tick the model refuses leaves its symbol's rolling window exactly as it was.

Engine.step commits a tick's window (running sums, ring row, position, count) before the
cache decides, keeping an undo record, and restores that record when the model then refuses
the tick (a hidden layer or an output overflowed, or the features did). These tests refuse
a tick at every ring position (window not yet full, just full, wrapped several times), on
every kernel set, through both refusals, and then step an engine and a twin that never saw
the bad tick through more than a window of ticks: every later signal must be bit-identical,
so a window restored one row off, a sum restored from the wrong record or a count left
advanced would show.
"""
import numpy as np
import pytest

from fastpath import Engine, InputError
from fastpath.model import FeatureSpec, Model
from helpers.builders import engine_cfg
from helpers.refusing_models import overflow_mlp

RAW = 7
Z = [0, 1, 2]   # raw[0] is 0 in every good tick, a huge weight on it overflows layer 1; raw[1]
                # is ~1e-31, its z-score's inv_std 1e30 overflows the features for raw[1] ~ 1e10
W_IDX = [3, 4, 5, 6]


def windowed_model(window: int, cache: bool) -> Model:
    n_feat = len(Z) + 2 * len(W_IDX)
    inv_std = np.ones(n_feat, np.float32)
    inv_std[1] = 1e30
    fs = FeatureSpec(RAW, np.array(Z), np.array(W_IDX), window, np.zeros(n_feat, np.float32),
                     inv_std)
    return overflow_mlp(fs, cache, window)


def counters(eng):
    s = eng.stats()
    return s["ticks"], s["hits"], s["misses"], s["miss_reasons"]


def good_tick(rng) -> np.ndarray:
    x = rng.standard_normal(RAW).astype(np.float32)
    x[0] = 0.0
    x[1] *= np.float32(1e-31)
    return x


@pytest.mark.parametrize("window", [1, 2, 3, 5])
@pytest.mark.parametrize("cache", [False, True])
@pytest.mark.parametrize("how", ["output", "features"])
def test_refused_tick_leaves_the_window_bit_for_bit(isa, window, cache, how):
    model = windowed_model(window, cache)
    rng = np.random.default_rng(17)
    good = [good_tick(rng) for _ in range(4 * window + 8)]
    bad_at = range(0, 3 * window + 2)
    for at in bad_at:
        eng = Engine(model, config=engine_cfg(isa))
        twin = Engine(model, config=engine_cfg(isa))
        t = 0
        for x in good[:at]:
            t += 1000
            eng.step(x, 3, ts_ns=t)
            twin.step(x, 3, ts_ns=t)
        bad = good[at].copy()
        if how == "output":
            bad[0] = 1e10                 # 1e10 * 1e30 overflows the first layer
            match = "model produced NaN/Inf"
        else:
            bad[1] = 1e10                 # 1e10 * 1e30 overflows its z-score
            match = "features overflowed"
        with pytest.raises(InputError, match=match):
            eng.step(bad, 3, ts_ns=t + 500)
        assert eng.stats()["ticks"] == twin.stats()["ticks"] == at
        for x in good[at:at + window + 3]:
            t += 1000
            a, b = eng.step(x, 3, ts_ns=t), twin.step(x, 3, ts_ns=t)
            assert (a.signal, a.confidence, a.cached, a.miss_reason) == \
                   (b.signal, b.confidence, b.cached, b.miss_reason), (at, t)
        assert counters(eng) == counters(twin)


def test_refusal_on_one_symbol_leaves_the_others(isa):
    """The undo record is the engine's, not the symbol's: refusing a tick of one symbol right
    after another symbol's tick restores only the refused symbol's window."""
    model = windowed_model(3, True)
    rng = np.random.default_rng(5)
    eng = Engine(model, config=engine_cfg(isa))
    twin = Engine(model, config=engine_cfg(isa))
    t = 0
    for i in range(10):
        x = good_tick(rng)
        t += 1000
        eng.step(x, i % 2, ts_ns=t)
        twin.step(x, i % 2, ts_ns=t)
    bad = good_tick(rng)
    bad[0] = 1e10
    with pytest.raises(InputError):
        eng.step(bad, 0, ts_ns=t + 1)
    for i in range(12):
        x = good_tick(rng)
        t += 1000
        a, b = eng.step(x, i % 2, ts_ns=t), twin.step(x, i % 2, ts_ns=t)
        assert (a.signal, a.confidence, a.cached) == (b.signal, b.confidence, b.cached)
