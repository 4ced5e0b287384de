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

from conftest import ISAS
from test_gpu import FakeCuda, _fake_pycuda, fake_fatbin  # noqa: F401 - fixture
from test_gpu import fake_gpu  # noqa: F401 - fixture

F = np.float32
RAW_LEN, W_FIELDS, WINDOW, N_SYM = 24, (1, 5, 9), 4, 5
# loose enough that repeated and near-repeated ticks hit, with a run guard that forces misses
POLICY = CachePolicy(enabled=True, cos_threshold=0.999, norm_tol=0.05, max_age_ns=10**15,
                     max_run=3)
SERVE = {"place": False, "idle": "yield", "idle_spin_ns": 50_000}


def _fs(rng):
    z = rng.choice(RAW_LEN, 10, replace=False)
    nf = 10 + 2 * len(W_FIELDS)
    return FeatureSpec(RAW_LEN, z, np.array(W_FIELDS), WINDOW,
                       (rng.standard_normal(nf) * 0.1).astype(F), (0.5 + rng.random(nf)).astype(F))


def _mlp(rng, fs, widths, acts, **kw):
    dims = [fs.n_feat, *widths]
    layers = tuple(Layer((rng.standard_normal((dims[i + 1], dims[i])) / np.sqrt(dims[i])).astype(F),
                         (rng.standard_normal(dims[i + 1]) * 0.1).astype(F), acts[i])
                   for i in range(len(dims) - 1))
    return Model(layers, fs, kw.pop("policy", POLICY), **kw)


def _forest(rng, fs, n_trees=6, depth=3, n_targets=1, **kw):
    """full trees of LEQ/LT/GTE/GT splits over every feature, a leaf weight per target"""
    nf = fs.n_feat
    off, mode, feat, thr, tc, fc, wn, wt, wv = [0], [], [], [], [], [], [], [], []
    for _ in range(n_trees):
        inner, leaves = 2 ** depth - 1, 2 ** depth
        for i in range(inner + leaves):
            leaf = i >= inner
            mode.append(6 if leaf else int(rng.integers(4)))
            feat.append(0 if leaf else int(rng.integers(nf)))
            thr.append(0.0 if leaf else float(F(rng.standard_normal())))
            tc.append(-1 if leaf else 2 * i + 1)
            fc.append(-1 if leaf else 2 * i + 2)
            if leaf:
                for k in range(n_targets):
                    wn.append(off[-1] + i)
                    wt.append(k)
                    wv.append(float(F(rng.standard_normal())))
        off.append(off[-1] + inner + leaves)
    te = TreeEnsemble(nf, n_targets, off, mode, feat, thr, tc, fc, np.zeros(len(mode)), wn, wt,
                      wv, **kw)
    return Model((), fs, POLICY, trees=te)


KINDS = ("acts", "one_layer", "linear", "deep16", "w1", "w3", "w17", "w33", "w65", "clf2_softmax",
         "clf3_softmax", "clf2_logistic2", "regression", "bf16", "int8", "trees_reg",
         "trees_clf3")
MLP_KINDS = tuple(k for k in KINDS if not k.startswith("trees"))


def make_model(kind, seed=1):
    rng = np.random.default_rng(seed)
    fs = _fs(rng)
    if kind == "acts":
        return _mlp(rng, fs, [16, 16, 16, 2], ["relu", "tanh", "sigmoid", "identity"])
    if kind == "one_layer":
        return _mlp(rng, fs, [2], ["identity"])
    if kind == "linear":
        return _mlp(rng, fs, [1], ["identity"])
    if kind == "deep16":
        return _mlp(rng, fs, [8] * 15 + [2], ["tanh"] * 15 + ["identity"])
    if kind.startswith("w"):
        return _mlp(rng, fs, [int(kind[1:]), 2], ["relu", "identity"])
    if kind == "clf2_softmax":
        return _mlp(rng, fs, [8, 2], ["relu", "identity"], post="softmax")
    if kind == "clf3_softmax":
        return _mlp(rng, fs, [8, 3], ["relu", "identity"], post="softmax")
    if kind == "clf2_logistic2":
        return _mlp(rng, fs, [8, 1], ["relu", "identity"], post="logistic2")
    if kind == "regression":
        return _mlp(rng, fs, [8, 1], ["relu", "identity"], head_spec=Head("regression", 0.7))
    if kind in ("bf16", "int8"):
        return _mlp(rng, fs, [16, 2], ["relu", "identity"], weights=kind)
    if kind == "trees_reg":
        return _forest(rng, fs)
    if kind == "trees_clf3":
        return _forest(rng, fs, n_targets=3, post_transform="SOFTMAX", classifier=True)
    raise AssertionError(kind)


def make_stream(seed, n=120, n_sym=N_SYM, nan_every=17, noise=1e-4):
    """(raws, symbols, ts_ns, bad): symbols interleaved at random; half the ticks repeat their
    symbol's last level exactly (hits once the window is full), some move it by `noise`, the
    rest jump to a new level; every nan_every-th tick holds a NaN (refused)."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((n_sym, RAW_LEN)).astype(F)
    syms = rng.integers(0, n_sym, n)
    raws = np.empty((n, RAW_LEN), F)
    for i in range(n):
        u = rng.random()
        if u < 0.5:
            raws[i] = base[syms[i]]
        elif u < 0.8:
            raws[i] = base[syms[i]] + F(noise) * rng.standard_normal(RAW_LEN).astype(F)
        else:
            base[syms[i]] = rng.standard_normal(RAW_LEN).astype(F)
            raws[i] = base[syms[i]]
    bad = np.zeros(n, bool)
    if nan_every:
        bad[nan_every // 2::nan_every] = True
        raws[bad, 3] = np.nan
    ts = 10**9 + np.arange(n, dtype=np.int64) * 1000
    return raws, syms, ts, bad


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


def cfg(isa=None, **over):
    c = {"engine": {"n_symbols": 8}}
    if isa:
        c["engine"]["simd"] = isa
    c.update(over)
    return c


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
    sig, conf = m.head_spec.apply(out)
    # reduced-precision hidden weights move the outputs; Model.forward is float32 throughout
    tol = 2e-2 if m.weights != "fp32" else 2e-5
    last = {}
    for i in range(len(R)):
        f = eng.features(R[i], int(S[i]))
        np.testing.assert_allclose(f, feats[i], rtol=1e-5, atol=1e-5)
        p = eng.predict(f)
        np.testing.assert_allclose(p, out[i], rtol=tol, atol=tol)
        r = eng.step(R[i], int(S[i]), int(T[i]))
        n = nocache.step(R[i], int(S[i]), int(T[i]))
        assert not n.cached and n.miss_reason == "disabled"
        if r.cached:
            assert (r.signal, r.confidence) == last[int(S[i])]
        else:
            # a miss answers exactly what the cache-off engine answers
            assert (r.signal, r.confidence) == (n.signal, n.confidence)
            last[int(S[i])] = (r.signal, r.confidence)
        assert abs(n.signal - sig[i]) <= tol and abs(n.confidence - conf[i]) <= tol, (i, n)
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
            cl2.submit(raws[bad][0], 0)
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
    assert st["served"] == 2 * int((~bad).sum()) and st["errors"] == 0


@pytest.mark.parametrize("kind", ["acts", "w3", "clf3_softmax", "clf2_logistic2", "regression"])
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
