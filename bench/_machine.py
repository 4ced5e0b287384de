"""Where the bench runs and on what: the measuring thread's placement (and putting it back
after the run), the step of the clock every figure is read on, and the machine's facts the
results are stamped with."""
from __future__ import annotations

import os
import platform
import sys

import numpy as np

import fastpath
from fastpath._kernels import clock_ticks
from fastpath.control.placement import place

from _commit import commit_stamp

HERE = os.path.dirname(os.path.abspath(__file__))


def placement(args) -> dict:
    """Place this thread with the control plane (core, policy) and record what was granted."""
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


def thread_sched() -> tuple:
    """This thread's CPU affinity, scheduling policy and priority, for restore_thread_sched."""
    return os.sched_getaffinity(0), os.sched_getscheduler(0), os.sched_getparam(0)


def restore_thread_sched(held: tuple) -> None:
    """Put back what thread_sched read (leaving SCHED_FIFO and widening the affinity within
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
