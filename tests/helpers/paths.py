"""One model and tick stream run through every path of the engine (step, batch, serve, GPU)."""
import os
import re
import uuid

import numpy as np
from hypothesis import strategies as st

from fastpath import CachePolicy, FeatureSpec, InputError, Layer, Model, TreeEnsemble
from fastpath.model.types import Head


F = np.float32


RAW_LEN, W_FIELDS, WINDOW, N_SYM = 24, (1, 5, 9), 4, 5


# loose enough that repeated and near-repeated ticks hit, with a run guard that forces misses
POLICY = CachePolicy(enabled=True, cos_threshold=0.999, norm_tol=0.05, max_age_ns=10**15,
                     max_run=3)


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
    if kind == "clf3_of5_permuted":
        return _mlp(rng, fs, [8, 5], ["relu", "identity"], post="softmax",
                    head_spec=Head("classifier3", outputs=(2, 0, 4)))
    if kind == "tanh_sigmoid_of4":
        return _mlp(rng, fs, [8, 4], ["tanh", "identity"],
                    head_spec=Head("tanh_sigmoid", outputs=(3, 1)))
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


def cfg(isa=None, **over):
    c = {"engine": {"n_symbols": 8}}
    if isa:
        c["engine"]["simd"] = isa
    c.update(over)
    return c


# ------------------------------------------------ running a stream through one path
KINDS = ("acts", "one_layer", "linear", "deep16", "w1", "w3", "w17", "w33", "w65", "clf2_softmax",
         "clf3_softmax", "clf2_logistic2", "regression", "bf16", "int8", "trees_reg",
         "trees_clf3", "clf3_of5_permuted", "tanh_sigmoid_of4")


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


def good_rows(raws, syms, ts, bad):
    g = ~bad
    return raws[g], syms[g], ts[g]


def batch_outcomes(b):
    return [(float(b.signal[i]), float(b.confidence[i]), bool(b.cached[i]))
            for i in range(len(b.signal))]


def strip_refused(outs):
    return [o[:3] for o in outs if o != "refused"]


def batch_greedy(eng, raws, syms, ts):
    """The stream through step_batch as a caller would: all rows in one call; when the call
    refuses row k with no row applied, rows before k the same way, then row k alone (the
    pre-check refuses a row that is behind in time against an earlier row of the batch the
    model stage may still refuse); when the model stage stops it at row k, the answers of rows
    before it from the error. Per-row outcomes, "refused" for a row no call applied."""
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
                        out[lo + k] = batch_outcomes(batch(lo + k, lo + k + 1))[0]
                    except InputError:
                        out[lo + k] = "refused"
                else:
                    # the model stage refused row k: rows before it applied, answers kept
                    assert f"rows 0..{k - 1} were applied" in str(exc) and exc.applied == k
                    for i, o in enumerate(batch_outcomes(exc.result)):
                        out[lo + i] = o
                    out[lo + k] = "refused"
                lo += k + 1
                continue
            for i, o in enumerate(batch_outcomes(b)):
                out[lo + i] = o
            return
    run(0, len(raws))
    return out


# a tick: (symbol, what happens to its level, ts step (negative: goes back), a NaN, a value far
# out in a z-scored field or in a windowed one)
TICK = st.tuples(st.integers(0, 3), st.sampled_from(["repeat", "repeat", "nudge", "jump"]),
                  st.integers(-3, 3), st.booleans(),
                  st.sampled_from([None] * 8 + [1e30, -1e30, 1e19, 3e38, 1e-40, -0.0]))


def hyp_stream(ticks, seed):
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


SERVE = {"place": False, "idle": "yield", "idle_spin_ns": 50_000}


def unique_name():
    return f"paths-{os.getpid()}-{uuid.uuid4().hex[:8]}"
