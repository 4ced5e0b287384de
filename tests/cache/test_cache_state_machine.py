"""The cache as a state machine, against a plain Python model of it.

Vectors come from a small set whose cache decisions are far from every threshold (exact
repeats, tiny perturbations, 2x scaling, unrelated directions), so float32 rounding in C can
never flip a decision and any disagreement is a real bug.
"""

import numpy as np
import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from fastpath import InputError
from fastpath import Engine
from helpers.builders import ISAS, random_model

N = 16          # feature width (identity spec)
SYMS = 2
MAX_AGE = 100
MAX_RUN = 2


def _base_vectors():
    rng = np.random.default_rng(42)
    q, _ = np.linalg.qr(rng.standard_normal((N, N)))
    return np.ascontiguousarray(q[:, :4].T * 3, dtype=np.float32)   # orthogonal: cosine 0


BASE = _base_vectors()
VARIANTS = ("same", "tiny", "double", "other")


class SlotModel:
    """What the engine should do, in plain Python."""

    def __init__(self):
        self.slots = {}
        self.last = {}
        self.hits = self.misses = 0
        self.reasons = {r: 0 for r in ("cold", "age", "run", "cosine", "norm")}

    def lookup(self, sym, key, t):
        s = self.slots.get(sym)
        if s is None:
            return "cold"
        if t - s["t"] > MAX_AGE:
            return "age"
        if s["run"] >= MAX_RUN:
            return "run"
        if s["key"][0] != key[0]:
            return "cosine"
        if s["key"][1] != key[1]:
            return "norm"
        return "hit"


class CacheMachine(RuleBasedStateMachine):
    @initialize(isa=st.sampled_from(ISAS))
    def setup(self, isa):
        self.eng = Engine(random_model(np.random.default_rng(1), [N, 8, 2]),
                          config={"engine": {"simd": isa, "n_symbols": SYMS},
                                  "cache": {"max_age_ns": MAX_AGE, "max_run": MAX_RUN,
                                            "cos_threshold": 0.999, "norm_tol": 0.02}})
        self.model = SlotModel()
        self.t = 0
        self.current = {}      # symbol -> (base index, scale) of the vector cached for it

    def _vector(self, sym, k, variant):
        if variant == "tiny" and sym in self.current:
            kb, scale = self.current[sym]
            v = BASE[kb] * scale
            v = v + np.float32(1e-5) * np.sign(v)            # cosine ~ 1 - 1e-11, norm ~ 1
            return v.astype(np.float32), (kb, scale)
        if variant == "double" and sym in self.current:
            kb, scale = self.current[sym]
            return (BASE[kb] * scale * 2).astype(np.float32), (kb, scale * 2)
        if variant == "same" and sym in self.current:
            kb, scale = self.current[sym]
            return (BASE[kb] * scale).astype(np.float32), (kb, scale)
        return BASE[k].copy(), (k, 1)

    @rule(sym=st.integers(0, SYMS - 1), k=st.integers(0, 3), variant=st.sampled_from(VARIANTS),
          dt=st.sampled_from([0, 1, 2, 40, 101]))
    def step(self, sym, k, variant, dt):
        self.t += dt
        x, key = self._vector(sym, k, variant)
        expect = self.model.lookup(sym, key, self.t)
        r = self.eng.step(x, sym, ts_ns=self.t)
        assert r.miss_reason == expect, (sym, key, self.t, self.model.slots.get(sym))
        m = self.model
        if expect == "hit":
            s = m.slots[sym]
            assert (r.signal, r.confidence) == (s["sig"], s["conf"])
            s["run"] += 1
            m.hits += 1
        else:
            m.slots[sym] = {"key": key, "t": self.t, "run": 0, "sig": r.signal, "conf": r.confidence}
            self.current[sym] = key
            m.misses += 1
            m.reasons[expect] += 1
        m.last[sym] = self.t

    @precondition(lambda self: any(t > 0 for t in self.model.last.values()))
    @rule(data=st.data())
    def backwards(self, data):
        sym = data.draw(st.sampled_from(sorted(s for s, t in self.model.last.items() if t > 0)))
        with pytest.raises(InputError, match="earlier than the last tick"):
            self.eng.step(BASE[0], sym, ts_ns=self.model.last[sym] - 1)

    @rule(sym=st.integers(0, SYMS - 1), bad=st.sampled_from(["nan", "inf", "symbol", "dtype"]))
    def rejected(self, sym, bad):
        x = BASE[0].copy()
        if bad == "nan":
            x[3] = np.nan
        elif bad == "inf":
            x[0] = -np.inf
        elif bad == "symbol":
            sym = SYMS + sym
        else:
            x = x.astype(np.float64)
        with pytest.raises(InputError):
            self.eng.step(x, sym, ts_ns=self.t)

    @rule()
    def reset(self):
        self.eng.reset()
        self.model = SlotModel()
        self.current = {}
        self.t = 0

    @invariant()
    def counters_match(self):
        if not hasattr(self, "eng"):
            return
        s = self.eng.stats()
        m = self.model
        assert (s["hits"], s["misses"]) == (m.hits, m.misses)
        for k, v in m.reasons.items():
            assert s["miss_reasons"][k] == v, k


TestCacheMachine = CacheMachine.TestCase
TestCacheMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
