"""A seeded synthetic order-book stream, several symbols interleaved, with regimes (calm,
shock, recovery): data for tests, the bench and the demo model when no capture is at hand.
"""
from __future__ import annotations

import numpy as np

from fastpath._checks import MAX_SYMBOLS
from fastpath.errors import InputError
from fastpath.lob.adapter import LEVELS, BookStream

REGIMES = ("calm", "shock", "recovery")


def generate_stream(n_ticks: int = 200_000, n_symbols: int = 8, seed: int = 7,
                    shock_at: float = 0.45, shock_len: float = 0.1, progress=None) -> BookStream:
    """A seeded synthetic order book stream, several symbols interleaved, with regimes:
    calm, a shock (sweeps through several levels, 5x volatility, wide spread, heavy trading),
    then calm again ("recovery"). Level-1 imbalance predicts the next mid move, so a model
    trained on it has a real signal to find. progress(done, total), when given, is called
    every 10,000 ticks. InputError for a count that is not a positive int (n_symbols at most
    1 << 22, an engine's most symbols) or a shock window outside [0, 1] (it would silently give
    a stream with no shock, or none at all); a shock of shock_len > 0 lasts at least one tick."""
    for name, v, lo in (("n_ticks", n_ticks, 1), ("n_symbols", n_symbols, 1), ("seed", seed, 0)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
            raise InputError(f"{name} must be an int >= {lo}, got {v!r}")
    if n_symbols > MAX_SYMBOLS:
        # the per-symbol book state is allocated up front: 2**31 symbols filled ~190 GB before
        # numpy could fail (the process was killed for memory), and past int32 the symbol ids
        # wrapped to negative ones; no engine serves more than this many
        raise InputError(f"n_symbols must be at most {MAX_SYMBOLS} (the most symbols an engine "
                         f"serves, [engine] n_symbols), got {n_symbols}")
    for name, v in (("shock_at", shock_at), ("shock_len", shock_len)):
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) \
                or not 0.0 <= v <= 1.0:
            raise InputError(f"{name} must be a fraction of the stream in [0, 1], got {v!r}")
    if shock_at + shock_len > 1.0:
        raise InputError(f"shock_at + shock_len must be <= 1 (the shock ends inside the stream), "
                         f"got {shock_at} + {shock_len}")
    rng = np.random.default_rng(seed)
    L = LEVELS
    tick = 0.01
    mid2 = rng.integers(8_000, 20_000, n_symbols) * 2        # 2 x mid, in ticks
    spread = np.ones(n_symbols, np.int64)
    bsz = rng.lognormal(3.0, 0.6, (n_symbols, L))
    asz = rng.lognormal(3.0, 0.6, (n_symbols, L))
    sym = rng.integers(0, n_symbols, n_ticks).astype(np.int32)
    s0, s1 = int(n_ticks * shock_at), int(n_ticks * (shock_at + shock_len))
    if shock_len > 0:
        # a shock asked for is at least one tick: a stream of under 10 ticks rounded its window
        # to nothing, and its later ticks were labelled "recovery" from a shock never run
        s1 = max(s1, s0 + 1)
    regime = np.zeros(n_ticks, np.int8)
    regime[s0:s1] = 1
    regime[s1:] = 2
    gaps = rng.exponential(1.0, n_ticks) * np.where(regime == 1, 10_000, 50_000)
    ts = (1_700_000_000_000_000_000 + np.cumsum(gaps)).astype(np.int64)
    out_bpx = np.empty((n_ticks, L))
    out_apx = np.empty((n_ticks, L))
    out_bsz = np.empty((n_ticks, L))
    out_asz = np.empty((n_ticks, L))
    tvol = np.zeros(n_ticks)
    tcnt = np.zeros(n_ticks)
    tlast = np.zeros(n_ticks)
    u = rng.random((n_ticks, 7))
    lvl = np.minimum(rng.geometric(0.12, n_ticks) - 1, L - 1)
    mult = rng.lognormal(0.0, 0.25, n_ticks)
    tsz = rng.lognormal(1.5, 0.8, n_ticks)
    fresh = rng.lognormal(3.0, 0.6, (n_ticks, L))
    levels = np.arange(L)
    for t in range(n_ticks):
        if progress is not None and t % 10_000 == 0:
            progress(t, n_ticks)
        s = sym[t]
        shock = regime[t] == 1
        b, a = bsz[s], asz[s]
        imb = (b[0] - a[0]) / (b[0] + a[0])
        p_move = 0.35 if shock else 0.04
        if u[t, 0] < p_move:
            up = u[t, 1] < 0.5 + 0.35 * imb
            k = 1 + int(u[t, 2] * (4 if shock else 1.3))          # levels swept
            k = min(k, L - 1)
            if up:   # asks swept, book shifts up
                mid2[s] += 2 * k
                asz[s] = np.concatenate([a[k:], fresh[t, :k]])
                bsz[s] = np.concatenate([fresh[t, :k] * 0.5, b[:L - k]])
            else:
                mid2[s] -= 2 * k
                bsz[s] = np.concatenate([b[k:], fresh[t, :k]])
                asz[s] = np.concatenate([fresh[t, :k] * 0.5, a[:L - k]])
            spread[s] = 1 + int(u[t, 3] * 3) if shock else 1
            if u[t, 4] < (0.9 if shock else 0.6):
                sign = 1.0 if up else -1.0
                tcnt[t] = 1 + int(u[t, 5] * 3)
                tvol[t] = sign * tsz[t] * tcnt[t] * (3 if shock else 1)
                tlast[t] = tsz[t]
        elif u[t, 6] < (0.1 if shock else 0.5):
            pass    # activity beyond the visible 10 levels: the top-10 book is unchanged
        else:
            side = bsz if u[t, 1] < 0.5 else asz
            j = lvl[t]
            side[s, j] = max(side[s, j] * mult[t], 0.5)
            if shock:   # heavy cancellation through the book
                side[s] *= np.where(u[t, 2] < 0.5, 0.7, 1.3) ** (levels < 5)
                spread[s] = 1 + int(u[t, 3] * 3)
            elif spread[s] > 1 and u[t, 3] < 0.3:
                spread[s] -= 1
            if u[t, 4] < (0.5 if shock else 0.03):
                tcnt[t] = 1
                tvol[t] = (1.0 if u[t, 5] < 0.5 + 0.3 * imb else -1.0) * tsz[t]
                tlast[t] = tsz[t]
        half = spread[s]
        bb2 = mid2[s] - half
        ba2 = mid2[s] + half
        out_bpx[t] = (bb2 / 2 - levels) * tick
        out_apx[t] = (ba2 / 2 + levels) * tick
        out_bsz[t] = bsz[s]
        out_asz[t] = asz[s]
    return BookStream(sym, ts, out_bpx, out_apx, out_bsz, out_asz, tvol, tcnt, tlast,
                      np.float64(tick), regime, REGIMES)
