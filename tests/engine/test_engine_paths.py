"""One model, every in-process path: the same tick stream (several symbols interleaved, refused
NaN ticks, repeated ticks that hit the cache) through Engine.step, fastpath.step, step_batch
(symbols of every integer dtype, with and without ts_ns) and _step_external with
predict(features()), after reset and after refused input, for every model kind, compared bit
for bit between paths and against the numpy reference (FeatureSpec.apply + Model.forward +
the head) within a tolerance. The serving client, the CLI server and the GPU backend are held
to the same streams in tests/serve, tests/cli and tests/gpu."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import fastpath
from fastpath import Engine, FeatureSpec, InputError, Layer, Model
from fastpath.model.types import Head
from helpers.builders import ISAS
from helpers.paths import (assert_same, batch_greedy, batch_outcomes, cfg, counters, F, _fs,
                           good_rows, hyp_stream, KINDS, make_model, make_stream, _mlp, RAW_LEN,
                           run_ticks, strip_refused, TICK)


@pytest.mark.parametrize("kind", KINDS)
def test_in_process_paths_agree_bit_for_bit(kind, isa):
    m = make_model(kind)
    raws, syms, ts, bad = make_stream(2)
    eng = Engine(m, config=cfg(isa))
    want = run_ticks(eng.step, raws, syms, ts)
    assert [o == "refused" for o in want] == list(bad)
    assert sum(o[2] for o in want if o != "refused") > 10, "the stream must hit the cache"
    want_cnt = counters(eng)

    # the module-level step through the default engine
    d = Engine(m, config=cfg(isa))
    fastpath.set_default_engine(d)
    try:
        assert_same(run_ticks(fastpath.step, raws, syms, ts), want, "fastpath.step")
    finally:
        fastpath.set_default_engine(None)
    assert counters(d) == want_cnt

    # step_batch over the accepted rows, symbols of every integer dtype, in one call and in
    # chunks; a batch holding a refused row applies nothing
    R, S, T = good_rows(raws, syms, ts, bad)
    for dt in (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64,
               np.dtype(">i4"), np.dtype(">u8")):
        b = Engine(m, config=cfg(isa))
        with pytest.raises(InputError, match="no row was applied"):
            b.step_batch(raws, syms.astype(dt), ts)
        assert b.ticks == 0
        got = batch_outcomes(b.step_batch(R, S.astype(dt), T))
        assert_same(got, strip_refused(want), f"step_batch symbols {np.dtype(dt)}")
        assert counters(b) == want_cnt
    b = Engine(m, config=cfg(isa))
    got = []
    for lo in range(0, len(R), 7):
        got += batch_outcomes(b.step_batch(R[lo:lo + 7], list(S[lo:lo + 7]), list(T[lo:lo + 7])))
    assert_same(got, strip_refused(want), "step_batch in chunks")

    # the outside-model path (what a GPU backend takes) fed by predict(features())
    x = Engine(m, config=cfg(isa))

    def external(raw, sym, t):
        return x._step_external(raw, sym, x.predict(x.features(raw, sym)), 1, t)
    assert_same(run_ticks(external, raws, syms, ts), want, "_step_external(predict(features))")
    assert counters(x) == want_cnt

    # reset: the engine answers as a fresh one
    eng.reset()
    assert eng.ticks == 0
    assert_same(run_ticks(eng.step, raws, syms, ts), want, "after reset()")
    assert counters(eng) == want_cnt


@pytest.mark.parametrize("kind", KINDS)
def test_paths_match_the_numpy_reference(kind, isa):
    m = make_model(kind)
    raws, syms, ts, bad = make_stream(3)
    R, S, T = good_rows(raws, syms, ts, bad)
    eng = Engine(m, config=cfg(isa))
    nocache = Engine(m, config=cfg(isa, cache={"enabled": False}))
    feats = m.feature_spec.apply(R, S)
    out = m.forward(feats)
    # reduced-precision hidden weights move the outputs; Model.forward is float32 throughout
    tol = 2e-2 if m.weights != "fp32" else 2e-5
    last = {}
    for i in range(len(R)):
        f = eng.features(R[i], int(S[i]))
        np.testing.assert_allclose(f, feats[i], rtol=1e-5, atol=1e-5)
        # the model's reference on the engine's own features: one a last bit off the numpy
        # reference's may cross a tree's split threshold
        ref = m.forward(f)
        if m.trees is None:
            np.testing.assert_allclose(ref, out[i], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(eng.predict(f), ref, rtol=tol, atol=tol)
        r = eng.step(R[i], int(S[i]), int(T[i]))
        n = nocache.step(R[i], int(S[i]), int(T[i]))
        assert not n.cached and n.miss_reason == "disabled"
        if r.cached:
            assert (r.signal, r.confidence) == last[int(S[i])]
        else:
            # a miss answers exactly what the cache-off engine answers
            assert (r.signal, r.confidence) == (n.signal, n.confidence)
            last[int(S[i])] = (r.signal, r.confidence)
        rs, rc = m.head_spec.apply(ref)
        assert abs(n.signal - rs) <= tol and abs(n.confidence - rc) <= tol, (i, n)
    s = nocache.stats()
    assert s["hits"] == 0 and s["miss_reasons"]["disabled"] == len(R) == s["ticks"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ticks=st.lists(TICK, min_size=1, max_size=60), seed=st.integers(0, 2**16),
       kind=st.sampled_from(KINDS), isa=st.sampled_from(ISAS), with_ts=st.booleans())
def test_hypothesis_streams_step_batch_and_external_agree(ticks, seed, kind, isa, with_ts):
    raws, syms, ts = hyp_stream(ticks, seed)
    if not with_ts:
        ts = None
    m = make_model(kind)
    eng = Engine(m, config=cfg(isa))
    want = run_ticks(eng.step, raws, syms, ts)
    b = Engine(m, config=cfg(isa))
    assert_same(batch_greedy(b, raws, syms, ts), [o if o == "refused" else o[:3] for o in want],
                "step_batch")
    assert counters(b) == counters(eng)
    x = Engine(m, config=cfg(isa))

    def external(raw, sym, t):
        return x._step_external(raw, sym, x.predict(x.features(raw, sym)), 1, t)
    assert_same(run_ticks(external, raws, syms, ts), want, "_step_external(predict(features))")
    assert counters(x) == counters(eng)
    d = Engine(m, config=cfg(isa))
    fastpath.set_default_engine(d)
    try:
        assert_same(run_ticks(fastpath.step, raws, syms, ts), want, "fastpath.step")
    finally:
        fastpath.set_default_engine(None)


@pytest.mark.parametrize("kind", ["acts", "int8", "trees_clf3"])
def test_step_batch_stopped_by_the_model_stage_keeps_the_applied_rows_answers(kind, isa):
    """Defect guarded: when the model stage refused row 5 of a batch (finite raw, overflowing
    features), rows 0..4 were applied but their answers dropped, so stepping them again applied
    them twice; the InputError carries .applied and .result."""
    m = make_model(kind)
    raws, syms, ts, _ = make_stream(8, n=12, nan_every=0)
    raws[5] = F(3.4e38)
    ref = Engine(m, config=cfg(isa))
    want = run_ticks(ref.step, raws, syms, ts)
    assert want[5] == "refused" and "refused" not in want[:5]
    eng = Engine(m, config=cfg(isa))
    with pytest.raises(InputError, match=r"row 5: .*rows 0\.\.4 were applied") as ei:
        eng.step_batch(raws, syms.astype(np.int32), ts)
    assert ei.value.applied == 5
    assert batch_outcomes(ei.value.result) == strip_refused(want[:5])
    assert ei.value.result.total_ns.shape == (5,)
    # the engine is where step() left it: the rest of the stream answers alike
    assert eng.ticks == 5
    assert_same(run_ticks(eng.step, raws[6:], syms[6:], ts[6:]), want[6:], "after the stop")
    # refused by the pre-check: nothing applied, an empty result
    with pytest.raises(InputError, match="row 1: .*no row was applied") as ei:
        eng.step_batch(raws[:2], np.array([0, 99]), ts[-2:] + 1)
    assert ei.value.applied == 0 and len(ei.value.result.signal) == 0
    with pytest.raises(InputError, match="ts_ns must be >= 0, row 1 is -5") as ei:
        eng.step_batch(raws[:2], syms[:2], [ts[-1] + 1, -5])
    assert ei.value.applied == 0 and len(ei.value.result.signal) == 0


def test_demo_model_and_a_copy_built_from_its_arrays_answer_alike(isa):
    from fastpath._build import DEMO_MODEL
    d = fastpath.get_default_engine()
    m = d.model
    copy = Model(tuple(Layer(np.array(l.weight), np.array(l.bias), l.activation)
                       for l in m.layers),
                 FeatureSpec(m.feature_spec.raw_len, np.array(m.feature_spec.z_idx),
                             np.array(m.feature_spec.w_idx), m.feature_spec.window,
                             np.array(m.feature_spec.mean), np.array(m.feature_spec.inv_std)),
                 m.cache_policy, post=m.post, head_spec=m.head_spec)
    rng = np.random.default_rng(11)
    base = rng.standard_normal((3, d.raw_len)).astype(F)
    idx = rng.integers(0, 3, 200)
    raws = np.ascontiguousarray(base[idx])
    raws[::3] += F(1e-6) * rng.standard_normal((len(raws[::3]), d.raw_len)).astype(F)
    syms, ts = idx, 10**9 + np.arange(200, dtype=np.int64) * 1000
    c = {"engine": {"simd": isa}}
    want = run_ticks(Engine(DEMO_MODEL, config=c).step, raws, syms, ts)
    assert sum(o[2] for o in want) > 20
    assert_same(run_ticks(Engine(copy, config=c).step, raws, syms, ts), want, "copy")
    assert_same(run_ticks(Engine(Model.from_bytes(m.to_bytes()), config=c).step, raws, syms,
                          ts), want, "bundle bytes")
    if isa == d.simd:
        fastpath.set_default_engine(None)
        try:
            assert_same(run_ticks(fastpath.step, raws, syms, ts), want, "fastpath.step")
        finally:
            fastpath.set_default_engine(None)


def test_check_batch_refuses_what_step_batch_refuses_and_applies_nothing(isa):
    # Engine._check_batch: step_batch's checks alone, for a caller that applies rows itself
    # (GpuEngine.step_batch checked time only within the batch: a row behind the engine's
    # last tick of its symbol was found after the rows before it had been applied)
    m = make_model("acts")
    raws, syms, ts, _ = make_stream(13, n=6, nan_every=0)
    eng = Engine(m, config=cfg(isa))
    eng.step(raws[0], 0, 10_000)
    for args, match in [((raws[1:3], np.array([1, 0]), np.array([20_000, 500])),
                         r"row 1: ts_ns 500 is earlier than the last tick of symbol 0"),
                        ((raws[1:3], np.array([1, 9]), None), r"row 1: symbol 9 out of range"),
                        ((np.where(np.arange(RAW_LEN) == 4, np.inf, raws[1:3]).astype(F),
                          [2, 3], None), r"row 0: raw contains 1 non-finite")]:
        with pytest.raises(InputError, match=match + ".*no row was applied") as ei:
            eng._check_batch(*args)
        assert ei.value.applied == 0
        with pytest.raises(InputError, match=match + ".*no row was applied"):
            eng.step_batch(*args)
        assert eng.ticks == 1
    R, S, T = eng._check_batch(raws[1:4], np.array([1, 0, 1], np.uint64), [20_000, 20_000, 30_000])
    assert R.dtype == F and S.dtype == np.int32 and T.dtype == np.int64 and eng.ticks == 1
    assert list(S) == [1, 0, 1] and list(T) == [20_000, 20_000, 30_000]


@pytest.mark.parametrize("how", ["pickle", "copy", "deepcopy"])
def test_engine_copy_is_refused_with_what_to_do_instead(how):
    """Defect guarded: pickling or copying an Engine raised a TypeError about __cinit__ that
    said nothing of why or what to do; the refusal says what to do instead."""
    import copy
    import pickle
    m = make_model("acts")
    eng = Engine(m, config=cfg(cache={"cos_threshold": 0.99}, engine={"n_symbols": 8,
                                                                       "weights": "bf16"}))
    f = {"pickle": pickle.dumps, "copy": copy.copy, "deepcopy": copy.deepcopy}[how]
    with pytest.raises(TypeError, match=r"cannot be pickled or copied.*Engine\(engine\.model, "
                                        r"config=engine\.config\.source\)"):
        f(eng)
    # what the message says to do builds an engine that answers as a fresh one of the same
    raws, syms, ts, _ = make_stream(15)
    twin = Engine(eng.model, config=eng.config.source)
    assert twin.model.weights == "bf16" and twin.config.cache == eng.config.cache
    assert_same(run_ticks(twin.step, raws, syms, ts), run_ticks(eng.step, raws, syms, ts),
                "rebuilt")


def test_batch_time_refusal_names_the_earlier_row_of_the_batch(isa):
    # Row 1 (symbol 0, ts 100) would be refused by the model stage (features overflow); row
    # 2 (symbol 0, ts 50) goes back against row 1 only. step() refuses row 1 and accepts row
    # 2 (the engine's last tick of symbol 0 is at ts 10); step_batch's pre-check refuses
    # row 2 and applies nothing. Before, its message blamed "the last tick of symbol 0",
    # a tick the engine never had; now it names the batch's row.
    m = make_model("acts")
    raws, _, _, _ = make_stream(16, n=3, nan_every=0)
    raws[1] = F(3.4e38)
    syms, ts = np.array([0, 0, 0]), np.array([10, 100, 50])
    eng = Engine(m, config=cfg(isa))
    want = run_ticks(eng.step, raws, syms, ts)
    assert want[1] == "refused" and want[2] != "refused"
    b = Engine(m, config=cfg(isa))
    with pytest.raises(InputError, match=r"row 2: ts_ns 50 is earlier than the last tick of "
                                         r"symbol 0, row 1 of this batch \(ts_ns 100\).*no row "
                                         r"was applied") as ei:
        b.step_batch(raws, syms, ts)
    assert ei.value.applied == 0 and b.ticks == 0
    # behind the engine's own last tick: the message as before
    b.step(raws[0], 0, 10)
    with pytest.raises(InputError, match=r"row 0: ts_ns 5 is earlier than the last tick of "
                                         r"symbol 0; timestamps"):
        b.step_batch(raws[:1], syms[:1], [5])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(widths=st.lists(st.integers(1, 70), min_size=0, max_size=15),
       acts=st.lists(st.sampled_from(["identity", "relu", "tanh", "sigmoid"]), min_size=16,
                     max_size=16),
       head=st.sampled_from(["tanh_sigmoid", "regression", "classifier2", "classifier3",
                             "logistic2"]),
       weights=st.sampled_from(["fp32", "fp32", "bf16", "int8"]),
       isa=st.sampled_from(ISAS), seed=st.integers(0, 2**16))
def test_hypothesis_model_shapes_every_path_agrees(widths, acts, head, weights, isa, seed):
    rng = np.random.default_rng(seed)
    fs = _fs(rng)
    out_w, post, spec = {"tanh_sigmoid": (2, "none", None),
                         "regression": (1, "none", Head("regression", 0.5)),
                         "classifier2": (2, "softmax", None),
                         "classifier3": (3, "softmax", None),
                         "logistic2": (1, "logistic2", None)}[head]
    dims = widths + [out_w]
    m = _mlp(rng, fs, dims, acts[:len(widths)] + ["identity"], post=post, head_spec=spec,
             weights=weights)
    raws, syms, ts, bad = make_stream(seed, n=40)
    eng = Engine(m, config=cfg(isa))
    want = run_ticks(eng.step, raws, syms, ts)
    b = Engine(m, config=cfg(isa))
    assert_same(batch_greedy(b, raws, syms, ts), [o if o == "refused" else o[:3] for o in want],
                "step_batch")
    x = Engine(m, config=cfg(isa))

    def external(raw, sym, t):
        return x._step_external(raw, sym, x.predict(x.features(raw, sym)), 1, t)
    assert_same(run_ticks(external, raws, syms, ts), want, "_step_external(predict(features))")
    R, S, T = good_rows(raws, syms, ts, bad)
    ref_sig, ref_conf = m.head_spec.apply(m.forward(fs.apply(R, S)))
    n = Engine(m, config=cfg(isa, cache={"enabled": False})).step_batch(R, S, T)
    # reduced-precision hidden layers move the outputs; Model.forward runs float32 weights
    tol = 2e-5 if weights == "fp32" or not widths else 0.25
    np.testing.assert_allclose(n.signal, ref_sig, atol=tol)
    np.testing.assert_allclose(n.confidence, ref_conf, atol=tol)


