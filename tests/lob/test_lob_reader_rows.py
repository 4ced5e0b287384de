"""The order-book readers name the row (and the file) an error is in, read a header with a
byte order mark, and the generator keeps its shock in a short stream and refuses more symbols
than an engine serves."""

import numpy as np
import pytest

from fastpath import InputError, lob


TS0 = 1723161254137307667


def _depth_header():
    cols = ["local_ts_ns"]
    for k in range(1, 11):
        cols += [f"ask_px_{k}", f"ask_qty_{k}", f"bid_px_{k}", f"bid_qty_{k}"]
    return cols


def _depth_rows(n):
    rows = []
    for i in range(n):
        r = [TS0 + 100_000_000 * i]
        for k in range(10):
            r += [100.01 + 0.01 * k, 1.5 + k, 100.0 - 0.01 * k, 2.0 + k]
        rows.append([str(v) for v in r])
    return rows


def _capture(tmp_path, rows, header=None, bom=False):
    header = header or _depth_header()
    text = ",".join(header) + "\n" + "".join(",".join(r) + "\n" for r in rows)
    (tmp_path / "depth10.csv").write_text(("\ufeff" if bom else "") + text, encoding="utf-8")
    (tmp_path / "trades.csv").write_text("local_ts_ns,qty,aggressor_side\n")
    return str(tmp_path)


# ---- readers: the row an error names -------------------------------------------------------

def test_binance_short_row_is_named_by_its_own_row_number(tmp_path):
    """A row missing its last column is data row 2; numpy says "invalid column index 40 at
    row 2" (counting from 1) and the reader added 1 to every row numpy named: "row 3", the
    row after the bad one (a 3-row file's last row was called row 4)."""
    rows = _depth_rows(3)
    rows[1].pop()
    with pytest.raises(InputError, match=r"at row 2 with 40 columns") as e:
        lob.read_binance(_capture(tmp_path, rows))
    assert "row 3" not in str(e.value)


def test_binance_bad_value_row_is_still_counted_from_1(tmp_path):
    """numpy counts a value it cannot convert from 0: that row number is still moved by one."""
    rows = _depth_rows(3)
    rows[1][5] = "abc"
    with pytest.raises(InputError, match=r"'abc'.* at row 2, column 6"):
        lob.read_binance(_capture(tmp_path, rows))


def test_lobster_truncated_last_row_is_named_by_its_row(tmp_path):
    """A LOBSTER file cut off in its last (third) row: "the number of columns changed from 4
    to 1 at row 4" of a 3-row file, with numpy's advice to pass usecols, which a caller of
    read_lobster cannot."""
    (tmp_path / "ob.csv").write_text("1001000,5,1000000,7\n1001000,5,1000000,7\n1001\n")
    (tmp_path / "msg.csv").write_text("34200.0,1,1,5,1001000,-1\n" * 3)
    with pytest.raises(InputError, match=r"changed from 4 to 1 at row 3\)") as e:
        lob.read_lobster(str(tmp_path / "ob.csv"), str(tmp_path / "msg.csv"))
    assert "usecols" not in str(e.value)


def test_lobster_negative_execution_size_names_the_message_file(tmp_path):
    """An execution of -5 shares flipped the tick's traded volume; it was refused only as "a
    negative trade count or last trade size" of a row of the order book file, where nothing
    is wrong, and let through where a later execution was the tick's last trade."""
    book = "1001000,5,1000000,7\n"
    (tmp_path / "ob.csv").write_text(book * 3)
    (tmp_path / "msg.csv").write_text("34200.1,1,1,10,1001000,-1\n34200.2,4,2,-5,1001000,-1\n"
                                      "34200.3,1,3,10,1000000,1\n")
    with pytest.raises(InputError, match=r"msg\.csv: row 2: execution of size -5"):
        lob.read_lobster(str(tmp_path / "ob.csv"), str(tmp_path / "msg.csv"))
    # an execution on a dropped row (empty ask) whose volume carries to the next kept tick,
    # where a positive execution is the last trade: the -5 was summed in without a word
    (tmp_path / "ob.csv").write_text(book + "9999999999,0,1000000,7\n" + book)
    (tmp_path / "msg.csv").write_text("34200.1,1,1,10,1001000,-1\n34200.2,4,2,-5,1001000,-1\n"
                                      "34200.3,4,3,3,1001000,-1\n")
    with pytest.raises(InputError, match=r"msg\.csv: row 2: execution of size -5"):
        lob.read_lobster(str(tmp_path / "ob.csv"), str(tmp_path / "msg.csv"))


def test_binance_header_with_a_byte_order_mark(tmp_path):
    """A depth file saved with a UTF-8 byte-order mark: its first column was "missing" in a
    message that listed local_ts_ns among the columns found."""
    ref = lob.read_binance(_capture(tmp_path, _depth_rows(2)))
    bs = lob.read_binance(_capture(tmp_path, _depth_rows(2), bom=True))
    np.testing.assert_array_equal(bs.ts_ns, ref.ts_ns)
    np.testing.assert_array_equal(bs.bid_px, ref.bid_px)


# ---- bench/run.py: arguments, and figures of calls that did not occur ----------------------


# ---- bench/scaling.py and bench/weights.py arguments ---------------------------------------


# ---- bench/zoo.py: where a partial run writes, and its arguments ---------------------------


# ---- bench/serve.py: where it writes, and its arguments ------------------------------------


# ---- the generator -------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 2, 5, 9])
def test_short_generated_stream_keeps_its_shock(n):
    """generate_stream(5): the shock window (0.45-0.55 of the stream) rounded to no tick, and
    the ticks after it were labelled "recovery" from a shock that never ran."""
    bs = lob.generate_stream(n, n_symbols=1, seed=3)
    assert (bs.regime == 1).sum() >= 1
    # a recovery only after a shock
    first_shock = int(np.flatnonzero(bs.regime == 1)[0])
    assert (bs.regime[:first_shock] == 0).all()
    # without a shock asked for, none
    assert not (lob.generate_stream(n, n_symbols=1, seed=3, shock_len=0.0).regime == 1).any()


def test_longer_generated_streams_are_unchanged():
    """The one-tick floor moves no window that already held a tick: a 400-tick stream is the
    one it was (its shock is ticks 180-219)."""
    bs = lob.generate_stream(400, n_symbols=4, seed=11)
    assert np.flatnonzero(bs.regime == 1).tolist() == list(range(180, 220))


def test_generator_refuses_more_symbols_than_an_engine_serves():
    """generate_stream(100, n_symbols=2**31 + 1) allocated its per-symbol books up front (the
    process was killed for memory before numpy could fail) and, past int32, would have
    wrapped symbol ids to negative ones. The bound is the engine's own (1 << 22)."""
    from fastpath.control.config import load_config
    # the small excess first: without the bound it runs (640 MB of books) and the test fails
    # there, before the 2**31 one could take the machine's memory
    with pytest.raises(InputError, match=r"n_symbols must be at most 4194304"):
        lob.generate_stream(100, n_symbols=(1 << 22) + 1)
    with pytest.raises(InputError, match=r"n_symbols must be at most 4194304"):
        lob.generate_stream(100, n_symbols=2**31 + 1)
    # the engine's own limit is that one
    assert load_config({"engine": {"n_symbols": 1 << 22}}).n_symbols == 1 << 22
    with pytest.raises(Exception, match="n_symbols"):
        load_config({"engine": {"n_symbols": (1 << 22) + 1}})


# ---- stubs against the runtime -------------------------------------------------------------
