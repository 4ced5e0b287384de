"""Print the README's bench tables (markdown) from a results JSON, so README figures are generated
from the committed results file next to them, never typed; --plot re-draws the PNG from the same file.

    python bench/readme_figures.py                                  # bench/results/latest-generated.json
    python bench/readme_figures.py bench/results/latest-binance.json
    python bench/readme_figures.py bench/results/latest-generated.json --plot docs/bench.png
"""
from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _report import fmt_ns, markdown, timing_notes, write_plots  # noqa: E402


def summary(res) -> str:
    """The prose figures under the tables: stages of a real miss, throughput, the kernel."""
    st = res["step"]
    miss = st["miss"]["in_c"]
    b, k = res["batch"], res["mlp_kernel"]
    lines = [
        f"Source: {res['stream']['source']}, {res['machine']['cpu_model']}, simd={res['machine']['simd']}, "
        f"fastpath {res['machine']['fastpath']} ({res['machine']['commit']}), started {res['started']}.",
        # a replay without a real miss has no stages to give (a p50 of no calls is no figure)
        f"Inside fp_step() on a real miss (p50 of {miss['total']['n']:,} calls): features "
        f"{fmt_ns(miss['feature']['p50'])}, cache stage {fmt_ns(miss['cache']['p50'])}, "
        f"inference {fmt_ns(miss['infer']['p50'])}, total {fmt_ns(miss['total']['p50'])}."
        if miss["total"]["n"] else "No real miss in this replay: no in-C stages of one.",
    ]
    for key in ("hit", "hit_loose"):
        r = st[key]
        if r["samples"]:
            lines.append(f"A real hit ({r['policy']['name']}, {r['samples']:,} hits) is "
                         f"{fmt_ns(r['in_c']['total']['p50'])} in C (p50).")
    # results without batch_timing are the best of three calls
    runs = b["cache_off"].get("batch_timing", {}).get("runs", 3)
    best = {3: "three", 5: "five"}.get(runs, str(runs))
    lines.append(f"step_batch: {b['cache_off']['ticks_per_s'] / 1e6:.2f} M ticks/s with the cache off, "
                 f"{b['cache_on']['ticks_per_s'] / 1e6:.2f} M with the bundle's policy (best of {best}).")
    line = f"The MLP kernel alone: {k['ns_per_forward']:.0f} ns for {k['macs']:,} multiply-adds"
    if "runs" in k:
        line += f" (best of {k['runs']} runs, each the mean of {k['passes_per_run']:,} passes)"
    if "gflops" in k:
        line += f" ({k['gflops']:.0f} GFLOP/s)"
    if "fma_bound_ns" in k:
        line += (f", {k['ratio_to_bound']:.2f}x the FMA throughput bound "
                 f"measured on this core ({k['fma_bound_ns']:.0f} ns)")
    lines.append(line + ".")
    lines += timing_notes(res)
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("results", nargs="?", default=os.path.join(HERE, "results", "latest-generated.json"),
                    help="results JSON written by bench/run.py")
    ap.add_argument("--plot", metavar="PNG", help="also re-draw the bench plot from this file")
    args = ap.parse_args(argv)
    with open(args.results) as f:
        res = json.load(f)
    print(markdown(res))
    print(summary(res))
    print(f"\n(from {os.path.relpath(args.results)})")
    if args.plot and not write_plots(res, args.plot):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
