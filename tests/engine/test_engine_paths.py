"""One model, every path: the same tick stream (several symbols interleaved, refused NaN ticks,
repeated ticks that hit the cache) through Engine.step, fastpath.step, step_batch (symbols of
every integer dtype, with and without ts_ns), _step_external with predict(features()), the
serving client, the GPU backend on its stand-in driver, after reset and after refused input,
for every model kind, compared bit for bit between paths and against the numpy reference
(FeatureSpec.apply + Model.forward + the head) within a tolerance.
"""
import os
import uuid

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import fastpath
from fastpath import CachePolicy, Engine, FeatureSpec, InputError, Layer, Model, TreeEnsemble
from fastpath.model.types import Head

from helpers.builders import ISAS
from helpers.fake_cuda import fake_fatbin, fake_gpu  # noqa: F401 - fixtures (the GPU stand-in)
from helpers.paths import F, N_SYM, POLICY, RAW_LEN, _fs, _mlp, cfg, make_model, make_stream  # noqa: F401

SERVE = {"place": False, "idle": "yield", "idle_spin_ns": 50_000}


KINDS = ("acts", "one_layer", "linear", "deep16", "w1", "w3", "w17", "w33", "w65", "clf2_softmax",
         "clf3_softmax", "clf2_logistic2", "regression", "bf16", "int8", "trees_reg",
         "trees_clf3", "clf3_of5_permuted", "tanh_sigmoid_of4")
MLP_KINDS = tuple(k for k in KINDS if not k.startswith("trees"))


def outcome(r):
    return (float(r.signal), float(r.confidence), bool(r.cached), r.miss_reason)


def run_ticks(fn, raws, syms, ts):
    """fn(raw, symbol, ts_ns) per tick: its outcome, or "refused" for an InputError"""
    out = []
    for i in range(len(raws)):
        try:
            out.append(outcome(fn(raws[i], int(syms[i]), None if ts is None else int(ts[i]))))
        except InputError:
            out.append("refused")
    return out


def counters(eng):
    s = eng.stats()
    return s["ticks"], s["hits"], s["misses"], s["miss_reasons"]


def assert_same(got, want, what):
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"{what}: tick {i}: {g} != {w}"


def _good(raws, syms, ts, bad):
    g = ~bad
    return raws[g], syms[g], ts[g]


def _batch_outcomes(b):
    return [(float(b.signal[i]), float(b.confidence[i]), bool(b.cached[i]))
            for i in range(len(b.signal))]


def _strip(outs):
    return [o[:3] for o in outs if o != "refused"]


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
    R, S, T = _good(raws, syms, ts, bad)
    for dt in (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64,
               np.dtype(">i4"), np.dtype(">u8")):
        b = Engine(m, config=cfg(isa))
        with pytest.raises(InputError, match="no row was applied"):
            b.step_batch(raws, syms.astype(dt), ts)
        assert b.ticks == 0
        got = _batch_outcomes(b.step_batch(R, S.astype(dt), T))
        assert_same(got, _strip(want), f"step_batch symbols {np.dtype(dt)}")
        assert counters(b) == want_cnt
    b = Engine(m, config=cfg(isa))
    got = []
    for lo in range(0, len(R), 7):
        got += _batch_outcomes(b.step_batch(R[lo:lo + 7], list(S[lo:lo + 7]), list(T[lo:lo + 7])))
    assert_same(got, _strip(want), "step_batch in chunks")

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
    R, S, T = _good(raws, syms, ts, bad)
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


def _uname():
    return f"t22-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize("kind", ["acts", "deep16", "w17", "clf3_softmax", "clf2_logistic2",
                                  "regression", "int8", "trees_clf3"])
@pytest.mark.parametrize("with_ts", [True, False])
def test_served_answers_equal_in_process_step(kind, with_ts):
    m = make_model(kind)
    raws, syms, ts, bad = make_stream(4)
    # finite ticks the server's engine refuses (features overflow): its state stays as is
    raws[[20, 41, 77]] = F(3.4e38)
    bad[[20, 41, 77]] = True
    t = ts if with_ts else None
    c = {"engine": {"n_symbols": 2 * N_SYM}, "serve": SERVE}
    eng = Engine(m, config=c)
    want = run_ticks(eng.step, raws, syms, t)
    name = _uname()
    with fastpath.serve(name, m, c) as srv, fastpath.connect(name) as cl:
        got = run_ticks(cl.step, raws, syms, t)
        # submit / poll: the same answers in order
        cl2 = fastpath.connect(name)
        seqs = []
        with pytest.raises(InputError):
            cl2.submit(raws[8], 0)          # a NaN: refused before it is sent
        R, S, T = _good(raws, syms, ts, bad)
        for i in range(len(R)):
            seqs.append(cl2.submit(R[i], int(S[i]) + N_SYM,
                                   None if t is None else int(T[i])))
        polled = []
        while len(polled) < len(seqs):
            polled += cl2.poll()
        cl2.close()
        st = srv.stats()
    assert_same(got, want, "served step")
    assert [s for s, _ in polled] == seqs
    # symbols shifted by N_SYM: the same stream on fresh slots answers the same
    assert_same([outcome(r) for _, r in polled], [o for o in want if o != "refused"],
                "served submit/poll")
    assert st["served"] == 2 * int((~bad).sum()) + 3 and st["errors"] == 3


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
        R, S, T = _good(raws, syms, ts, bad)
        for dt in (np.uint8, np.int32, np.uint64):
            ge.reset()
            with pytest.raises(InputError, match="no row was applied"):
                ge.step_batch(raws, syms.astype(dt), ts)
            assert ge.ticks == 0
            b = ge.step_batch(R, S.astype(dt), T)
            got = _batch_outcomes(b)
            want_b = _strip(want)
            assert [g[2] for g in got] == [w[2] for w in want_b]
            np.testing.assert_allclose([g[0] for g in got], [w[0] for w in want_b], atol=1e-5)
            assert counters(ge) == counters(cpu)


def _batch_greedy(eng, raws, syms, ts):
    """The stream through step_batch as a caller would: all rows in one call; when the call
    refuses row k with no row applied, rows before k the same way, then row k alone (the
    pre-check refuses a row that is behind in time against an earlier row of the batch the
    model stage may still refuse); when the model stage stops it at row k, the answers of rows
    before it from the error. Per-row outcomes, "refused" for a row no call applied."""
    import re
    out = [None] * len(raws)

    def batch(lo, hi):
        return eng.step_batch(raws[lo:hi], syms[lo:hi], None if ts is None else ts[lo:hi])

    def run(lo, hi):
        while lo < hi:
            try:
                b = batch(lo, hi)
            except InputError as exc:
                k = int(re.match(r"row (\d+): ", str(exc)).group(1))
                assert exc.applied == len(exc.result.signal)
                if "no row was applied" in str(exc):
                    assert exc.applied == 0
                    run(lo, lo + k)
                    try:
                        out[lo + k] = _batch_outcomes(batch(lo + k, lo + k + 1))[0]
                    except InputError:
                        out[lo + k] = "refused"
                else:
                    # the model stage refused row k: rows before it applied, answers kept
                    assert f"rows 0..{k - 1} were applied" in str(exc) and exc.applied == k
                    for i, o in enumerate(_batch_outcomes(exc.result)):
                        out[lo + i] = o
                    out[lo + k] = "refused"
                lo += k + 1
                continue
            for i, o in enumerate(_batch_outcomes(b)):
                out[lo + i] = o
            return
    run(0, len(raws))
    return out


# a tick: (symbol, what happens to its level, ts step (negative: goes back), a NaN, a value far
# out in a z-scored field or in a windowed one)
_TICK = st.tuples(st.integers(0, 3), st.sampled_from(["repeat", "repeat", "nudge", "jump"]),
                  st.integers(-3, 3), st.booleans(),
                  st.sampled_from([None] * 8 + [1e30, -1e30, 1e19, 3e38, 1e-40, -0.0]))


def _hyp_stream(ticks, seed):
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((4, RAW_LEN)).astype(F)
    raws = np.empty((len(ticks), RAW_LEN), F)
    syms = np.empty(len(ticks), np.int64)
    ts = np.empty(len(ticks), np.int64)
    t = 10**6
    for i, (s, how, dt, nan, far) in enumerate(ticks):
        if how == "jump":
            base[s] = rng.standard_normal(RAW_LEN).astype(F)
        raws[i] = base[s]
        if how == "nudge":
            raws[i] += F(1e-4) * rng.standard_normal(RAW_LEN).astype(F)
        if far is not None:
            raws[i, int(rng.integers(RAW_LEN))] = F(far)
        if nan:
            raws[i, int(rng.integers(RAW_LEN))] = np.nan
        t = max(t + dt * 1000, 0)
        syms[i], ts[i] = s, t
    return raws, syms, ts


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ticks=st.lists(_TICK, min_size=1, max_size=60), seed=st.integers(0, 2**16),
       kind=st.sampled_from(KINDS), isa=st.sampled_from(ISAS), with_ts=st.booleans())
def test_hypothesis_streams_step_batch_and_external_agree(ticks, seed, kind, isa, with_ts):
    raws, syms, ts = _hyp_stream(ticks, seed)
    if not with_ts:
        ts = None
    m = make_model(kind)
    eng = Engine(m, config=cfg(isa))
    want = run_ticks(eng.step, raws, syms, ts)
    b = Engine(m, config=cfg(isa))
    assert_same(_batch_greedy(b, raws, syms, ts), [o if o == "refused" else o[:3] for o in want],
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
    # Row 5 passes the pre-check (finite) but its features overflow, which only the model
    # stage finds: rows 0..4 were applied (windows, cache slots, counters moved) and the error
    # said so, but their signals were dropped with the arrays; stepping them again to get them
    # applies them twice. Before: the InputError had no .applied / .result (AttributeError).
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
    assert _batch_outcomes(ei.value.result) == _strip(want[:5])
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


def test_gpu_step_batch_refusals_say_what_was_applied(fake_gpu):
    # Before: a row the pre-check refused on the GPU backend said only "engine state
    # unchanged" (the CPU's step_batch says "no row was applied"), and neither carried the
    # applied rows' answers
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


def test_cli_serve_answers_as_an_engine_of_the_same_files(tmp_path):
    import subprocess
    import sys
    m = make_model("clf3_softmax")
    mp, cp = str(tmp_path / "m.fpm"), str(tmp_path / "c.toml")
    m.save(mp)
    with open(cp, "w") as f:
        f.write('[engine]\nn_symbols = 16\n[serve]\nplace = false\nidle = "yield"\n')
    raws, syms, ts, bad = make_stream(10)
    want = run_ticks(Engine(mp, config=cp).step, raws, syms, ts)
    name = _uname()
    p = subprocess.Popen([sys.executable, "-m", "fastpath.cli", "serve", "--name", name,
                          "--model", mp, "--config", cp], cwd=str(tmp_path),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with fastpath.connect(name, timeout=60) as c:
            assert_same(run_ticks(c.step, raws, syms, ts), want, "fastpath serve")
    finally:
        p.terminate()
        out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    assert f"{int((~bad).sum())} served, 0 errors" in out


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


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(ticks=st.lists(_TICK, min_size=1, max_size=40), seed=st.integers(0, 2**16),
       kind=st.sampled_from(["acts", "w1", "clf3_softmax", "clf2_logistic2", "regression",
                             "tanh_sigmoid_of4", "deep16"]),
       mode=st.sampled_from(["launch", "persistent"]))
def test_hypothesis_streams_gpu_backend_agrees_with_the_cpu(fake_gpu, ticks, seed, kind, mode):
    raws, syms, ts = _hyp_stream(ticks, seed)
    m = make_model(kind)
    cpu = Engine(m, config=cfg())
    want = run_ticks(cpu.step, raws, syms, ts)
    with Engine(m, backend="gpu", config=cfg(gpu={"mode": mode, "timeout_ms": 5000})) as ge:
        got = run_ticks(ge.step, raws, syms, ts)
        assert counters(ge) == counters(cpu)
        ge.reset()
        got_b = _batch_greedy(ge, raws, syms, ts)
        assert counters(ge) == counters(cpu)
    for i, w in enumerate(want):
        for g in (got[i], got_b[i]):
            assert (g == "refused") == (w == "refused"), (i, g, w)
            if g != "refused":
                assert g[2] == w[2] and abs(g[0] - w[0]) < 1e-5 and abs(g[1] - w[1]) < 1e-5, \
                    (i, g, w)


@pytest.mark.parametrize("how", ["pickle", "copy", "deepcopy"])
def test_engine_copy_is_refused_with_what_to_do_instead(how):
    # Before: TypeError "no default __reduce__ due to non-trivial __cinit__", which said
    # nothing of why or what to do
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


@pytest.mark.parametrize("t", [np.int64(2), np.float32(0.5), np.float64(1.0)])
def test_connect_takes_numpy_numbers_of_seconds(t):
    # Before: InputError "timeout must be a number of seconds in [0, 3600], got 2" for a
    # numpy number in range (read from a config array), a message that contradicted itself
    m = make_model("w3")
    name = _uname()
    raw = make_stream(17, n=1, nan_every=0)[0][0]
    with fastpath.serve(name, m, {"engine": {"n_symbols": 4}, "serve": SERVE}):
        with fastpath.connect(name, timeout=t, stall_timeout=t) as c:
            assert c.stall_timeout == pytest.approx(float(t))
            assert outcome(c.step(raw, 1, 5)) == outcome(Engine(m, config=cfg()).step(raw, 1, 5))
    for bad in (np.bool_(True), True, np.float64("nan"), np.int64(3601)):
        with pytest.raises(InputError, match="timeout must be a number of seconds"):
            fastpath.connect(name, timeout=bad)


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
    assert_same(_batch_greedy(b, raws, syms, ts), [o if o == "refused" else o[:3] for o in want],
                "step_batch")
    x = Engine(m, config=cfg(isa))

    def external(raw, sym, t):
        return x._step_external(raw, sym, x.predict(x.features(raw, sym)), 1, t)
    assert_same(run_ticks(external, raws, syms, ts), want, "_step_external(predict(features))")
    R, S, T = _good(raws, syms, ts, bad)
    ref_sig, ref_conf = m.head_spec.apply(m.forward(fs.apply(R, S)))
    n = Engine(m, config=cfg(isa, cache={"enabled": False})).step_batch(R, S, T)
    # reduced-precision hidden layers move the outputs; Model.forward runs float32 weights
    tol = 2e-5 if weights == "fp32" or not widths else 0.25
    np.testing.assert_allclose(n.signal, ref_sig, atol=tol)
    np.testing.assert_allclose(n.confidence, ref_conf, atol=tol)


@pytest.mark.parametrize("est", ["gb3", "rf_reg"])
def test_sklearn_forest_through_every_path(est, tmp_path):
    pytest.importorskip("skl2onnx")
    ort = pytest.importorskip("onnxruntime")
    from sklearn.ensemble import GradientBoostingClassifier, RandomForestRegressor
    from helpers.models import _skl
    rng = np.random.default_rng(18)
    fs = _fs(rng)
    raws, syms, ts, bad = make_stream(19)
    R, S, T = _good(raws, syms, ts, bad)
    X = fs.apply(R, S)
    Xt = rng.standard_normal((300, fs.n_feat)).astype(F)
    if est == "gb3":
        skl = GradientBoostingClassifier(n_estimators=12, max_depth=3, random_state=0)
        skl.fit(Xt, np.digitize(Xt[:, 0] + Xt[:, 3], [-0.5, 0.5]))
    else:
        skl = RandomForestRegressor(n_estimators=8, max_depth=4, random_state=0)
        skl.fit(Xt, Xt[:, 1] - Xt[:, 12])
    path = _skl(skl, Xt, tmp_path / "m.onnx")
    m = Model.from_onnx(path).with_feature_spec(fs).with_cache_policy(POLICY)
    assert m.trees is not None
    c = {"engine": {"n_symbols": 8}, "serve": SERVE}
    eng = Engine(m, config=c)
    want = run_ticks(eng.step, raws, syms, ts)
    assert sum(o[2] for o in want if o != "refused") > 10
    assert_same(_batch_greedy(Engine(m, config=c), raws, syms, ts),
                [o if o == "refused" else o[:3] for o in want], "step_batch")
    name = _uname()
    with fastpath.serve(name, m, c), fastpath.connect(name) as cl:
        assert_same(run_ticks(cl.step, raws, syms, ts), want, "served")
    # onnxruntime through the model's head, on the engine's own features (a feature a last
    # bit off the numpy reference's may cross a split threshold)
    nocache = Engine(m, config=cfg(cache={"enabled": False}))
    Xe = np.empty_like(X)
    sig_e, conf_e = [], []
    for i in range(len(R)):
        Xe[i] = nocache.features(R[i], int(S[i]))
        r = nocache.step(R[i], int(S[i]), int(T[i]))
        sig_e.append(r.signal)
        conf_e.append(r.confidence)
    np.testing.assert_allclose(Xe, X, rtol=1e-5, atol=1e-5)
    s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    outs = s.run(None, {s.get_inputs()[0].name: Xe})
    names = [o.name for o in s.get_outputs()]
    ref = np.asarray(outs[names.index("probabilities") if "probabilities" in names else -1],
                     np.float32).reshape(len(X), -1)
    got = np.array([nocache.predict(x) for x in Xe])
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    b = (np.array(sig_e), np.array(conf_e))
    sig, conf = m.head_spec.apply(ref)
    np.testing.assert_allclose(b[0], sig, atol=1e-5)
    np.testing.assert_allclose(b[1], conf, atol=1e-5)
    b = Engine(m, config=cfg(cache={"enabled": False})).step_batch(R, S, T)
    assert list(b.signal) == sig_e and list(b.confidence) == conf_e


def test_server_counters_and_records_after_stop():
    # Before: srv.stats() and srv.latency_records() after stop() raised AttributeError
    # ('NoneType' object has no attribute 'stats')
    m = make_model("w3")
    raws, syms, ts, bad = make_stream(20, n=30, nan_every=0)
    name = _uname()
    srv = fastpath.serve(name, m, {"engine": {"n_symbols": 8}, "serve": SERVE})
    with fastpath.connect(name) as c:
        run_ticks(c.step, raws, syms, ts)
    live = srv.latency_records()
    srv.stop()
    st = srv.stats()
    assert st["served"] == 30 == srv.final_stats["served"] and st["errors"] == 0
    st["served"] = -1                   # a copy: final_stats stays as the stop left it
    assert srv.stats()["served"] == 30
    lat = srv.latency_records()
    assert lat.shape == (30, 5) and np.array_equal(lat, live)
    srv.stop()                          # a second stop is a no-op
    assert srv.stats()["served"] == 30
