"""Ticks whose features, hidden layers or outputs are NaN/Inf are refused on every kernel set.

A model that overflows (weights ~1e30 against inputs ~1e10, as an imported ONNX model can)
must never turn the overflow into a full-conviction signal: ReLU maps a NaN hidden unit to 0,
tanh maps +Inf to 1, and a vector exp whose clamp drops NaN answers -1 where libm answers NaN.
Each case checks the refusal (InputError), then that the engine is exactly as before: its
counters, and every later decision compared against a twin engine that never saw the tick
(same cache hits, same signals, same windows).
"""
import numpy as np
import pytest

from fastpath import Engine, InputError
from fastpath import _kernels as K
from fastpath.model import CachePolicy, FeatureSpec, Layer, Model
from helpers.builders import ISAS, engine_cfg

POLICY = CachePolicy(enabled=True, cos_threshold=0.999, norm_tol=0.02, max_age_ns=10**12,
                     max_run=1000)


def _model(layers, fs=None):
    return Model(tuple(layers), fs, POLICY)


def overflow_model(hidden_act="relu"):
    """2 -> 4 -> 2: the first layer overflows float32 for inputs ~1e10 (1e30 * 1e10)."""
    w1 = np.array([[1e30, 0], [-1e30, 0], [1e30, 1e30], [1, 1]], np.float32)
    w2 = np.array([[1, -1, 1, 1e-3], [1, 1, -1, 1e-3]], np.float32)
    return _model([Layer(w1, np.zeros(4, np.float32), hidden_act),
                   Layer(w2, np.zeros(2, np.float32), "identity")])


def middle_overflow_model():
    """2 -> 8 -> 8 -> 2 with huge weights in the middle layer only: layer 1 is finite, layer 2
    overflows to +-Inf for inputs ~1e9, and its tanh would squash that to a finite +-1."""
    rng = np.random.default_rng(3)
    w3 = rng.standard_normal((2, 8)).astype(np.float32)
    z = np.zeros
    return _model([Layer(np.ones((8, 2), np.float32), z(8, np.float32), "identity"),
                   Layer(np.full((8, 8), 1e30, np.float32), z(8, np.float32), "tanh"),
                   Layer(w3, z(2, np.float32), "identity")])


def feature_overflow_model():
    """Finite raw values whose features overflow: z-score inv_std 1e30, and a rolling window
    whose sum of squares overflows float32 when its std is taken."""
    fs = FeatureSpec(4, np.array([0, 1]), np.array([2]), 3, np.zeros(4, np.float32),
                     np.array([1e30, 1, 1, 1], np.float32))
    rng = np.random.default_rng(5)
    w1 = rng.standard_normal((8, 4)).astype(np.float32)
    w2 = rng.standard_normal((2, 8)).astype(np.float32)
    return _model([Layer(w1, np.zeros(8, np.float32), "relu"),
                   Layer(w2, np.zeros(2, np.float32), "identity")], fs)


def _good_ticks(n_in, rng, n=12):
    return [(rng.standard_normal(n_in) * 0.5).astype(np.float32) for _ in range(n)]


def _state(eng):
    s = eng.stats()
    return (s["ticks"], s["hits"], s["misses"], tuple(sorted(s["miss_reasons"].items())))


def check_refused_and_untouched(model, isa, bad, good, sym=0, match="not applied"):
    """Prime an engine and its twin with the same ticks, hit the engine with `bad` (must be
    refused), then step both through the same ticks: every result must match exactly."""
    eng = Engine(model, config=engine_cfg(isa))
    twin = Engine(model, config=engine_cfg(isa))
    t = 0
    for x in good[:4]:
        t += 1000
        eng.step(x, sym, ts_ns=t)
        twin.step(x, sym, ts_ns=t)
    before = _state(eng)
    with pytest.raises(InputError, match=match) as ei:
        eng.step(np.asarray(bad, np.float32), sym, ts_ns=t + 500)
    assert "not applied" in str(ei.value)
    assert _state(eng) == before
    # the repeated tick tests the cache slot (a stored NaN result would hit here), the rest
    # the windows and the slot's age
    for x in [good[3]] + good[4:]:
        t += 1000
        a, b = eng.step(x, sym, ts_ns=t), twin.step(x, sym, ts_ns=t)
        assert (a.signal, a.confidence, a.cached, a.miss_reason) == \
               (b.signal, b.confidence, b.cached, b.miss_reason)
    assert _state(eng) == _state(twin)


@pytest.mark.parametrize("bad", [[1e10, 0], [1e10, 1e10], [-1e10, 1e10], [1e10, -1e10]])
@pytest.mark.parametrize("act", ["relu", "tanh", "sigmoid", "identity"])
def test_overflowing_hidden_layer_is_refused(isa, bad, act):
    rng = np.random.default_rng(1)
    check_refused_and_untouched(overflow_model(act), isa, bad, _good_ticks(2, rng),
                                match="model produced NaN/Inf")


@pytest.mark.parametrize("bad", [[1e10, 0], [1e9, 1e9], [-1e10, -1e10]])
def test_overflow_in_a_middle_layer_is_refused(isa, bad):
    rng = np.random.default_rng(2)
    # tiny good ticks keep the middle layer finite (8 * 1e30 * 1e-6)
    good = [(rng.standard_normal(2) * 1e-6).astype(np.float32) for _ in range(12)]
    check_refused_and_untouched(middle_overflow_model(), isa, bad, good)


@pytest.mark.parametrize("bad", [[1e10, 0, 0, 0], [0, 0, 1e30, 0], [-3e38, 0, 3e38, 0]])
def test_overflowing_features_are_refused(isa, bad):
    rng = np.random.default_rng(4)
    good = [np.concatenate([rng.standard_normal(1) * 1e-31, rng.standard_normal(3)]).astype(np.float32)
            for _ in range(12)]
    # the slot is warm and fresh, so the lookup runs on the bad features: a NaN key must
    # miss (it fails no comparison) and the tick be refused, naming the features
    check_refused_and_untouched(feature_overflow_model(), isa, bad, good, match="features overflowed")


def test_batch_refuses_overflow_and_keeps_earlier_rows(isa):
    """In step_batch the bad row is reported; rows before it are applied, it and later ones not."""
    m = overflow_model()
    eng = Engine(m, config=engine_cfg(isa))
    twin = Engine(m, config=engine_cfg(isa))
    rng = np.random.default_rng(6)
    good = np.array(_good_ticks(2, rng, 4))
    raws = np.vstack([good[:2], [[1e10, 1e10]], good[2:]]).astype(np.float32)
    with pytest.raises(InputError, match="row 2"):
        eng.step_batch(raws, np.zeros(5, np.int64), np.arange(5) * 1000)
    twin.step_batch(raws[:2], np.zeros(2, np.int64), np.arange(2) * 1000)
    assert _state(eng) == _state(twin)


@pytest.mark.parametrize("act", ["identity", "relu", "tanh", "sigmoid"])
def test_dense_flags_nonfinite_preactivations(isa, act):
    """The dense kernel's own flag: set for finite pre-activations, cleared by NaN/Inf in any
    row (first, middle, last, in a padded last block), whatever the activation hides."""
    rng = np.random.default_rng(7)
    for n_out in (1, 8, 13, 33, 40):
        w = rng.standard_normal((n_out, 5)).astype(np.float32)
        b = rng.standard_normal(n_out).astype(np.float32)
        x = rng.standard_normal(5).astype(np.float32)
        for reverse in (False, True):
            _, ok = K.kernel_dense(isa, w, b, act, x, reverse)
            assert ok
            for row in {0, n_out // 2, n_out - 1}:
                for big in (3e38, -3e38, np.nan):
                    w2 = w.copy()
                    w2[row] = big
                    _, ok = K.kernel_dense(isa, w2, b, act, np.abs(x) + 1, reverse)
                    assert not ok, (n_out, row, big, reverse)


EDGES = np.array([-np.inf, -1e30, -100, -88.8, -87, -20, -1, -1e-7, 0, 1e-7, 1, 20, 87, 88.8,
                  100, 1e30, np.inf, np.nan], np.float32)


@pytest.mark.parametrize("act", ["tanh", "sigmoid"])
def test_activation_limits_and_nan(isa, act):
    """The activation (vector or libm) at +-Inf gives the limits and NaN stays NaN, as numpy."""
    with np.errstate(over="ignore", invalid="ignore"):
        want = np.tanh(EDGES.astype(np.float64)) if act == "tanh" else \
            1 / (1 + np.exp(-EDGES.astype(np.float64)))
    # identity weight: the pre-activation is the edge value itself
    got = np.array([K.kernel_dense(isa, np.ones((1, 1), np.float32), np.zeros(1, np.float32),
                                   act, np.array([v], np.float32))[0][0] for v in EDGES])
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)
    assert np.array_equal(np.isnan(got), np.isnan(EDGES))
    lim = {"tanh": (-1.0, 1.0), "sigmoid": (0.0, 1.0)}[act]
    assert (got[0], got[-2]) == lim


def test_head_limits_and_nan(isa):
    for v, s_want, c_want in ((np.inf, 1.0, 1.0), (-np.inf, -1.0, 0.0)):
        assert K.kernel_head(isa, v, v) == (s_want, c_want)
    s, c = K.kernel_head(isa, np.nan, np.nan)
    assert np.isnan(s) and np.isnan(c)


def test_every_kernel_set_agrees_on_refusal():
    """Defect guarded: AVX2 answered an overflowing tick that the other sets refused; every set
    refuses it."""
    for bad in ([1e10, 0], [1e10, 1e10]):
        for isa in ISAS:
            eng = Engine(overflow_model(), config=engine_cfg(isa))
            with pytest.raises(InputError):
                eng.step(np.array(bad, np.float32), 0, ts_ns=1)
