"""Whole-engine differential test of the kernel sets: the same model, config and edge-heavy
stream stepped through scalar (the reference) and through each vector set this CPU runs must
give the same decisions: a tick refused or not (and with what message, numbers aside), a hit
or a miss and its reason, the same features bit for bit, and signals / confidences within what
the sets' rounding can explain (tree ensembles: the same bits), their signs alike wherever the
rounding cannot reach zero.

The streams mix windows (wrapping), the cache at its threshold edges (exact repeats, scaled
repeats at the norm tolerance, negated repeats), NaN / +-Inf / 1e30 / 3e38 / subnormal / -0.0
values, resets, repeated and backward timestamps and step_batch runs, over MLPs (fp32, bf16,
int8 weights; tanh/sigmoid, regression and classifier heads; weights large enough for
pre-activations near float32's limit) and tree ensembles (leaves of very different sizes).
A set this CPU cannot run is reported as skipped."""
import math
import re
from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fastpath import Engine, InputError, Model, TreeEnsemble
from fastpath._engine import all_isas, supported_isas
from fastpath.model import CachePolicy, FeatureSpec, Head, Layer

F32 = np.float32
FMAX = float(np.finfo(np.float32).max)
ISAS = supported_isas()
VECTOR_SETS = [s for s in all_isas() if s != "scalar"]
N_SYM = 3

EDGES = [math.nan, math.inf, -math.inf, 1e30, -1e30, 3e38, -3e38, 1e-40, -1e-45, -0.0, 0.0,
         1e19, -1e19, 1e-30, 2.0 ** -126]

POLICIES = [
    dict(cos_threshold=0.999, norm_tol=0.02),
    dict(cos_threshold=1.0, norm_tol=0.0),
    dict(cos_threshold=0.999999, norm_tol=0.5),
    dict(cos_threshold=-1.0, norm_tol=1.0),
    dict(cos_threshold=0.9, norm_tol=0.25),
]


def _need(isa):
    if isa not in ISAS:
        pytest.skip(f"kernel set {isa} is not supported by this CPU (runs {ISAS})")


def _engine(model, isa, pol, weights=None, max_run=4):
    cache = dict(enabled=True, max_age_ns=10**6, max_run=max_run, **pol)
    eng = {"simd": isa, "n_symbols": N_SYM}
    if weights:
        eng["weights"] = weights
    e = Engine(model, config={"engine": eng, "cache": cache})
    if e.simd != isa:
        pytest.skip(f"engine runs {e.simd}, not {isa} (FASTPATH_SIMD forces a set)")
    return e


_NUM = re.compile(r"[-+]?(nan|inf|(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?)", re.I)


def _msg(exc):
    """An error's class and message with its numbers taken out (values may differ by rounding;
    what was refused and why may not)."""
    return type(exc).__name__, _NUM.sub("#", str(exc))


# ------------------------------------------------------------------ the streams

_edit = st.tuples(st.integers(0, 63), st.sampled_from(EDGES))
# a fresh tick's scale: whole ticks of subnormals or below int8's FP_LOWP_TINY (1e-30), of
# 1e19 (products near FLT_MAX on large weights) or 1e37 (some values overflow to Inf)
_mag = st.sampled_from([-40, -36, -3, -1, 0, 0, 0, 1, 3, 19, 37])
_tick = st.tuples(st.just("tick"), st.integers(0, N_SYM - 1), _mag, st.lists(_edit, max_size=2))
_rep = st.tuples(st.sampled_from(["repeat", "repeat", "neg", "same_ts"]),
                 st.integers(0, N_SYM - 1), st.just(0), st.just([]))
_scaled = st.tuples(st.just("scaled"), st.integers(0, N_SYM - 1),
                    st.sampled_from([0, 1, 2, 3, 4, 5]), st.just([]))
_misc = st.tuples(st.sampled_from(["reset", "back", "batch"]), st.integers(-1, N_SYM - 1),
                  st.integers(1, 4), st.just([]))
OPS = st.lists(st.one_of(_tick, _tick, _tick, _rep, _rep, _scaled, _misc), min_size=4,
               max_size=60)
# exact scalings of a repeat: at the norm tolerances above (1.5, 0.5, 1.25, 2) and near 1
SCALES = [1.5, 0.5, 1.25, 2.0, 1.0 + 2.0 ** -20, 0.75]


class Stream:
    """Turns ops into (kind, raws, symbols, ts) steps; the same steps for every set."""

    def __init__(self, raw_len, seed, quantize):
        self.rng = np.random.default_rng(seed)
        self.raw_len = raw_len
        self.quantize = quantize
        self.last = {}
        self.t = {}

    def fresh(self, mag, edits):
        x = self.rng.standard_normal(self.raw_len) * 10.0 ** mag
        if self.quantize:
            # few mantissa bits: scaled repeats are exact, and their norms tie the tolerance
            x = np.round(x * 64) / 64
        x = x.astype(F32)
        for pos, v in edits:
            x[pos % self.raw_len] = v
        return x

    def steps(self, ops):
        with np.errstate(over="ignore", invalid="ignore"):
            return self._steps(ops)

    def _steps(self, ops):
        out = []
        for kind, s, a, edits in ops:
            if kind == "reset":
                sym = None if s < 0 else s
                out.append(("reset", sym, None, None))
                for d in (self.last, self.t):
                    d.clear() if sym is None else d.pop(sym, None)
                continue
            if kind == "batch":
                rows, syms, ts = [], [], []
                for j in range(a):
                    sy = (max(s, 0) + j) % N_SYM
                    raw = self.fresh(0, [])
                    t = self.t.get(sy, 0) + 5
                    rows.append(raw), syms.append(sy), ts.append(t)
                    self.last[sy], self.t[sy] = raw, t
                out.append(("batch", np.array(syms, np.int32), np.ascontiguousarray(rows),
                            np.array(ts, np.int64)))
                continue
            prev = self.last.get(s)
            t = self.t.get(s, 0)
            if kind == "tick" or prev is None:
                raw, t = self.fresh(a, edits), t + 5
            elif kind == "repeat":
                raw, t = prev.copy(), t + 5
            elif kind == "neg":
                raw, t = (-prev).astype(F32), t + 5
            elif kind == "scaled":
                raw, t = (prev * F32(SCALES[a])).astype(F32), t + 5
            elif kind == "same_ts":
                raw = prev.copy()
            else:                                   # back: refused, nothing changes
                out.append(("tick", s, prev.copy(), t - 1))
                continue
            out.append(("tick", s, raw, t))
            if np.all(np.isfinite(raw)):
                self.last[s], self.t[s] = raw, t
        return out


# ------------------------------------------------------------------ the models

def _mlp(seed, raw_len, n_w, window, hidden, act, head, wscale, inv_big, plain):
    rng = np.random.default_rng(seed)
    n_z = raw_len - 1
    z = rng.permutation(raw_len)[:n_z]
    w_idx = rng.choice(raw_len, n_w, replace=False) if n_w else np.zeros(0, np.int32)
    nf = n_z + 2 * n_w
    mean = (rng.standard_normal(nf) * 0.1).astype(F32)
    inv = (0.5 + rng.random(nf)).astype(F32)
    if plain:
        # raw values reach the model as they are: -0.0, subnormals, 1e-30 as features
        mean, inv = np.zeros(nf, F32), np.ones(nf, F32)
    if inv_big:
        inv[rng.integers(0, nf)] = F32(1e20)     # a z-score that overflows on big raws
    fs = FeatureSpec(raw_len, z, w_idx, window, mean, inv)
    width = {"tanh_sigmoid": 2, "regression": 1, "classifier3": 3, "sigmoid2": 2,
             "logistic2": 1}[head]
    dims = [nf, *hidden, width]
    layers = []
    for i in range(len(dims) - 1):
        w = rng.standard_normal((dims[i + 1], dims[i])) / np.sqrt(dims[i])
        b = rng.standard_normal(dims[i + 1]) * 0.1
        if i == 0:
            w = w * wscale
        last = i == len(dims) - 2
        a = ("sigmoid" if head == "sigmoid2" else "identity") if last else act
        layers.append(Layer(w.astype(F32), b.astype(F32), a))
    post = {"classifier3": "softmax", "logistic2": "logistic2"}.get(head, "none")
    hs = {"classifier3": Head("classifier3"), "sigmoid2": Head("classifier2"),
          "logistic2": Head("classifier2"), "regression": Head("regression", 2.0)}.get(head)
    return Model(tuple(layers), fs, CachePolicy(enabled=True), post=post, head_spec=hs)


def _bound(model, feats, weights, n_sets_u=2.0):
    """What the sets' rounding can move (signal, confidence) by for features feats, from a
    float64 pass with |W| |h| sums; whether some pre-activation sits so near float32's limit
    that rounding decides whether the tick is refused; and what it can move the model's
    outputs (predict) by."""
    u = {"fp32": 2.0 ** -24, "bf16": 2.0 ** -16, "int8": 2.0 ** -24}[weights]
    h = feats.astype(np.float64)
    e = np.zeros_like(h)
    near = False
    for k, L in enumerate(model.layers):
        W = L.weight.astype(np.float64) * (1.1 if weights != "fp32" else 1.0)
        b = L.bias.astype(np.float64)
        z = W @ h + b
        mag = np.abs(W) @ np.abs(h) + np.abs(b)
        n = W.shape[1] + 8
        ez = np.abs(W) @ e + n_sets_u * n * u * mag + n * 2.0 ** -24 * mag
        if np.any(np.abs(np.abs(z) - FMAX) <= ez + FMAX * n * 2.0 ** -23) or \
                (np.any(mag > FMAX * 0.5) and np.any(np.abs(z) > FMAX * 0.25)):
            near = True
        a = L.activation
        if a == "relu":
            h, e = np.maximum(z, 0), ez
        elif a == "tanh":
            h, e = np.tanh(z), ez + 1e-6
        elif a == "sigmoid":
            with np.errstate(over="ignore"):
                h, e = 1 / (1 + np.exp(-z)), ez / 4 + 1e-6
        else:
            h, e = z, ez
    err = float(np.max(e)) if e.size else 0.0
    hk = model.head_spec.kind
    if model.post in ("softmax", "logistic2"):
        err = 2 * err + 1e-6
    out_err = err + 1e-5
    if hk == "regression":
        err = err / model.head_spec.scale
    sig_tol = (2 * err if hk.startswith("classifier") else err) + 1e-5
    return sig_tol, err + 1e-5, near, out_err


def _stumps(rng, n_feat, n_trees, depth, leaf_kind, thr_kind):
    """n_trees perfect trees of LEQ splits (the vector sets' grouped path), one target."""
    offs, mode, feat, thr, tc, fc, wn, wv = [0], [], [], [], [], [], [], []
    inner = 2 ** depth - 1
    for t in range(n_trees):
        base = offs[-1]
        n = 2 * inner + 1
        for i in range(n):
            if i < inner:
                mode.append(0)
                feat.append(int(rng.integers(0, n_feat)))
                thr.append({"zero": 0.0, "negzero": -0.0, "normal": float(rng.standard_normal()),
                            "edge": float(rng.choice([0.0, -0.0, 1e30, -1e30, 1e-40, 3e38]))
                            }[thr_kind])
                tc.append(2 * i + 1)
                fc.append(2 * i + 2)
            else:
                mode.append(6), feat.append(0), thr.append(0.0), tc.append(0), fc.append(0)
                wn.append(base + i)
                if leaf_kind == "huge":
                    v = float(rng.choice([1e20, -1e20, 1.0, -0.5, 3e-8, 0.0]))
                elif leaf_kind == "wide":
                    v = float(rng.standard_normal() * 10.0 ** rng.integers(-12, 12))
                else:
                    v = float(rng.standard_normal())
                wv.append(v)
        offs.append(base + n)
    nn = offs[-1]
    return TreeEnsemble(n_feat, 1, np.array(offs), np.array(mode), np.array(feat),
                        np.array(thr), np.array(tc), np.array(fc), np.zeros(nn, np.uint8),
                        np.array(wn), np.zeros(len(wn), np.int32), np.array(wv))


# ------------------------------------------------------------------ running and comparing

def _run(eng, steps):
    """Every step's decision: ("err", class, message) or (signal, confidence, cached,
    reason), batch rows' arrays; and for each tick, the features it was decided on and the
    symbol's cache key then (the features of its last computed tick, None when unknown)."""
    out, info, keys = [], [], {}
    for kind, s, raw, t in steps:
        if kind == "reset":
            eng.reset(s)
            keys.clear() if s is None else keys.pop(s, None)
            out.append(("reset",))
            continue
        if kind == "batch":
            try:
                r = eng.step_batch(raw, s, t)
                out.append(("batch", r.signal.copy(), r.confidence.copy(), r.cached.copy()))
            except InputError as exc:
                out.append(("err",) + _msg(exc))
            for sy in s:
                keys[int(sy)] = None
            continue
        try:
            f = eng.features(raw, s)
        except InputError:
            f = None
        info.append((f, keys.get(s)))
        try:
            r = eng.step(raw, s, ts_ns=t)
            out.append((float(r.signal), float(r.confidence), bool(r.cached), r.miss_reason))
            if not r.cached:
                keys[s] = f
        except InputError as exc:
            out.append(("err",) + _msg(exc))
    return out, info


def _at_threshold(f, key, pol):
    """Whether f's cosine with key, or its norm ratio, lies within 1e-12 of the policy's
    thresholds: there the double sums' rounding decides (fp_cache.h), so sets may part."""
    if f is None or key is None:
        return False
    a = [Fraction(float(v)) for v in f]
    b = [Fraction(float(v)) for v in key]
    dot, A, B = sum(x * y for x, y in zip(a, b)), sum(x * x for x in a), sum(y * y for y in b)
    if A == 0 or B == 0:
        return False
    cos = float(dot / B) / math.sqrt(float(A / B))
    ratio = math.sqrt(float(A / B))
    return abs(cos - pol["cos_threshold"]) < 1e-12 or \
        abs(abs(ratio - 1.0) - pol["norm_tol"]) < 1e-12


def _compare(ref, got, steps, pol, bound, exact):
    """Compare got (a vector set's run) with ref (scalar's), step by step. Returns False at the
    first step that rounding alone may decide (a refusal at float32's edge, a cosine or norm
    ratio within 1e-12 of its threshold): the sets' states may part there, as allowed; True
    when every step agreed."""
    (ra, ia), (rb, ib) = ref, got
    ti = 0
    for i, (st_, a, b) in enumerate(zip(steps, ra, rb)):
        ctx = f"step {i}: {st_[0]} sym {st_[1]}"
        f = key = None
        if st_[0] == "tick":
            (f, key), (g, _) = ia[ti], ib[ti]
            ti += 1
            assert (f is None) == (g is None), ctx
            if f is not None:
                assert f.tobytes() == g.tobytes(), f"{ctx}: features differ\n{f}\n{g}"
        if a[0] == "err" or b[0] == "err":
            if a != b and f is not None and bound is not None and bound(f)[2]:
                return False                            # refusal at float32's edge
            assert a == b, f"{ctx}: scalar {a} vs vector {b}"
            continue
        if a[0] == "reset":
            assert b[0] == "reset"
            continue
        if a[0] == "batch":
            assert b[0] == "batch", ctx
            assert np.array_equal(a[3], b[3]), f"{ctx}: cached {a[3]} vs {b[3]}"
            if exact:
                assert a[1].tobytes() == b[1].tobytes() and a[2].tobytes() == b[2].tobytes(), ctx
            else:
                np.testing.assert_allclose(a[1], b[1], atol=1e-4, rtol=0, err_msg=ctx)
            continue
        sa, ca, ha, ra_ = a
        sb, cb, hb, rb_ = b
        if (ha, ra_) != (hb, rb_) and _at_threshold(f, key, pol):
            return False
        assert (ha, ra_) == (hb, rb_), f"{ctx}: scalar {a} vs vector {b}"
        if exact:
            assert F32(sa).tobytes() == F32(sb).tobytes() and \
                F32(ca).tobytes() == F32(cb).tobytes(), f"{ctx}: scalar {a} vs vector {b}"
            continue
        if ha:
            # a hit returns what that set computed on its miss: compared there
            continue
        stol, ctol, _, _ = bound(f) if f is not None else (1e-4, 1e-4, False, 0)
        assert abs(sa - sb) <= stol, f"{ctx}: signal {sa} vs {sb} (tolerance {stol})"
        assert abs(ca - cb) <= ctol, f"{ctx}: confidence {ca} vs {cb} (tolerance {ctol})"
        if abs(sa) > stol:
            assert np.sign(sa) == np.sign(sb), f"{ctx}: signal sign {sa} vs {sb}"
    return True


def _same_stats(a, b):
    sa, sb = a.stats(), b.stats()
    for k in ("ticks", "hits", "misses", "miss_reasons"):
        assert sa[k] == sb[k], (k, sa[k], sb[k])


MLP = st.fixed_dictionaries(dict(
    seed=st.integers(0, 2**31 - 1),
    raw_len=st.integers(3, 40),
    n_w=st.integers(0, 3),
    window=st.integers(1, 4),
    hidden=st.sampled_from([(), (8,), (20, 6), (40,)]),
    act=st.sampled_from(["relu", "tanh", "sigmoid", "identity"]),
    head=st.sampled_from(["tanh_sigmoid", "regression", "classifier3", "sigmoid2", "logistic2"]),
    wscale=st.sampled_from([1.0, 1.0, 1e18, 3e37]),
    inv_big=st.booleans(),
    plain=st.booleans(),
))


@pytest.mark.parametrize("isa", VECTOR_SETS)
@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=MLP, weights=st.sampled_from(["fp32", "bf16", "int8"]),
       pol=st.sampled_from(POLICIES), ops=OPS, quantize=st.booleans())
def test_mlp_streams_decide_as_scalar(isa, spec, weights, pol, ops, quantize):
    _need(isa)
    model = _mlp(**spec)
    steps = Stream(model.feature_spec.raw_len, spec["seed"], quantize).steps(ops)
    engines = {s: _engine(model, s, pol, weights) for s in ("scalar", isa)}
    res = {s: _run(e, steps) for s, e in engines.items()}
    if _compare(res["scalar"], res[isa], steps, pol, lambda f: _bound(model, f, weights),
                exact=False):
        _same_stats(engines["scalar"], engines[isa])
    else:
        event("stopped where rounding decides")
    # predict() on the stream's features and on edge vectors: refused alike, else close
    nf = model.feature_spec.n_feat
    xs = [f for f, _ in res["scalar"][1][:8] if f is not None] + [
        np.full(nf, v, F32) for v in (0.0, -0.0, 1e-40, 1e19, 3e38, np.nan)]
    for x in xs:
        p = {}
        for s, e in engines.items():
            try:
                p[s] = e.predict(x)
            except InputError as exc:
                p[s] = _msg(exc)
        if isinstance(p["scalar"], tuple) or isinstance(p[isa], tuple):
            if p["scalar"] != p[isa] and not _bound(model, x, weights)[2]:
                assert p["scalar"] == p[isa], (x, p)
            continue
        tol = _bound(model, x, weights)[3]
        assert np.all(np.abs(p["scalar"].astype(float) - p[isa]) <= tol), (x, p, tol)
    for r in res["scalar"][0]:
        event(f"{r[0]}: {r[2][:60]}" if r[0] == "err" else
              r[0] if isinstance(r[0], str) else f"tick: {r[3]}")


@pytest.mark.parametrize("isa", VECTOR_SETS)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), raw_len=st.integers(2, 12), n_w=st.integers(0, 2),
       window=st.integers(1, 3), n_trees=st.sampled_from([16, 17, 32, 40]),
       depth=st.integers(1, 3), leaf_kind=st.sampled_from(["huge", "wide", "normal"]),
       thr_kind=st.sampled_from(["zero", "negzero", "normal", "edge"]),
       aggregate=st.sampled_from(["SUM", "AVERAGE"]), pol=st.sampled_from(POLICIES), ops=OPS)
def test_tree_streams_decide_as_scalar_bit_for_bit(isa, seed, raw_len, n_w, window, n_trees,
                                                   depth, leaf_kind, thr_kind, aggregate,
                                                   pol, ops):
    _need(isa)
    rng = np.random.default_rng(seed)
    w_idx = rng.choice(raw_len, min(n_w, raw_len), replace=False)
    nf = raw_len + 2 * len(w_idx)
    fs = FeatureSpec(raw_len, np.arange(raw_len), w_idx, window,
                     np.zeros(nf, F32), np.ones(nf, F32))
    ens = replace(_stumps(rng, nf, n_trees, depth, leaf_kind, thr_kind), aggregate=aggregate)
    model = Model((), fs, CachePolicy(enabled=True), trees=ens)
    steps = Stream(raw_len, seed, False).steps(ops)
    engines = {s: _engine(model, s, pol) for s in ("scalar", isa)}
    res = {s: _run(e, steps) for s, e in engines.items()}
    if _compare(res["scalar"], res[isa], steps, pol, None, exact=True):
        _same_stats(engines["scalar"], engines[isa])
    # predict() on edge feature vectors, NaN (a missing value) included: the same bits
    xs = [np.zeros(nf, F32), np.full(nf, -0.0, F32), np.full(nf, np.nan, F32),
          np.full(nf, 1e-40, F32), rng.standard_normal(nf).astype(F32)]
    for x in xs:
        p = {s: e.predict(x).tobytes() for s, e in engines.items()}
        assert p["scalar"] == p[isa], (x, p)


def _stump_ensemble(leaves, n_feat=2):
    """len(leaves) one-split trees (LEQ on feature 0 at 0), both leaves of tree i leaves[i]:
    16 of them are one group of the vector sets' perfect layout, tree i in lane i."""
    n = len(leaves)
    wn = np.concatenate([[3 * i + 1, 3 * i + 2] for i in range(n)])
    return TreeEnsemble(n_feat, 1, np.arange(0, 3 * n + 1, 3), np.tile([0, 6, 6], n),
                        np.zeros(3 * n, np.int32), np.zeros(3 * n), np.tile([1, 0, 0], n),
                        np.tile([2, 0, 0], n), np.zeros(3 * n, np.uint8), wn,
                        np.zeros(2 * n, np.int32), np.repeat(np.asarray(leaves, float), 2))


@pytest.mark.parametrize("isa", VECTOR_SETS)
def test_tree_group_leaves_add_in_one_order_on_every_set(isa):
    """Defect guarded: each kernel set added a tree group's 16 leaves in its own order, so
    leaves ~2^53 apart (1e20, 1, -1e20) summed to different signals per set."""
    from fastpath._kernels import PackedTrees
    _need(isa)
    wrong = []
    x = np.zeros(2, F32)
    for i in range(1, 16):
        for j in range(1, 16):
            if i == j:
                continue
            lv = [0.0] * 16
            lv[0], lv[i], lv[j] = 1e20, 1.0, -1e20
            ens = _stump_ensemble(lv)
            m = Model((), FeatureSpec.identity(2), trees=ens)
            got = {}
            for s in ("scalar", isa):
                e = Engine(m, config={"engine": {"simd": s, "n_symbols": 1}})
                r = e.step(x, 0)
                got[s] = (PackedTrees(ens, s).eval(x).tobytes(), e.predict(x).tobytes(),
                          F32(r.signal).tobytes(), F32(r.confidence).tobytes())
            if got["scalar"] != got[isa]:
                wrong.append((i, j))
    assert not wrong, wrong[:8]


@pytest.mark.parametrize("tol,k", [(0.5, 1.5), (0.5, 0.5), (0.25, 1.25), (0.25, 0.75),
                                   (0.125, 1.125), (3.0, 4.0), (0.75, 0.25)])
def test_a_tick_exactly_at_the_norm_tolerance_hits_on_every_set(tol, k):
    """Defect guarded: a tick exactly 1 +- norm_tol times its key missed as "norm" when the
    ratio of two rounded square roots came out an ulp past the tolerance; the tie hits, a tick
    2^-12 beyond it misses."""
    from fastpath import _kernels as K
    rng = np.random.default_rng(29)
    n = 37
    m = Model((Layer(rng.standard_normal((2, n)).astype(F32), np.zeros(2, F32)),),
              FeatureSpec.identity(n))
    pol = dict(cos_threshold=0.999, norm_tol=tol)
    beyond = k + (2.0 ** -12 if k > 1 else -2.0 ** -12)
    wrong = []
    for isa in ISAS:
        e = _engine(m, isa, pol, max_run=1000)
        for i in range(150):
            c = (np.round(rng.standard_normal(n) * 64) / 64 * 2.0 ** rng.integers(-8, 8)).astype(F32)
            if not np.any(c):
                continue
            f = (c * F32(k)).astype(F32)
            e.reset(0)
            e.step(c, 0, ts_ns=1)
            r = e.step(f, 0, ts_ns=2)
            e.reset(0)
            e.step(c, 0, ts_ns=1)
            far = e.step((c * F32(beyond)).astype(F32), 0, ts_ns=2)
            if r.miss_reason != "hit" or far.miss_reason != "norm" or \
                    K.kernel_cache_decide(isa, f, c, 0.999, tol) != "hit":
                wrong.append((isa, i, r.miss_reason, far.miss_reason))
    assert not wrong, (len(wrong), wrong[:5])
