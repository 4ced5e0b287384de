"""The per-call path of Engine.step / fastpath.step around the C engine: Result objects (a
dropped one is filled again instead of allocating; one the caller still holds must never
change), the argument fast paths (common calls inline, every other input through the
checks with their messages) and the tail of the C step (the Result's stage times and the
latency record both from one conversion)."""
import gc
import sysconfig

import numpy as np
import pytest

import fastpath
from fastpath import Engine, InputError
from helpers.builders import engine_cfg, windowed_model, random_model
from helpers.fake_cuda import HIT_CACHE

FIELDS = ("signal", "confidence", "cached", "miss_reason", "seq", "wait_ns")
LAT = ("feature_ns", "cache_ns", "infer_ns", "h2d_ns", "d2h_ns", "total_ns", "wait_ns")


def snap(r):
    L = r.latency
    return tuple(getattr(r, f) for f in FIELDS) + tuple(getattr(L, f) for f in LAT)


def stream(rng, raw_len, n=200):
    """Repeated ticks with a little noise: the cache policy below gives hits and misses."""
    base = rng.standard_normal((n // 4, raw_len)).astype(np.float32)
    raws = np.repeat(base, 4, axis=0) + np.float32(1e-3) * rng.standard_normal(
        (n, raw_len)).astype(np.float32)
    return np.ascontiguousarray(raws)


def make(isa, seed=5):
    return Engine(windowed_model(np.random.default_rng(seed)), config=engine_cfg(isa, **HIT_CACHE))


@pytest.fixture
def eng(isa):
    return make(isa)


def test_held_results_never_change(eng):
    # every Result kept: none may be filled again by a later tick, whatever the caller does
    # with the others (drops some, keeps some)
    raws = stream(np.random.default_rng(6), eng.raw_len)
    kept, want = [], []
    for i, x in enumerate(raws):
        r = eng.step(x, i % 3, ts_ns=i * 1000)
        if i % 3 == 0:
            kept.append(r)
            want.append(snap(r))
        del r
        if i % 7 == 0:
            eng.step(x, i % 3, ts_ns=i * 1000)      # a Result dropped at once
    assert any(w[2] for w in want) and not all(w[2] for w in want)
    assert [snap(r) for r in kept] == want


def test_result_held_only_by_a_container_is_not_reused(eng):
    raws = stream(np.random.default_rng(7), eng.raw_len, 40)
    box = {"r": [eng.step(raws[0], 0, ts_ns=0)]}
    first = box["r"][0]
    want = snap(first)
    del first
    for i, x in enumerate(raws[1:], 1):
        eng.step(x, 0, ts_ns=i * 1000)
    assert snap(box["r"][0]) == want


def test_a_dropped_result_is_filled_again_with_every_field(isa):
    # `r = step(...)`: the Result of two calls ago is dropped when the next one is stored, so
    # it is reused; a reused Result must read exactly as a new one would
    eng, twin = make(isa), make(isa)
    raws = stream(np.random.default_rng(8), eng.raw_len)
    ids = set()
    r = None
    for i, x in enumerate(raws):
        r = eng.step(x, i % 2, ts_ns=i * 1000)
        ids.add(id(r))
        w = twin.step(x, i % 2, ts_ns=i * 1000)
        rec = eng.latency_records()[-1]
        assert snap(r)[:6] == snap(w)[:6] == snap(w)[:4] + (0, 0), i
        L = r.latency
        assert (L.feature_ns, L.cache_ns, L.infer_ns, L.total_ns) == tuple(int(v) for v in rec)
        assert L.h2d_ns == L.d2h_ns == L.wait_ns == 0
        assert (L.infer_ns == 0) == r.cached
        assert repr(r).startswith(f"Result(signal={r.signal:.6f}")
    # the reuse ran (a count of objects, not a timing); a free-threaded build never reuses
    if not sysconfig.get_config_var("Py_GIL_DISABLED"):
        assert len(ids) <= 3


@pytest.mark.parametrize("stage_times", [True, False])
def test_result_and_record_agree(isa, stage_times):
    # the stage times after t4 come from one read of the clock's rate; the Result and the
    # record carry the same values (-1 / 0 when stage times are off)
    m = windowed_model(np.random.default_rng(9))
    cfg = engine_cfg(isa, **HIT_CACHE)
    cfg["engine"]["stage_times"] = stage_times
    e = Engine(m, config=cfg)
    raws = stream(np.random.default_rng(10), e.raw_len, 80)
    got = [e.step(x, 0, ts_ns=i * 1000).latency for i, x in enumerate(raws)]
    rec = e.latency_records()
    assert len(rec) == len(got)
    for L, row in zip(got, rec):
        assert L.total_ns == int(row[3]) and L.total_ns > 0
        if stage_times:
            assert (L.feature_ns, L.cache_ns, L.infer_ns) == tuple(int(v) for v in row[:3])
        else:
            assert L.feature_ns == L.cache_ns == L.infer_ns == -1
            assert not row[:3].any()


def test_module_step_reuses_and_keeps_held_results(isa):
    m = windowed_model(np.random.default_rng(11))
    e = Engine(m, config=engine_cfg(isa, **HIT_CACHE))
    fastpath.set_default_engine(e)
    try:
        raws = stream(np.random.default_rng(12), e.raw_len, 60)
        held = [fastpath.step(x, 1, i * 1000) for i, x in enumerate(raws[:30])]
        want = [snap(r) for r in held]
        r = None
        for i, x in enumerate(raws[30:], 30):
            r = fastpath.step(x, 1, i * 1000)
        assert [snap(h) for h in held] == want
        assert r.latency.total_ns == int(e.latency_records()[-1][3])
    finally:
        fastpath.set_default_engine(None)


# --- arguments: the inline fast paths fall back to the full checks, same messages ----------

def test_symbol_and_ts_through_the_slow_path(eng):
    x = np.zeros(eng.raw_len, np.float32)
    base = eng.step(x, 2, ts_ns=5).signal
    # accepted off the fast path: numpy integers, ts None (engine clock after ts 5 fails on
    # order, so a fresh symbol)
    assert eng.step(x, np.int64(2), ts_ns=np.int64(6)).signal == pytest.approx(base, abs=1e-6)
    eng.step(x, np.uint8(3), ts_ns=None)
    before = eng.stats()
    bad_sym = [(2**70, "symbol 1180591620717411303424 out of range"),
               (-1, "symbol -1 out of range"),
               (eng.n_symbols, f"symbol {eng.n_symbols} out of range"),
               (True, "got bool True"), (1.0, "got float 1.0"), ("a", "got str 'a'"),
               (np.int64(-2), "symbol -2 out of range")]
    for s, msg in bad_sym:
        with pytest.raises(InputError, match=msg.replace("(", r"\(").replace(")", r"\)")):
            eng.step(x, s, ts_ns=100)
    bad_ts = [(-1, "ts_ns must be >= 0 (ns), got -1"),
              (2**63, f"ts_ns {2**63} does not fit a signed 64-bit int of ns"),
              (-2**70, f"ts_ns {-2**70} does not fit a signed 64-bit int of ns"),
              (1.5, "got float 1.5"), (np.int64(-3), "ts_ns must be >= 0 (ns), got -3"),
              # numpy's own spelling of its bool: "bool np.True_" (numpy 2), "bool_ True" (1.x)
              (np.True_, f"got {type(np.True_).__name__} {np.True_!r}")]
    for t, msg in bad_ts:
        with pytest.raises(InputError) as ei:
            eng.step(x, 2, ts_ns=t)
        assert msg in str(ei.value)
    # no Python error left pending by a failed conversion, and nothing applied
    assert eng.stats()["ticks"] == before["ticks"]
    assert eng.step(x, 2, ts_ns=100).signal == pytest.approx(base, abs=1e-6)
    gc.collect()


F32 = np.float32


def _cache_engine(isa, n=16, n_symbols=4, **pol):
    rng = np.random.default_rng(5)
    policy = dict(enabled=True, cos_threshold=0.999, norm_tol=0.1, max_age_ns=10**12,
                  max_run=1000)
    policy.update(pol)
    return Engine(random_model(rng, [n, 8, 2]),
                  config={"engine": {"simd": isa, "n_symbols": n_symbols}, "cache": policy})


def test_kept_results_never_change_under_the_caller(isa):
    # Results are recycled only when nothing but the engine's spare slot holds them: every
    # Result a caller keeps (in a list, a dict, an attribute, a closure) keeps its values
    e = _cache_engine(isa)
    rng = np.random.default_rng(4)
    xs = rng.standard_normal((40, 16)).astype(F32)
    kept, box = [], {}
    snap = []

    class Holder:
        pass
    h = Holder()
    for i, x in enumerate(xs):
        r = e.step(x, i % 4, ts_ns=i)
        if i % 3 == 0:
            kept.append(r)
        elif i % 3 == 1:
            box[i] = r
        else:
            h.last = r
            f = (lambda rr=r: rr)
            kept.append(f())
        snap.append((id(r), r.signal, r.confidence, r.cached, r.miss_reason,
                     r.latency.total_ns))
        del r
    for i in range(30):                        # results dropped at once: these are recycled
        e.step(xs[i], 0, ts_ns=100 + i)
    by_id = {s[0]: s for s in snap}
    for r in kept + list(box.values()):
        s = by_id[id(r)]
        assert (r.signal, r.confidence, r.cached, r.miss_reason, r.latency.total_ns) == s[1:]
