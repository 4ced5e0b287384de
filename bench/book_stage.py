"""The live book stage alone (csrc/fp_book.c, no model, no Python per update): ns per update
of fp_book_compute + fp_book_commit over a generated order-book stream, per kernel set, and
with libm's log1p value by value beside the kernel sets' batch log1p.

    python bench/book_stage.py [--ticks 30000] [--passes 5]
"""
import argparse

import numpy as np

from fastpath import _kernels as K
from fastpath import lob
from fastpath._core import supported_isas


def stage_ns(bs, isa, passes, libm=False):
    """(p50, p90, p99) ns of the stage per update: each update's fastest pass, then the
    percentiles over the stream (the fastest pass drops the other engineers' and the OS's
    interruptions, not the stage's own cost)."""
    ns = K.book_stage_ns(isa, bs.tick_size, bs.symbols, bs.bid_px, bs.bid_sz, bs.ask_px,
                         bs.ask_sz, bs.ts_ns, bs.trade_vol, bs.trade_cnt, bs.last_trade_sz,
                         passes=passes, libm=libm)
    best = ns.min(axis=0)
    return tuple(float(np.percentile(best, q)) for q in (50, 90, 99))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ticks", type=int, default=30_000)
    ap.add_argument("--passes", type=int, default=5)
    args = ap.parse_args(argv)
    if args.ticks < 100 or args.passes < 1:
        ap.error(f"--ticks must be >= 100 and --passes >= 1, got {args.ticks} and {args.passes}")
    bs = lob.generate_stream(n_ticks=args.ticks)
    print(f"book stage alone, {args.ticks:,} updates, best of {args.passes} passes per update; "
          f"libm log1p is the kernels' bit for bit: {K.log1p_libm_fused()}")
    # the scalar set keeps libm's log1p (fp_book_set_kernels): one row; each vector set with
    # libm's log1p value by value and with its batch kernel
    rows = [("scalar", "scalar", False)]
    for isa in supported_isas()[1:]:
        rows += [(f"{isa}, libm log1p", isa, True), (f"{isa}, batch log1p kernel", isa, False)]
    for label, isa, libm in rows:
        p50, p90, p99 = stage_ns(bs, isa, args.passes, libm)
        print(f"  {label:<28} p50 {p50:6.0f} ns  p90 {p90:6.0f} ns  p99 {p99:6.0f} ns")


if __name__ == "__main__":
    main()
