"""read_tardis: Tardis book_snapshot and incremental_book_L2 CSV files (plain or .gz), with an
optional trades file, into a BookStream: the real samples, the incremental book rebuilt as Tardis
documents it (a snapshot resets, amount 0 deletes, rows before the first snapshot skipped),
and the refusals naming the file, row and column."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastpath import InputError
from fastpath.lob import raw_from_book, read_tardis

from helpers.vendor_files import (TARDIS_INCREMENTAL, TARDIS_INCREMENTAL_ASKS, TARDIS_SNAPSHOT,
                                  TARDIS_TRADES, write_text)

INC_HEADER = "exchange,symbol,timestamp,local_timestamp,is_snapshot,side,price,amount\n"
TRADES_HEADER = "exchange,symbol,timestamp,local_timestamp,id,side,price,amount\n"


def _snapshot_text(edit=None) -> str:
    lines = open(TARDIS_SNAPSHOT).read().splitlines()
    if edit:
        lines = edit(lines)
    return "\n".join(lines) + "\n"


def test_tardis_snapshot_real_file_values():
    bs = read_tardis(TARDIS_SNAPSHOT)
    assert len(bs) == 10 and bs.symbol_names == ("BTCUSDT",)
    assert bs.ts_ns[0] == 1598918403810979 * 1000                 # local_timestamp, us -> ns
    assert bs.ask_px[0, 0] == 11657.08 and bs.ask_sz[0, 0] == 1.714
    assert bs.bid_px[0, 0] == 11657.07 and bs.bid_sz[0, 0] == 10.896
    assert bs.bid_px[7, 2] == 11655.79 and bs.bid_sz[7, 2] == 4.544    # row 8: bids[2]
    assert bs.ask_px[9, 4] == 11657.92 and bs.ask_sz[9, 4] == 0.918
    # five levels in the file: levels 6..10 empty, one tick (0.01, inferred) apart
    np.testing.assert_allclose(bs.bid_px[0, 5:], 11655.68 - 0.01 * np.arange(1, 6))
    assert (bs.bid_sz[:, 5:] == 0).all() and (bs.ask_sz[:, 5:] == 0).all()
    np.testing.assert_array_equal(bs.tick_size, 0.01)
    bs.validate()
    raws = raw_from_book(bs)
    assert raws.shape == (10, 256) and np.isfinite(raws).all()


def test_tardis_gz_reads_as_plain(tmp_path):
    a = read_tardis(TARDIS_SNAPSHOT)
    b = read_tardis(write_text(tmp_path / "s.csv.gz", open(TARDIS_SNAPSHOT).read(), gz=True))
    for k in ("ts_ns", "bid_px", "ask_px", "bid_sz", "ask_sz"):
        np.testing.assert_array_equal(getattr(a, k), getattr(b, k))


def test_tardis_incremental_rebuilds_the_book_with_trades(tmp_path):
    bs = read_tardis(TARDIS_INCREMENTAL, trades=TARDIS_TRADES)
    assert bs.symbol_names == ("BTC-PERPETUAL", "ETH-PERPETUAL")
    assert bs.symbols.tolist() == [0, 1, 0, 0, 1, 0, 0]           # one tick per message
    # per symbol tick sizes: BTC quotes on 0.5, ETH on 0.05
    np.testing.assert_allclose(bs.tick_size, [0.5, 0.05, 0.5, 0.5, 0.05, 0.5, 0.5])
    # the snapshot; the bid at 6400 before it was skipped
    assert bs.bid_px[0, :3].tolist() == [6421, 6420.5, 6420] and bs.bid_sz[0, 3] == 0
    assert bs.ask_px[0, :3].tolist() == [6421.5, 6422, 6422.5]
    assert bs.bid_px[2, 0] == 6420.5 and bs.bid_sz[2, 0] == 3000        # amount 0 deleted 6421
    assert bs.ask_px[3, :2].tolist() == [6421, 6421.5] and bs.bid_sz[3, 0] == 1000
    assert bs.bid_px[4, 0] == 133.1 and bs.bid_sz[4, 0] == 250            # ETH's own book
    # a snapshot after updates reset the book: one level a side left
    assert bs.bid_px[5, 0] == 6422 and bs.ask_px[5, 0] == 6423 and bs.bid_sz[5, 1] == 0
    assert bs.ask_sz[6, 0] == 100                                # deleting an absent level: no-op
    # trades: none on a symbol's first tick; sell 40 + sell 25000 before the third message
    assert bs.trade_cnt.tolist() == [0, 0, 2, 1, 1, 0, 0]
    assert bs.trade_vol.tolist() == [0, 0, -25040, 7, 0, 0, 0]   # ETH's 'unknown' side: 0
    assert bs.last_trade_sz.tolist() == [0, 0, 25000, 7, 3, 0, 0]
    raws = raw_from_book(bs)
    assert np.isfinite(raws).all()
    gz = read_tardis(write_text(tmp_path / "i.csv.gz", open(TARDIS_INCREMENTAL).read(), gz=True),
                     trades=write_text(tmp_path / "t.csv.gz", open(TARDIS_TRADES).read(), gz=True))
    np.testing.assert_array_equal(gz.bid_px, bs.bid_px)
    np.testing.assert_array_equal(gz.trade_vol, bs.trade_vol)


def test_tardis_one_sided_real_incremental_is_refused():
    with pytest.raises(InputError, match=r"BTC-PERPETUAL\.csv: no update has both a best bid "
                                         r"and a best ask"):
        read_tardis(TARDIS_INCREMENTAL_ASKS)


def test_tardis_missing_columns_are_named(tmp_path):
    p = write_text(tmp_path / "m.csv", _snapshot_text(lambda ls: [
        ",".join(c for k, c in enumerate(line.split(",")) if k != 3) for line in ls]))
    with pytest.raises(InputError, match=r"m\.csv: missing column\(s\) local_timestamp"):
        read_tardis(p)
    p = write_text(tmp_path / "i.csv", INC_HEADER.replace(",amount", "") +
                   "x,S,1,1,true,bid,10\n")
    with pytest.raises(InputError, match=r"i\.csv: missing column\(s\) amount"):
        read_tardis(p)
    p = write_text(tmp_path / "t.csv", TRADES_HEADER.replace(",side", "") + "x,S,1,1,1,10,1\n")
    with pytest.raises(InputError, match=r"t\.csv: missing column\(s\) side"):
        read_tardis(TARDIS_SNAPSHOT, trades=p)
    p = write_text(tmp_path / "q.csv", "exchange,symbol,timestamp,local_timestamp,bid_price\n")
    with pytest.raises(InputError, match=r"q\.csv: neither a book_snapshot nor an "
                                         r"incremental_book_L2 file"):
        read_tardis(p)


def test_tardis_time_going_backwards_is_refused(tmp_path):
    def swap(ls):
        ls[3], ls[4] = ls[4], ls[3]
        return ls
    p = write_text(tmp_path / "s.csv", _snapshot_text(swap))
    with pytest.raises(InputError, match=r"s\.csv: row 4: local_timestamp 1598918403935479 is "
                                         r"before row 3's"):
        read_tardis(p)
    text = open(TARDIS_INCREMENTAL).read().splitlines()
    text[10], text[12] = text[12], text[10]                      # BTC's 510000 before 410000
    p = write_text(tmp_path / "i.csv", "\n".join(text) + "\n")
    with pytest.raises(InputError, match=r"i\.csv: row 12: local_timestamp 1585699200410000 is "
                                         r"before 1585699200510000"):
        read_tardis(p)
    p = write_text(tmp_path / "t.csv", TRADES_HEADER + "x,BTCUSDT,5,5,1,buy,1,1\n"
                                                        "x,BTCUSDT,4,4,2,buy,1,1\n")
    with pytest.raises(InputError, match=r"t\.csv: row 2: local_timestamp 4 is before row 1"):
        read_tardis(TARDIS_SNAPSHOT, trades=p)


def test_tardis_non_finite_values_are_refused(tmp_path):
    p = write_text(tmp_path / "s.csv", _snapshot_text(
        lambda ls: ls[:2] + [ls[2].replace("10.896", "nan")] + ls[3:]))
    with pytest.raises(InputError, match=r"s\.csv: malformed book row .*'nan'.*row 2, column 8 "
                                         r"\(bids\[0\]\.amount\)"):
        read_tardis(p)
    p = write_text(tmp_path / "i.csv", INC_HEADER + "x,S,1,1,true,bid,inf,5\n")
    with pytest.raises(InputError, match=r"i\.csv: row 1: price is 'inf'; expected a finite"):
        read_tardis(p)
    p = write_text(tmp_path / "t.csv", TRADES_HEADER + "x,BTCUSDT,5,5,1,buy,1,nan\n")
    with pytest.raises(InputError, match=r"t\.csv: malformed amount .*'nan'.*column 8 \(amount\)"):
        read_tardis(TARDIS_SNAPSHOT, trades=p)


@pytest.mark.parametrize("row, match", [
    ("x,S,1,1,true,bid,10,-1", r"row 1: amount is -1; expected an amount >= 0"),
    ("x,S,1,1,true,buy,10,1", r"row 1: side is 'buy'; expected bid or ask"),
    ("x,S,1,1,yes,bid,10,1", r"row 1: is_snapshot is 'yes'; expected true or false"),
    ("x,S,1,1,true,bid,10", r"row 1 has 7 fields; expected 8"),
    ("x,S,1.5,soon,true,bid,10,1", r"row 1: local_timestamp is 'soon'; expected integer"),
])
def test_tardis_incremental_bad_rows_are_named(tmp_path, row, match):
    with pytest.raises(InputError, match=match):
        read_tardis(write_text(tmp_path / "i.csv", INC_HEADER + row + "\n"))


def test_tardis_crossed_book_names_row_and_columns(tmp_path):
    p = write_text(tmp_path / "s.csv", _snapshot_text(
        lambda ls: ls[:5] + [ls[5].replace(",11657.07,", ",11657.09,", 1)] + ls[6:]))
    with pytest.raises(InputError, match=r"s\.csv: row 5: bids\[0\]\.price 11657\.09 >= "
                                         r"asks\[0\]\.price 11657\.08 \(a crossed or locked"):
        read_tardis(p)


def test_tardis_tick_size_given_and_refused():
    assert read_tardis(TARDIS_SNAPSHOT, tick_size=0.1).tick_size[0] == 0.1
    with pytest.raises(InputError, match=r"tick_size must be a positive finite number"):
        read_tardis(TARDIS_SNAPSHOT, tick_size=float("nan"))


def test_tardis_empty_and_unreadable_files(tmp_path):
    with pytest.raises(InputError, match=r"e\.csv: empty file"):
        read_tardis(write_text(tmp_path / "e.csv", ""))
    with pytest.raises(InputError, match=r"nowhere\.csv: cannot be read"):
        read_tardis(str(tmp_path / "nowhere.csv"))


def test_tardis_blank_snapshot_fields_are_empty_levels(tmp_path):
    """A book thinner than the file's depth leaves its deepest fields blank: an empty level
    (one tick beyond the level before, size 0), not a malformed row."""
    def blank(ls):
        cells = ls[1].split(",")
        names = ls[0].split(",")
        for k in ("asks[4].price", "asks[4].amount"):
            cells[names.index(k)] = ""
        return [ls[0], ",".join(cells)] + ls[2:]
    bs = read_tardis(write_text(tmp_path / "b.csv", _snapshot_text(blank)))
    assert bs.ask_px[0, 3] == 11657.61 and bs.ask_px[0, 4] == pytest.approx(11657.62)
    assert bs.ask_sz[0, 4] == 0 and bs.ask_sz[1, 4] == 0.918


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 19), st.sampled_from([0, 0, 1, 2.5, 7])),
                min_size=1, max_size=60))
def test_tardis_incremental_matches_a_dict_book(tmp_path, updates):
    """Every message's top 10 levels equal those of a plain dict book given the same updates
    (bids on 90..99.5, asks on 100..109.5: never crossed; a side emptied drops the message)."""
    rows = [f"x,S,1,1,true,bid,{99.5 - j * 0.5},{j + 1}" for j in range(3)]
    rows += [f"x,S,1,1,true,ask,{100 + j * 0.5},{j + 1}" for j in range(3)]
    book = {"bid": {99.5 - j * 0.5: j + 1 for j in range(3)},
            "ask": {100 + j * 0.5: j + 1 for j in range(3)}}
    want = [(book["bid"].copy(), book["ask"].copy())]
    for t, (is_bid, k, amt) in enumerate(updates, 2):
        side = "bid" if is_bid else "ask"
        px = 99.5 - k * 0.5 if is_bid else 100 + k * 0.5
        rows.append(f"x,S,{t},{t},false,{side},{px},{amt}")
        if amt:
            book[side][px] = amt
        else:
            book[side].pop(px, None)
        want.append((book["bid"].copy(), book["ask"].copy()))
    want = [w for w in want if w[0] and w[1]]
    bs = read_tardis(write_text(tmp_path / "h.csv", INC_HEADER + "\n".join(rows) + "\n"),
                     tick_size=0.5)
    assert len(bs) == len(want)
    for r, (bids, asks) in enumerate(want):
        bp = sorted(bids, reverse=True)[:10]
        ap = sorted(asks)[:10]
        assert bs.bid_px[r, :len(bp)].tolist() == bp and bs.ask_px[r, :len(ap)].tolist() == ap
        assert bs.bid_sz[r, :len(bp)].tolist() == [bids[p] for p in bp]
        assert bs.ask_sz[r, :len(ap)].tolist() == [asks[p] for p in ap]
        assert (bs.bid_sz[r, len(bp):] == 0).all() and (bs.ask_sz[r, len(ap):] == 0).all()
