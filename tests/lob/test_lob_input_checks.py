"""What the order-book readers (Binance, LOBSTER), the tick adapter and the generator
accept: files and books they cannot describe are an InputError naming what is wrong, times are
exact nanoseconds, trades reach the tick they belong to, and the adapter equals a per-tick
reference."""
import math
import os

import numpy as np
import pytest

from fastpath import InputError, lob
from helpers.builders import DATA_DIR

TS0 = 1723161254137307667          # a real local_ts_ns: not representable in float64


def _depth_header():
    cols = ["local_ts_ns", "exch_event_ms", "first_update_id", "last_update_id"]
    for k in range(1, 11):
        cols += [f"ask_px_{k}", f"ask_qty_{k}", f"bid_px_{k}", f"bid_qty_{k}"]
    return cols


def _depth_rows(n, ts0=TS0):
    rows = []
    for i in range(n):
        r = [ts0 + 100_000_000 * i + 1, 1, 2, 3]
        for k in range(10):
            r += [100.01 + 0.01 * k + 0.01 * i, 1.5 + k, 100.0 - 0.01 * k + 0.01 * i, 2.0 + k]
        rows.append(r)
    return rows


def _write(path, header, rows, delim=","):
    with open(path, "w") as f:
        f.write(delim.join(header) + "\n")
        for r in rows:
            f.write(delim.join(str(v) for v in r) + "\n")


TRADE_HDR = ["local_ts_ns", "exch_event_ms", "trade_time_ms", "trade_id", "price", "qty",
             "is_buyer_maker", "aggressor_side"]


def _capture(tmp_path, n=3, trades=((TS0 + 5, 0.25, 1), (TS0 + 100_000_100, 0.5, -1)), delim=","):
    _write(tmp_path / "depth10.csv", _depth_header(), _depth_rows(n), delim)
    _write(tmp_path / "trades.csv", TRADE_HDR,
           [[t, 1, 1, i, 100.0, q, int(s < 0), s] for i, (t, q, s) in enumerate(trades)], delim)
    return str(tmp_path)


# ---- readers -------------------------------------------------------------------------------

def test_binance_one_snapshot_and_no_trades(tmp_path):
    # one data row made loadtxt return a 1-d array: "expected 44 columns, got (44,)";
    # a header-only trades file crashed with an IndexError
    bs = lob.read_binance(_capture(tmp_path, n=1, trades=()))
    assert len(bs) == 1 and bs.trade_cnt.tolist() == [0.0]
    assert bs.bid_px[0, 0] == pytest.approx(100.0) and bs.ask_sz[0, 9] == pytest.approx(10.5)


def test_binance_trades_before_the_first_snapshot_are_on_no_tick(tmp_path):
    # they were all counted on tick 0: a trades file starting hours before the depth file
    # gave the first tick every one of them (and the flow averages started from that)
    early = tuple((TS0 - 10**9 * k, 1.0, 1) for k in range(1, 50))
    bs = lob.read_binance(_capture(tmp_path, trades=early + ((TS0, 2.0, -1),
                                                             (TS0 + 5, 0.25, 1),
                                                             (TS0 + 100_000_100, 0.5, -1))))
    assert bs.trade_cnt.tolist() == [0.0, 1.0, 1.0]
    assert bs.trade_vol.tolist() == [0.0, 0.25, -0.5]


def test_binance_timestamps_are_exact_ns(tmp_path):
    # a float64 parse rounded local_ts_ns to a multiple of 256 ns
    bs = lob.read_binance(_capture(tmp_path))
    assert bs.ts_ns.tolist() == [TS0 + 1, TS0 + 100_000_001, TS0 + 200_000_001]
    assert bs.trade_cnt.tolist() == [0.0, 1.0, 1.0]     # TS0+5 is after tick 0 (TS0+1)


def test_binance_columns_found_by_name_and_other_delimiters(tmp_path):
    os.mkdir(tmp_path / "a")
    ref = lob.read_binance(_capture(tmp_path / "a"))
    # the same capture with its columns in another order, and one separated by semicolons
    hdr, rows = _depth_header(), _depth_rows(3)
    perm = list(range(len(hdr)))[::-1]
    os.mkdir(tmp_path / "b")
    _write(tmp_path / "b" / "depth10.csv", [hdr[j] for j in perm], [[r[j] for j in perm] for r in rows])
    _write(tmp_path / "b" / "trades.csv", TRADE_HDR[::-1],
           [[t, 1, 1, i, 100.0, q, int(s < 0), s][::-1] for i, (t, q, s) in
            enumerate(((TS0 + 5, 0.25, 1), (TS0 + 100_000_100, 0.5, -1)))])
    os.mkdir(tmp_path / "c")
    for bs in (lob.read_binance(str(tmp_path / "b")),
               lob.read_binance(_capture(tmp_path / "c", delim=";"))):
        for k in ("ts_ns", "bid_px", "ask_px", "bid_sz", "ask_sz", "trade_vol", "trade_cnt"):
            np.testing.assert_array_equal(getattr(bs, k), getattr(ref, k), err_msg=k)


@pytest.mark.parametrize("edit, match", [
    (lambda rows: rows[1].__setitem__(6, "nan"), r"row 2 column bid_px_1 is nan"),
    (lambda rows: rows[2].__setitem__(4, "1e999"), r"row 3 column ask_px_1 is inf"),
    (lambda rows: rows[1].__setitem__(5, "abc"), r"malformed depth row.*'abc'.* at row 2,"),
    (lambda rows: rows[1].pop(), r"malformed depth row"),
    (lambda rows: rows[2].__setitem__(0, TS0), r"go backwards at row 3"),
    (lambda rows: rows.clear(), r"no depth snapshots"),
    (lambda rows: rows[1].__setitem__(4, 99.0), r"depth10.csv: row 2 has a crossed"),
    (lambda rows: rows[0].__setitem__(7, -1.0), r"depth10.csv: row 1 has a negative size"),
])
def test_binance_bad_depth_file_is_an_input_error(tmp_path, edit, match):
    _capture(tmp_path)
    rows = [list(map(str, r)) for r in _depth_rows(3)]
    edit(rows)
    _write(tmp_path / "depth10.csv", _depth_header(), rows)
    with pytest.raises(InputError, match=match):
        lob.read_binance(str(tmp_path))


def test_binance_quoted_header(tmp_path):
    _capture(tmp_path)
    _write(tmp_path / "depth10.csv", [f'"{c}"' for c in _depth_header()], _depth_rows(2))
    assert len(lob.read_binance(str(tmp_path))) == 2


def test_binance_missing_columns_and_bad_trades(tmp_path):
    _capture(tmp_path)
    hdr = _depth_header()
    _write(tmp_path / "depth10.csv", hdr[:-4], [r[:-4] for r in _depth_rows(2)])
    with pytest.raises(InputError, match="missing column.*ask_px_10"):
        lob.read_binance(str(tmp_path))
    _capture(tmp_path, trades=((TS0 + 5, 0.25, 0),))
    with pytest.raises(InputError, match="aggressor_side"):
        lob.read_binance(str(tmp_path))
    (tmp_path / "trades.csv").write_text("")
    with pytest.raises(InputError, match="empty file"):
        lob.read_binance(str(tmp_path))


def _lobster(tmp_path, ob, msg, **kw):
    np.savetxt(tmp_path / "ob.csv", np.asarray(ob, np.int64), delimiter=",", fmt="%d")
    np.savetxt(tmp_path / "msg.csv", np.asarray(msg), delimiter=",", fmt="%.9f")
    return lob.read_lobster(str(tmp_path / "ob.csv"), str(tmp_path / "msg.csv"), **kw)


def test_lobster_timestamps_exact_with_a_date(tmp_path):
    # date_ns + float seconds was a float64 sum: rounded to 256 ns at today's epoch
    date = 1_700_000_000_000_000_000
    bs = _lobster(tmp_path, [[1001000, 5, 1000000, 7]] * 2,
                  [[34200.000000001, 1, 1, 5, 1001000, -1], [34200.000000003, 1, 2, 5, 1001000, -1]],
                  date_ns=date)
    assert bs.ts_ns.tolist() == [date + 34200_000_000_001, date + 34200_000_000_003]


def test_lobster_bad_files(tmp_path):
    good_msg = [[34200.0, 1, 1, 5, 1001000, -1]]
    with pytest.raises(InputError, match="crossed"):
        _lobster(tmp_path, [[1000000, 5, 1001000, 7]], good_msg)
    with pytest.raises(InputError, match="direction"):
        _lobster(tmp_path, [[1001000, 5, 1000000, 7]], [[34200.0, 4, 1, 5, 1001000, 0]])
    with pytest.raises(InputError, match="go backwards at row 2"):
        _lobster(tmp_path, [[1001000, 5, 1000000, 7]] * 2, good_msg + [[34199.0, 1, 1, 5, 1001000, -1]])
    with pytest.raises(InputError, match="tick_size"):
        _lobster(tmp_path, [[1001000, 5, 1000000, 7]], good_msg, tick_size=0.0)
    (tmp_path / "ob.csv").write_text("")
    with pytest.raises(InputError, match="empty file"):
        lob.read_lobster(str(tmp_path / "ob.csv"), str(tmp_path / "msg.csv"))
    (tmp_path / "ob.csv").write_text("1001000,5,1000000,7\n1001000,5\n")
    with pytest.raises(InputError, match="malformed LOBSTER"):
        lob.read_lobster(str(tmp_path / "ob.csv"), str(tmp_path / "msg.csv"))


def test_real_capture_still_reads_the_same():
    if not os.path.isdir(DATA_DIR):
        pytest.skip("shared Binance data not present")
    bs = lob.read_binance(DATA_DIR)
    d = os.path.join(DATA_DIR, "derived", "depth10.csv")
    exact = np.loadtxt(d, delimiter=",", skiprows=1, usecols=0, dtype=np.int64)
    np.testing.assert_array_equal(bs.ts_ns, exact)
    # 19,904 trades in the file; the one at or before the first snapshot is on no tick
    assert len(bs) == 6493 and bs.trade_cnt.sum() == 19903


# ---- adapter -------------------------------------------------------------------------------

def _small():
    return lob.generate_stream(300, 2, seed=3)


@pytest.mark.parametrize("edit, match", [
    (lambda bs: bs.ask_px.__setitem__((7, 0), bs.bid_px[7, 0] - 0.01), r"row 8 \(of 300\) has a crossed"),
    (lambda bs: setattr(bs, "bid_px", bs.bid_px[:, :5]), r"bid_px must have shape \(300, 10\)"),
    (lambda bs: setattr(bs, "tick_size", np.float64(0.0)), r"tick_size must be a positive"),
    (lambda bs: bs.bid_px.__setitem__((4, 3), np.nan), r"row 5 .* non-finite"),
    (lambda bs: bs.ask_sz.__setitem__((9, 2), -1.0), r"row 10 .* negative size"),
    (lambda bs: bs.bid_px.__setitem__((0, 4), bs.bid_px[0, 0] + 1), r"row 1 .* bid levels out of order"),
    (lambda bs: bs.ask_px.__setitem__(slice(None), bs.ask_px[:, ::-1]), r"ask levels out of order"),
    (lambda bs: setattr(bs, "trade_cnt", bs.trade_cnt[:-1]), r"trade_cnt must have shape \(300,\)"),
])
def test_adapter_refuses_books_it_cannot_describe(edit, match):
    # before: a crossed book gave a negative spread, a NaN poisoned every later EWMA, a zero
    # tick size gave inf, a negative size was clipped to 0, a 5-level side was a broadcast error
    bs = _small()
    edit(bs)
    with pytest.raises(InputError, match=match):
        lob.raw_from_book(bs)


def test_future_return_horizon_validated():
    bs = _small()
    with pytest.raises(InputError, match="horizon"):
        lob.future_return_bps(bs, 0)
    assert lob.future_return_bps(bs, 1).shape == (300,)


# ---- generator -----------------------------------------------------------------------------

@pytest.mark.parametrize("kw", [dict(n_ticks=0), dict(n_ticks=10.5), dict(n_symbols=0),
                                dict(seed=-1), dict(shock_at=1.5), dict(shock_at=0.95),
                                dict(shock_len=-0.1), dict(n_ticks=True)])
def test_generator_parameters_validated(kw):
    # before: n_ticks=0 gave an empty stream, shock_at=1.5 a stream with no shock, the rest
    # numpy TypeErrors/ValueErrors
    with pytest.raises(InputError):
        lob.generate_stream(**{"n_ticks": 100, **kw})


def test_label_volatility_validated():
    bs = _small()
    with pytest.raises(InputError, match="window"):
        lob.label_volatility(bs, window=0)
    with pytest.raises(InputError, match="quantile"):
        lob.label_volatility(bs, quantile=1.5)






def test_adapter_refuses_time_going_backwards_within_a_symbol():
    bs = _small()
    r = np.flatnonzero(bs.symbols == 1)
    bs.ts_ns[r[10]] = bs.ts_ns[r[9]] - 1      # other symbols' ticks may sit between them
    with pytest.raises(InputError, match=f"row {r[10] + 1} .* earlier than its symbol"):
        lob.raw_from_book(bs)
    bs.ts_ns[r[10]] = bs.ts_ns[r[9]]          # equal times are fine
    assert np.isfinite(lob.raw_from_book(bs)).all()


def test_adapter_overflow_is_refused_not_inf():
    # finite but absurd inputs: every price offset overflowed float32 to inf, silently
    bs = _small()
    bs.tick_size = np.float64(1e-300)
    with pytest.raises(InputError, match=r"row 1 field 0 \(bid_px_off_1\).*tick size"):
        lob.raw_from_book(bs)


def test_adapter_interleaved_equals_per_symbol():
    # differential: everything past the row-wise fields is per symbol, so a symbol's rows
    # must come out the same whether other symbols are interleaved or not
    bs = lob.generate_stream(2_000, 3, seed=4)
    raw = lob.raw_from_book(bs)
    for s in range(3):
        r = np.flatnonzero(bs.symbols == s)
        sub = lob.BookStream(bs.symbols[r], bs.ts_ns[r], bs.bid_px[r], bs.ask_px[r], bs.bid_sz[r],
                             bs.ask_sz[r], bs.trade_vol[r], bs.trade_cnt[r], bs.last_trade_sz[r],
                             bs.tick_size)
        np.testing.assert_array_equal(lob.raw_from_book(sub), raw[r])


def test_lobster_trades_of_a_dropped_row_reach_the_next_tick(tmp_path):
    # row 2's execution empties the ask side: the row is dropped (no mid), and its trade was
    # dropped with it; it belongs to the next tick's "trades since the previous tick"
    E = 9999999999
    ob = [[1001000, 5, 1000000, 7], [E, 0, 1000000, 7], [1002000, 3, 1000000, 7]]
    msg = [[34200.0, 1, 1, 5, 1001000, -1], [34200.5, 4, 1, 5, 1001000, -1],
           [34201.0, 1, 2, 3, 1002000, -1]]
    bs = _lobster(tmp_path, ob, msg)
    assert len(bs) == 2
    assert bs.trade_vol.tolist() == [0.0, 5.0] and bs.trade_cnt.tolist() == [0.0, 1.0]
    assert bs.last_trade_sz.tolist() == [0.0, 5.0]
    # a bad row after a dropped one is named by its row in the file
    ob[2] = [999000, 3, 1000000, 7]
    with pytest.raises(InputError, match=r"ob.csv: row 3 has a crossed"):
        _lobster(tmp_path, ob, msg)


def test_future_return_is_zero_where_the_horizon_runs_past_the_end():
    # documented "0 at the end", but the last `horizon` ticks got the return to the symbol's
    # last tick: a label over a shorter horizon than asked
    bs = lob.generate_stream(400, 2, seed=6, shock_at=0.85, shock_len=0.15)   # moving at the end
    fr = lob.future_return_bps(bs, 20)
    lm = np.log(bs.mid())
    for s in range(2):
        r = np.flatnonzero(bs.symbols == s)
        np.testing.assert_array_equal(fr[r[-20:]], 0.0)
        np.testing.assert_allclose(fr[r[:-20]], (lm[r[20:]] - lm[r[:-20]]) * 1e4)
        assert np.any(lm[r[-20:-1]] != lm[r[-1]])     # the old labels there were not 0


def _slog1(x):
    return math.copysign(math.log1p(abs(x)), x) if x else 0.0


def test_adapter_matches_a_per_tick_reference():
    # differential guard: the per-symbol fields (size changes, OFI, returns, trade and timing
    # fields, every EWMA) recomputed one tick at a time, plainly, from the layout's definition
    bs = lob.generate_stream(600, 2, seed=11)
    raw = lob.raw_from_book(bs).astype(np.float64)
    n, tick, HL = len(bs), 0.01, lob.HALF_LIVES
    slog = _slog1
    ref = np.full((n, 256), np.nan)
    state = {}
    for t in range(n):
        s = bs.symbols[t]
        bp, ap, bz, az = bs.bid_px[t], bs.ask_px[t], bs.bid_sz[t], bs.ask_sz[t]
        st = state.get(s)
        if st is not None and (bp == st['bp']).all() and (ap == st['ap']).all() and (bz == st['bz']).all() and (az == st['az']).all() and bs.trade_cnt[t] == 0:
            ref[t] = st['row']; continue
        row = np.full(256, np.nan)
        mid = (bp[0] + ap[0]) / 2
        if st is None:
            st = dict(bp=bp, ap=ap, bz=bz, az=az, mids=[], ts=None, lasttrade=None, lastmove=0, k=0, ew=None)
            pbp, pap, pbz, paz = bp, ap, bz, az
        else:
            pbp, pap, pbz, paz = st['bp'], st['ap'], st['bz'], st['az']
        ofi = []
        for j in range(10):
            eb = (bz[j] if bp[j] >= pbp[j] else 0) - (pbz[j] if bp[j] <= pbp[j] else 0)
            ea = (az[j] if ap[j] <= pap[j] else 0) - (paz[j] if ap[j] >= pap[j] else 0)
            ofi.append(eb - ea)
            row[122 + j] = slog(eb - ea)
            row[102 + j] = math.log1p(bz[j]) - math.log1p(pbz[j])
            row[112 + j] = math.log1p(az[j]) - math.log1p(paz[j])
        mids = st['mids']; mids.append(mid); k = len(mids) - 1
        for j, h in enumerate(HL):
            row[132 + j] = (math.log(mid) - math.log(mids[max(k - h, 0)])) * 1e4
        row[211] = row[132]
        ts = bs.ts_ns[t]
        row[209] = math.log1p(max((ts - st['ts']) / 1e6, 0)) if st['ts'] is not None else 0.0
        if bs.trade_cnt[t] > 0:
            st['lasttrade'] = (np.sign(bs.trade_vol[t]), bs.last_trade_sz[t], ts)
        lt = st['lasttrade']
        row[204] = lt[0] if lt else 0; row[205] = math.log1p(lt[1]) if lt else 0
        row[208] = math.log1p((ts - lt[2]) / 1e6) if lt else math.log1p(1e4)
        if k > 0 and mids[k] != mids[k - 1]: st['lastmove'] = k
        row[210] = math.log1p(k - st['lastmove'])
        row[206] = math.log1p(bs.trade_cnt[t]); row[207] = slog(bs.trade_vol[t])
        spread = (ap[0] - bp[0]) / tick
        row[60] = spread
        imb1 = (bz[0] - az[0]) / (bz[0] + az[0])
        micro = ((ap[0] * bz[0] + bp[0] * az[0]) / (bz[0] + az[0]) - mid) / tick
        dr = math.log1p(bz.sum()) - math.log1p(az.sum())
        series = [row[122], slog(sum(ofi[:5])), row[207], imb1, row[132] ** 2, spread, micro, dr]
        series += [(bz[j] - az[j]) / (bz[j] + az[j]) for j in range(1, 5)] + [abs(row[122])]
        x = np.array([[v] * 8 for v in series])
        a = np.array([1 - 0.5 ** (1 / h) for h in HL])
        st['ew'] = x.copy() if st['ew'] is None else st['ew'] + a * (x - st['ew'])
        ew = st['ew'].reshape(-1)
        row[140:204] = ew[:64]; row[212:244] = ew[64:96]; row[244:252] = ew[96:104]
        st.update(bp=bp, ap=ap, bz=bz, az=az, ts=ts, row=row)
        state[s] = st
        ref[t] = row
    cols = [c for c in range(256) if not np.isnan(ref[:, c]).all()]
    assert len(cols) == 151
    np.testing.assert_allclose(raw[:, cols], ref[:, cols], rtol=1e-4, atol=1e-4)


def test_trades_between_matches_a_loop():
    # differential guard for the Binance trade assignment, with trades exactly at tick times,
    # several trades at one time and trades before the first and after the last tick
    from fastpath.lob.readers import _trades_between
    rng = np.random.default_rng(8)
    for _ in range(20):
        ticks = np.sort(rng.integers(0, 50, rng.integers(1, 12)))
        tt = np.sort(np.concatenate([rng.integers(-5, 60, rng.integers(0, 30)), ticks[:2]]))
        sign = rng.choice([-1.0, 1.0], len(tt))
        size = rng.uniform(0.1, 2, len(tt))
        vol, cnt, last = _trades_between(ticks, tt, sign * size, size)
        prev = None
        for i, tk in enumerate(ticks):
            # the first tick has no previous one: it counts none
            sel = [] if prev is None else [j for j in range(len(tt)) if prev < tt[j] <= tk]
            assert cnt[i] == len(sel)
            assert vol[i] == pytest.approx(sum(sign[j] * size[j] for j in sel))
            assert last[i] == (size[sel[-1]] if sel else 0.0)
            prev = tk
