"""Distributions, the terminal and README tables, and the plots of the bench.

Everything here reads the result dict only (never the engine), so the README figures and plot
can be regenerated from a committed results JSON (see bench/readme_figures.py).
"""
from __future__ import annotations

import numpy as np

PCTS = (50, 90, 99, 99.9)
# a timed step_batch call whose wall time exceeds its thread CPU time by more than this fraction
# was descheduled (bench/run.py counts with the same bound)
OFF_CPU_FRACTION = 0.01


def _step_py(sp) -> str:
    """'hit p50 / miss p50' of a trade-off row's step() replay, '-' where it had none."""
    if not sp:
        return "-"
    return " / ".join(fmt_ns(sp[k]["p50"]) if sp[k]["p50"] is not None else "-" for k in ("hit", "miss"))


def _batch_spread(bt) -> str:
    """'min-max' ns per tick of a step_batch figure's timed calls, with how many were taken off
    the CPU; '-' for results written before the calls were kept."""
    if not bt:
        return "-"
    cell = f"{bt['min_ns_per_tick']:.0f}-{bt['max_ns_per_tick']:.0f}"
    if bt["descheduled_runs"]:
        cell += f" ({bt['descheduled_runs']} of {bt['runs']} off CPU)"
    return cell


def _tradeoff_ns(t) -> str:
    """A trade-off row's step_batch ns per tick: the median, with the calls' spread where kept."""
    cell = f"{t['batch_ns_per_tick']:.0f} ns"
    if t.get("batch_timing"):
        cell += f" ({_batch_spread(t['batch_timing'])})"
    return cell


def _batch_cell(b) -> str:
    """A throughput row's ns per tick: the best call, and the median and spread where kept."""
    cell = f"{b['ns_per_tick']:.0f} ns/tick"
    bt = b.get("batch_timing")
    if bt:
        cell += (f" (best of {bt['runs']}; median {bt['median_ns_per_tick']:.0f}, "
                 f"{_batch_spread(bt)})")
    return cell


# a clock step below this is not worth a sentence: the figures are printed to the ns
CLOCK_STEP_NOTE_NS = 2.0


# kernel clocksources that read the TSC: CLOCK_MONOTONIC, and so time.perf_counter_ns, then
# advances in the TSC's steps (kvm-clock scales the guest's own TSC reads)
TSC_CLOCKSOURCES = ("tsc", "kvm-clock")


def c_clock(machine) -> str:
    """The clock of the in-C figures on the host that wrote the results: the TSC, or
    CLOCK_MONOTONIC where fastpath found no invariant TSC."""
    return "TSC" if machine.get("clock", {}).get("source", "tsc") == "tsc" else "CLOCK_MONOTONIC"


def clock_step_note(machine) -> str | None:
    """The sentence on the clock's step where it is coarse, naming the clock this host has:
    the TSC (stepped by a hypervisor: bare metal counts every tick) or, without an invariant
    TSC, CLOCK_MONOTONIC; the Python figures are said to share its steps only where they read
    the same counter."""
    cs = machine.get("clock_step")
    if not cs or cs["ns"] < CLOCK_STEP_NOTE_NS:
        return None
    tsc = machine.get("clock", {}).get("source", "tsc") == "tsc"
    if tsc:
        head = (f"resolution: the TSC on this host advances in steps of {cs['ns']:.1f} ns "
                f"({cs['ticks']} ticks; a hypervisor's clock, where bare metal counts every tick)")
        shared = machine.get("kernel_clocksource") in TSC_CLOCKSOURCES
        why = "time.perf_counter_ns reads the same counter"
    else:
        head = (f"resolution: fastpath's clock on this host, CLOCK_MONOTONIC (no invariant TSC), "
                f"advances in steps of {cs['ns']:.1f} ns")
        shared = True
        why = "time.perf_counter_ns reads the same clock"
    if shared:
        body = (f"every per-call figure, from Python ({why}) and in C, and the timer overhead "
                f"removed are whole numbers of such steps, so a p50 moves in steps of "
                f"~{cs['ns']:.0f} ns")
    else:
        body = (f"every figure in C is a whole number of such steps (the figures from Python "
                f"read CLOCK_MONOTONIC through the kernel's "
                f"{machine.get('kernel_clocksource') or 'unknown'} clocksource, whose steps "
                f"were not measured), so an in-C p50 moves in steps of ~{cs['ns']:.0f} ns")
    return f"{head}: {body}; the means in the JSON are not quantized that way"


def timing_notes(res) -> list:
    """Sentences on what disturbed the timings and how the step_batch figures were taken: a
    step() row whose slowest calls sat through a stall says so (with its replay's time off the
    CPU), a step_batch figure is the median (throughput: best) of several timed calls, and a
    call that lost time off the CPU is named with the likely cause, so a stray figure is
    explained rather than hidden."""
    out = []
    note = clock_step_note(res.get("machine", {}))
    if note:
        out.append(note)
    for key in STEP_ROWS:
        r = res.get("step", {}).get(key, {})
        st = r.get("stalls")
        if not st or not st["calls_over_1ms"]:
            continue
        rp = st["replay"]
        wait = rp.get("runqueue_wait_ms")
        # a stall only where the replay was off the CPU for at least half of what its slowest
        # call ran past 1 ms; otherwise that time was spent on the CPU and is not excused
        stall = rp["off_cpu_ms"] * 1e6 >= 0.5 * (r["python"]["max"] - 1e6)
        out.append(f"{r['short']}: {st['calls_over_1ms']} call(s) over 1 ms (slowest "
                   f"{fmt_ns(r['python']['max'])}) "
                   + ("sat through a stall, not the engine: " if stall else
                      "spent that time on the CPU (page faults, the engine or Python), not in a "
                      "stall: ")
                   + f"that replay spent {rp['off_cpu_ms']:.1f} ms of {rp['wall_ms']:.0f} ms off the CPU"
                   + (f", {wait:.1f} ms of it waiting in the run queue" if wait is not None else "")
                   + (". p99.9 and below are not moved by it."
                      if st["calls_over_1ms"] * 1000 < r["samples"] else "."))
    timed = [(f"trade-off row '{t['policy']}'", t["batch_timing"])
             for t in res.get("replay", {}).get("tradeoff", []) if t.get("batch_timing")]
    timed += [(f"throughput {k.replace('_', ' ')}", b["batch_timing"])
              for k, b in res.get("batch", {}).items() if isinstance(b, dict) and b.get("batch_timing")]
    if not timed:
        return out
    bt0 = timed[0][1]
    out += [f"step_batch ns/tick: each figure is the median of {bt0['runs']} timed calls over the "
           f"whole stream (throughput: the best, a fresh engine each call, after an untimed "
           f"{bt0['warmup_ticks']:,}-tick warm-up on a twin; the others: the warm-up on the timed "
           f"engine, then reset), the rows of a table taken in turn; every "
           f"call's wall and thread CPU time are in the JSON (batch_timing)."]
    hit = [(name, bt) for name, bt in timed if bt["descheduled_runs"]]
    if not hit:
        return out
    rt = str(res.get("placement", {}).get("policy_granted", "")).upper() in ("SCHED_FIFO", "SCHED_RR")
    why = {"throttle": "waited in the run queue while the kernel's RT throttling held the "
                       "SCHED_FIFO thread (a real-time thread that never sleeps is stopped once "
                       "it has run sched_rt_runtime_us of each sched_rt_period_us: by default up "
                       "to 50 ms a second)",
           "task": "waited in the run queue while another task ran on this core",
           "outside": "were off the CPU with no wait this kernel saw (the hypervisor ran "
                      "something else on this vCPU, or interrupts)",
           "unknown": "were off the CPU where this OS keeps no run-queue wait per thread, so "
                      "the cause is not known"}
    causes: dict = {}
    worst = 0.0
    for _, bt in hit:
        waits = bt.get("runqueue_wait_ms") or [None] * bt["runs"]
        for off, wall, wait in zip(bt["off_cpu_ms"], bt["ns_per_tick"], waits):
            if off * 1e6 <= OFF_CPU_FRACTION * wall * bt["ticks"]:
                continue
            worst = max(worst, off)
            if wait is None:
                key = "unknown"
            else:
                key = ("throttle" if rt else "task") if wait >= 0.5 * off else "outside"
            causes[key] = causes.get(key, 0) + 1
    calls = sum(bt["descheduled_runs"] for _, bt in hit)
    out.append(f"{calls} of {sum(bt['runs'] for _, bt in timed)} timed step_batch calls lost over "
               f"{100 * OFF_CPU_FRACTION:g}% of their time off the CPU (up to {worst:.1f} ms; "
               f"{', '.join(name for name, _ in hit)}): "
               + "; ".join(f"{k} {why[c]}" for c, k in causes.items())
               + ". The median leaves such a call out unless most calls of a figure were hit.")
    return out


def percentile_levels(n: int) -> list:
    """The percentile levels HdrHistogram's percentile iterator reports (5 ticks per halving
    of the distance to 100%: each step closes a tenth of the remaining gap), down to the
    resolution n samples give; the last level is 100 * (1 - 1/n), where the slowest sample sits."""
    if n <= 0:
        return []
    out, gap = [], 100.0
    while gap * n / 100.0 >= 1.0:
        out.append(100.0 - gap)
        gap *= 0.9
    last = 100.0 * (1.0 - 1.0 / n)
    if not out or last > out[-1]:
        out.append(last)
    return out


def _at_rank(s: np.ndarray, levels) -> np.ndarray:
    """The values of sorted samples s at percentile levels by HdrHistogram's rule
    (get_value_at_percentile): the sample of rank round-half-up(p * n / 100), at least 1, with
    the same float operations, so both paths pick the same sample."""
    n = len(s)
    rank = np.floor(np.asarray(levels, np.float64) * n / 100 + 0.5).astype(np.int64)
    return s[np.clip(rank, 1, n) - 1]


def percentiles(values, levels) -> list:
    """values (any order) at percentile levels by the rank rule above: a sample some call
    took, never np.percentile's interpolation between two. The helper of the benches that
    keep no Dist (scaling, serve, weights, gpu_check), so every figure bench/ prints is
    read one way."""
    s = np.sort(np.asarray(values, np.float64).reshape(-1))
    return [float(x) for x in _at_rank(s, levels)] if s.size else [0.0 for _ in levels]


class Dist:
    """A latency distribution in ns: HdrHistogram (3 significant digits) when available."""
    HDR = None

    def __init__(self, values: np.ndarray):
        v = np.asarray(values, dtype=np.int64).reshape(-1)
        self.n = int(v.size)
        self.values = v
        self._h = None
        if self.n == 0:
            self.q = {p: 0.0 for p in PCTS}
            self.max = 0
            self.mean = 0.0
            return
        try:
            from hdrh.histogram import HdrHistogram
            h = HdrHistogram(1, max(int(v.max()), 2) * 2, 3)
            # a 0 is recorded as 0 (bucket 0): a stage shorter than one step of a coarse clock
            # reads 0, and clamping it to 1 would report a time no call took
            vals, counts = np.unique(np.maximum(v, 0), return_counts=True)
            for x, c in zip(vals.tolist(), counts.tolist()):
                h.record_value(x, c)
            self._h = h
            # a value in the slowest sample's bucket reads as the top of that bucket, above the
            # slowest call: held to the max, a time a call took, within the histogram's precision
            top = int(v.max())
            self.q = {p: float(min(h.get_value_at_percentile(p), top)) for p in PCTS}
            Dist.HDR = True
        except ImportError:
            # the histogram's rank rule, not np.percentile's interpolation: a p50 of two calls
            # is one of them, never a time no call took, and a run without hdrhistogram prints
            # the figures a run with it would (exactly, below 2048 ns)
            self.q = dict(zip(PCTS, (float(x) for x in _at_rank(np.sort(v), PCTS))))
            Dist.HDR = False
        # the slowest sample and the mean from the samples themselves: the histogram's max is
        # the top of the slowest sample's bucket (4,032,511 ns for a 4,031,234 ns call) and its
        # mean is of bucket values, where the samples are at hand
        self.max = int(v.max())
        self.mean = float(v.mean())

    @classmethod
    def of(cls, values) -> "Dist":
        return cls(values)

    @property
    def p50(self) -> float:
        return self.q[50]

    @property
    def p99(self) -> float:
        return self.q[99]

    def summary(self) -> dict:
        return {"n": self.n, "p50": self.q[50], "p90": self.q[90], "p99": self.q[99],
                "p999": self.q[99.9], "max": self.max, "mean": self.mean}

    def series(self) -> dict:
        """The whole percentile distribution: {"percentile": [...], "ns": [...]}, levels from
        percentile_levels(n); values from the histogram (get_percentile_to_value_dict) or, without
        hdrhistogram, the same rank rule on the sorted samples. The last point is the slowest
        sample itself."""
        levels = percentile_levels(self.n)
        if not levels:
            return {"percentile": [], "ns": []}
        if self._h is not None:
            d = self._h.get_percentile_to_value_dict(levels)
            # held to the slowest sample as the summary's percentiles are: the top of its bucket
            # put the points before the last one above it (a series that went down at its end)
            ns = [float(min(d[p], self.max)) for p in levels]
        else:
            ns = [float(x) for x in _at_rank(np.sort(self.values), levels)]
        ns[-1] = float(self.max)
        return {"percentile": [round(p, 6) for p in levels], "ns": ns}


def fmt_ns(ns: float) -> str:
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    if ns >= 1e4:
        return f"{ns / 1e3:.1f} us"
    if ns >= 1e3:
        return f"{ns / 1e3:.2f} us"
    return f"{ns:.0f} ns"


# the rows of the per-call table, in print order (keys of res["step"])
STEP_ROWS = ("miss", "hit", "hit_loose", "cache_off")


def _dist_cells(d):
    if not d["n"]:
        return ["-"] * 5
    return [fmt_ns(d["p50"]), fmt_ns(d["p90"]), fmt_ns(d["p99"]), fmt_ns(d["p999"]), fmt_ns(d["max"])]


def tradeoff_table(res):
    """(title, header, rows) of the cache trade-off table: per policy, hits, signal error on
    them, step_batch ns per tick (the median of the timed calls, their min-max beside it) and
    step() hit / miss p50."""
    names = res["stream"]["regimes"]
    trade = res["replay"].get("tradeoff", [])
    rows = [[t["policy"], f"{t['hits']:,} ({100 * t['hit_rate']:.1f}%)"]
            # a regime with no ticks in this stream has no hit rate, not 0.0%
            + [f"{100 * t['regime_hit_rates'][n]:.1f}%" if n in t["regime_hit_rates"] else "-"
               for n in names]
            + [f"{t['mean_abs_error_on_hits']:.4f}", f"{t['max_abs_error_on_hits']:.4f}",
               str(t["sign_flips_on_hits"]), _tradeoff_ns(t), _step_py(t.get("step_python")),
               " / ".join(f"{t['miss_reasons'].get(x, 0):,}" for x in ("age", "run", "cosine", "norm"))]
            for t in trade]
    # results without batch_timing hold one call per row
    runs = next((t["batch_timing"]["runs"] for t in trade if t.get("batch_timing")), None)
    title = ("What the cache buys and costs (step_batch replay"
             + (f", ns/tick the median of {runs} timed calls" if runs else "")
             + "; error on hits vs a cache-off replay; step() p50 from Python of that policy's "
             "hits and real misses)")
    header = (["policy", "hits"] + [f"hits {n}" for n in names]
              + ["err mean", "err max", "sign flips", "ns/tick" + (" (min-max)" if runs else ""),
                 "step() hit / miss p50", "misses age / run / cos / norm"])
    return title, header, rows


def tables(res):
    """(title, header, rows) for every table, shared by the terminal, plain text and README."""
    out = []
    step = res["step"]
    # no real miss (a stream too short for a lookup to run): no ratios, since ones against
    # max(0, 1) ns would read thousands
    has_miss = bool(step["miss"]["python"]["n"])
    miss_p50 = max(step["miss"]["python"]["p50"], 1)
    rows = []
    for key in STEP_ROWS:
        r = step[key]
        d = r["python"]
        ratio = f"{d['p50'] / miss_p50:.2f}x" if d["n"] and has_miss else "-"
        rows.append([r["label"], f"{r['samples']:,}"] + _dist_cells(d) + [ratio])
    for name, p in res["peers"].items():
        if not p.get("available"):
            continue
        d = p["python"]
        ratio = f"{p['ratio_p50']:.1f}x" if has_miss and p.get("ratio_p50") is not None else "-"
        rows.append([p["label"], f"{d['n']:,}"] + _dist_cells(d) + [ratio])
    bk = res.get("book")
    if bk:
        d = bk["python"]
        ratio = f"{d['p50'] / miss_p50:.2f}x" if d["n"] and has_miss else "-"
        rows.append([bk["label"], f"{bk['samples']:,}"] + _dist_cells(d) + [ratio])
        rows.append(["batch adapter (lob.raw_from_book), per tick", "-",
                     fmt_ns(bk["adapter_ns_per_tick"]), "-", "-", "-", "-", "-"])
    cs = res["machine"].get("clock_step")
    step_note = (f"; the clock advances in {cs['ns']:.1f} ns steps here"
                 if cs and cs["ns"] >= CLOCK_STEP_NOTE_NS else "")
    out.append((f"fastpath.step() per call from Python, replay of {res['stream']['source']} "
                f"(timer overhead {res['timer_overhead_ns']['p50']:.0f} ns removed{step_note}; "
                f"peers run the "
                f"MLP alone on precomputed features)",
                ["", "n", "p50", "p90", "p99", "p99.9", "max", "p50 / real miss p50"], rows))
    rows = []
    for key in STEP_ROWS:
        r = step[key]
        for stage in ("feature", "cache", "infer", "total"):
            d = r["in_c"][stage]
            if d["n"]:
                rows.append([f"{r['short']}: {stage}", f"{d['n']:,}"] + _dist_cells(d))
            elif r["samples"]:
                rows.append([f"{r['short']}: {stage}", "0", "-", "-", "-", "-", "did not run"])
    if bk:
        for stage in ("book", "total"):
            rows.append([f"{bk['short']}: {stage}", f"{bk['in_c'][stage]['n']:,}"]
                        + _dist_cells(bk["in_c"][stage]))
    out.append((f"Stages inside fp_step() ({c_clock(res.get('machine', {}))}), the same calls",
                ["", "n", "p50", "p90", "p99", "p99.9", "max"], rows))
    rp = res["replay"]
    rows = []
    for r in rp["regimes"]:
        t = r["in_c"]["total"]
        rows.append([r["name"], f"{r['ticks']:,}", f"{r['hits']:,} ({100 * r['hit_rate']:.1f}%)",
                     fmt_ns(t["p50"]), fmt_ns(t["p99"]), fmt_ns(r["python"]["p50"]),
                     fmt_ns(r["python"]["p99"]),
                     f"{r['mean_abs_signal_error_on_hits']:.4f} / {r['max_abs_signal_error_on_hits']:.4f}",
                     " / ".join(f"{r['miss_reasons'][x]:,}" for x in ("cold", "age", "run", "cosine", "norm"))])
    sh = rp["shadow"]
    out.append((f"Replay with the bundle's cache policy: {sh['hits_checked']:,} hits "
                f"({100 * rp['hit_rate']:.2f}%), signal error on hits vs a cache-off replay: mean "
                f"{sh['mean_abs_signal_error']:.4f}, max {sh['max_abs_signal_error']:.4f}",
                ["regime", "ticks", "hits", "C p50", "C p99", "py p50", "py p99",
                 "hit err mean / max", "misses cold / age / run / cosine / norm"], rows))
    out.append(tradeoff_table(res))
    b, k = res["batch"], res["mlp_kernel"]
    rows = [["step_batch, cache off", f"{b['cache_off']['ticks_per_s'] / 1e6:.2f} M ticks/s",
             _batch_cell(b["cache_off"])],
            ["step_batch, bundle cache policy", f"{b['cache_on']['ticks_per_s'] / 1e6:.2f} M ticks/s",
             _batch_cell(b["cache_on"])],
            [f"MLP kernel alone ({k['kernel_set']}, {k['macs']} MACs"
             + (f"; best of {k['runs']} runs, each the mean of {k['passes_per_run']:,} passes"
                if "runs" in k else "") + ")", f"{k['ns_per_forward']:.0f} ns",
             f"{k['gflops']:.1f} GFLOP/s" if "gflops" in k else "-"]]
    if "fma_bound_ns" in k:
        rows.append(["FMA throughput bound (measured peak)", f"{k['fma_bound_ns']:.0f} ns",
                     f"ratio {k['ratio_to_bound']:.2f}x"])
    out.append(("Throughput", ["", "", ""], rows))
    rows = [[t["what"], "-" if t["value"] is None else f"{t['value']:.2f}",
             f"{t['op']} {t['target']:g}",
             "met" if t["met"] else "NOT MEASURED" if t["value"] is None else "NOT MET"]
            for t in res["targets"]]
    out.append(("Targets", ["", "value", "target", ""], rows))
    return out


# said under the tables with or without rich
NO_HDR = ("hdrhistogram not installed: percentiles picked from the sorted samples by its rank "
          "rule")


def render(res) -> None:
    m = res["machine"]
    pl = res["placement"]
    mem = res.get("memory") or {}
    head = (f"fastpath {m['fastpath']} ({m['commit']}) on {m['cpu_model']}, simd={m['simd']}, "
            f"clock={m['clock']['source']}, {res['stream']['source']}\n"
            f"placement: core {pl.get('core')}, {pl.get('policy_granted', '?')} "
            f"{pl.get('priority_granted', '')}"
            # the control plane refused (--cpu 9999): the run goes on unplaced, and says why
            + (f" (not placed: {pl['error']})" if pl.get("error") else "")
            + (f" (asked {pl.get('policy_asked')} {pl.get('priority_asked')}: {pl.get('sched_refused')})"
               if pl.get("sched_refused") else "")
            + (f"; arena {mem.get('method')} pages {mem.get('page_size')}, mlock {mem.get('mlock')}"
               if mem else ""))
    skipped = [f"{n}: skipped ({p['reason']})" for n, p in res["peers"].items() if not p["available"]]
    notes = [res["step"][k]["what"] for k in STEP_ROWS] + timing_notes(res)
    if res.get("book"):
        notes.append(res["book"]["what"])
    try:
        from rich.console import Console
        from rich.table import Table
        c = Console(width=None if Console().is_terminal else 140)
        c.print(f"[bold]{head}[/bold]")
        for title, header, rows in tables(res):
            t = Table(title=title, title_justify="left")
            for h in header:
                t.add_column(h, justify="left" if not h or h in ("regime", "policy") else "right")
            for r in rows:
                t.add_row(*r)
            c.print(t)
        for s in notes:
            c.print(f"- {s}", highlight=False)
        for s in skipped:
            c.print(f"[yellow]{s}[/yellow]")
        if res.get("hdrhistogram") is False:
            c.print(f"[yellow]{NO_HDR}[/yellow]")
    except ImportError:
        print(head)
        for title, header, rows in tables(res):
            print(f"\n{title}")
            widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
            for r in [header] + rows:
                print("  ".join(str(x).rjust(w) if i else str(x).ljust(w)
                                for i, (x, w) in enumerate(zip(r, widths))))
        for s in notes:
            print(f"- {s}")
        for s in skipped:
            print(s)
        if res.get("hdrhistogram") is False:
            print(NO_HDR)
        print("rich not installed: plain table")


def markdown(res) -> str:
    """The README's tables, generated from a results dict."""
    out = []
    for title, header, rows in tables(res):
        out.append(f"{title}\n")
        out.append("| " + " | ".join(h or " " for h in header) + " |")
        out.append("|" + "---|" * len(header))
        for r in rows:
            out.append("| " + " | ".join(str(x).replace("|", "/") for x in r) + " |")
        out.append("")
    return "\n".join(out)


# ------------------------------------------------------------------------------------ plots
NINES = (0.0, 90.0, 99.0, 99.9, 99.99, 99.999, 99.9999, 99.99999)


def _nines_axis(ax, n_max):
    ax.set_xscale("log")
    ticks = [1.0 / (1.0 - p / 100.0) for p in NINES]
    keep = [i for i, t in enumerate(ticks) if t <= max(n_max, 10) * 1.01]
    ax.set_xticks([ticks[i] for i in keep])
    ax.set_xticklabels([f"{NINES[i]:g}%" for i in keep])
    ax.minorticks_off()
    ax.set_xlim(1, max(n_max, 10) * 1.5)
    ax.set_xlabel("percentile (each line ends at its slowest sample, drawn at 1 - 1/n)")


def _plot_series(ax, s, **kw):
    p = np.asarray(s["percentile"], float)
    if not len(p):
        return 0
    x = 1.0 / (1.0 - p / 100.0)
    ax.plot(x, s["ns"], **kw)
    return int(s["n"])


def write_plots(res, path: str):
    """Three panels, one question each: what a step() costs from Python (real misses, real hits,
    cache off, peers), where the ns go inside fp_step() on a miss, and how often the cache hits
    along the replay. Returns the path, or None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return None
    pd = res["percentile_distributions"]
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(19, 6))
    n_max = 1
    styles = {"step_miss": dict(color="tab:red", lw=2), "step_hit": dict(color="tab:green", lw=2),
              "step_hit_loose": dict(color="tab:green", lw=1.5, ls="--"),
              "step_cache_off": dict(color="tab:gray", lw=1.5, ls="-.")}
    for key, s in pd.items():
        if s["panel"] != "python" or not s["n"]:
            continue
        kw = styles.get(key, dict(lw=1.2, ls=":"))
        n_max = max(n_max, _plot_series(a1, s, label=f"{s['label']} (n={s['n']:,})", **kw))
    _nines_axis(a1, n_max)
    a1.set_yscale("log")
    a1.set_ylabel("latency per call, ns (log)")
    a1.set_title("What does one call cost from Python:\nreal miss vs real hit vs peers?", fontsize=11)
    a1.grid(True, which="both", alpha=0.3)
    a1.legend(fontsize=7, loc="upper left")

    n_max = 1
    for key, s in pd.items():
        if s["panel"] != "in_c_miss" or not s["n"]:
            continue
        n_max = max(n_max, _plot_series(a2, s, label=f"{s['label']} (n={s['n']:,})", lw=1.5))
    _nines_axis(a2, n_max)
    a2.set_yscale("log")
    a2.set_ylabel(f"ns inside fp_step() ({c_clock(res.get('machine', {}))}, log)")
    a2.set_title("Where do the ns go inside fp_step()\non a real miss?", fontsize=11)
    a2.grid(True, which="both", alpha=0.3)
    if a2.get_legend_handles_labels()[0]:
        a2.legend(fontsize=7, loc="upper left")
    else:
        # an empty panel says why (an empty legend is a UserWarning: an error under -W error)
        a2.text(0.5, 0.5, "no real miss in this replay", transform=a2.transAxes, ha="center",
                va="center", fontsize=9)

    tl = res["replay"]["timeline"]
    rp = res["replay"]
    a3.plot(tl["tick"], np.asarray(tl["hit_rate"]) * 100, color="tab:green", lw=2,
            label=f"bundle policy (step() replay, {rp['shadow']['hits_checked']:,} hits)")
    for t, ls, col in zip(rp.get("tradeoff", [])[1:], (":", "-.", "--"),
                          ("tab:olive", "tab:blue", "tab:purple")):
        a3.plot(tl["tick"], np.asarray(t["timeline_hit_rate"]) * 100, ls, color=col, alpha=0.9,
                label=f"{t['policy']} (max err on hits {t['max_abs_error_on_hits']:.3f})")
    a3.set_ylim(0, 100)
    regs = tl["regime"]
    bounds = [0] + [i for i in range(1, len(regs)) if regs[i] != regs[i - 1]] + [len(regs)]
    for a, b in zip(bounds[:-1], bounds[1:]):
        x0 = tl["tick"][a]
        if a:
            a3.axvline(x0, color="grey", ls="--", lw=0.8)
        a3.text(x0, 97, f" {regs[a]}", fontsize=8, va="top", rotation=90)
    if not rp["hits"] and not any(t["hits"] for t in rp.get("tradeoff", [])):
        # an empty panel needs its reason: which guard refused the lookups
        why = {x: sum(r["miss_reasons"][x] for r in rp["regimes"])
               for x in ("cold", "age", "run", "cosine", "norm")}
        a3.text(0.5, 0.5, "no policy hits on this stream; misses by guard (bundle policy):\n"
                + ", ".join(f"{k} {v:,}" for k, v in why.items()), transform=a3.transAxes,
                ha="center", va="center", fontsize=9)
    a3.set_xlabel("tick of the replay")
    a3.set_ylabel("cache hit rate per bin, %")
    a3.set_title(f"How often does the cache hit, regime by regime?\n{res['stream']['source']}",
                 fontsize=11)
    a3.grid(True, alpha=0.3)
    a3.legend(fontsize=7, loc="upper right", bbox_to_anchor=(1.0, 0.91))
    m = res["machine"]
    fig.suptitle(f"fastpath {m['fastpath']} ({m['commit']}), {m['cpu_model']}, simd={m['simd']}",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
