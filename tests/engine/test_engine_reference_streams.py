"""The engine as a whole: step() against step_batch() against a numpy model of one tick
(features with rolling windows, the cache's decision, the MLP, the head), over multi-symbol
streams with refused ticks and resets in them, on every kernel set; symbols and timestamps at
their extremes; predict() and step_batch() argument edges."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fastpath import Engine, InputError
from fastpath.model import window_pre_features

from helpers.builders import ISAS, random_model, windowed_model

F32 = np.float32
N_SYM = 3
POLICY = {"enabled": True, "cos_threshold": 0.99, "norm_tol": 0.05, "max_age_ns": 50,
          "max_run": 2}


# ------------------------------------------------------------------ the numpy model of a tick

def _mlp64(model, f):
    """The MLP and the tanh/sigmoid head in float64."""
    x = np.asarray(f, np.float64)
    for L in model.layers:
        x = L.weight.astype(np.float64) @ x + L.bias.astype(np.float64)
        x = {"relu": lambda v: np.maximum(v, 0.0), "identity": lambda v: v,
             "tanh": np.tanh, "sigmoid": lambda v: 1.0 / (1.0 + np.exp(-v))}[L.activation](x)
    return np.tanh(x[0]), 1.0 / (1.0 + np.exp(-x[1]))


class Reference:
    """What the engine should answer, tick by tick, in float64: features from the two-pass
    window reference, the cache's four guards, the MLP. A cache decision within 1e-6 of a
    threshold is ambiguous in float arithmetic; there the engine's verdict is taken (and
    counted) so the reference keeps its state in step."""

    def __init__(self, model, pol):
        self.m, self.pol = model, pol
        fs = model.feature_spec
        self.fs = fs
        self.hist = {}          # symbol -> good raws since its last reset
        self.slot = {}          # symbol -> (key, t, signal, confidence, run)
        self.ambiguous = 0

    def reset(self, s=None):
        for k in ([s] if s is not None else list(self.hist)):
            self.hist.pop(k, None)
            self.slot.pop(k, None)

    def features(self, raw, s):
        rows = self.hist.get(s, []) + [raw]
        fs = self.fs
        pre = window_pre_features(np.array(rows, F32), np.zeros(len(rows), int), fs.z_idx,
                                  fs.w_idx, fs.window)[-1].astype(np.float64)
        return (pre - fs.mean.astype(np.float64)) * fs.inv_std.astype(np.float64)

    def step(self, raw, s, t, engine_reason):
        f = self.features(raw, s)
        self.hist.setdefault(s, []).append(raw)
        p = self.pol
        sl = self.slot.get(s)
        if sl is None:
            reason = "cold"
        elif t - sl[1] > p["max_age_ns"]:
            reason = "age"
        elif sl[4] >= p["max_run"]:
            reason = "run"
        else:
            key = sl[0]
            na, nb = np.linalg.norm(f), np.linalg.norm(key)
            cos = f @ key / (na * nb) if na and nb else (1.0 if na == nb else 0.0)
            ratio = na / nb - 1.0 if nb else 0.0
            near = abs(cos - p["cos_threshold"]) < 1e-6 or (
                cos >= p["cos_threshold"] and abs(abs(ratio) - p["norm_tol"]) < 1e-6)
            if near:
                self.ambiguous += 1
                reason = engine_reason
            elif cos < p["cos_threshold"]:
                reason = "cosine"
            elif abs(ratio) > p["norm_tol"]:
                reason = "norm"
            else:
                reason = "hit"
        if reason == "hit":
            key, t0, sig, conf, run = sl
            self.slot[s] = (key, t0, sig, conf, run + 1)
            return sig, conf, True, reason
        sig, conf = _mlp64(self.m, f)
        self.slot[s] = (f, t, sig, conf, 0)
        return sig, conf, False, reason


# ------------------------------------------------------------------ the stream

# a good tick: (symbol, fresh or a repeat of the symbol's last good raw);
# a refused one: ("nan" | "symbol" | "back" | "dtype" | "bool", symbol); ("reset", symbol)
_good = st.tuples(st.just("good"), st.integers(0, N_SYM - 1), st.booleans())
_bad = st.tuples(st.sampled_from(["nan", "symbol", "back", "dtype", "bool"]),
                 st.integers(0, N_SYM - 1), st.just(False))
_reset = st.tuples(st.just("reset"), st.integers(-1, N_SYM - 1), st.just(False))
OPS = st.lists(st.one_of(_good, _good, _good, _bad, _reset), min_size=1, max_size=45)


def _refuse(eng, op, s, raw, last_t, t):
    """Send one bad tick; it must be refused with an InputError."""
    with pytest.raises(InputError):
        if op == "nan":
            bad = raw.copy()
            bad[int(t) % len(bad)] = np.nan
            eng.step(bad, s, ts_ns=t)
        elif op == "symbol":
            eng.step(raw, N_SYM if t % 2 else -1, ts_ns=t)
        elif op == "back":
            eng.step(raw, s, ts_ns=last_t - 1)
        elif op == "dtype":
            eng.step(raw.astype(np.float64), s, ts_ns=t)
        else:
            eng.step(raw, True, ts_ns=t)


def _same_bits(a, b):
    return np.float32(a).tobytes() == np.float32(b).tobytes()


@settings(max_examples=25, deadline=None)
@given(ops=OPS, window=st.sampled_from([1, 2, 3, 5]), seed=st.integers(0, 2**31 - 1))
def test_whole_engine_step_batch_and_numpy_agree_with_refusals_and_resets(ops, window, seed):
    rng = np.random.default_rng(seed)
    model = windowed_model(rng, window=window)
    fresh = (rng.standard_normal((len(ops), model.feature_spec.raw_len)) * 2).astype(F32)
    for isa in ISAS:
        cfg = {"engine": {"simd": isa, "n_symbols": N_SYM}, "cache": POLICY}
        a = Engine(model, config=cfg)       # every op, bad ticks included
        b = Engine(model, config=cfg)       # only the good ticks and the resets
        c = Engine(model, config=cfg)       # the good ticks through step_batch
        ref = Reference(model, POLICY)
        last_raw, last_t = {}, {}
        pending, got_b = [], []
        t = 0

        def flush():
            if pending:
                raws = np.ascontiguousarray([p[0] for p in pending])
                r = c.step_batch(raws, np.array([p[1] for p in pending]),
                                 np.array([p[2] for p in pending], np.int64))
                got_b.extend(zip(r.signal, r.confidence, r.cached))
                pending.clear()

        answers = []
        for i, (op, s, repeat) in enumerate(ops):
            t += 7
            if op == "reset":
                sym = None if s < 0 else s
                for e in (a, b):
                    e.reset(sym)
                flush()
                c.reset(sym)
                ref.reset(sym)
                for d in (last_raw, last_t):
                    d.clear() if sym is None else d.pop(sym, None)
                continue
            raw = last_raw[s] if (repeat and s in last_raw) else fresh[i]
            if op != "good":
                if op == "back" and last_t.get(s, 0) < 1:
                    continue
                _refuse(a, op, s, raw, last_t.get(s, 0), t)
                continue
            fb = b.features(raw, s)
            ra = a.step(raw, s, ts_ns=t)
            rb = b.step(raw, s, ts_ns=t)
            # a refused tick changed nothing: the same bits as the engine that never saw it
            assert (_same_bits(ra.signal, rb.signal) and _same_bits(ra.confidence, rb.confidence)
                    and ra.cached == rb.cached and ra.miss_reason == rb.miss_reason), (isa, i)
            want = ref.features(raw, s)
            np.testing.assert_allclose(fb, want, rtol=2e-4, atol=2e-4,
                                       err_msg=f"{isa} tick {i}")
            sig, conf, cached, reason = ref.step(raw, s, t, rb.miss_reason)
            assert rb.miss_reason == reason and bool(rb.cached) == cached, (isa, i, reason)
            assert abs(rb.signal - sig) < 1e-4 and abs(rb.confidence - conf) < 1e-4, (isa, i)
            answers.append((rb.signal, rb.confidence, rb.cached))
            pending.append((raw, s, t))
            last_raw[s], last_t[s] = raw, t
        flush()
        # step_batch answers as step does, bit for bit
        assert len(got_b) == len(answers)
        for j, (x, y) in enumerate(zip(answers, got_b)):
            assert _same_bits(x[0], y[0]) and _same_bits(x[1], y[1]) and bool(x[2]) == bool(y[2]), \
                (isa, j)
        sa, sb, sc = a.stats(), b.stats(), c.stats()
        for k in ("ticks", "hits", "misses", "miss_reasons"):
            assert sa[k] == sb[k] == sc[k], (isa, k)
        probe = fresh[0]
        for s in range(N_SYM):
            fa, fb, fc = a.features(probe, s), b.features(probe, s), c.features(probe, s)
            assert fa.tobytes() == fb.tobytes() == fc.tobytes(), (isa, s)


# ------------------------------------------------------------------ the cache at its edges

def _cache_engine(isa, n=16, n_symbols=4, **pol):
    rng = np.random.default_rng(5)
    policy = dict(enabled=True, cos_threshold=0.999, norm_tol=0.1, max_age_ns=10**12,
                  max_run=1000)
    policy.update(pol)
    return Engine(random_model(rng, [n, 8, 2]),
                  config={"engine": {"simd": isa, "n_symbols": n_symbols}, "cache": policy})


@pytest.mark.parametrize("sym", [0, 3, np.int8(3), np.uint8(0), np.int16(2), np.uint16(1),
                                 np.int32(3), np.uint32(2), np.int64(1), np.uint64(3)])
def test_symbols_at_the_ends_and_numpy_integers(isa, sym):
    e = _cache_engine(isa)
    x = np.linspace(1, 2, 16).astype(F32)
    assert e.step(x, sym, ts_ns=1).miss_reason == "cold"
    r = e.step(x, sym, ts_ns=2)
    assert r.cached
    others = [s for s in range(4) if s != int(sym)]
    assert all(e.step(x, s, ts_ns=3).miss_reason == "cold" for s in others)


@pytest.mark.parametrize("sym", [-1, 4, 2**31, 2**63, 2**64, -2**63 - 1, np.int64(-1),
                                 np.uint64(2**64 - 1), True, np.bool_(False), 1.0, "0", None])
def test_bad_symbols_refused_state_unchanged(isa, sym):
    e = _cache_engine(isa)
    x = np.linspace(1, 2, 16).astype(F32)
    e.step(x, 0, ts_ns=1)
    before = e.stats()
    with pytest.raises(InputError, match="symbol"):
        e.step(x, sym, ts_ns=2)
    with pytest.raises(InputError, match="symbol"):
        e.features(x, sym)
    with pytest.raises(InputError, match="symbol"):
        e.reset(sym) if sym is not None else e.step_batch(x[None], [4])
    after = e.stats()
    assert {k: before[k] for k in ("ticks", "hits", "misses", "miss_reasons")} == \
           {k: after[k] for k in ("ticks", "hits", "misses", "miss_reasons")}
    assert e.step(x, 0, ts_ns=3).cached


def test_features_after_a_timestamp_past_2_62():
    """Defect guarded: features() after a tick stepped at ts_ns past 2**62 raised "the engine
    clock is earlier than the last tick" for a valid call."""
    rng = np.random.default_rng(2)
    e = Engine(windowed_model(rng), config={"engine": {"n_symbols": 2}})
    x = rng.standard_normal(40).astype(F32)
    for ts in ((1 << 62) + 5, 2**63 - 1):
        e.step(x, 0, ts_ns=ts)
        f = e.features(x, 0)
        assert f.shape == (e.n_features,) and np.isfinite(f).all()
    assert e.ticks == 2


def test_reset_mid_stream_equals_a_fresh_engine(isa):
    # windows half full, just wrapped and full, cache warm: reset(s) makes s a fresh symbol
    rng = np.random.default_rng(8)
    m = windowed_model(rng, window=4)
    cfg = {"engine": {"simd": isa, "n_symbols": 2}, "cache": POLICY}
    raws = (rng.standard_normal((30, 40))).astype(F32)
    for cut in (2, 4, 5, 9):
        e, fresh = Engine(m, config=cfg), Engine(m, config=cfg)
        for i in range(cut):
            e.step(raws[i], 0, ts_ns=100 + i)
            e.step(raws[i], 1, ts_ns=100 + i)
        e.reset(0)
        for i in range(cut, 30):
            r0, rf = e.step(raws[i], 0, ts_ns=i), fresh.step(raws[i], 0, ts_ns=i)
            assert r0.signal == rf.signal and r0.miss_reason == rf.miss_reason, (cut, i)
            e.step(raws[i], 1, ts_ns=200 + i)


# ------------------------------------------------------------------ the GPU behind step()


# ------------------------------------------------------------------ config


# ------------------------------------------------------------------ Result and threads


# ------------------------------------------------------------------ predict and step_batch input

def test_predict_big_endian_float32_is_read_by_value(isa):
    """Defect guarded: predict() read a big-endian float32 array's bytes as native floats
    (outputs ~1e37 instead of ~1, silently)."""
    rng = np.random.default_rng(9)
    e = Engine(random_model(rng, [16, 8, 2]), config={"engine": {"simd": isa, "n_symbols": 2}})
    x = rng.standard_normal(16).astype(F32)
    want = e.predict(x)
    for y in (x.astype(">f4"), x.astype("<f4"), x.astype(np.float64),
              np.repeat(x, 2)[::2], x.astype(">f8")):
        assert e.predict(y).tobytes() == want.tobytes(), y.dtype


@pytest.mark.parametrize("syms", [np.array([2**64 - 1], np.uint64), np.array([2**63], np.uint64),
                                  [2**63], np.array([2**40]), np.array([-2**63])])
def test_step_batch_symbols_past_int64_are_input_errors(isa, syms):
    """Defect guarded: a uint64 symbol of 2**63 or more raised OverflowError instead of the
    InputError naming its row."""
    rng = np.random.default_rng(10)
    e = Engine(random_model(rng, [16, 8, 2]), config={"engine": {"simd": isa, "n_symbols": 2}})
    x = rng.standard_normal((1, 16)).astype(F32)
    with pytest.raises(InputError, match=r"row 0: symbol -?\d+ out of range"):
        e.step_batch(x, syms)
    assert e.ticks == 0


def test_step_batch_of_nothing_with_empty_lists(isa):
    """Defect guarded: step_batch of no rows with symbols given as [] was refused because numpy
    reads [] as float64."""
    rng = np.random.default_rng(12)
    e = Engine(random_model(rng, [16, 8, 2]), config={"engine": {"simd": isa, "n_symbols": 2}})
    empty = np.empty((0, 16), F32)
    for args in (([],), ([], []), ((), ()), (np.empty(0, np.int64), [])):
        r = e.step_batch(empty, *args)
        assert len(r.signal) == len(r.cached) == 0
    assert e.ticks == 0
    with pytest.raises(InputError, match="symbols must be an integer array"):
        e.step_batch(empty, np.empty(0, np.float64))


# ------------------------------------------------------------------ the range parser

