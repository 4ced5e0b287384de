"""The public Python API as a user calls it: the paths that must agree (fastpath.step,
Engine.step, step_batch whole / split / one tick at a time, Engine.features with
Engine.predict and the head), what a refused call leaves behind, the argument edges of
Engine.features / predict / step_batch / step, and the kernel shims' index arguments, on
every kernel set."""
import array
import enum
import os
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import fastpath
import fastpath._kernels as K
from fastpath import Engine, InputError, Layer, Model
from fastpath._build import DEMO_MODEL
from helpers.builders import ISAS

F32 = np.float32


def _engine(isa, **cache):
    cfg = {"engine": {"simd": isa, "n_symbols": 8}}
    if cache:
        cfg["cache"] = cache
    return Engine(DEMO_MODEL, config=cfg)


def _raws(n, seed=0):
    return np.random.default_rng(seed).standard_normal((n, 256)).astype(F32)


def _overflowing_tick(eng, raw, symbol):
    """A finite copy of raw whose features overflow to Inf (one field at float32's edge),
    found by step() refusing it on a scratch engine with the same history."""
    for i in range(256):
        r = raw.copy()
        r[i] = 3e38
        probe = Engine(eng.model, config={"engine": {"simd": eng.simd, "n_symbols": 8}})
        try:
            probe.step(r, symbol, 1)
        except InputError as exc:
            if "features overflowed" in str(exc):
                return r
    raise AssertionError("no field of the demo model's spec overflows at 3e38")


def test_features_refuse_a_tick_whose_features_overflow_as_step_does(isa):
    """Defect guarded: Engine.features returned +-Inf features for a finite tick whose features
    overflow, where step() refuses it; features() raises the same InputError."""
    eng = _engine(isa)
    raws = _raws(3)
    eng.step(raws[0], 2, 10)
    bad = _overflowing_tick(eng, raws[1], 2)
    with pytest.raises(InputError, match="features overflowed") as step_exc:
        eng.step(bad, 2, 20)
    with pytest.raises(InputError, match="features overflowed") as feat_exc:
        eng.features(bad, 2)
    assert str(feat_exc.value) == str(step_exc.value)
    # nothing applied by either refusal: the next tick answers as on an engine that never saw it
    fresh = _engine(isa)
    fresh.step(raws[0], 2, 10)
    np.testing.assert_array_equal(eng.features(raws[2], 2), fresh.features(raws[2], 2))
    assert eng.step(raws[2], 2, 30).signal == fresh.step(raws[2], 2, 30).signal
    assert eng.ticks == fresh.ticks == 2


def test_predict_names_a_float64_value_past_float32s_range(isa):
    """Defect guarded: predict() of a float64 value past float32's range (1e39) reported an Inf
    the caller never passed and let numpy's cast warning out; it names the value and float32's
    range, and warns nothing."""
    eng = _engine(isa)
    x = np.zeros(eng.n_features)
    x[5] = -1e39
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(InputError, match=r"x\[5\] = -1e\+39 is beyond float32's range"):
            eng.predict(x)
    # a real Inf is still the non-finite message, and a value inside the range still answers
    x[5] = np.inf
    with pytest.raises(InputError, match="non-finite values, first at index 5"):
        eng.predict(x)
    x[5] = 1.0
    np.testing.assert_array_equal(eng.predict(x), eng.predict(x.astype(F32)))


@pytest.mark.parametrize("syms, ts, match", [
    ([0, 2 ** 70], None, r"row 1: symbol 1180591620717411303424 out of range"),
    ([0, -(2 ** 70)], None, r"row 1: symbol -1180591620717411303424 out of range"),
    ([0, 1], [5, 2 ** 64], r"ts_ns row 1 is 18446744073709551616, which does not fit"),
    ([0, 1], [5, -(2 ** 70)], r"ts_ns must be >= 0, row 1 is -1180591620717411303424"),
    (np.array([0, 1], object), None, r"got object shape \(2,\); convert with np\.asarray\("
                                     r"symbols, dtype=np\.int64\)"),
    ([0, 1], np.array([5, 6], object), r"got object shape \(2,\); convert with np\.asarray\("
                                       r"ts_ns, dtype=np\.int64\)"),
])
def test_step_batch_names_an_integer_numpy_kept_as_an_object(syms, ts, match):
    """Defect guarded: step_batch with an int past int64 among the symbols or timestamps (an
    object array) gave a message about the dtype, or none for ts_ns; it names the row and the
    value, and an object array of small ints says how to convert."""
    eng = _engine(ISAS[0])
    with pytest.raises(InputError, match=match):
        eng.step_batch(_raws(2), syms, ts)
    assert eng.ticks == 0


def test_step_batch_still_names_strings_as_symbols():
    eng = _engine(ISAS[0])
    with pytest.raises(InputError, match="map names to indices once"):
        eng.step_batch(_raws(2), ["BTC", "ETH"])
    with pytest.raises(InputError, match="map names to indices once"):
        eng.step_batch(_raws(2), np.array(["BTC", 1], object))


@pytest.mark.parametrize("make, hint", [
    (lambda r: memoryview(r), "np.ascontiguousarray(x, dtype=np.float32)"),
    (lambda r: array.array("f", r.tolist()), "np.ascontiguousarray(x, dtype=np.float32)"),
    (lambda r: r.tobytes(), "np.frombuffer(x, dtype=np.float32)"),
    (lambda r: bytearray(r.tobytes()), "np.frombuffer(x, dtype=np.float32)"),
])
def test_raw_buffers_get_a_conversion_hint(make, hint):
    """Defect guarded: a memoryview, array.array or bytes raw was refused with no advice; the
    message names the conversion to use."""
    eng = _engine(ISAS[0])
    raw = _raws(1)[0]
    x = make(raw)
    for call in (lambda: eng.step(x, 1), lambda: fastpath.step(x, 1), lambda: eng.features(x)):
        with pytest.raises(InputError, match="convert with " + __import__("re").escape(hint)):
            call()
    # and the advice works
    fixed = (np.frombuffer(x, dtype=F32) if isinstance(x, (bytes, bytearray))
             else np.ascontiguousarray(x, dtype=F32))
    assert eng.step(fixed, 1).signal == _engine(ISAS[0]).step(raw, 1).signal


class _Ts(enum.IntEnum):
    A = 1_000
    B = 2_000


class _Ns(int):
    pass


def test_ts_ns_takes_any_int_but_bool(isa):
    """Defect guarded: ts_ns refused an IntEnum or another int subclass although it is an int
    (symbol takes them); it is read by value, and bool is still refused."""
    a, b = _engine(isa), _engine(isa)
    raws = _raws(2)
    for raw, ts in zip(raws, (_Ts.A, _Ns(2_000))):
        assert a.step(raw, 3, ts).signal == b.step(raw, 3, int(ts)).signal
    with pytest.raises(InputError, match="earlier than the last tick"):
        a.step(raws[0], 3, _Ts.B - 1)
    with pytest.raises(InputError, match="got bool"):
        a.step(raws[0], 3, True)
    assert a.stats()["ticks"] == b.stats()["ticks"] == 2


@pytest.mark.parametrize("idx, match", [
    (np.array([2 ** 32 + 3]), "must index raw"),
    (np.array([-1]), "must index raw"),
    (np.array([1.7]), "must be a 1-d integer array"),
    (np.array([[1]]), "must be a 1-d integer array"),
])
def test_kernel_shims_check_indices_before_the_int32_cast(isa, idx, match):
    """Defect guarded: the kernel shims cast index arrays to int32 before checking them, so an
    index of 2**32 + 3 read raw[3] and 1.7 read raw[1], silently; such indices are InputErrors."""
    raw = np.arange(4, dtype=F32)
    one = np.ones(1, F32)
    zero = np.zeros(1, F32)
    for fn in (K.kernel_zscore_gather, K.kernel_zscore_runs, K.kernel_zscore_perm):
        with pytest.raises(InputError, match="idx " + match):
            fn(isa, raw, idx, zero, one)
    with pytest.raises(InputError, match="w_idx " + match):
        K.kernel_window_commit(isa, raw, idx, [0.0], [0.0], [0.0], True)
    with pytest.raises(InputError, match="w_idx " + match):
        K.kernel_window_stats(isa, raw, idx, [0.0], [0.0], None, 1.0)
    with pytest.raises(InputError, match="w_idx " + match):
        K.kernel_window_zscore(isa, raw, idx, [0.0], [0.0], None, 1.0, np.zeros(2, F32),
                               np.ones(2, F32))
    # a valid index still reads the value numpy reads
    np.testing.assert_array_equal(K.kernel_zscore_gather(isa, raw, np.array([3]), zero, one),
                                  raw[[3]])


def test_kernel_dense_of_no_inputs_is_an_input_error(isa):
    """Defect guarded: kernel_dense of a layer with no inputs raised MemoryError; it is an
    InputError saying a layer needs an input."""
    with pytest.raises(InputError, match="at least one input"):
        K.kernel_dense(isa, np.zeros((1, 0), F32), np.zeros(1, F32), "relu", np.zeros(0, F32))


# ------------------------------------------------------------------ paths that must agree
def _stream(seed, n):
    """A multi-symbol stream with repeats (so the fitted cache hits) and duplicate symbols."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((4, 256)).astype(F32)
    syms = rng.integers(0, 4, n)
    # most rows a near repeat of their symbol's base (hits), some far from it (cosine misses)
    scale = rng.choice([1e-4, 0.5], n, p=[0.95, 0.05])[:, None]
    raws = base[syms] + (rng.standard_normal((n, 256)) * scale).astype(F32)
    ts = 1 + np.cumsum(rng.integers(0, 3_000_000, n)).astype(np.int64)
    return np.ascontiguousarray(raws), syms, ts


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2 ** 32 - 1), cuts=st.lists(st.integers(0, 60), max_size=6))
def test_every_path_answers_the_same_on_every_kernel_set(seed, cuts):
    """step, fastpath.step, step_batch whole / at random cuts / one row at a time, and
    features -> predict -> head (on a miss) give the same signal, confidence and hit."""
    raws, syms, ts = _stream(seed, 60)
    bounds = sorted(set([0, 60] + cuts))
    for isa in ISAS:
        a = _engine(isa)                      # the demo model's fitted cache policy: on
        ref = [a.step(r, s, t) for r, s, t in zip(raws, syms, ts)]
        sig = np.array([r.signal for r in ref], F32)
        conf = np.array([r.confidence for r in ref], F32)
        hit = np.array([r.cached for r in ref])
        whole = _engine(isa).step_batch(raws, syms, ts)
        c = _engine(isa)
        parts = [c.step_batch(raws[i:j], syms[i:j], ts[i:j]) for i, j in zip(bounds, bounds[1:])]
        d = _engine(isa)
        ones = [d.step_batch(raws[i:i + 1], syms[i:i + 1].astype(np.uint8), ts[i:i + 1])
                for i in range(60)]
        fastpath.set_default_engine(_engine(isa))
        try:
            mod = [fastpath.step(r, np.int64(s), np.uint64(t)) for r, s, t in zip(raws, syms, ts)]
        finally:
            fastpath.set_default_engine(None)
        for got in (whole, parts, ones):
            if isinstance(got, list):
                got = [np.concatenate(x) for x in zip(*got)]
            np.testing.assert_array_equal(got[0], sig)
            np.testing.assert_array_equal(got[1], conf)
            np.testing.assert_array_equal(got[2], hit)
        assert [r.signal for r in mod] == [r.signal for r in ref]
        assert a.stats()["miss_reasons"] == c.stats()["miss_reasons"] == d.stats()["miss_reasons"]
        # features -> predict -> head on a fresh engine, tick by tick (the cache off: every
        # tick is a miss, and must be what step() answered on a miss)
        e = _engine(isa, enabled=False)
        for r, s, t in zip(raws, syms, ts):
            out = e.predict(e.features(r, s))
            got = e.step(r, s, t)
            want = e.model.signal(out)
            assert abs(got.signal - float(want[0])) <= 2e-7
            assert abs(got.confidence - float(want[1])) <= 2e-7


def test_refused_calls_leave_counters_records_and_state_as_they_were(isa):
    """Every refusal a user can provoke before the model runs changes nothing a later call
    can see: ticks, hits, miss reasons, latency records, the windows (features) and the
    cache (the next answer)."""
    raws, syms, ts = _stream(5, 20)
    eng, fresh = _engine(isa), _engine(isa)
    for e in (eng, fresh):
        e.step_batch(raws[:10], syms[:10], ts[:10])
    before = eng.stats()
    rec = eng.latency_records()
    nan = raws[10].copy()
    nan[7] = np.nan
    s0, t = int(syms[0]), int(ts[10])       # a symbol already stepped (at ts[0] >= 1)
    refusals = [
        lambda: eng.step(nan, s0, t),
        lambda: eng.step(raws[10], s0, 0),                      # time backwards
        lambda: eng.step(raws[10], 8, t),
        lambda: eng.step(raws[10], float(s0), t),
        lambda: eng.step(raws[10].astype(np.float64), s0),
        lambda: eng.step(raws[10], s0, -1),
        lambda: eng.step_batch(np.stack([raws[10], nan]), [s0, s0], ts[10:12]),
        lambda: eng.step_batch(raws[10:12], [s0, 9], ts[10:12]),
        lambda: eng.step_batch(raws[10:12], [s0, s0], [t, 0]),
        lambda: eng.step_batch(raws[10:12], [s0, 2 ** 70], ts[10:12]),
        lambda: eng.features(nan, s0),
        lambda: eng.features(_overflowing_tick(eng, raws[10], s0), s0),
        lambda: eng.predict(np.full(eng.n_features, np.nan, F32)),
        lambda: eng.reset(9),
        lambda: eng.reset(True),
    ]
    for call in refusals:
        with pytest.raises(InputError):
            call()
    after = eng.stats()
    for key in ("ticks", "hits", "misses", "miss_reasons"):
        assert after[key] == before[key], key
    np.testing.assert_array_equal(eng.latency_records(), rec)
    for r, s in zip(raws[10:], syms[10:]):
        np.testing.assert_array_equal(eng.features(r, s), fresh.features(r, s))
    np.testing.assert_array_equal(eng.step_batch(raws[10:], syms[10:], ts[10:]).signal,
                                  fresh.step_batch(raws[10:], syms[10:], ts[10:]).signal)


def test_masked_values_are_refused_not_read(isa):
    """Defect guarded: a numpy masked array was stepped (and predicted, and batched) with the
    data under its mask as if valid; masked values are an InputError that counts them, and a
    masked array with nothing masked is still read."""
    eng, fresh = _engine(isa), _engine(isa)
    raws = _raws(2)
    m = np.ma.array(raws[0].copy())
    m[5] = np.ma.masked
    for call in (lambda: eng.step(m, 1, 5), lambda: eng.features(m, 1),
                 lambda: eng.step_batch(np.ma.array(raws, mask=np.eye(2, 256, dtype=bool)),
                                        [1, 2], [5, 6])):
        with pytest.raises(InputError, match=r"masked array with \d+ masked value"):
            call()
    x = np.ma.array(np.zeros(eng.n_features, F32))
    x[0] = np.ma.masked
    with pytest.raises(InputError, match="masked array with 1 masked value"):
        eng.predict(x)
    assert eng.ticks == 0
    # nothing masked: read as the plain array
    assert eng.step(np.ma.array(raws[1]), 1, 7).signal == fresh.step(raws[1], 1, 7).signal
    np.testing.assert_array_equal(eng.predict(np.ma.array(np.zeros(eng.n_features, F32))),
                                  fresh.predict(np.zeros(eng.n_features, F32)))


def _mlp(acts=("relu", "identity"), dims=(3, 4, 2), post="none", seed=0):
    rng = np.random.default_rng(seed)
    return Model(tuple(Layer(rng.normal(size=(dims[i + 1], dims[i])),
                             rng.normal(size=dims[i + 1]), acts[i])
                       for i in range(len(dims) - 1)), post=post)


def test_engine_takes_a_bytes_path_as_model_load_does(tmp_path):
    """Model.load / Model.from_onnx take a bytes path (as open() does); Engine(b"m.fpm") was
    "model must be a fastpath.Model or a path to .onnx / .fpm, got bytes"."""
    m = _mlp()
    p = str(tmp_path / "m.fpm")
    m.save(p)
    assert fastpath.Engine(os.fsencode(p)).model == m
    pytest.importorskip("onnx")
    q = str(tmp_path / "m.onnx")
    m.to_onnx(q)
    assert fastpath.Engine(os.fsencode(q)).model.layers == m.layers
