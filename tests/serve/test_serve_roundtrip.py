"""Round trip through a server: every answer equals a local engine's for the same ticks, in
order, from one client or several, pipelined or interleaved; errors come back with the tick
they belong to."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import fastpath
from fastpath import InputError, RingFull
from fastpath._build import DEMO_MODEL
from helpers.serving import PKG_ROOT, cfg, deadline, raw_zero, ticks, uname


# ------------------------------------------------------------------ per-tick errors by poll()
def test_poll_error_names_the_ticks_own_symbol_and_ts():
    """Regression: an error taken by poll() named symbol -1 and no ts_ns instead of the tick's
    own."""
    name = uname()
    raw = raw_zero()
    with fastpath.serve(name, None, cfg()), fastpath.connect(name) as c:
        c.step(raw, 2, 1000)
        s_ok = c.submit(raw, 3, 10)
        s_bad = c.submit(raw, 2, 500)
        s_none = c.submit(raw, 2)          # the engine clock: no ts_ns given
        got = {}
        with deadline(60):
            while len(got) < 3:
                got.update(c.poll())
        assert isinstance(got[s_ok], fastpath.Result)
        err = got[s_bad]
        assert isinstance(err, InputError)
        assert "ts_ns 500" in str(err) and "symbol 2 " in str(err), str(err)
        assert "-1" not in str(err)
        # the engine clock (ns since boot, far past 1000) is not earlier: this one passes
        assert isinstance(got[s_none], fastpath.Result)


def test_poll_error_records_survive_ring_wrap():
    """After many turns of the ring an error taken by poll() still names the right tick."""
    name = uname()
    raw = raw_zero()
    with fastpath.serve(name, None, cfg(ring_slots=4)), fastpath.connect(name) as c:
        for i in range(1, 40):
            c.step(raw, i % 5, 1_000_000 + i)
        c.submit(raw, 1, 999)              # earlier than symbol 1's last tick
        c.submit(raw, 7, 2_000_000)
        got = {}
        with deadline(60):
            while len(got) < 2:
                got.update(c.poll())
        errs = [v for v in got.values() if isinstance(v, Exception)]
        assert len(errs) == 1 and "ts_ns 999" in str(errs[0]) and "symbol 1 " in str(errs[0])


# ------------------------------------------------------------------ interleavings
@pytest.mark.parametrize("on_full", ["spin", "reject"])
def test_random_interleaving_of_submit_poll_step_matches_a_local_engine(on_full):
    """Submits, polls and steps in random order over a 4-slot ring answer as a local Engine
    does, seq for seq, errors included."""
    rng = np.random.default_rng(11)
    raw_len = fastpath.get_default_engine().raw_len
    raws = ticks(600, raw_len, seed=4)
    local = fastpath.Engine(DEMO_MODEL, config=cfg())
    name = uname()
    want, got, sent = {}, {}, 0
    last_ts = {}
    with fastpath.serve(name, None, cfg(ring_slots=4, on_full=on_full)), \
            fastpath.connect(name) as c, deadline(60):
        for i in range(600):
            sym = int(rng.integers(0, 4))
            # now and then a tick earlier than the symbol's last: an error reply
            ts = last_ts.get(sym, 0) + int(rng.integers(1, 1000))
            if rng.random() < 0.05 and sym in last_ts:
                ts = last_ts[sym] - 1
            action = rng.random()
            if action < 0.15:
                try:
                    r = c.step(raws[i], sym, ts)
                    got[r.seq] = (r.signal, r.confidence, r.cached, r.miss_reason)
                except InputError:
                    got[sent + 1] = "error"
                except RingFull:
                    continue
                seq = sent + 1
            else:
                try:
                    seq = c.submit(raws[i], sym, ts)
                except RingFull:
                    continue                       # not sent: the local engine skips it too
            assert seq == sent + 1
            sent = seq
            try:
                r = local.step(raws[i], sym, ts)
                want[seq] = (r.signal, r.confidence, r.cached, r.miss_reason)
                last_ts[sym] = ts
            except InputError:
                want[seq] = "error"
            if rng.random() < 0.3:
                for s, r in c.poll():
                    got[s] = "error" if isinstance(r, Exception) else \
                        (r.signal, r.confidence, r.cached, r.miss_reason)
        while len(got) < sent:
            for s, r in c.poll():
                got[s] = "error" if isinstance(r, Exception) else \
                    (r.signal, r.confidence, r.cached, r.miss_reason)
        # one refused tick for certain (under load "reject" may have refused every random
        # one at the ring): the same InputError both ways, and the state after it alike
        sym = max(last_ts, key=last_ts.get)
        with pytest.raises(InputError, match="earlier than"):
            c.step(raws[0], sym, last_ts[sym] - 1)
        with pytest.raises(InputError, match="earlier than"):
            local.step(raws[0], sym, last_ts[sym] - 1)
        r = c.step(raws[1], sym, last_ts[sym] + 1)
        want_r = local.step(raws[1], sym, last_ts[sym] + 1)
        assert (r.signal, r.confidence, r.cached) == (want_r.signal, want_r.confidence,
                                                      want_r.cached)
    assert sorted(got) == list(range(1, sent + 1))
    assert got == want


def local_results(model, raws, syms, ts, config):
    eng = fastpath.Engine(model, config=config)
    out = [eng.step(raws[i], int(syms[i]), int(ts[i])) for i in range(len(raws))]
    return (np.array([r.signal for r in out]), np.array([r.confidence for r in out]),
            np.array([r.cached for r in out]))


def test_round_trip_equals_local_engine(model, isa):
    config = cfg()
    config["engine"]["simd"] = isa
    n = 400
    raws = ticks(n, model.feature_spec.raw_len)
    syms = np.arange(n) % 5
    ts = 1_000_000 * (np.arange(n) + 1)
    sig, conf, cached = local_results(model, raws, syms, ts, config)
    name = uname()
    with fastpath.serve(name, model, config), fastpath.connect(name) as c:
        got = [c.step(raws[i], int(syms[i]), int(ts[i])) for i in range(n)]
    assert [r.seq for r in got] == list(range(1, n + 1))
    np.testing.assert_array_equal([r.signal for r in got], sig)
    np.testing.assert_array_equal([r.confidence for r in got], conf)
    np.testing.assert_array_equal([r.cached for r in got], cached)
    assert cached.any() and not cached.all()          # both paths were exercised
    r = got[-1]
    assert r.miss_reason in ("hit", "cold", "age", "run", "cosine", "norm", "disabled")
    lat = r.latency
    assert lat.total_ns > 0 and lat.wait_ns >= 0 and lat.h2d_ns == 0


def test_pipelined_submits_are_answered_in_order(model):
    name = uname()
    raws = ticks(300, model.feature_spec.raw_len, seed=1)
    with fastpath.serve(name, model, cfg()), fastpath.connect(name) as c:
        seqs = [c.submit(raws[i], i % 3, 1000 * (i + 1)) for i in range(300)]
        got = []
        with deadline(60):
            while len(got) < 300:
                got += c.poll()
    assert seqs == list(range(1, 301))
    assert [s for s, _ in got] == seqs


SOAK_CLIENT = textwrap.dedent("""
    import sys, numpy as np, fastpath
    name, raws_path, sym0, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    raws = np.load(raws_path)
    n = len(raws)
    c = fastpath.connect(name, timeout=5)
    seqs = np.zeros(n, np.int64); sig = np.zeros(n); conf = np.zeros(n)
    k = 0
    for i in range(n):
        c.submit(raws[i], sym0 + i % 4, 1000 * (i + 1))
        if i % 64 == 63 or i == n - 1:
            for s, r in c.poll():
                seqs[k] = s; sig[k] = r.signal; conf[k] = r.confidence; k += 1
    while k < n:
        for s, r in c.poll():
            seqs[k] = s; sig[k] = r.signal; conf[k] = r.confidence; k += 1
    c.close()
    np.savez(out, seqs=seqs, sig=sig, conf=conf)
""")


# a few laps of the default rings per client; the soak sends 50,000 per client
@pytest.mark.parametrize("n", [3_000, pytest.param(50_000, marks=pytest.mark.soak)])
def test_two_client_processes_get_a_local_engines_answers_in_order(model, tmp_path, n):
    """n requests from each of 2 processes: every answer arrives once, in order, and equals a
    local Engine's."""
    raw_len = model.feature_spec.raw_len
    name = uname()
    config = cfg()
    script = tmp_path / "client.py"
    script.write_text(SOAK_CLIENT)
    paths = []
    for k in range(2):
        p = tmp_path / f"raws{k}.npy"
        np.save(p, ticks(n, raw_len, seed=10 + k))
        paths.append(p)
    env = dict(os.environ, PYTHONPATH=PKG_ROOT)
    with fastpath.serve(name, model, config):
        procs = [subprocess.Popen([sys.executable, str(script), name, str(paths[k]), str(4 * k),
                                   str(tmp_path / f"out{k}.npz")], env=env, cwd=PKG_ROOT) for k in range(2)]
        for p in procs:
            assert p.wait(timeout=120) == 0
    for k in range(2):
        out = np.load(tmp_path / f"out{k}.npz")
        assert np.array_equal(out["seqs"], np.arange(1, n + 1))   # none lost, doubled, reordered
        raws = np.load(paths[k])
        syms = 4 * k + np.arange(n) % 4
        eng = fastpath.Engine(model, config=config)
        ts = 1000 * (np.arange(n, dtype=np.int64) + 1)
        ref = eng.step_batch(raws, syms, ts)
        np.testing.assert_array_equal(out["sig"], ref.signal.astype(np.float64))
        np.testing.assert_array_equal(out["conf"], ref.confidence.astype(np.float64))


def test_bad_input_is_refused_at_the_client(model):
    name = uname()
    raw_len = model.feature_spec.raw_len
    good = ticks(1, raw_len)[0]
    with fastpath.serve(name, model, cfg()) as srv, fastpath.connect(name) as c:
        bad_raw = [good.astype(np.float64), good[:-1], np.ascontiguousarray(np.stack([good] * 2).T)[:, 0],
                   list(good)]
        for raw in bad_raw:
            with pytest.raises(InputError, match="float32 C-contiguous"):
                c.step(raw, 0)
        for sym in (-1, 16, 2.0, "BTC", True):
            with pytest.raises(InputError, match="symbol"):
                c.submit(good, sym)
        for ts in (-5, 1.5):
            with pytest.raises(InputError, match="ts_ns"):
                c.submit(good, 0, ts)
        nan = good.copy()
        nan[3] = np.nan
        with pytest.raises(InputError, match="non-finite value.*index 3"):
            c.step(nan, 0)
        assert srv.stats()["served"] == 0             # nothing reached the ring
        c.step(good, 1, 5000)
        # only the worker knows a symbol's last tick: it refuses, and the client says why
        with pytest.raises(InputError, match="earlier than the last tick of symbol 1"):
            c.step(good, 1, 4000)
        st = srv.stats()
        assert st["served"] == 2 and st["errors"] == 1
        assert c.step(good, 1, 6000).seq == 3      # ticks refused at the client took no seq
