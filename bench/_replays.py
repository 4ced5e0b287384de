"""The stream and its replays: the tick stream read or generated, step() replayed call by call
(each call's time from Python, its answer and its in-C record), the rows made of the calls a
replay answered one way, the regime summary, the cache trade-off and throughput of step_batch,
and the peers timed on the same features."""
from __future__ import annotations

import time

import numpy as np

import fastpath
from fastpath import Engine, lob

from _harness import (BATCH_RUNS, BATCH_WARM, jsonable, pow2_at_least, stage_dists,
                      thread_counters, time_batches)
from _report import Dist


# Result.miss_reason values, in the engine's order
REASONS = ("hit", "cold", "age", "run", "cosine", "norm", "disabled")
# looser policies of the trade-off table; the first one also gets its own step() replay, so the
# hit row has enough samples (the bundle's policy hits a fraction of a percent of ticks)
TRADEOFF = (("cos 0.99999, norm 0.002", 0.99999, 0.002), ("cos 0.9999, norm 0.005", 0.9999, 0.005),
            ("cos 0.999, norm 0.02", 0.999, 0.02))
LOOSE = TRADEOFF[0]
# a step() call slower than this sat through something other than the engine (the replay's
# time off the CPU is kept beside the row)
STALL_NS = 1_000_000


def data_paths(data: str) -> list:
    """--data's paths: two for 'a.csv,b.csv' (LOBSTER, or a Tardis book and its trades), else one."""
    return lob.sources.data_paths(data)


def data_error(data: str, why) -> SystemExit:
    """The one-line refusal of a --data the bench cannot read (not a reader's traceback)."""
    return SystemExit(f"bench/run.py: --data {data}: cannot read it: {why} (expected "
                      f"{lob.sources.EXPECTED})")


def load_stream(args, bar):
    if args.data:
        # a missing file or one the reader refuses is the caller's error: said in one line,
        # not a traceback from deep in the reader
        try:
            return lob.read_data(args.data)
        except (fastpath.InputError, OSError) as exc:
            raise data_error(args.data, exc) from None
    n = args.ticks if args.ticks is not None else (30_000 if args.quick else 200_000)
    bs = lob.generate_stream(n, n_symbols=8, seed=args.seed, progress=lambda d, t: bar(d / t * 0.6))
    return bs, f"generated ({n} ticks, 8 symbols)"


def replay_step(model, cache: dict | None, raws, syms, ts, overhead: int, warm: int) -> dict:
    """Replay the stream through the public fastpath.step() on an engine built by
    fastpath.configure(): per-call ns from Python, what each call answered (cached, miss reason,
    signal) and the engine's own in-C stage records for the same calls, in the same order."""
    n = len(raws)
    cfg = {"engine": {"latency_records": pow2_at_least(n)}}
    if cache is not None:
        cfg["cache"] = cache
    eng = fastpath.configure(cfg, model=model)
    step = fastpath.step
    for i in range(min(warm, n)):               # warm code paths and pages, then forget it all
        step(raws[i], int(syms[i]), int(ts[i]))
    eng.reset()
    pc = time.perf_counter_ns
    py = np.empty(n, np.int64)
    sig = np.empty(n, np.float64)
    cached = np.empty(n, np.bool_)
    reason = np.empty(n, np.int8)
    code = {name: k for k, name in enumerate(REASONS)}
    buf = np.empty(raws.shape[1], np.float32)
    # nested windows (wall around CPU time around the run-queue counters), as in time_batches:
    # the replay's run-queue wait is then part of its time off the CPU, never more than it
    w0 = pc()
    c0 = time.thread_time_ns()
    u0 = thread_counters()
    for i in range(n):
        buf[:] = raws[i]
        s, t = int(syms[i]), int(ts[i])
        t0 = pc()
        r = step(buf, s, t)
        py[i] = pc() - t0
        sig[i] = r.signal
        cached[i] = r.cached
        reason[i] = code[r.miss_reason]
    u1 = thread_counters()
    c1 = time.thread_time_ns()
    w1 = pc()
    # the replay's time off the CPU: a call that took milliseconds sat through it, and the
    # per-call rows say so (stalls) instead of leaving a bare max
    sched = {"wall_ms": (w1 - w0) / 1e6, "off_cpu_ms": max(w1 - w0 - (c1 - c0), 0) / 1e6,
             "runqueue_wait_ms": None if u0 is None or u0[2] is None else (u1[2] - u0[2]) / 1e6,
             "involuntary_switches": None if u0 is None else u1[0] - u0[0]}
    rec = eng.latency_records()
    if len(rec) != n:
        raise RuntimeError(f"expected {n} latency records, the engine kept {len(rec)}")
    out = {"py": np.maximum(py - overhead, 0), "signal": sig, "cached": cached, "reason": reason,
           "rec": rec, "stats": jsonable(eng.stats()), "memory": None, "sched": sched}
    if getattr(eng, "memory", None):
        out["memory"] = eng.memory.to_dict()
        out["memory"]["page_size"] = eng.memory.page_size
    fastpath.set_default_engine(None)
    return out


def step_row(label, short, what, policy, rp, sel, ref_signal=None):
    """One row of the per-call table: the calls of replay rp selected by sel, timed from Python
    and inside C, with how many there are and what the engine answered for each of them."""
    rec = rp["rec"][sel]
    stages = stage_dists(rec)
    py = Dist.of(rp["py"][sel])
    row = {"label": label, "short": short, "what": what, "policy": policy,
           "samples": int(sel.sum()), "cached_samples": int(rp["cached"][sel].sum()),
           "reasons": {name: int((rp["reason"][sel] == k).sum()) for k, name in enumerate(REASONS)},
           "in_c_records_with_infer": int((rec[:, 2] > 0).sum()),
           "python": py.summary(), "in_c": {k: v.summary() for k, v in stages.items()},
           "stalls": {"calls_over_1ms": int((rp["py"][sel] > STALL_NS).sum()),
                      "replay": rp["sched"]}}
    if ref_signal is not None:
        row["error_on_hits"] = errors_on(rp["signal"], ref_signal, sel & rp["cached"])
    return row, py, stages


def errors_on(sig, ref, sel) -> dict:
    """Signal error of the selected ticks against the cache-off replay of the same stream."""
    if not sel.any():
        return {"mean_abs": 0.0, "max_abs": 0.0, "p99_abs": 0.0, "sign_flips": 0}
    err = np.abs(sig[sel] - ref[sel])
    return {"mean_abs": float(err.mean()), "max_abs": float(err.max()),
            "p99_abs": float(np.percentile(err, 99)),
            "sign_flips": int((np.sign(sig[sel]) * np.sign(ref[sel]) < 0).sum())}


def policy_row(cos, norm, name) -> dict:
    return {"name": name, "enabled": True, "cos_threshold": float(cos), "norm_tol": float(norm)}


def peer_error(name, fn, model, raws, syms, feats) -> float:
    """Max |peer - fastpath's model| over the first tick's outputs, every one of them: the
    reference is the raw tick's (Model.outputs: features, input scaler, layers, post
    transform; forward() takes the model's input, before an input scaler that feats already
    hold). A peer that returns another number of outputs is not timed as the same work."""
    ref = np.asarray(model.outputs(raws[:1], syms[:1])[0], np.float64).reshape(-1)
    got = np.asarray(fn(feats[0]), np.float64).reshape(-1)
    if got.shape != ref.shape:
        raise RuntimeError(f"peer {name} returns {got.size} outputs, the model has {ref.size}: "
                           f"it does not run the same model")
    return float(np.abs(got - ref).max())


def time_peer(fn, feats, n, overhead):
    pc = time.perf_counter_ns
    out = np.empty(n, np.int64)
    buf = np.empty(feats.shape[1], np.float32)
    m = len(feats)
    for i in range(n):
        buf[:] = feats[i % m]
        t0 = pc()
        fn(buf)
        out[i] = pc() - t0
    return np.maximum(out - overhead, 0)


def replay_summary(on: dict, ref, bs, n: int) -> dict:
    """The bundle-policy step() replay, regime by regime, with the shadow error of its hits."""
    cached, reason, py, rec, sig = on["cached"], on["reason"], on["py"], on["rec"], on["signal"]
    err = np.abs(sig - ref)
    sh = errors_on(sig, ref, cached)
    out = {"ticks": n, "hits": int(cached.sum()), "hit_rate": float(cached.mean()),
           "stats": on["stats"],
           "shadow": {"hits_checked": int(cached.sum()), "mean_abs_signal_error": sh["mean_abs"],
                      "max_abs_signal_error": sh["max_abs"], "p99_abs_signal_error": sh["p99_abs"],
                      "sign_flips": sh["sign_flips"]},
           "regimes": [], "timeline": {}}
    for k, name in enumerate(bs.regime_names):
        m = bs.regime == k
        if not m.any():
            continue
        st = stage_dists(rec, m)
        reasons = {x: int(((reason == REASONS.index(x)) & m).sum()) for x in
                   ("cold", "age", "run", "cosine", "norm")}
        h = m & cached
        out["regimes"].append({
            "name": name, "ticks": int(m.sum()), "hits": int(h.sum()), "hit_rate": float(cached[m].mean()),
            "python": Dist.of(py[m]).summary(), "in_c": {s: d.summary() for s, d in st.items()},
            "miss_reasons": reasons,
            "mean_abs_signal_error_on_hits": float(err[h].mean()) if h.any() else 0.0,
            "max_abs_signal_error_on_hits": float(err[h].max()) if h.any() else 0.0})
    nb = min(100, max(n // 100, 1))
    edges = np.linspace(0, n, nb + 1).astype(int)
    tl = {"tick": [], "hit_rate": [], "p50_ns": [], "p99_ns": [], "regime": []}
    for a, b in zip(edges[:-1], edges[1:]):
        if b <= a:
            continue
        tl["tick"].append(int(a))
        tl["hit_rate"].append(float(cached[a:b].mean()))
        # in-C totals of the bin's calls, by the rank rule as every figure: a time some call took
        d = Dist.of(rec[a:b, 3])
        tl["p50_ns"].append(d.p50)
        tl["p99_ns"].append(d.p99)
        tl["regime"].append(bs.regime_names[int(np.bincount(bs.regime[a:b]).argmax())])
    tl["edges"] = [int(x) for x in edges]
    # p50_ns / p99_ns are not the Python figures the regime table prints beside the C ones
    tl["what"] = ("per bin of ticks of the bundle-policy step() replay: hit_rate, and p50_ns / "
                  "p99_ns of fp_step()'s total in C (the stage table's clock), not from Python")
    out["timeline"] = tl
    out["in_c_all"] = {s: d.summary() for s, d in stage_dists(rec).items()}
    out["python_all"] = Dist.of(py).summary()
    return out


def hit_miss_cost(rp) -> dict:
    """p50 / p99 from Python of the hits and of the real misses (a lookup ran and a guard
    refused) of one step() replay."""
    looked = np.isin(rp["reason"], [REASONS.index(x) for x in ("age", "run", "cosine", "norm")])
    out = {}
    for key, sel in (("hit", rp["cached"]), ("miss", looked)):
        d = Dist.of(rp["py"][sel])
        out[key] = {"n": int(sel.sum()), "p50": d.p50 if d.n else None, "p99": d.p99 if d.n else None}
    return out


def cache_tradeoff(model, raws, syms, ts, bs, fresh_signal, edges, step_cost=None,
                   runs: int = BATCH_RUNS, warm: int = BATCH_WARM) -> list:
    """What looser cache policies would buy (hit rate, ns per tick in step_batch: the median of
    `runs` timed calls, the policies taken in turn, see time_batches) and cost (signal error
    and sign flips on hits, against the cache-off replay), per regime; with
    step_cost (policy label -> hit_miss_cost of its step() replay), what a hit and a miss cost
    from Python at that policy."""
    pol = model.cache_policy
    policies = (("bundle policy", pol.cos_threshold, pol.norm_tol),) + TRADEOFF
    timed = time_batches([lambda c=c, t=t: Engine(model, config={"cache": {
        "enabled": True, "cos_threshold": c, "norm_tol": t}}) for _, c, t in policies],
        raws, syms, ts, runs, warm)
    rows = []
    for (label, c, t), (r, eng, timing) in zip(policies, timed):
        e = errors_on(r.signal.astype(np.float64), fresh_signal, r.cached)
        row = {"policy": label, "cos_threshold": c, "norm_tol": t, "hits": int(r.cached.sum()),
               "hit_rate": float(r.cached.mean()), "batch_ns_per_tick": timing["median_ns_per_tick"],
               "batch_timing": {"reported": "median", **timing},
               "mean_abs_error_on_hits": e["mean_abs"], "max_abs_error_on_hits": e["max_abs"],
               "sign_flips_on_hits": e["sign_flips"],
               "miss_reasons": {k: int(v) for k, v in eng.stats()["miss_reasons"].items()},
               "regime_hit_rates": {n: float(r.cached[bs.regime == k].mean())
                                    for k, n in enumerate(bs.regime_names) if (bs.regime == k).any()},
               "timeline_hit_rate": [float(r.cached[a:b].mean())
                                     for a, b in zip(edges[:-1], edges[1:]) if b > a]}
        if step_cost and label in step_cost:
            row["step_python"] = step_cost[label]
        rows.append(row)
    return rows


def batch_throughput(model, raws, syms, ts, runs: int = BATCH_RUNS) -> dict:
    """Ticks per second of step_batch over the whole stream on a fresh engine (cold slots, as a
    process that starts on this stream): the best of `runs` timed calls (cache off and on taken
    in turn), with the median and every call in batch_timing."""
    out = {}
    cfgs = (("cache_off", {"cache": {"enabled": False}}),
            ("cache_on", {"cache": {"enabled": True}}))     # the bundle's policy
    timed = time_batches([lambda cfg=cfg: Engine(model, config=cfg) for _, cfg in cfgs],
                         raws, syms, ts, runs, BATCH_WARM, fresh=True)
    for (name, _), (_, _, timing) in zip(cfgs, timed):
        best = timing["min_ns_per_tick"]
        out[name] = {"ticks_per_s": 1e9 / best, "ns_per_tick": best, "ticks": len(raws),
                     "median_ns_per_tick": timing["median_ns_per_tick"],
                     "batch_timing": {"reported": "best", **timing}}
    return out


def replay_book(model, bs, overhead: int, warm: int) -> dict:
    """Replay the book stream update by update through Engine.step_book (cache off, as the
    step() cache-off row): per-call ns from Python and the book stage's and the whole tick's
    ns inside C, for the same calls."""
    n = len(bs)
    eng = Engine(model, config={"engine": {"latency_records": pow2_at_least(n)},
                                "cache": {"enabled": False}})
    tick = np.broadcast_to(np.asarray(bs.tick_size, np.float64), (n,))
    syms = bs.symbols.tolist()
    for s in sorted(set(syms)):
        eng.set_tick_size(s, float(tick[syms.index(s)]))
    bp, bz = np.ascontiguousarray(bs.bid_px, np.float64), np.ascontiguousarray(bs.bid_sz, np.float64)
    ap, az = np.ascontiguousarray(bs.ask_px, np.float64), np.ascontiguousarray(bs.ask_sz, np.float64)
    ts, vol = bs.ts_ns.tolist(), bs.trade_vol.astype(np.float64).tolist()
    cnt, last = bs.trade_cnt.astype(np.int64).tolist(), bs.last_trade_sz.astype(np.float64).tolist()
    step_book = eng.step_book
    for i in range(min(warm, n)):               # warm code paths and pages, then forget it all
        step_book(syms[i], bp[i], bz[i], ap[i], az[i], ts[i], vol[i], cnt[i], last[i])
    eng.reset()
    pc = time.perf_counter_ns
    py = np.empty(n, np.int64)
    book = np.empty(n, np.int64)
    for i in range(n):
        a, b, c, d = bp[i], bz[i], ap[i], az[i]
        s, t, v, k, x = syms[i], ts[i], vol[i], cnt[i], last[i]
        t0 = pc()
        r = step_book(s, a, b, c, d, t, v, k, x)
        py[i] = pc() - t0
        book[i] = r.latency.book_ns
    return {"py": np.maximum(py - overhead, 0), "book_ns": book, "rec": eng.latency_records()}


def book_row(rp, step_cache_off: dict, adapter_ns_per_tick: float) -> dict:
    """The "book update -> signal" row: step_book per call from Python and its stages in C,
    beside the cache-off step() p50 of the same run and the batch adapter's cost per tick."""
    py = Dist.of(rp["py"])
    total = stage_dists(rp["rec"])["total"]
    step_p50 = step_cache_off["python"]["p50"]
    return {"label": "book update -> signal (Engine.step_book, cache off)",
            "short": "book update", "samples": int(len(rp["py"])),
            "python": py.summary(),
            "in_c": {"book": Dist.of(rp["book_ns"]).summary(), "total": total.summary()},
            "step_cache_off_p50_ns": step_p50,
            "above_step_p50_ns": py.p50 - step_p50,
            "adapter_ns_per_tick": adapter_ns_per_tick,
            "what": ("book update -> signal: Engine.step_book per update (the live book in C, "
                     "then the step), cache off, beside step() cache off on the adapter's "
                     "vectors of the same stream; the batch adapter (lob.raw_from_book) per "
                     "tick is the cost step_book replaces")}
