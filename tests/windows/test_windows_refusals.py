"""The early window commit: fp_step commits a tick's rolling window before the cache lookup and
restores an undo record when the model refuses the tick.

An engine that was handed refused ticks must stay bit-identical to a twin that never saw
them, whatever the window shape (no window, 1..7 fields, more than one 8-lane step with a
masked tail), the ring position, the symbol mix, the cause of the refusal (an overflowed
layer, an overflowed z-score, an overflowed window feature), the model kind (MLP, tree
ensemble), the entry point (step, step_batch with a refused row mid-batch) and the state
memory (the engine's own, or a [memory] region); on every kernel set. The engine's windows
are compared through Engine.features(), which reads them without applying anything, and
through every later answer."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastpath import Engine, InputError
from helpers.refusing_models import (N_SYM, W0, engine_cfg as cfg, good_tick, mlp_model, spoil,
                                     tree_model)

def probe_windows(eng, twin, n_w):
    """Each symbol's window, read through features() (applies nothing): bit-identical."""
    x = np.zeros(W0 + max(n_w, 1), np.float32)
    x[W0:] = 0.5e-3
    for s in range(N_SYM):
        assert eng.features(x, s).tobytes() == twin.features(x, s).tobytes(), s


def same(a, b):
    return (a.signal, a.confidence, a.cached, a.miss_reason) == \
           (b.signal, b.confidence, b.cached, b.miss_reason)


def stats_of(eng):
    s = eng.stats()
    return s["ticks"], s["hits"], s["misses"], s["miss_reasons"]


OPS = st.lists(st.tuples(st.integers(0, N_SYM - 1),
                         st.sampled_from(["good", "good", "good", "out", "zfeat", "wfeat"])),
               min_size=1, max_size=40)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n_w=st.sampled_from([0, 1, 3, 8, 9, 17]), window=st.integers(1, 6),
       cache=st.booleans(), trees=st.sampled_from([None, "plain", "probit"]),
       memory=st.booleans(), ops=OPS, seed=st.integers(0, 2**16))
def test_refused_ticks_leave_no_trace(isa, n_w, window, cache, trees, memory, ops, seed):
    """Random interleavings of good and refused ticks over several symbols: the engine answers
    every good tick exactly as a twin that only saw the good ones, and its windows and
    counters end equal."""
    if trees == "plain":
        # a tree ensemble maps any finite feature to a leaf: only features can refuse a tick
        ops = [(s, "zfeat" if k == "out" else k) for s, k in ops]
        model = tree_model(n_w, window, cache)
    elif trees == "probit":
        model = tree_model(n_w, window, cache, probit=True)
    else:
        model = mlp_model(n_w, window, cache, seed)
    if n_w == 0:
        ops = [(s, "zfeat" if k == "wfeat" else k) for s, k in ops]
    eng = Engine(model, config=cfg(isa, memory))
    twin = Engine(model, config=cfg(isa))
    rng = np.random.default_rng(seed)
    t = 0
    for sym, kind in ops:
        t += 1000
        x = good_tick(rng, n_w)
        if kind == "good":
            assert same(eng.step(x, sym, ts_ns=t), twin.step(x, sym, ts_ns=t)), (sym, t)
        else:
            with pytest.raises(InputError, match="not applied"):
                eng.step(spoil(x, kind, n_w), sym, ts_ns=t)
    probe_windows(eng, twin, n_w)
    # more than a window of ticks on every symbol after the last refusal
    for i in range(N_SYM * (window + 2)):
        t += 1000
        x = good_tick(rng, n_w)
        assert same(eng.step(x, i % N_SYM, ts_ns=t), twin.step(x, i % N_SYM, ts_ns=t))
    assert stats_of(eng) == stats_of(twin)
    probe_windows(eng, twin, n_w)


@pytest.mark.parametrize("n_w", [0, 2, 9])
@pytest.mark.parametrize("trees", [False, True])
def test_step_batch_refused_row_mid_batch(isa, n_w, trees):
    """A batch whose row k the model refuses: rows before k applied, row k restored, and the
    engine continues (rest of the batch) exactly as a twin that stepped only the good rows."""
    window = 3
    model = tree_model(n_w, window, True) if trees else mlp_model(n_w, window, True)
    rng = np.random.default_rng(n_w)
    n = 30
    raws = np.stack([good_tick(rng, n_w) for _ in range(n)])
    syms = (np.arange(n) % N_SYM).astype(np.int32)
    ts = (1000 * (np.arange(n) + 1)).astype(np.int64)
    kinds = ["zfeat", "wfeat"] if n_w and trees else ["zfeat"] if trees else \
        ["out", "zfeat"] + (["wfeat"] if n_w else [])
    for kind in kinds:
        for k in (0, 4, 11, n - 1):
            eng, twin = Engine(model, config=cfg(isa)), Engine(model, config=cfg(isa))
            bad = raws.copy()
            bad[k] = spoil(raws[k], kind, n_w)
            with pytest.raises(InputError, match=f"row {k}:"):
                eng.step_batch(bad, syms, ts)
            if k + 1 < n:
                got = eng.step_batch(bad[k + 1:], syms[k + 1:], ts[k + 1:])
            keep = np.r_[0:k, k + 1:n]
            want = twin.step_batch(raws[keep], syms[keep], ts[keep])
            if k + 1 < n:
                assert got.signal.tobytes() == want.signal[k:].tobytes(), (kind, k)
                assert got.cached.tobytes() == want.cached[k:].tobytes(), (kind, k)
            assert stats_of(eng) == stats_of(twin), (kind, k)
            probe_windows(eng, twin, n_w)


def test_reset_after_a_refusal(isa):
    """reset(symbol) / reset() right after a refused tick: nothing of the undo record survives
    into the emptied windows."""
    model = mlp_model(9, 3, True)
    rng = np.random.default_rng(3)
    eng, twin = Engine(model, config=cfg(isa)), Engine(model, config=cfg(isa))
    t = 0
    for i in range(10):
        t += 1000
        x = good_tick(rng, 9)
        eng.step(x, i % N_SYM, ts_ns=t)
        twin.step(x, i % N_SYM, ts_ns=t)
    with pytest.raises(InputError):
        eng.step(spoil(good_tick(rng, 9), "wfeat", 9), 1, ts_ns=t + 1)
    eng.reset(1)
    twin.reset(1)
    probe_windows(eng, twin, 9)
    for i in range(10):
        t += 1000
        x = good_tick(rng, 9)
        assert same(eng.step(x, i % N_SYM, ts_ns=t), twin.step(x, i % N_SYM, ts_ns=t))
    with pytest.raises(InputError):
        eng.step(spoil(good_tick(rng, 9), "out", 9), 2, ts_ns=t + 1)
    eng.reset()
    twin.reset()
    probe_windows(eng, twin, 9)
    t = 0
    for i in range(10):
        t += 1000
        x = good_tick(rng, 9)
        assert same(eng.step(x, i % N_SYM, ts_ns=t), twin.step(x, i % N_SYM, ts_ns=t))


# ------------------------------------------------------------------------------------ bench


