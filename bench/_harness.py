"""The bench's timing tools: the cost of an empty timed region, this thread's scheduler counters,
timed step_batch calls taken round-robin over the rows they compare, the MLP kernel timed alone,
and a progress line per phase. Every figure is a sample the tools took, never interpolated."""
from __future__ import annotations

import contextlib
import gc
import resource
import sys
import time

import numpy as np

import fastpath
from fastpath._engine import supported_isas
from fastpath._kernels import PackedMLP, fma_macs_per_ns, fma_ns_per_instr

from _report import OFF_CPU_FRACTION, Dist


def timer_overhead(n: int) -> Dist:
    pc = time.perf_counter_ns
    out = np.empty(n, np.int64)
    for i in range(n):
        t0 = pc()
        t1 = pc()
        out[i] = t1 - t0
    return Dist.of(out)


def thread_counters():
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


# timed step_batch calls per figure: the median of 5 survives two disturbed calls
BATCH_RUNS = 5
# ticks a trade-off engine steps (then reset()) before its timed calls: code, slots and pages warm
BATCH_WARM = 2000


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
                u0 = thread_counters()
                r = eng.step_batch(raws, syms, ts)
                u1 = thread_counters()
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
    # GFLOP/s is the kernel's own (its multiply-adds over its time): it needs no FMA probe, so a
    # CPU without FMA (rate 0) still gets it
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


def progress_phases(args):
    """A context manager per phase: a rich progress line on a terminal, else one log line."""
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


def pow2_at_least(n: int) -> int:
    return 1 << max(int(n - 1).bit_length(), 0)


def jsonable(o):
    if isinstance(o, dict):
        return {str(k): jsonable(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [jsonable(v) for v in o]
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    return o
