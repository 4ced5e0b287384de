"""fastpath.lob: limit-order books to ticks. The adapter (book snapshots + trades -> the
256-value raw vector, adapter.py), a seeded synthetic book stream with regimes
(generator.py), readers for Binance captures and LOBSTER files (readers.py), Databento
MBP-10 files (databento.py), Tardis CSV files (tardis.py), and the choice among them for a
`--data` argument (sources.py).

Design: the raw vector describes the book relative to itself (prices in ticks from
mid, log sizes, imbalances), never in absolute prices, so one model serves every
instrument and price level. Slow-moving context (returns over several lags and
exponentially weighted averages at half-lives of 1..128 ticks) replaces a shifting
window of past snapshots: consecutive ticks of a calm book give nearly the same
vector, which is what lets the per-symbol cache hit, while a shock changes it at once.
Everything is computed per symbol, in tick order, vectorised over fields. The per-symbol
clock is book changes: an update that leaves the visible top-10 book unchanged and carries no
trade (activity deeper in the book, a repeated snapshot) repeats the symbol's previous vector
exactly, so "since the previous tick" below means since the previous change.

Raw layout (RAW_LEN = 256 float32), L = 10 levels, "hl" = half-lives 1,2,4,...,128 ticks:
    0-9    bid price offset from mid, ticks, level 1..10 (negative)
    10-19  ask price offset from mid, ticks (positive)
    20-29  log1p bid size            30-39  log1p ask size
    40-49  level imbalance (b-a)/(b+a)
    50-59  cumulative depth imbalance, levels 1..k
    60     spread, ticks             61     microprice offset from mid, ticks
    62     log1p total bid depth     63     log1p total ask depth
    64-83  log1p cumulative depth, bid 1..10 then ask 1..10
    84-101 gaps between consecutive levels, ticks, bid 9 then ask 9
    102-121 log size change since the symbol's previous tick, bid 10 then ask 10
    122-131 order-flow imbalance per level (Cont et al.), log-signed
    132-139 mid return over the last 1,2,4,...,128 ticks, bps
    140-203 EWMA of 8 series x 8 hl: [OFI level 1, OFI levels 1-5, signed trade volume,
            level-1 imbalance, squared 1-tick return (bps^2), spread, microprice offset,
            log depth ratio bid/ask]; series-major (140-147 is OFI level 1 at hl 1..128)
    204    last trade sign (+1 buy, -1 sell, 0 none yet)
    205    log1p size of the last trade
    206    log1p trades since the previous tick
    207    signed trade volume since the previous tick, log-signed
    208    log1p ms since the last trade
    209    log1p ms since the symbol's previous tick
    210    log1p ticks since the mid last changed
    211    mid change since the previous tick, bps
    212-243 EWMA of imbalance at levels 2..5 x hl (1, 2, 8, 32, 128, 4, 16, 64 -> sorted 1..128)
    244-251 EWMA of |OFI level 1| x 8 hl
    252-253 level-1 size / mean level size, bid then ask
    254-255 depth slope (log size level 10 - level 1) / 9, bid then ask
"""
from fastpath.lob.adapter import (HALF_LIVES, LEVELS, RAW_LEN, STATE_FIELDS, WINDOW_FIELDS,
                                  BookStream, field_names, future_return_bps, raw_from_book)
from fastpath.lob.generator import REGIMES, generate_stream
from fastpath.lob.databento import read_databento
from fastpath.lob.readers import label_volatility, read_binance, read_lobster
from fastpath.lob.sources import data_kind, read_data
from fastpath.lob.tardis import read_tardis

__all__ = ["RAW_LEN", "LEVELS", "HALF_LIVES", "WINDOW_FIELDS", "STATE_FIELDS", "REGIMES",
           "BookStream", "field_names", "raw_from_book", "future_return_bps", "generate_stream",
           "label_volatility", "read_binance", "read_lobster", "read_databento", "read_tardis",
           "read_data", "data_kind"]
