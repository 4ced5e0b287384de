"""fastpath bench: what one tick costs, stage by stage, next to the tools people use today.

    python bench/run.py                 # generated order-book stream with regimes (about 10 s)
    python bench/run.py --quick         # the same, smaller (< 30 s)
    python bench/run.py --data ../shared/data/binance-btcusdt-2024-08-08
    python bench/run.py --data orderbook.csv,message.csv      # a LOBSTER pair
    python bench/run.py --data glbx-mdp3.mbp-10.dbn.zst        # Databento MBP-10
    python bench/run.py --data book_snapshot_25.csv.gz,trades.csv.gz   # Tardis (trades optional)
    python bench/readme_figures.py bench/results/latest-generated.json   # the README tables

Method (printed with the results):
- Every figure is a distribution recorded in an HdrHistogram (3 significant digits) when the
  hdrhistogram package is installed, else picked from the sorted samples by the histogram's
  rank rule (the same sample: no interpolated time that no call took); max and mean are the
  samples' own (the slowest call to the ns, not the top of its bucket), and a percentile that
  falls in the slowest call's bucket is that call's time, never above it; the JSON keeps the
  whole percentile distribution of each row (percentile_distributions) and how many samples it has.
- "from Python" = time.perf_counter_ns() around one fastpath.step() call, minus the median cost of
  an empty timed region (timer_overhead_ns); peers are timed the same way. Where the kernel's
  clocksource is the TSC, both clocks (this one and the TSC behind "in C") read the same counter.
  The step of fastpath's clock is measured (machine.clock_step): where it advances in steps of
  several ns (a hypervisor's TSC), every figure it times is a whole number of them and the notes
  say so.
- The stream is replayed in order through fastpath.step() three times: with the bundle's own
  (fitted) cache policy, with a looser policy, and with the cache off. Rows are sets of calls
  selected by what the engine answered: "real miss" = calls of the bundle-policy replay where the
  symbol's slot held a result, the lookup ran and a guard refused it (cold slots left out);
  "real hit" = calls the cache answered, in the bundle-policy replay and in the looser-policy
  replay (the looser policy's signal error on those hits, against the cache-off replay, is
  printed next to it); "model only, cache off" = every call of the cache-off replay (no lookup,
  so not a miss). The trade-off table's looser policies get a step() replay each too, for what a
  hit and a real miss cost from Python at that hit rate: a hit is dearer where hits are rare
  (the CPU predicts a miss, runs ahead into the model and throws that work away).
- step_batch figures (the trade-off table's ns/tick, the throughput table) come from several
  timed step_batch calls over the whole stream each: the trade-off rows print the median (one
  engine per policy, which steps the stream's first 2000 ticks and is reset() before each call),
  the throughput table the best and the median (a fresh engine per call). The calls of one table
  go round-robin over its rows, so a drift of the machine lands on every row alike. One call is
  one wall-clock sample of ~50 ms, and a single stall lands in it whole (a SCHED_FIFO thread that
  never sleeps is stopped by the kernel's RT throttling for up to 50 ms a second; a time-shared
  core runs other tasks): each call's wall time, thread CPU time, run-queue wait, involuntary
  context switches and page faults are kept in the JSON (batch_timing), a call that spent over
  1% of its wall time off the CPU is counted as descheduled, and the notes say what held it.
- Before each timed call the tick is copied into one reused buffer, as a feed handler would have
  just written it: the tick is in cache, as it is in production.
- "in C" = the stage timestamps fp_step() takes itself (the TSC, or CLOCK_MONOTONIC where there
  is no invariant TSC: fastpath.clock_info(), and the stage table's title), for the same calls
  as the row.
- Peers (numpy, onnxruntime with one thread, PyTorch eager) run the same MLP on the same feature
  vectors, precomputed for them: they do less work than fastpath, which also extracts the features
  and consults the cache. Their ratios are against the real-miss row, percentile for percentile.
- The control plane places the measuring thread (fastpath.control.place: core choice, and
  SCHED_FIFO 50 unless --no-rt) and the JSON records what the host granted; BLAS/OpenMP pools are
  held to one thread so the peers' thread pools do not compete with it.
"""
from __future__ import annotations

import os

# the peers' BLAS / OpenMP pools hold one thread, as the table says: set, not defaulted, and
# before numpy is first imported (the pools size themselves from these then)
BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                    "BLIS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")
for _v in BLAS_THREAD_VARS:
    os.environ[_v] = "1"

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import fastpath  # noqa: E402
from fastpath import Model, lob  # noqa: E402
try:
    from fastpath._build import DEMO_MODEL  # noqa: E402
except ImportError:  # the bundle ships in the package's data folder either way
    DEMO_MODEL = os.path.join(os.path.dirname(fastpath.__file__), "data", "demo.fpm")

from _commit import int_at_least, results_dir  # noqa: E402
from _harness import jsonable, mlp_kernel, progress_phases, timer_overhead  # noqa: E402
# read as run.batch_runs_summary by tests that load this script as the bench's module
from _harness import batch_runs_summary  # noqa: E402,F401
from _machine import machine_facts, placement, restore_thread_sched, thread_sched  # noqa: E402
from _replays import (LOOSE, REASONS, TRADEOFF, batch_throughput, cache_tradeoff,  # noqa: E402
                      data_error, data_paths, errors_on, hit_miss_cost, load_stream, peer_error,
                      policy_row, replay_book, book_row, replay_step, replay_summary, step_row,
                      time_peer)
from _report import Dist, render, write_plots  # noqa: E402
from peers import make_peers  # noqa: E402

SCHEMA_VERSION = 2
# the performance bar: checked and printed, never asserted in tests
TARGETS = {
    "miss_p50_ns": 1000, "miss_p99_ns": 2500, "hit_p50_ns": 300, "onnxruntime_ratio_min": 10.0,
    "batch_ticks_per_s_min": 1_000_000, "mlp_vs_fma_bound_max": 2.0,
    "book_above_step_p50_ns": 150,
}
DEFAULT_SEED = 11
# a step() replay keeps every call's in-C record (the engine's latency_records, at most 1 << 24):
# a longer stream is refused before it is turned into ticks
MAX_TICKS = 1 << 24
PEER_NAMES = {"numpy": "numpy (1 BLAS thread)", "onnxruntime": "onnxruntime (1 thread)",
              "torch": "PyTorch eager (1 thread)"}
# the guards that refuse a hit after the lookup ran: a miss for one of them is a real miss
LOOKED = ("age", "run", "cosine", "norm")


def thread_pools() -> list:
    """The native thread pools numpy (and torch) run on, as threadpoolctl sees them: what the
    peers' "1 thread" rests on; the environment variables set for them where threadpoolctl
    is not installed."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return [{"env": {v: os.environ.get(v) for v in BLAS_THREAD_VARS}}]
    return [{k: p.get(k) for k in ("user_api", "internal_api", "num_threads", "version")}
            for p in threadpool_info()]


def _stream(args, progress, res):
    """The tick stream as raw ticks, symbols and times; res["stream"] says what it is."""
    with progress("tick stream") as bar:
        bs, label = load_stream(args, bar)
        if len(bs) > MAX_TICKS:
            raise SystemExit(f"bench/run.py: {label} has {len(bs):,} ticks; the step() replays "
                             f"keep one in-C latency record per call, at most {MAX_TICKS:,} "
                             f"(replay a part of the stream)")
        t0 = time.perf_counter_ns()
        raws = lob.raw_from_book(bs, progress=lambda d, t: bar(0.6 + 0.4 * d / t))
        res["adapter_ns_per_tick"] = (time.perf_counter_ns() - t0) / max(len(bs), 1)
        bar(1.0)
    res["stream"] = {"source": label, "ticks": len(bs), "symbols": int(len(np.unique(bs.symbols))),
                     "regimes": list(bs.regime_names),
                     "regime_ticks": [int((bs.regime == k).sum()) for k in range(len(bs.regime_names))]}
    return bs, raws


def _step_replays(model, loose, raws, syms, ts, progress, res) -> tuple:
    """The step() replays: cache off, the bundle's policy, the looser policy, and one per
    trade-off policy for what a hit and a miss cost from Python there. (off, on, lo, step
    costs by policy label, timer overhead)."""
    warm = min(len(raws), 3_000)
    with progress("timer overhead; step() replays: cache off, bundle policy, looser policy") as bar:
        ov = timer_overhead(20_000)
        overhead = int(ov.p50)
        res["timer_overhead_ns"] = ov.summary()
        off = replay_step(model, {"enabled": False}, raws, syms, ts, overhead, warm)
        bar(0.33)
        # only "enabled" is stated: a bundle whose policy is off still measures real lookups
        on = replay_step(model, {"enabled": True}, raws, syms, ts, overhead, warm)
        bar(0.66)
        lo = replay_step(model, {"enabled": True, "cos_threshold": loose["cos_threshold"],
                                 "norm_tol": loose["norm_tol"]}, raws, syms, ts, overhead, warm)
        bar(0.8)
        # a hit is cheaper where hits are common (the CPU predicts them instead of running
        # ahead into the model and throwing that work away): each policy gets its own replay
        costs = {TRADEOFF[0][0]: lo, "bundle policy": on}
        for label, c, t in TRADEOFF[1:]:
            costs[label] = replay_step(model, {"enabled": True, "cos_threshold": c,
                                               "norm_tol": t}, raws, syms, ts, overhead, warm)
        costs = {k: hit_miss_cost(v) for k, v in costs.items()}
        bar(1.0)
    return off, on, lo, costs, overhead


def _step_rows(bundle, loose, off, on, lo, n) -> tuple:
    """The per-call rows (real miss, real hit under each policy, cache off), their Python
    distributions, and the miss row's in-C stages."""
    ref = off["signal"]
    # a real miss: the cache was on, the symbol's slot held a result, the lookup ran and a
    # guard refused it (age, run, cosine or norm); only a cold slot is left out
    looked = np.isin(on["reason"], [REASONS.index(x) for x in LOOKED])
    why = ", ".join(f"{x} {int((on['reason'] == REASONS.index(x)).sum()):,}"
                    for x in ("cosine", "norm", "age", "run")
                    if (on["reason"] == REASONS.index(x)).any())
    rows, dists = {}, {}
    rows["miss"], dists["miss"], miss_stages = step_row(
        f"step() real miss: cache on, lookup done, missed ({why or 'none'})", "real miss",
        "real miss: fastpath.step() calls of a replay with the bundle's cache policy on, where "
        "the symbol's slot held a result, the lookup ran and a guard refused it (counts by "
        "guard in the label; age and run refuse before comparing the vectors, cosine and norm "
        "after), so the call paid the lookup and the MLP; the first tick of each symbol (cold "
        "slot) is left out and counted in other_misses",
        bundle, on, looked)
    rows["miss"]["other_misses"] = {name: int((on["reason"] == REASONS.index(name)).sum())
                                    for name in ("cold", "disabled")}
    rows["hit"], dists["hit"], _ = step_row(
        "step() real hit: replayed stream, bundle policy", "real hit (bundle policy)",
        f"real hit: fastpath.step() calls of the same replay that the cache answered "
        f"({bundle['name']})", bundle, on, on["cached"], ref)
    e = errors_on(lo["signal"], ref, lo["cached"])
    rows["hit_loose"], dists["hit_loose"], _ = step_row(
        f"step() real hit: replayed stream, looser policy {LOOSE[0]} "
        + (f"(error on hits: mean {e['mean_abs']:.4f}, max {e['max_abs']:.4f})"
           if lo["cached"].any() else "(no hits)"), f"real hit ({LOOSE[0]})",
        f"real hit, looser policy: a second replay with {LOOSE[0]}; hits are more common "
        f"and cost signal error (error_on_hits, against a cache-off replay)", loose, lo,
        lo["cached"], ref)
    rows["cache_off"], dists["cache_off"], _ = step_row(
        "step() model only, cache off", "cache off",
        "model only: fastpath.step() with the cache disabled (no lookup, every call runs "
        "the MLP); not a cache miss", {"name": "cache disabled", "enabled": False}, off,
        np.ones(n, np.bool_))
    return rows, dists, miss_stages


def _series(dists, miss_stages) -> dict:
    """The plotted percentile distributions: each row's from Python, the miss row's stages."""
    series = {}
    for key, lab in (("miss", "step() real miss"), ("hit", "step() real hit, bundle policy"),
                     ("hit_loose", f"step() real hit, {LOOSE[0]}"),
                     ("cache_off", "step(), model only, cache off")):
        series[f"step_{key}"] = {"panel": "python", "label": lab, "n": dists[key].n,
                                 **dists[key].series()}
    for stage in ("feature", "cache", "infer", "total"):
        d = miss_stages[stage]
        series[f"in_c_miss_{stage}"] = {"panel": "in_c_miss", "label": f"{stage}, on real misses",
                                        "n": d.n, **d.series()}
    return series


def _peers(model, raws, syms, n_peer, overhead, miss_d, series, progress) -> dict:
    """Each peer, checked to compute the model, then timed on the same feature vectors; its
    ratios are against the real miss, percentile for percentile."""
    with progress("peers") as bar:
        feats = model.features(raws[:n_peer], syms[:n_peer])
        peers = {}
        for name, fn, info in make_peers(model):
            if fn is None:
                peers[name] = {"available": False, "reason": info}
                continue
            err = peer_error(name, fn, model, raws, syms, feats)
            time_peer(fn, feats, 500, overhead)
            d = Dist.of(time_peer(fn, feats, n_peer, overhead))
            plabel = f"{PEER_NAMES.get(name, name)} {info}, MLP only"
            peers[name] = {"available": True, "version": info, "label": plabel,
                           "max_abs_diff_vs_fastpath_model": err, "python": d.summary(),
                           "ratio_basis": "peer percentile / fastpath.step() real miss percentile",
                           # no real miss (a stream too short for a lookup to run): no ratio
                           "ratio_p50": d.p50 / max(miss_d.p50, 1) if miss_d.n else None,
                           "ratio_p99": d.p99 / max(miss_d.p99, 1) if miss_d.n else None}
            series[f"peer_{name}"] = {"panel": "python", "label": plabel, "n": d.n, **d.series()}
        bar()
    return peers


def _model_facts(model) -> dict:
    pol = model.cache_policy
    return {"path": os.path.relpath(DEMO_MODEL), "dims": model.dims,
            "activations": [l.activation for l in model.layers],
            "raw_len": model.raw_len, "n_features": model.feature_spec.n_feat,
            "cache_policy": dataclasses.asdict(pol), "meta": model.meta}


def run(args) -> dict:
    t_start = time.time()
    quick = args.quick
    n_peer = 3_000 if quick else 20_000
    res: dict = {"schema_version": SCHEMA_VERSION, "quick": quick,
                 "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    res["placement"] = placement(args)
    res["machine"] = machine_facts()
    progress = progress_phases(args)
    bs, raws = _stream(args, progress, res)
    syms, ts = bs.symbols, bs.ts_ns
    model = Model.load(DEMO_MODEL)
    res["model"] = _model_facts(model)
    pol = model.cache_policy
    bundle = policy_row(pol.cos_threshold, pol.norm_tol,
                        f"bundle policy, cos {pol.cos_threshold:g} / norm {pol.norm_tol:g}")
    loose = policy_row(LOOSE[1], LOOSE[2], f"looser policy, {LOOSE[0]}")
    gc.collect()
    gc.disable()
    try:
        off, on, lo, costs, overhead = _step_replays(model, loose, raws, syms, ts, progress, res)
        res["memory"] = on["memory"]
        ref = off["signal"]
        res["step"], dists, miss_stages = _step_rows(bundle, loose, off, on, lo, len(raws))
        with progress("book update -> signal (step_book replay)") as bar:
            book = replay_book(model, bs, overhead, min(len(raws), 3_000))
            res["book"] = book_row(book, res["step"]["cache_off"], res["adapter_ns_per_tick"])
            bar()
        series = _series(dists, miss_stages)
        res["replay"] = replay_summary(on, ref, bs, len(raws))
        res["peers"] = _peers(model, raws, syms, n_peer, overhead, dists["miss"], series, progress)
        res["peer_thread_pools"] = thread_pools()
        res["percentile_distributions"] = series
    finally:
        gc.enable()

    with progress("cache trade-off (step_batch replays)") as bar:
        res["replay"]["tradeoff"] = cache_tradeoff(model, raws, syms, ts, bs, ref,
                                                   res["replay"]["timeline"]["edges"], costs)
        bar()
    with progress("step_batch throughput") as bar:
        res["batch"] = batch_throughput(model, raws, syms, ts)
        bar()
    with progress("MLP kernel alone vs FMA bound") as bar:
        res["mlp_kernel"] = mlp_kernel(model)
        bar()
    res["targets"] = check_targets(res)
    res["method"] = __doc__.split("Method (printed with the results):")[1].strip()
    res["hdrhistogram"] = Dist.HDR
    res["elapsed_s"] = round(time.time() - t_start, 2)
    return res


def check_targets(res) -> list:
    """The targets against this run's figures; a figure whose calls did not occur (no real
    miss on a stream too short for a lookup to run) has value None and is not met, since the
    p50 of no samples would read 0 ns."""
    t = TARGETS
    miss, hit = res["step"]["miss"]["python"], res["step"]["hit_loose"]["python"]
    no_miss = not miss["n"]
    rows = [("fastpath.step() real miss p50 (ns)", None if no_miss else miss["p50"], "<=",
             t["miss_p50_ns"]),
            ("fastpath.step() real miss p99 (ns)", None if no_miss else miss["p99"], "<=",
             t["miss_p99_ns"])]
    if hit["n"]:
        rows.append((f"fastpath.step() real hit p50, {LOOSE[0]} (ns)", hit["p50"], "<=",
                     t["hit_p50_ns"]))
    ort = res["peers"].get("onnxruntime", {})
    if ort.get("available"):
        rows.append(("onnxruntime p50 / fastpath real miss p50", ort["ratio_p50"], ">=",
                     t["onnxruntime_ratio_min"]))
    npy = res["peers"].get("numpy", {})
    if npy.get("available"):
        rows.append(("numpy p50 / fastpath real miss p50", npy["ratio_p50"], ">", 1.0))
    rows.append(("step_batch ticks/s (cache off)", res["batch"]["cache_off"]["ticks_per_s"], ">=",
                 t["batch_ticks_per_s_min"]))
    if "book" in res:
        rows.append(("step_book p50 - step() p50, cache off (ns)",
                     res["book"]["above_step_p50_ns"], "<=", t["book_above_step_p50_ns"]))
    if "ratio_to_bound" in res["mlp_kernel"]:
        rows.append(("MLP kernel / FMA bound", res["mlp_kernel"]["ratio_to_bound"], "<=",
                     t["mlp_vs_fma_bound_max"]))
    ops = {"<=": lambda a, b: a <= b, ">=": lambda a, b: a >= b, ">": lambda a, b: a > b}
    return [{"what": w, "value": None if v is None else float(v), "op": op, "target": float(b),
             "met": v is not None and bool(ops[op](v, b)),
             **({"unmeasured": "no real misses in this replay"} if v is None else {})}
            for w, v, op, b in rows]


def _args(argv, prog):
    """The command line, checked before anything is placed or measured."""
    # prog: "fastpath bench" when the fastpath command runs the bench, so usage names it
    ap = argparse.ArgumentParser(prog=prog, description="fastpath latency bench",
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__)
    ap.add_argument("--quick", action="store_true", help="small run (< 30 s), as the tests use")
    ap.add_argument("--data", help="Binance capture folder, 'orderbook.csv,message.csv' (LOBSTER), "
                    "a Databento MBP-10 .dbn[.zst], or a Tardis book CSV[.gz][,trades.csv]")
    ap.add_argument("--ticks", type=int_at_least(1, MAX_TICKS),
                    help="generated ticks (default 200000, 30000 with --quick)")
    ap.add_argument("--seed", type=int_at_least(0), default=DEFAULT_SEED,
                    help="seed of the generated stream")
    ap.add_argument("--cpu", type=int_at_least(0),
                    help="CPU to run on (default: the control plane's choice)")
    ap.add_argument("--no-rt", action="store_true",
                    help="do not ask for SCHED_FIFO 50 (the default placement policy)")
    ap.add_argument("--out", default=results_dir(HERE),
                    help="folder for JSON and PNG (default: bench/results in a checkout, else "
                         "./fastpath-bench-results)")
    ap.add_argument("--no-plot", action="store_true", help="skip the PNG")
    ap.add_argument("--json-only", action="store_true", help="print only the JSON path")
    args = ap.parse_args(argv)
    if args.data and (args.ticks is not None or args.seed != DEFAULT_SEED):
        # they shape the generated stream only: an ignored option is refused, not dropped
        ap.error("--ticks and --seed set the generated stream; --data replays a recorded one")
    if args.data:
        # before the run's placement, so a refused --data leaves a caller of main() unpinned
        missing = [p for p in data_paths(args.data) if not os.path.exists(p)]
        if missing:
            raise data_error(args.data, f"{missing[0]!r} does not exist")
    # before the run, so a bad --out fails in a second rather than after every figure
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as exc:
        ap.error(f"--out {args.out!r}: cannot make the results folder ({exc.strerror or exc})")
    if not os.access(args.out, os.W_OK | os.X_OK):
        ap.error(f"--out {args.out!r}: the results folder is not writable by this user")
    return args


def _write(args, res) -> None:
    """The results as JSON (and PNG) under a timestamped name and the stable latest-* name;
    the table, or only the JSON path with --json-only."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    src = stream_kind(args)
    base = os.path.join(args.out, f"{stamp}-{src}")
    # the stable name README figures come from; a quick or non-default run gets its own
    latest = os.path.join(args.out, f"latest-{src}")
    if not args.no_plot:
        res["plot"] = os.path.basename(latest + ".png")
        if write_plots(res, latest + ".png"):
            shutil.copyfile(latest + ".png", base + ".png")
        else:
            res["plot"] = None
    text = json.dumps(jsonable(res), indent=1)
    for path in (base + ".json", latest + ".json"):
        with open(path, "w") as f:
            f.write(text)
    if args.json_only:
        print(base + ".json")
    else:
        render(res)
        print(f"\nJSON: {latest}.json (and {base}.json)"
              + (f"\nplot: {latest}.png" if res.get("plot") else ""))


def main(argv=None, prog=None) -> int:
    args = _args(argv, prog)
    # run() places this thread (one core, SCHED_FIFO unless --no-rt): given back however it
    # ends, so a caller of main() in process is not left pinned
    held = thread_sched()
    try:
        res = run(args)
    finally:
        restore_thread_sched(held)
    _write(args, res)
    return 0


def stream_kind(args) -> str:
    """generated / binance / lobster / databento / tardis, with -quick or -custom when the run
    is not the default one."""
    if args.data:
        try:
            src = lob.data_kind(args.data)
        except fastpath.InputError:
            src = "data"
    else:
        src = "generated"
        if args.ticks is not None or args.seed != DEFAULT_SEED:
            src += "-custom"
    return src + ("-quick" if args.quick else "")


if __name__ == "__main__":
    sys.exit(main())
