"""read_databento: Databento MBP-10 files (.dbn, .dbn.zst) into a BookStream, on the real
sample from Databento's dbn repository and on variants of it (trades, empty levels, several
instruments, events of several records), and the refusals naming the file, record and field."""
import sys

import numpy as np
import pytest

from fastpath import InputError
from fastpath.lob import raw_from_book

from helpers.vendor_files import (DBN, DBN_TRADES, DBN_ZST, dbn_parts, dbn_trade, write_dbn)

pytest.importorskip("databento_dbn")
from fastpath.lob.databento import F_LAST, UNDEF_PRICE, read_databento  # noqa: E402


def test_databento_real_file_values():
    bs = read_databento(DBN)
    assert len(bs) == 2 and bs.symbol_names == ("ESH1",)
    assert bs.ts_ns.tolist() == [1609160400000704060, 1609160400000750544]      # ts_recv
    assert bs.bid_px[0, 0] == 3720.25 and bs.ask_px[0, 0] == 3720.5
    assert bs.bid_sz[0, 0] == 24 and bs.ask_sz[0, 0] == 10
    assert bs.bid_px[0, 9] == 3718.0 and bs.ask_px[0, 9] == 3722.75
    assert bs.bid_sz[0, 1] == 31 and bs.bid_sz[1, 1] == 30        # the second record's cancel
    np.testing.assert_array_equal(bs.tick_size, 0.25)
    assert bs.trade_cnt.tolist() == [0, 0]
    bs.validate()
    raws = raw_from_book(bs)
    assert raws.shape == (2, 256) and np.isfinite(raws).all()
    assert raws[0, 60] == 1.0                                     # spread: one tick


def test_databento_zst_reads_as_the_plain_file():
    a, b = read_databento(DBN), read_databento(DBN_ZST)
    for k in ("ts_ns", "bid_px", "ask_px", "bid_sz", "ask_sz", "trade_vol", "trade_cnt"):
        np.testing.assert_array_equal(getattr(a, k), getattr(b, k))


def test_databento_trades_between_updates(tmp_path):
    meta, rec = dbn_parts()
    buy = rec[:1].copy()
    buy["action"], buy["side"], buy["size"] = b"T", b"B", 3
    sell = dbn_trade(rec[0], 2, b"A", int(rec[0]["ts_recv"]) + 10)
    unsided = dbn_trade(rec[0], 5, b"N", int(rec[0]["ts_recv"]) + 20)
    bs = read_databento(write_dbn(tmp_path / "t.dbn", meta, rec[:1], buy, sell, unsided, rec[1:]))
    assert len(bs) == 2
    assert bs.trade_cnt.tolist() == [0, 3]
    assert bs.trade_vol.tolist() == [0, 3 - 2]                   # 'N' counts, unsigned
    assert bs.last_trade_sz.tolist() == [0, 5]


def test_databento_empty_levels_and_one_sided_records(tmp_path):
    """UNDEF_PRICE levels are filled one tick beyond the level before, size 0 (as read_lobster
    fills LOBSTER's empty levels); a record without a best ask is dropped and its trades are
    carried to the next tick."""
    meta, rec = dbn_parts()
    thin = rec[:1].copy()
    thin["levels"]["bid_px"][0, 8:] = UNDEF_PRICE
    thin["levels"]["bid_sz"][0, 8:] = 0
    no_ask = rec[1:].copy()
    no_ask["levels"]["ask_px"][0, :] = UNDEF_PRICE
    trade = dbn_trade(rec[0], 4, b"B", int(rec[1]["ts_recv"]))
    last = rec[1:].copy()
    last["ts_recv"] += 1
    bs = read_databento(write_dbn(tmp_path / "e.dbn", meta, thin, no_ask, trade, last))
    assert len(bs) == 2
    assert bs.bid_px[0, 7] == 3718.5 and bs.bid_px[0, 8] == 3718.25 and bs.bid_px[0, 9] == 3718.0
    assert bs.bid_sz[0, 8] == 0 and bs.bid_sz[0, 9] == 0
    assert bs.trade_cnt.tolist() == [0, 1] and bs.trade_vol.tolist() == [0, 4]


def test_databento_instruments_are_symbols(tmp_path):
    meta, rec = dbn_parts()
    other = rec.copy()
    other["instrument_id"] = 99
    other["ts_recv"] -= 1000      # earlier than ESH1's records: times are per instrument
    bs = read_databento(write_dbn(tmp_path / "m.dbn", meta, rec[:1], other[:1], rec[1:],
                                  other[1:]))
    assert bs.symbols.tolist() == [0, 1, 0, 1]
    assert bs.symbol_names == ("ESH1", "99")        # 99 has no mapping in the metadata
    raw_from_book(bs)


def test_databento_records_inside_an_event_are_not_ticks(tmp_path):
    meta, rec = dbn_parts()
    inner = rec[:1].copy()
    inner["flags"] = 0
    inner["levels"]["ask_px"][0, 0] = inner["levels"]["bid_px"][0, 0]     # crossed mid-event
    bs = read_databento(write_dbn(tmp_path / "ev.dbn", meta, inner, rec[1:]))
    assert len(bs) == 1 and bs.ts_ns[0] == rec[1]["ts_recv"]
    assert rec[1]["flags"] & F_LAST


def test_databento_refuses_a_trades_file():
    with pytest.raises(InputError, match=r"databento_glbx_esh1_trades\.dbn: schema trades .*"
                                         r"expected an mbp-10 file"):
        read_databento(DBN_TRADES)


def test_databento_refuses_a_truncated_file(tmp_path):
    raw = open(DBN, "rb").read()
    p = tmp_path / "cut.dbn"
    p.write_bytes(raw[:-50])
    with pytest.raises(InputError, match=r"cut\.dbn: truncated: record 2 is cut short"):
        read_databento(str(p))
    p.write_bytes(raw[:40])
    with pytest.raises(InputError, match=r"cut\.dbn: truncated"):
        read_databento(str(p))


def test_databento_refuses_what_is_not_dbn(tmp_path):
    p = tmp_path / "x.dbn"
    p.write_bytes(b"exchange,symbol\n")
    with pytest.raises(InputError, match=r"x\.dbn: not a DBN file"):
        read_databento(str(p))
    with pytest.raises(InputError, match=r"nowhere\.dbn: cannot be read"):
        read_databento(str(tmp_path / "nowhere.dbn"))


def test_databento_refuses_time_going_backwards(tmp_path):
    meta, rec = dbn_parts()
    rec[1]["ts_recv"] = rec[0]["ts_recv"] - 1
    with pytest.raises(InputError, match=r"b\.dbn: record 2: ts_recv \d+ is before record 1"):
        read_databento(write_dbn(tmp_path / "b.dbn", meta, rec))


def test_databento_refuses_a_crossed_book_naming_record_and_field(tmp_path):
    meta, rec = dbn_parts()
    rec[1]["levels"]["bid_px"][0] = rec[1]["levels"]["ask_px"][0]
    rec[1]["levels"]["bid_px"][1] = rec[1]["levels"]["ask_px"][0] - 250_000_000
    with pytest.raises(InputError, match=r"c\.dbn: record 2: bid_px_00 3720\.5 >= ask_px_00 "
                                         r"3720\.5 \(a crossed or locked book\)"):
        read_databento(write_dbn(tmp_path / "c.dbn", meta, rec))


def test_databento_refuses_levels_out_of_order(tmp_path):
    meta, rec = dbn_parts()
    rec[0]["levels"]["ask_px"][3] = rec[0]["levels"]["ask_px"][1]
    with pytest.raises(InputError, match=r"o\.dbn: record 1: ask_px_03 is 3720\.75; expected ask "
                                         r"levels in order"):
        read_databento(write_dbn(tmp_path / "o.dbn", meta, rec))


def test_databento_bad_tick_size_is_refused():
    with pytest.raises(InputError, match=r"tick_size must be a positive finite number"):
        read_databento(DBN, tick_size=0)
    assert read_databento(DBN, tick_size=0.125).tick_size[0] == 0.125


def test_databento_without_the_package_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "databento_dbn", None)
    with pytest.raises(InputError, match=r"databento-dbn package: pip install "
                                         r"'fastpath\[databento\]'"):
        read_databento(DBN)


def test_databento_refuses_trade_records_only_and_bad_prices(tmp_path):
    meta, rec = dbn_parts()
    t = rec.copy()
    t["action"] = b"T"
    with pytest.raises(InputError, match=r"t\.dbn: no MBP-10 book records \(only trades\)"):
        read_databento(write_dbn(tmp_path / "t.dbn", meta, t))
    rec[1]["levels"]["bid_px"][4:] = -rec[1]["levels"]["bid_px"][4:]
    with pytest.raises(InputError, match=r"p\.dbn: record 2: bid_px_04 is -3719\.25; expected a "
                                         r"price > 0"):
        read_databento(write_dbn(tmp_path / "p.dbn", meta, rec), tick_size=0.25)
