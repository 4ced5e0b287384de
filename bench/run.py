"""fastpath bench: what one tick costs, stage by stage, next to the tools people use today.

    python bench/run.py                 # generated order-book stream with regimes (about 10 s)
    python bench/run.py --quick         # the same, smaller (< 30 s)
    python bench/run.py --data ../shared/data/binance-btcusdt-2024-08-08
    python bench/run.py --data orderbook.csv,message.csv      # a LOBSTER pair
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

# the peers' BLAS / OpenMP pools hold one thread, as the table says: set, not defaulted, so a
# caller's OPENBLAS_NUM_THREADS=8 does not time numpy on eight threads under a one-thread label
# (the pools size themselves from these when numpy is first imported, just below)
BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                    "BLIS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")
for _v in BLAS_THREAD_VARS:
    os.environ[_v] = "1"

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import resource  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import fastpath  # noqa: E402
from fastpath import Engine, Model, lob  # noqa: E402
try:
    from fastpath._build import DEMO_MODEL  # noqa: E402
except ImportError:  # the bundle ships in the package's data folder either way
    DEMO_MODEL = os.path.join(os.path.dirname(fastpath.__file__), "data", "demo.fpm")
from fastpath._kernels import PackedMLP, clock_ticks, fma_macs_per_ns, fma_ns_per_instr  # noqa: E402
from fastpath._engine import supported_isas  # noqa: E402

from _commit import commit_stamp, int_at_least, results_dir  # noqa: E402
from _report import OFF_CPU_FRACTION, Dist, render, write_plots  # noqa: E402
from peers import make_peers  # noqa: E402

SCHEMA_VERSION = 2
# the performance bar: checked and printed, never asserted in tests
TARGETS = {
    "miss_p50_ns": 1000, "miss_p99_ns": 2500, "hit_p50_ns": 300, "onnxruntime_ratio_min": 10.0,
    "batch_ticks_per_s_min": 1_000_000, "mlp_vs_fma_bound_max": 2.0,
}
# Result.miss_reason values, in the engine's order
REASONS = ("hit", "cold", "age", "run", "cosine", "norm", "disabled")
# looser policies of the trade-off table; the first one also gets its own step() replay, so the
# hit row has enough samples (the bundle's policy hits a fraction of a percent of ticks)
TRADEOFF = (("cos 0.99999, norm 0.002", 0.99999, 0.002), ("cos 0.9999, norm 0.005", 0.9999, 0.005),
            ("cos 0.999, norm 0.02", 0.999, 0.02))
LOOSE = TRADEOFF[0]
DEFAULT_SEED = 11
# a step() call slower than this sat through something other than the engine (the replay's
# time off the CPU is kept beside the row)
STALL_NS = 1_000_000
# timed step_batch calls per figure: the median of 5 survives two disturbed calls
BATCH_RUNS = 5
# ticks a trade-off engine steps (then reset()) before its timed calls: code, slots and pages warm
BATCH_WARM = 2000
# a step() replay keeps every call's in-C record (the engine's latency_records, at most 1 << 24):
# a longer stream was refused by the engine's config only after it had been generated and
# turned into ticks (minutes), with a ConfigError traceback
MAX_TICKS = 1 << 24
PEER_NAMES = {"numpy": "numpy (1 BLAS thread)", "onnxruntime": "onnxruntime (1 thread)",
              "torch": "PyTorch eager (1 thread)"}


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


# --------------------------------------------------------------------- setup
def placement(args) -> dict:
    """Place this thread with the control plane (core, policy) and record what was granted."""
    from fastpath.control.placement import place
    cfg = {"placement": {"core": args.cpu if args.cpu is not None else "auto"}}
    if args.no_rt:
        cfg["placement"].update(policy="other", priority=0)
    try:
        rep = place(cfg)
    except Exception as exc:  # noqa: BLE001 - the bench still runs, and says why
        return {"core": None, "error": f"{type(exc).__name__}: {exc}"}
    d = rep.to_dict()
    d["summary"] = rep.lines()
    return d


# fewer distinct readings than this say nothing about a step: every q puts one value (or two)
# in one residue class, so the search would answer its largest candidate
CLOCK_STEP_MIN_DISTINCT = 8


def clock_step_of(ticks, max_step: int = 4096, share: float = 0.9) -> tuple[int, float]:
    """The step a clock advances in, from readings taken at scattered moments: the largest q
    (up to max_step) for which at least `share` of the readings fall in one residue class mod
    q, with that fraction; (1, 1.0) where none does: a clock that counts every tick, or one
    whose step is not a whole number of ticks (26.5: readings drift across the classes),
    which this cannot tell apart and so does not call coarse. A gcd of differences does not
    do: a hypervisor that advances the TSC in steps keeps it strictly increasing by handing a
    read inside a step the last value + 1, which puts a few readings off the lattice (and the
    gcd at 1) while nearly all stay on it. The readings of that class then give the step
    itself, the gcd of their differences: a multiple of q, and above max_step where the
    clock's step is (the search alone would answer its largest divisor under max_step).
    ValueError where the readings take fewer than CLOCK_STEP_MIN_DISTINCT values: a clock
    not seen advancing has no measurable step."""
    # differences taken on Python ints: fp_ticks() is a uint64, past int64 on an offset TSC
    lo = min(int(t) for t in ticks)
    a = np.array([int(t) - lo for t in ticks], dtype=np.int64)
    distinct = len(np.unique(a))
    if distinct < CLOCK_STEP_MIN_DISTINCT:
        raise ValueError(f"{distinct} distinct clock readings of {len(a)}: at least "
                         f"{CLOCK_STEP_MIN_DISTINCT} needed to tell the clock's step")
    best, frac, cls = 1, 1.0, 0
    for q in range(2, max_step + 1):
        counts = np.bincount(a % q)
        f = counts.max() / len(a)
        if f >= share:
            best, frac, cls = q, float(f), int(counts.argmax())
    on = a[a % best == cls]
    return int(np.gcd.reduce(on - on.min())) or best, frac


def clock_step(n: int = 3000) -> dict | None:
    """The step of the clock behind every figure of this bench, measured now: readings of
    fastpath's clock (TSC ticks, or CLOCK_MONOTONIC ns without an invariant TSC) from Python,
    tens of ns apart at no fixed phase. None where the clock was not seen advancing (the
    JSON then has no clock_step, and the notes no sentence on it)."""
    try:
        q, frac = clock_step_of([clock_ticks() for _ in range(n)])
    except ValueError:
        return None
    ns_per_tick = fastpath.clock_info()["ns_per_tick"]
    return {"ticks": q, "ns": q * ns_per_tick, "readings_on_step": frac, "readings": n}


def machine_facts() -> dict:
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    # results from a tree with uncommitted changes are not the commit's: commit_stamp says so
    commit = commit_stamp(HERE)
    try:
        with open("/sys/devices/system/clocksource/clocksource0/current_clocksource") as f:
            clocksource = f.read().strip()
    except OSError:
        clocksource = None
    d = {"cpu_model": model, "cores": os.cpu_count(), "simd": fastpath.simd(),
         "cpu_features": fastpath.cpu_features(), "clock": fastpath.clock_info(),
         "kernel_clocksource": clocksource, "commit": commit, "python": platform.python_version(),
         "numpy": np.__version__, "fastpath": fastpath.__version__,
         "platform": platform.platform()}
    cs = clock_step()
    if cs is not None:
        d["clock_step"] = cs
    return d


def data_paths(data: str) -> list:
    """--data's paths: [orderbook, message] for LOBSTER ('a.csv,b.csv'), else [folder]."""
    return data.split(",", 1) if "," in data else [data]


def data_error(data: str, why) -> SystemExit:
    """The one-line refusal of a --data the bench cannot read (not a reader's traceback)."""
    return SystemExit(f"bench/run.py: --data {data}: cannot read it: {why} (expected a Binance "
                      f"capture folder, or 'orderbook.csv,message.csv')")


def load_stream(args, bar):
    if args.data:
        # a missing file or one the reader refuses is the caller's error: said in one line,
        # not a traceback from deep in the reader
        paths = data_paths(args.data)
        try:
            if len(paths) == 2:
                return lob.read_lobster(*paths), f"LOBSTER {os.path.basename(paths[0])}"
            return (lob.read_binance(args.data),
                    f"Binance {os.path.basename(os.path.abspath(args.data))}")
        except (fastpath.InputError, OSError) as exc:
            raise data_error(args.data, exc) from None
    n = args.ticks if args.ticks is not None else (30_000 if args.quick else 200_000)
    bs = lob.generate_stream(n, n_symbols=8, seed=args.seed, progress=lambda d, t: bar(d / t * 0.6))
    return bs, f"generated ({n} ticks, 8 symbols)"


# ------------------------------------------------------------------- timing
def timer_overhead(n: int) -> Dist:
    pc = time.perf_counter_ns
    out = np.empty(n, np.int64)
    for i in range(n):
        t0 = pc()
        t1 = pc()
        out[i] = t1 - t0
    return Dist.of(out)


def _thread_counters():
    """(involuntary context switches, minor page faults, ns spent runnable but waiting for the
    CPU) of this thread so far; None where the OS keeps no per-thread counts. The wait (Linux
    schedstat run_delay) is what the guest's own scheduler withheld: another task, or RT
    throttling; time off the CPU beyond it went where the kernel cannot see (a hypervisor
    running another guest on this vCPU) or to interrupts."""
    who = getattr(resource, "RUSAGE_THREAD", None)
    if who is None:
        return None
    ru = resource.getrusage(who)
    try:
        with open("/proc/thread-self/schedstat") as f:
            wait = int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        wait = None
    return ru.ru_nivcsw, ru.ru_minflt, wait


def time_batches(makers, raws, syms, ts, runs: int = BATCH_RUNS, warm: int = BATCH_WARM,
                 fresh: bool = False) -> list:
    """Time `runs` step_batch calls over the whole stream for each engine factory in makers,
    round-robin (1, 2, .., 1, 2, ..) so that a drift of the machine (a neighbour's load, the
    clock) lands on every figure alike instead of on whichever ran last. Before each call the
    engine steps the first `warm` ticks untimed and is reset(), so code, slots and pages are warm
    and every call replays from the same state; with fresh, each call gets a new engine (warmed
    through a throwaway twin), as a process that starts on this stream. Returns, per factory,
    (the first call's BatchResult, the engine of the last call, batch_runs_summary). Every call
    of a factory must answer the same (a replay from the same state is deterministic): a
    difference is a bug, not noise."""
    n = len(raws)
    warm = min(warm, n)
    engines = [None if fresh else mk() for mk in makers]
    rec = [{"first": None, "wall": [], "cpu": [], "sw": [], "flt": [], "wait": []} for _ in makers]
    pc, tt = time.perf_counter_ns, time.thread_time_ns
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        for _ in range(runs):
            for k, mk in enumerate(makers):
                if fresh:
                    if warm:
                        mk().step_batch(raws[:warm], syms[:warm], ts[:warm])
                    eng = engines[k] = mk()
                else:
                    eng = engines[k]
                    if warm:
                        eng.reset()
                        eng.step_batch(raws[:warm], syms[:warm], ts[:warm])
                    eng.reset()
                # the windows nest: wall clock around CPU clock around the run-queue counters.
                # Reading a thread's CPU time updates its runtime, and so can be the moment RT
                # throttling finds the budget spent; the stall then falls inside the wall-clock
                # pair and shows as off-CPU time of this call instead of a run-queue wait
                # outside every clock. A wait charged at a counter read (the thread preempted on
                # its way back from the syscall) lands inside both pairs, so a call's run-queue
                # wait is never more than its time off the CPU; and the reads' own cost (tens
                # of us for the /proc file) is CPU time, not time off the CPU
                t0 = pc()
                c0 = tt()
                u0 = _thread_counters()
                r = eng.step_batch(raws, syms, ts)
                u1 = _thread_counters()
                c1 = tt()
                t1 = pc()
                d = rec[k]
                d["wall"].append(t1 - t0)
                d["cpu"].append(c1 - c0)
                d["sw"].append(None if u0 is None else u1[0] - u0[0])
                d["flt"].append(None if u0 is None else u1[1] - u0[1])
                d["wait"].append(None if u0 is None or u0[2] is None else u1[2] - u0[2])
                if d["first"] is None:
                    d["first"] = r
                elif not (np.array_equal(r.cached, d["first"].cached)
                          and np.array_equal(r.signal, d["first"].signal)):
                    raise RuntimeError("two step_batch replays of the same stream from the same "
                                       "state answered differently")
    finally:
        if gc_was_on:
            gc.enable()
    out = []
    for d, eng in zip(rec, engines):
        summary = batch_runs_summary(d["wall"], d["cpu"], d["sw"], d["flt"], n, warm, fresh,
                                     d["wait"])
        summary["round_robin_with"] = len(makers)
        out.append((d["first"], eng, summary))
    return out


def batch_runs_summary(wall_ns, cpu_ns, switches, faults, ticks: int, warm: int,
                       fresh: bool, waits=None) -> dict:
    """The timed calls of one step_batch figure: per call ns per tick of wall time and of thread
    CPU time, time off the CPU (wall - CPU) and the part of it spent runnable in this kernel's
    run queue (waits, ns), involuntary switches and page faults (None where the OS keeps no
    per-thread counts), with their median, min and max."""
    wall = np.asarray(wall_ns, np.float64)
    cpu = np.asarray(cpu_ns, np.float64)
    off = np.maximum(wall - cpu, 0.0)
    per = wall / ticks
    return {"runs": int(len(wall)), "ticks": int(ticks),
            "warmup_ticks": int(warm), "fresh_engine_per_run": bool(fresh),
            "median_ns_per_tick": float(np.median(per)), "min_ns_per_tick": float(per.min()),
            "max_ns_per_tick": float(per.max()),
            "median_cpu_ns_per_tick": float(np.median(cpu / ticks)),
            "ns_per_tick": [float(x) for x in per],
            "cpu_ns_per_tick": [float(x) for x in cpu / ticks],
            "off_cpu_ms": [float(x) / 1e6 for x in off],
            "descheduled_runs": int((off > OFF_CPU_FRACTION * wall).sum()),
            "runqueue_wait_ms": [None if w is None else float(w) / 1e6
                                 for w in (waits if waits is not None else [None] * len(wall))],
            "involuntary_switches": list(switches), "minor_faults": list(faults)}


def stage_dists(records: np.ndarray, mask=None) -> dict:
    r = records if mask is None else records[mask]
    miss = r[:, 2] > 0
    out = {"feature": Dist.of(r[:, 0]), "cache": Dist.of(r[:, 1]), "infer": Dist.of(r[miss, 2]),
           "h2d": Dist.of(np.zeros(0)), "d2h": Dist.of(np.zeros(0)), "total": Dist.of(r[:, 3])}
    return out


# ------------------------------------------------------------------- replays
def replay_step(model, cache: dict | None, raws, syms, ts, overhead: int, warm: int) -> dict:
    """Replay the stream through the public fastpath.step() on an engine built by
    fastpath.configure(): per-call ns from Python, what each call answered (cached, miss reason,
    signal) and the engine's own in-C stage records for the same calls, in the same order."""
    n = len(raws)
    cfg = {"engine": {"latency_records": _pow2(n)}}
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
    u0 = _thread_counters()
    for i in range(n):
        buf[:] = raws[i]
        s, t = int(syms[i]), int(ts[i])
        t0 = pc()
        r = step(buf, s, t)
        py[i] = pc() - t0
        sig[i] = r.signal
        cached[i] = r.cached
        reason[i] = code[r.miss_reason]
    u1 = _thread_counters()
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
           "rec": rec, "stats": _jsonable(eng.stats()), "memory": None, "sched": sched}
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
        row["error_on_hits"] = _errors(rp["signal"], ref_signal, sel & rp["cached"])
    return row, py, stages


def _errors(sig, ref, sel) -> dict:
    """Signal error of the selected ticks against the cache-off replay of the same stream."""
    if not sel.any():
        return {"mean_abs": 0.0, "max_abs": 0.0, "p99_abs": 0.0, "sign_flips": 0}
    err = np.abs(sig[sel] - ref[sel])
    return {"mean_abs": float(err.mean()), "max_abs": float(err.max()),
            "p99_abs": float(np.percentile(err, 99)),
            "sign_flips": int((np.sign(sig[sel]) * np.sign(ref[sel]) < 0).sum())}


def _policy(cos, norm, name) -> dict:
    return {"name": name, "enabled": True, "cos_threshold": float(cos), "norm_tol": float(norm)}


# -------------------------------------------------------------------- main
def run(args) -> dict:
    t_start = time.time()
    quick = args.quick
    n_peer = 3_000 if quick else 20_000
    res: dict = {"schema_version": SCHEMA_VERSION, "quick": quick,
                 "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    res["placement"] = placement(args)
    res["machine"] = machine_facts()
    progress = _progress(args)

    with progress("tick stream") as bar:
        bs, label = load_stream(args, bar)
        if len(bs) > MAX_TICKS:
            raise SystemExit(f"bench/run.py: {label} has {len(bs):,} ticks; the step() replays "
                             f"keep one in-C latency record per call, at most {MAX_TICKS:,} "
                             f"(replay a part of the stream)")
        raws = lob.raw_from_book(bs, progress=lambda d, t: bar(0.6 + 0.4 * d / t))
        syms, ts = bs.symbols, bs.ts_ns
        bar(1.0)
    res["stream"] = {"source": label, "ticks": len(bs), "symbols": int(len(np.unique(syms))),
                     "regimes": list(bs.regime_names),
                     "regime_ticks": [int((bs.regime == k).sum()) for k in range(len(bs.regime_names))]}
    model = Model.load(DEMO_MODEL)
    pol = model.cache_policy
    res["model"] = {"path": os.path.relpath(DEMO_MODEL), "dims": model.dims,
                    "activations": [l.activation for l in model.layers],
                    "raw_len": model.raw_len, "n_features": model.feature_spec.n_feat,
                    "cache_policy": dataclasses.asdict(pol), "meta": model.meta}
    bundle = _policy(pol.cos_threshold, pol.norm_tol,
                     f"bundle policy, cos {pol.cos_threshold:g} / norm {pol.norm_tol:g}")
    loose = _policy(LOOSE[1], LOOSE[2], f"looser policy, {LOOSE[0]}")
    warm = min(len(raws), 3_000)
    gc.collect()
    gc.disable()
    try:
        with progress("timer overhead; step() replays: cache off, bundle policy, looser policy") as bar:
            ov = timer_overhead(20_000)
            overhead = int(ov.p50)
            res["timer_overhead_ns"] = ov.summary()
            off = replay_step(model, {"enabled": False}, raws, syms, ts, overhead, warm)
            bar(0.33)
            # the bundle's own (fitted) policy, as a user of the bundle runs it; only "enabled"
            # is stated, so a bundle whose policy is off still measures real lookups
            on = replay_step(model, {"enabled": True}, raws, syms, ts, overhead, warm)
            bar(0.66)
            lo = replay_step(model, {"enabled": True, "cos_threshold": loose["cos_threshold"],
                                     "norm_tol": loose["norm_tol"]}, raws, syms, ts, overhead, warm)
            bar(0.8)
            # what a hit and a miss cost from Python at each trade-off policy: a hit is cheaper
            # where hits are common (the CPU learns to predict them instead of running ahead
            # into the model and throwing that work away)
            step_cost = {TRADEOFF[0][0]: lo, "bundle policy": on}
            for label, c, t in TRADEOFF[1:]:
                step_cost[label] = replay_step(model, {"enabled": True, "cos_threshold": c,
                                                       "norm_tol": t}, raws, syms, ts, overhead, warm)
            step_cost = {k: _step_cost(v) for k, v in step_cost.items()}
            bar(1.0)
        res["memory"] = on["memory"]
        ref = off["signal"]
        # a real miss: the cache was on, the symbol's slot held a result, the lookup ran and a
        # guard refused it (age, run, cosine or norm); only a cold slot is left out
        looked = np.isin(on["reason"], [REASONS.index(x) for x in ("age", "run", "cosine", "norm")])
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
        e = _errors(lo["signal"], ref, lo["cached"])
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
            np.ones(len(raws), np.bool_))
        res["step"] = rows
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
        res["replay"] = replay_summary(on, ref, bs, len(raws))

        with progress("peers") as bar:
            feats = model.features(raws[:n_peer], syms[:n_peer])
            peers = {}
            miss_d = dists["miss"]
            for name, fn, info in make_peers(model):
                if fn is None:
                    peers[name] = {"available": False, "reason": info}
                    continue
                # check the peer computes the same thing before timing it
                err = peer_error(name, fn, model, raws, syms, feats)
                time_peer(fn, feats, 500, overhead)
                d = Dist.of(time_peer(fn, feats, n_peer, overhead))
                plabel = f"{PEER_NAMES.get(name, name)} {info}, MLP only"
                peers[name] = {"available": True, "version": info, "label": plabel,
                               "max_abs_diff_vs_fastpath_model": err, "python": d.summary(),
                               "ratio_basis": "peer percentile / fastpath.step() real miss percentile",
                               # no real miss (a stream too short for a lookup to run): no
                               # ratio, where one against max(0, 1) ns read thousands
                               "ratio_p50": d.p50 / max(miss_d.p50, 1) if miss_d.n else None,
                               "ratio_p99": d.p99 / max(miss_d.p99, 1) if miss_d.n else None}
                series[f"peer_{name}"] = {"panel": "python", "label": plabel, "n": d.n, **d.series()}
            bar()
        res["peers"] = peers
        res["peer_thread_pools"] = thread_pools()
        res["percentile_distributions"] = series
    finally:
        gc.enable()

    with progress("cache trade-off (step_batch replays)") as bar:
        res["replay"]["tradeoff"] = cache_tradeoff(model, raws, syms, ts, bs, ref,
                                                   res["replay"]["timeline"]["edges"], step_cost)
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


def peer_error(name, fn, model, raws, syms, feats) -> float:
    """Max |peer - fastpath's model| over the first tick's outputs, every one of them: the
    reference is the raw tick's (Model.outputs: features, input scaler, layers, post
    transform; forward() takes the model's input, before an input scaler that feats already
    hold). A peer that returns another number of outputs is not timed as the same work (the
    check once compared the first two outputs alone: a third was never looked at, and a
    one-output model's single value was broadcast against two)."""
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
    sh = _errors(sig, ref, cached)
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
        # in-C totals of the bin's calls, by the rank rule as every figure (np.percentile's
        # interpolation gave a time between two calls that no call took)
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


def _step_cost(rp) -> dict:
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
    step_cost (policy label -> _step_cost of its step() replay), what a hit and a miss cost
    from Python at that policy."""
    pol = model.cache_policy
    policies = (("bundle policy", pol.cos_threshold, pol.norm_tol),) + TRADEOFF
    timed = time_batches([lambda c=c, t=t: Engine(model, config={"cache": {
        "enabled": True, "cos_threshold": c, "norm_tol": t}}) for _, c, t in policies],
        raws, syms, ts, runs, warm)
    rows = []
    for (label, c, t), (r, eng, timing) in zip(policies, timed):
        e = _errors(r.signal.astype(np.float64), fresh_signal, r.cached)
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


# the MLP kernel alone: timed runs, each the mean of this many back-to-back passes; the best
# run is the figure (as the FMA bound is the probe's best), and the table says so
MLP_RUNS, MLP_PASSES = 5, 200_000


def mlp_kernel(model) -> dict:
    P = PackedMLP([l.weight for l in model.layers], [l.bias for l in model.layers],
                  [l.activation for l in model.layers], fastpath.simd())
    x = np.random.default_rng(0).standard_normal(model.dims[0]).astype(np.float32)
    P.time_forward(x, 20_000)
    runs = [P.time_forward(x, MLP_PASSES) for _ in range(MLP_RUNS)]
    ns = min(runs)
    fma = fma_ns_per_instr()
    # the core's FMA rate, whichever vector set reaches it (16-lane FMAs may or may not run at
    # twice the 8-lane rate: Zen 4 splits them, Zen 5 and some Intel cores run them full width)
    rate = max(fma_macs_per_ns(s) for s in supported_isas())
    padded = sum(((d_out + 7) // 8 * 8) * d_in for d_in, d_out in zip(model.dims[:-1], model.dims[1:]))
    # GFLOP/s is the kernel's own (its multiply-adds over its time): it needs no FMA probe, and a
    # CPU without one (no AVX2+FMA: rate 0) printed "0.0 GFLOP/s" for a kernel that ran
    out = {"ns_per_forward": ns, "ns_median_of_runs": float(np.median(runs)),
           "runs": MLP_RUNS, "passes_per_run": MLP_PASSES,
           "reported": "best run (mean ns per pass of its back-to-back passes)",
           "macs": P.macs, "padded_macs": padded, "kernel_set": fastpath.simd(),
           "weights_bytes": padded * 4, "gflops": 2 * P.macs / ns}
    if rate > 0:
        bound = padded / rate
        out.update({"fma_ns_per_instr": fma, "fma_macs_per_ns": rate, "fma_bound_ns": bound,
                    "ratio_to_bound": ns / bound})
    return out


def check_targets(res) -> list:
    """The targets against this run's figures; a figure whose calls did not occur (no real
    miss on a stream too short for a lookup to run) has value None and is not met: the p50 of
    no samples read 0 ns and a peer ratio against it thousands, and both were "met"."""
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
    if "ratio_to_bound" in res["mlp_kernel"]:
        rows.append(("MLP kernel / FMA bound", res["mlp_kernel"]["ratio_to_bound"], "<=",
                     t["mlp_vs_fma_bound_max"]))
    ops = {"<=": lambda a, b: a <= b, ">=": lambda a, b: a >= b, ">": lambda a, b: a > b}
    return [{"what": w, "value": None if v is None else float(v), "op": op, "target": float(b),
             "met": v is not None and bool(ops[op](v, b)),
             **({"unmeasured": "no real misses in this replay"} if v is None else {})}
            for w, v, op, b in rows]


def _pow2(n: int) -> int:
    return 1 << max(int(n - 1).bit_length(), 0)


def _jsonable(o):
    if isinstance(o, dict):
        return {str(k): _jsonable(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_jsonable(v) for v in o]
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    return o


def _progress(args):
    """A context manager per phase: a rich progress line on a terminal, else one log line."""
    import contextlib
    try:
        from rich.console import Console
        console = Console(stderr=True)
        rich_ok = console.is_terminal and not args.json_only
    except ImportError:
        rich_ok = False

    @contextlib.contextmanager
    def phase(name):
        """yields bar(fraction=None): fraction in [0, 1] moves the bar, no argument ends it"""
        t0 = time.time()
        if rich_ok:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
            # no auto-refresh: a refresh thread would wake up inside the timed loops
            with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TimeElapsedColumn(),
                          console=console, transient=True, auto_refresh=False) as p:
                task = p.add_task(name, total=1.0)

                def bar(f=1.0):
                    p.update(task, completed=f)
                    p.refresh()
                yield bar
        else:
            yield lambda f=1.0: None
        if not args.json_only:
            print(f"  {name}: {time.time() - t0:.1f} s", file=sys.stderr)
    return phase


def _thread_sched() -> tuple:
    """This thread's CPU affinity, scheduling policy and priority, for _restore_thread_sched."""
    return os.sched_getaffinity(0), os.sched_getscheduler(0), os.sched_getparam(0)


def _restore_thread_sched(held: tuple) -> None:
    """Put back what _thread_sched read (leaving SCHED_FIFO and widening the affinity within
    the cpuset need no privilege); one that cannot be put back is said, not raised over the
    run's own outcome."""
    cpus, policy, param = held
    for what, put in (("scheduling policy", lambda: os.sched_setscheduler(0, policy, param)),
                      ("CPU affinity", lambda: os.sched_setaffinity(0, cpus))):
        try:
            put()
        except OSError as exc:
            print(f"bench/run.py: could not restore this thread's {what} after the run "
                  f"({exc.strerror or exc})", file=sys.stderr)


def main(argv=None, prog=None) -> int:
    # prog: "fastpath bench" from the command line (its usage said "cli.py" or "fastpath")
    ap = argparse.ArgumentParser(prog=prog, description="fastpath latency bench",
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__)
    ap.add_argument("--quick", action="store_true", help="small run (< 30 s), as the tests use")
    ap.add_argument("--data", help="Binance capture folder, or 'orderbook.csv,message.csv' (LOBSTER)")
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
        # they shape the generated stream only: a recorded one was read whole, and the run
        # said nothing of the option it ignored
        ap.error("--ticks and --seed set the generated stream; --data replays a recorded one")
    if args.data:
        # before the run's placement (SCHED_FIFO on a pinned core): a caller of main() in
        # process was left pinned by a --data that was not there
        missing = [p for p in data_paths(args.data) if not os.path.exists(p)]
        if missing:
            raise data_error(args.data, f"{missing[0]!r} does not exist")
    # before the run, not after it: an --out that could not be made (a file of that name,
    # an empty name, no permission) failed only once every figure had been measured
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as exc:
        ap.error(f"--out {args.out!r}: cannot make the results folder ({exc.strerror or exc})")
    if not os.access(args.out, os.W_OK | os.X_OK):
        ap.error(f"--out {args.out!r}: the results folder is not writable by this user")
    # run() places this thread (one core, SCHED_FIFO unless --no-rt): given back however it
    # ends, or a caller of main() in process stayed pinned (a --data folder it could not
    # read, a stream over MAX_TICKS, Ctrl-C, or a finished run)
    held = _thread_sched()
    try:
        res = run(args)
    finally:
        _restore_thread_sched(held)
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
    text = json.dumps(_jsonable(res), indent=1)
    for path in (base + ".json", latest + ".json"):
        with open(path, "w") as f:
            f.write(text)
    if args.json_only:
        print(base + ".json")
    else:
        render(res)
        print(f"\nJSON: {latest}.json (and {base}.json)"
              + (f"\nplot: {latest}.png" if res.get("plot") else ""))
    return 0


def stream_kind(args) -> str:
    """generated / binance / lobster, with -quick or -custom when the run is not the default one."""
    if args.data:
        src = "lobster" if "," in args.data else "binance"
    else:
        src = "generated"
        if args.ticks is not None or args.seed != DEFAULT_SEED:
            src += "-custom"
    return src + ("-quick" if args.quick else "")


if __name__ == "__main__":
    sys.exit(main())
