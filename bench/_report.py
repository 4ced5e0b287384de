"""Distributions, the terminal table and the plots of the bench."""
from __future__ import annotations

import numpy as np

PCTS = (50, 90, 99, 99.9)


class Dist:
    """A latency distribution in ns: HdrHistogram (3 significant digits) when available."""
    HDR = None

    def __init__(self, values: np.ndarray):
        v = np.asarray(values, dtype=np.int64).reshape(-1)
        self.n = int(v.size)
        self.values = v
        if self.n == 0:
            self.q = {p: 0.0 for p in PCTS}
            self.max = 0
            self.mean = 0.0
            return
        try:
            from hdrh.histogram import HdrHistogram
            h = HdrHistogram(1, max(int(v.max()), 2) * 2, 3)
            vals, counts = np.unique(np.maximum(v, 1), return_counts=True)
            for x, c in zip(vals.tolist(), counts.tolist()):
                h.record_value(x, c)
            self.q = {p: float(h.get_value_at_percentile(p)) for p in PCTS}
            self.max = int(h.get_max_value())
            self.mean = float(h.get_mean_value())
            Dist.HDR = True
        except ImportError:
            self.q = dict(zip(PCTS, (float(x) for x in np.percentile(v, PCTS))))
            self.max = int(v.max())
            self.mean = float(v.mean())
            Dist.HDR = False

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


def _fmt(ns: float) -> str:
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    if ns >= 1e4:
        return f"{ns / 1e3:.1f} us"
    return f"{ns:.0f} ns"


def _tables(res):
    """(title, header, rows) for every table, shared by rich and plain output."""
    out = []
    rows = []
    miss_p50 = max(res["step_miss"]["python"]["p50"], 1)
    for label, d in (("fastpath.step() miss", res["step_miss"]["python"]),
                     ("fastpath.step() hit", res["step_hit"]["python"])):
        rows.append([label, _fmt(d["p50"]), _fmt(d["p90"]), _fmt(d["p99"]), _fmt(d["p999"]),
                     _fmt(d["max"]), f"{d['p50'] / miss_p50:.2f}x"])
    for name, p in res["peers"].items():
        if not p.get("available"):
            continue
        d = p["python"]
        rows.append([f"{name} {p['version']}", _fmt(d["p50"]), _fmt(d["p90"]), _fmt(d["p99"]),
                     _fmt(d["p999"]), _fmt(d["max"]), f"{p['ratio_p50']:.1f}x"])
    out.append(("Per tick from Python (timer overhead "
                f"{res['timer_overhead_ns']['p50']:.0f} ns removed)",
                ["", "p50", "p90", "p99", "p99.9", "max", "p50 vs miss"], rows))
    rows = []
    for label, key in (("miss", "step_miss"), ("hit", "step_hit")):
        for stage, d in res[key]["in_c"].items():
            if d["n"]:
                rows.append([f"{label}: {stage}", _fmt(d["p50"]), _fmt(d["p90"]), _fmt(d["p99"]),
                             _fmt(d["p999"]), _fmt(d["max"])])
            else:
                rows.append([f"{label}: {stage}", "-", "-", "-", "-", "did not run"])
    out.append(("Stages inside fp_step() (TSC)", ["", "p50", "p90", "p99", "p99.9", "max"], rows))
    rp = res["replay"]
    rows = []
    for r in rp["regimes"]:
        t = r["in_c"]["total"]
        rows.append([r["name"], str(r["ticks"]), f"{100 * r['hit_rate']:.1f}%", _fmt(t["p50"]),
                     _fmt(t["p99"]), _fmt(r["python"]["p50"]), _fmt(r["python"]["p99"]),
                     f"{r['mean_abs_signal_error_on_hits']:.4f} / {r['max_abs_signal_error_on_hits']:.4f}"])
    sh = rp["shadow"]
    out.append((f"Replay with the cache ({res['stream']['source']}): hit rate "
                f"{100 * rp['hit_rate']:.1f}%, shadow error on {sh['hits_checked']} hits mean "
                f"{sh['mean_abs_signal_error']:.4f} max {sh['max_abs_signal_error']:.4f}",
                ["regime", "ticks", "hits", "C p50", "C p99", "py p50", "py p99",
                 "hit err mean / max"], rows))
    names = res["stream"]["regimes"]
    rows = [[t["policy"], f"{100 * t['hit_rate']:.1f}%"]
            + [f"{100 * t['regime_hit_rates'].get(n, 0):.1f}%" for n in names]
            + [f"{t['mean_abs_error_on_hits']:.4f}", f"{t['max_abs_error_on_hits']:.4f}",
               f"{t['batch_ns_per_tick']:.0f} ns"] for t in rp.get("tradeoff", [])]
    out.append(("What the cache buys and costs (step_batch replay, shadow error on hits)",
                ["policy", "hits"] + [f"hits {n}" for n in names]
                + ["err mean", "err max", "ns/tick"], rows))
    b, k = res["batch"], res["mlp_kernel"]
    rows = [["step_batch, cache off", f"{b['cache_off']['ticks_per_s'] / 1e6:.2f} M ticks/s",
             f"{b['cache_off']['ns_per_tick']:.0f} ns/tick"],
            ["step_batch, cache on", f"{b['cache_on']['ticks_per_s'] / 1e6:.2f} M ticks/s",
             f"{b['cache_on']['ns_per_tick']:.0f} ns/tick"],
            [f"MLP kernel alone ({k['kernel_set']}, {k['macs']} MACs)", f"{k['ns_per_forward']:.0f} ns",
             f"{k.get('gflops', 0):.1f} GFLOP/s"]]
    if "fma_bound_ns" in k:
        rows.append(["FMA throughput bound (measured peak)", f"{k['fma_bound_ns']:.0f} ns",
                     f"ratio {k['ratio_to_bound']:.2f}x"])
    out.append(("Throughput", ["", "", ""], rows))
    rows = [[t["what"], f"{t['value']:.2f}", f"{t['op']} {t['target']:g}",
             "met" if t["met"] else "NOT MET"] for t in res["targets"]]
    out.append(("Targets (issue 2)", ["", "value", "target", ""], rows))
    return out


def render(res) -> None:
    m = res["machine"]
    pl = res["placement"]
    mem = res.get("memory") or {}
    head = (f"fastpath {m['fastpath']} ({m['commit']}) on {m['cpu_model']}, simd={m['simd']}, "
            f"clock={m['clock']['source']}, {res['stream']['source']}\n"
            f"placement: core {pl.get('core')}, {pl.get('policy_granted', '?')} "
            f"{pl.get('priority_granted', '')}"
            + (f" (asked {pl.get('policy_asked')} {pl.get('priority_asked')}: {pl.get('sched_refused')})"
               if pl.get("sched_refused") else "")
            + (f"; arena {mem.get('method')} pages {mem.get('page_size')}, mlock {mem.get('mlock')}"
               if mem else ""))
    skipped = [f"{n}: skipped ({p['reason']})" for n, p in res["peers"].items() if not p["available"]]
    try:
        from rich.console import Console
        from rich.table import Table
        c = Console(width=None if Console().is_terminal else 130)
        c.print(f"[bold]{head}[/bold]")
        for title, header, rows in _tables(res):
            t = Table(title=title, title_justify="left")
            for h in header:
                t.add_column(h, justify="left" if not h or h in ("regime",) else "right")
            for r in rows:
                t.add_row(*r)
            c.print(t)
        for s in skipped:
            c.print(f"[yellow]{s}[/yellow]")
        if res.get("hdrhistogram") is False:
            c.print("[yellow]hdrhistogram not installed: percentiles from numpy[/yellow]")
    except ImportError:
        print(head)
        for title, header, rows in _tables(res):
            print(f"\n{title}")
            widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
            for r in [header] + rows:
                print("  ".join(str(x).rjust(w) if i else str(x).ljust(w)
                                for i, (x, w) in enumerate(zip(r, widths))))
        for s in skipped:
            print(s)
        print("rich not installed: plain table")


def write_plots(res, path: str):
    """Latency CDFs (fastpath stages and peers) and the replay timeline; None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return None
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(14, 5.2))

    def line(ax, d, label, style="-"):
        # the max is the slowest of n calls: plotted at 1/n
        ax.plot([d["p50"], d["p90"], d["p99"], d["p999"], d["max"]],
                [0.5, 0.1, 0.01, 0.001, 1.0 / max(d["n"], 1)], style, marker="o", label=label)
    line(a1, res["step_miss"]["python"], "fastpath.step miss (python)")
    line(a1, res["step_hit"]["python"], "fastpath.step hit (python)")
    for stage in ("feature", "cache", "infer", "total"):
        d = res["step_miss"]["in_c"][stage]
        if d["n"]:
            line(a1, d, f"miss, in C: {stage}", "--")
    for name, p in res["peers"].items():
        if p.get("available"):
            line(a1, p["python"], f"{name} (python)", ":")
    a1.set_xscale("log")
    a1.set_yscale("log")
    a1.set_xlabel("latency, ns")
    a1.set_ylabel("fraction slower (1 - CDF)")
    a1.set_title("Latency tails per tick (log-log)")
    a1.grid(True, which="both", alpha=0.3)
    a1.legend(fontsize=7)
    tl = res["replay"]["timeline"]
    a2.plot(tl["tick"], tl["p99_ns"], label="p99 total in C (ns)", color="tab:red")
    a2.plot(tl["tick"], tl["p50_ns"], label="p50 total in C (ns)", color="tab:orange")
    a2.set_xlabel("tick")
    a2.set_ylabel("ns")
    a3 = a2.twinx()
    a3.plot(tl["tick"], tl["hit_rate"], label="hit rate (bundle policy)", color="tab:blue")
    for t, style in zip(res["replay"].get("tradeoff", [])[1:], (":", "-.", "--")):
        a3.plot(tl["tick"], t["timeline_hit_rate"], style, color="tab:blue", alpha=0.7,
                label=f"hit rate, {t['policy']}")
    a3.set_ylabel("hit rate")
    a3.set_ylim(0, 1)
    regs = tl["regime"]
    for i in range(1, len(regs)):
        if regs[i] != regs[i - 1]:
            a2.axvline(tl["tick"][i], color="grey", ls="--")
            a2.text(tl["tick"][i], a2.get_ylim()[1] * 0.95, regs[i], fontsize=8)
    a2.set_title(f"Replay: {res['stream']['source']}")
    h1, l1 = a2.get_legend_handles_labels()
    h2, l2 = a3.get_legend_handles_labels()
    a2.legend(h1 + h2, l1 + l2, fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
