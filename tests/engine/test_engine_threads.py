"""One engine stepped from several threads: step() calls serialize (each thread's answers are
those of a sequential run, per-symbol state stays apart), and a step during another thread's
step_batch is refused with EngineBusyError, never run concurrently; every tick is accounted
for. Every wait is bounded (Event.wait / join with a timeout, then an assert that the thread
finished)."""
import threading

import numpy as np

from fastpath import EngineBusyError, Engine
from fastpath._build import DEMO_MODEL
from helpers.builders import ISAS, engine_cfg, windowed_model
from helpers.threads import WAIT, raw_tick as _raw, run_in_thread as _run


# ------------------------------------------------------------ the default engine's lifetime


# ------------------------------------------------------------ one engine, several threads

def _batch(rng, n, syms, t0=1000):
    raws = rng.standard_normal((n, 256)).astype(np.float32)
    symbols = np.asarray([syms[i % len(syms)] for i in range(n)], np.int32)
    ts = t0 + np.arange(n, dtype=np.int64) * 1000
    return raws, symbols, ts


def test_threads_on_one_engine_serialize_or_refuse_cleanly():
    """A thread stepping batches (symbols 0-3) and a thread stepping ticks and reading stats
    (symbols 4-7) on one engine: every call either runs whole or raises EngineBusyError
    having changed nothing, so the engine ends as a single-threaded replay of the calls that
    succeeded (symbols do not share state; the order between the two threads' symbols does
    not matter)."""
    cfg = {"engine": {"n_symbols": 8}}
    eng = Engine(DEMO_MODEL, config=cfg)
    rng = np.random.default_rng(7)
    batches = [_batch(rng, 2000, (0, 1, 2, 3), 1000 + k * 10_000_000) for k in range(6)]
    ticks = [(_raw(100 + i), 4 + i % 4, 1000 + i * 1000) for i in range(3000)]
    done_b, done_t = [], []
    busy = {"n": 0}

    def batcher():
        for b in batches:
            while True:
                try:
                    done_b.append((b, eng.step_batch(*b)))
                    break
                except EngineBusyError:
                    busy["n"] += 1

    def ticker():
        for raw, s, ts in ticks:
            while True:
                try:
                    done_t.append(eng.step(raw, s, ts))
                    eng.stats()
                    break
                except EngineBusyError:
                    busy["n"] += 1
    t1, b1 = _run(batcher)
    t2, b2 = _run(ticker)
    # the two threads contend for the GIL on every refused call: ~25 s on an idle 2-core host,
    # so the bound only guards against a hang
    for t in (t1, t2):
        t.join(WAIT * 12)
        assert not t.is_alive()
    assert "e" not in b1 and "e" not in b2, (b1, b2)
    ref = Engine(DEMO_MODEL, config=cfg)
    for b, got in done_b:
        want = ref.step_batch(*b)
        np.testing.assert_array_equal(got.signal, want.signal)
        np.testing.assert_array_equal(got.cached, want.cached)
    for (raw, s, ts), got in zip(ticks, done_t):
        want = ref.step(raw, s, ts)
        assert (got.signal, got.confidence, got.cached) == (want.signal, want.confidence,
                                                            want.cached)
    assert eng.ticks == ref.ticks == 6 * 2000 + 3000
    probe = _raw(999)
    for s in range(8):
        a, b = eng.step(probe, s, 10**12), ref.step(probe, s, 10**12)
        assert (a.signal, a.confidence, a.cached) == (b.signal, b.confidence, b.cached)


# ------------------------------------------------------------ the serving loop


F32 = np.float32


POLICY = {"enabled": True, "cos_threshold": 0.99, "norm_tol": 0.05, "max_age_ns": 50,
          "max_run": 2}


def test_two_threads_stepping_one_engine_answer_as_one_thread(isa):
    # step() holds the GIL for the whole C call: two threads on one engine interleave whole
    # ticks; with one symbol each, each thread's answers are those of a sequential run
    rng = np.random.default_rng(6)
    m = windowed_model(rng, window=3)
    cfg = {"engine": {"simd": isa, "n_symbols": 2}, "cache": POLICY}
    raws = rng.standard_normal((400, 40)).astype(F32)
    raws[1::2] = raws[::2]                   # repeats: hits and misses
    shared = Engine(m, config=cfg)
    got = {0: [], 1: []}
    err = []

    def run(s):
        try:
            for i in range(len(raws)):
                r = shared.step(raws[i], s, ts_ns=i)
                got[s].append((r.signal, r.cached))
        except Exception as exc:              # noqa: BLE001 - reported below
            err.append(exc)
    ths = [threading.Thread(target=run, args=(s,)) for s in (0, 1)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    assert not err, err
    solo = Engine(m, config=cfg)
    want = [(r.signal, r.cached) for r in (solo.step(raws[i], 0, ts_ns=i)
                                          for i in range(len(raws)))]
    assert got[0] == want and got[1] == want
    assert shared.ticks == 2 * len(raws)


def test_step_during_step_batch_on_another_thread_is_refused_cleanly(isa):
    rng = np.random.default_rng(7)
    m = windowed_model(rng, window=3)
    e = Engine(m, config={"engine": {"simd": isa, "n_symbols": 2}})
    raws = rng.standard_normal((200_000, 40)).astype(F32)
    syms = np.zeros(len(raws), np.int64)
    done = threading.Event()
    seen = {"busy": 0, "ok": 0}

    def batch():
        e.step_batch(raws, syms)
        done.set()
    th = threading.Thread(target=batch)
    th.start()
    while not done.is_set():
        try:
            e.step(raws[0], 1)
            seen["ok"] += 1
        except EngineBusyError as exc:
            assert "single-writer" in str(exc)
            seen["busy"] += 1
    th.join()
    assert e.ticks == len(raws) + seen["ok"]


def _ticks(rng, m, n, syms):
    return rng.standard_normal((n, m.raw_len)).astype(np.float32), rng.integers(0, syms, n)


def test_threads_stepping_distinct_symbols_match_sequential():
    """Two threads share one engine, each on its own symbols: per-symbol state is separate,
    so every result equals a single-threaded replay whatever the interleaving."""
    rng = np.random.default_rng(7)
    m = windowed_model(rng)
    raws, _ = _ticks(rng, m, 4000, 1)
    raws[::3] = raws[0]                                   # some repeats so the cache hits
    shared = Engine(m, config=engine_cfg(ISAS[-1]))
    out = {}

    def worker(tid):
        res = []
        for i in range(2000):
            j = tid * 2000 + i
            r = shared.step(raws[j], tid * 4 + i % 4, ts_ns=i)
            res.append((r.signal, r.cached))
        out[tid] = res

    th = [threading.Thread(target=worker, args=(t,)) for t in range(2)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    ref = Engine(m, config=engine_cfg(ISAS[-1]))
    for tid in range(2):
        for i in range(2000):
            j = tid * 2000 + i
            r = ref.step(raws[j], tid * 4 + i % 4, ts_ns=i)
            assert (r.signal, r.cached) == out[tid][i]
    assert shared.stats()["ticks"] == 4000


def test_step_during_step_batch_refused_cleanly():
    """step_batch releases the GIL; a second thread's step meanwhile is refused with
    EngineBusyError, never run concurrently. Every tick is accounted for."""
    rng = np.random.default_rng(8)
    m = windowed_model(rng, hidden=(256, 256))
    raws, syms = _ticks(rng, m, 20000, 8)
    eng = Engine(m, config=engine_cfg(ISAS[-1], enabled=False))
    done = threading.Event()
    counts = {"ok": 0, "busy": 0}

    def poker():
        x = raws[0].copy()
        t = 10**12
        while not done.is_set():
            try:
                eng.step(x, 15, ts_ns=t)
                counts["ok"] += 1
            except EngineBusyError:
                counts["busy"] += 1
            t += 1

    th = threading.Thread(target=poker)
    th.start()
    batches = 0
    first = None
    try:
        for _ in range(5):
            r = eng.step_batch(raws, syms, np.arange(len(raws)) + batches * len(raws))
            first = r if first is None else first
            batches += 1
    finally:
        done.set()
        th.join()
    assert counts["busy"] > 0
    assert eng.stats()["ticks"] == batches * len(raws) + counts["ok"]
    # the poker's symbol is not in the batch, so the batch computed what a lone engine does
    ref = Engine(m, config=engine_cfg(ISAS[-1], enabled=False))
    np.testing.assert_array_equal(first.signal, ref.step_batch(raws, syms, np.arange(len(raws))).signal)
