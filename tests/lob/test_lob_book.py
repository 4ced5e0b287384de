"""The order-book adapter (fastpath.lob): the raw tick layout, the generator's regimes and
seed, and the LOBSTER and Binance readers (a missing file is an InputError naming it)."""
import os

import numpy as np
import pytest

import fastpath
from fastpath import Engine, lob
from helpers.builders import DATA_DIR


def test_raw_layout_has_256_named_fields_computed_from_the_book():
    names = lob.field_names()
    assert len(names) == lob.RAW_LEN == 256 and len(set(names)) == 256
    bs = lob.generate_stream(3_000, 3, seed=1)
    raw = lob.raw_from_book(bs)
    assert raw.shape == (3_000, 256) and raw.dtype == np.float32 and np.isfinite(raw).all()
    i = names.index
    # a one-tick spread on a 0.01 grid: best bid half a tick under mid, best ask half over
    calm = bs.regime == 0
    assert np.allclose(raw[calm, i("spread")][:100], 1.0)
    np.testing.assert_allclose(raw[:, i("bid_px_off_1")], -raw[:, i("spread")] / 2, atol=1e-4)
    np.testing.assert_allclose(raw[:, i("bid_logsz_1")], np.log1p(bs.bid_sz[:, 0]), rtol=1e-6)
    b, a = bs.bid_sz[:, 0], bs.ask_sz[:, 0]
    np.testing.assert_allclose(raw[:, i("imb_1")], (b - a) / (b + a), atol=1e-6)
    assert set(np.unique(raw[:, i("last_trade_sign")])) <= {-1.0, 0.0, 1.0}


def test_regimes_change_the_book():
    bs = lob.generate_stream(20_000, 4, seed=2)
    raw = lob.raw_from_book(bs)
    sp = raw[:, lob.field_names().index("spread")]
    assert sp[bs.regime == 1].mean() > 1.5 * sp[bs.regime == 0].mean()
    assert bs.trade_cnt[bs.regime == 1].mean() > 3 * bs.trade_cnt[bs.regime == 0].mean()


def test_generator_is_seeded():
    a, b = lob.generate_stream(2_000, 2, seed=5), lob.generate_stream(2_000, 2, seed=5)
    np.testing.assert_array_equal(a.bid_px, b.bid_px)
    np.testing.assert_array_equal(lob.raw_from_book(a), lob.raw_from_book(b))


def test_lobster_reader_reads_levels_prices_and_trade_signs(tmp_path):
    # 3 events, 2 levels; prices in 1e-4 units; the second ask level empty in row 2
    ob = np.array([[1001000, 5, 1000000, 7, 1002000, 3, 999000, 2],
                   [1001000, 4, 1000000, 7, 9999999999, 0, 999000, 2],
                   [1001000, 4, 1000000, 6, 1002000, 1, 999000, 2]], dtype=np.int64)
    msg = np.array([[34200.0, 1, 11, 5, 1001000, -1],
                    [34200.5, 4, 11, 1, 1001000, -1],       # sell order executed: buyer aggressor
                    [34201.0, 4, 12, 1, 1000000, 1]])       # buy order executed: seller aggressor
    np.savetxt(tmp_path / "ob.csv", ob, delimiter=",", fmt="%d")
    np.savetxt(tmp_path / "msg.csv", msg, delimiter=",", fmt="%.3f")
    bs = lob.read_lobster(str(tmp_path / "ob.csv"), str(tmp_path / "msg.csv"))
    assert len(bs) == 3 and bs.bid_px.shape == (3, 10)
    assert bs.ask_px[0, 0] == pytest.approx(100.1) and bs.bid_px[0, 0] == pytest.approx(100.0)
    assert bs.ask_sz[1, 1] == 0 and bs.ask_px[1, 1] == pytest.approx(100.11)
    np.testing.assert_allclose(bs.trade_vol, [0, 1, -1])
    assert (np.diff(bs.ask_px[0]) > 0).all() and (np.diff(bs.bid_px[0]) < 0).all()
    raw = lob.raw_from_book(bs)
    assert np.isfinite(raw).all()


def test_lobster_files_of_different_lengths_are_refused(tmp_path):
    np.savetxt(tmp_path / "ob.csv", np.ones((2, 4)), delimiter=",")
    np.savetxt(tmp_path / "msg.csv", np.ones((3, 6)), delimiter=",")
    with pytest.raises(ValueError, match="disagree"):
        lob.read_lobster(str(tmp_path / "ob.csv"), str(tmp_path / "msg.csv"))


def test_binance_capture_reads_and_serves():
    if not os.path.isdir(DATA_DIR):
        pytest.skip("shared Binance data not present")
    bs = lob.read_binance(DATA_DIR)
    assert len(bs) == 6493
    # 19,904 trades in the file; the one at or before the first snapshot is on no tick
    assert bs.trade_cnt.sum() == 19903
    assert (bs.ask_px[:, 0] > bs.bid_px[:, 0]).all()
    raw = lob.raw_from_book(bs)
    assert np.isfinite(raw).all()
    eng = Engine(fastpath._build.DEMO_MODEL)
    res = eng.step_batch(raw, bs.symbols, bs.ts_ns)
    assert np.isfinite(res.signal).all()


def test_a_missing_recorded_file_is_an_input_error_naming_it(tmp_path):
    # the module promises every problem of a recorded file is an InputError naming it; a
    # missing one was open()'s FileNotFoundError
    from fastpath import InputError
    from fastpath.lob import readers
    with pytest.raises(InputError, match=r"depth10\.csv: cannot be read \(No such file"):
        readers.read_binance(str(tmp_path / "nowhere"))
    (tmp_path / "ob.csv").write_text("1,2,3,4\n")
    with pytest.raises(InputError, match=r"msg\.csv: cannot be read"):
        readers.read_lobster(str(tmp_path / "ob.csv"), str(tmp_path / "msg.csv"))
