"""Engine.step_book against the numpy batch adapter (fastpath.lob.raw_from_book, the oracle):
replaying a stream update by update gives its raw vectors bit for bit and the same signals
(the adapter computing its logs with the C library's log and log1p, as the engine does), and
within 1e-6 relative of the adapter as numpy computes them, on the generated stream (every
regime), the Binance capture and a LOBSTER file, on every kernel set."""
import os

import numpy as np
import pytest

from fastpath import lob
from helpers.book import book_engine, lobster_files, raw_from_book_libm, replay_book, replay_raw
from helpers.builders import DATA_DIR


def _check_parity(isa, bs):
    want = raw_from_book_libm(bs)
    raws, sig, conf, cached = replay_book(book_engine(isa), bs)
    # numpy's own logs (an AVX-512 build has its own): the same vectors within 1e-6 relative
    np.testing.assert_allclose(raws, lob.raw_from_book(bs), rtol=1e-6, atol=1e-9)
    bad = np.argwhere(raws.view(np.uint32) != want.view(np.uint32))
    names = lob.field_names()
    assert not len(bad), (f"{len(bad)} fields differ, first row {bad[0][0]} field {bad[0][1]} "
                          f"({names[bad[0][1]]}): {raws[tuple(bad[0])]!r} vs "
                          f"{want[tuple(bad[0])]!r}")
    s2, c2, h2 = replay_raw(book_engine(isa), bs, want)
    np.testing.assert_array_equal(sig, s2)
    np.testing.assert_array_equal(conf, c2)
    np.testing.assert_array_equal(cached, h2)


def test_generated_stream_every_regime_bit_exact(isa):
    bs = lob.generate_stream(6_000, 3, seed=11)
    assert set(np.unique(bs.regime)) == {0, 1, 2}
    _check_parity(isa, bs)


def test_repeated_books_repeat_the_vector_and_do_not_move_the_clock(isa):
    bs = lob.generate_stream(1_500, 2, seed=3)
    # every third update of symbol 0 repeats its previous book with no trade
    rows = np.flatnonzero(bs.symbols == 0)
    for a, b in zip(rows[2::3], rows[3::3]):
        for k in ("bid_px", "ask_px", "bid_sz", "ask_sz"):
            getattr(bs, k)[b] = getattr(bs, k)[a]
        bs.trade_cnt[b] = 0
    _check_parity(isa, bs)


def test_binance_capture_bit_exact(isa):
    if not os.path.isdir(DATA_DIR):
        pytest.skip(f"the Binance capture is not here ({DATA_DIR})")
    bs = lob.read_binance(DATA_DIR)
    _check_parity(isa, bs)


def test_lobster_file_bit_exact(isa, tmp_path):
    bs = lob.read_lobster(*lobster_files(tmp_path, lob.generate_stream(3_000, 1, seed=4)))
    assert len(bs) > 2_000 and (bs.trade_cnt > 0).any()
    _check_parity(isa, bs)


def test_book_ns_is_a_stage_of_the_tick(isa):
    bs = lob.generate_stream(50, 1, seed=2)
    eng = book_engine(isa)
    eng.set_tick_size(0, 0.01)
    r = eng.step_book(0, bs.bid_px[0], bs.bid_sz[0], bs.ask_px[0], bs.ask_sz[0], 1)
    lat = r.latency
    assert lat.book_ns >= 0 and lat.total_ns >= lat.book_ns
    assert eng.step(np.zeros(256, np.float32), 0, 2).latency.book_ns == 0


def test_unchanged_inputs_and_whole_number_logs_bit_exact(isa):
    """Fields copied from the previous change (prices still, one level's sizes moving) and log1p
    of whole numbers on both sides of the table's end (256) give the adapter's bits."""
    bs = lob.generate_stream(1_200, 1, seed=5)
    # prices held for 400 changes: the mid does not move, the changes since it moved pass 256
    for k in ("bid_px", "ask_px"):
        getattr(bs, k)[100:500] = getattr(bs, k)[100]
    # from row 600 on, every other update moves only level 4's sizes
    for i in range(601, 900, 2):
        for k in ("bid_sz", "ask_sz"):
            row = getattr(bs, k)[i - 1].copy()
            row[3] = getattr(bs, k)[i][3]
            getattr(bs, k)[i] = row
    bs.trade_cnt[[150, 151, 152, 153]] = [255, 256, 257, 1_000]
    bs.trade_vol[[150, 151, 152, 153]] = [3.0, -2.5, 0.0, 7.0]
    bs.ts_ns[160] = bs.ts_ns[159]                  # a zero time step
    bs.ts_ns[161:] += 250_000                      # and a step of a fraction of a ms
    assert (bs.trade_cnt >= 256).any()
    _check_parity(isa, bs)


def test_moved_levels_alone_recompute_their_logs_bit_exact(isa):
    """Only the moved levels' logs and the depths from the first moved level down are
    recomputed: one side or one deep level moving alone, sizes moving with every cumulative
    depth below them unchanged (+5 at one level, -5 at the next), and a size moving to 0 and
    back give the adapter's bits."""
    bs = lob.generate_stream(1_500, 1, seed=8)
    for i in range(300, 1_200):
        for k in ("bid_px", "ask_px", "bid_sz", "ask_sz"):
            getattr(bs, k)[i] = getattr(bs, k)[i - 1]
        bs.trade_cnt[i] = 0
        kind = i % 5
        if kind == 0:                                  # the deepest bid alone
            bs.bid_sz[i][9] += 1
        elif kind == 1:                                # the ask side alone, levels 2 and 6
            bs.ask_sz[i][[2, 6]] += [3, 1]
        elif kind == 2:                                # levels 5 and 6 swapped
            bs.bid_sz[i][[4, 5]] = bs.bid_sz[i][[5, 4]]
        elif kind == 3:                                # a level emptied
            bs.ask_sz[i][0] = 0.0
        else:                                          # and refilled, with level 1 of the bids
            bs.ask_sz[i][0] = bs.ask_sz[i - 2][0]
            bs.bid_sz[i][0] += 2
    assert (bs.bid_sz >= 0).all()
    _check_parity(isa, bs)


def test_negative_zero_sizes_and_prices_moving_alone_bit_exact(isa):
    """A size of -0.0, which the checks accept, is +0.0 to the adapter (np.maximum(sz, 0)):
    the C stage wrote -0.0 into the log fields and the level-1 shares. Also a side whose
    prices move while its sizes stay recomputes its offsets and order flow."""
    bs = lob.generate_stream(1_200, 1, seed=9)
    tick = float(np.asarray(bs.tick_size).ravel()[0])
    for i in range(300, 1_000):
        for k in ("bid_px", "ask_px", "bid_sz", "ask_sz"):
            getattr(bs, k)[i] = getattr(bs, k)[i - 1]
        bs.trade_cnt[i] = 0
        kind = i % 4
        if kind == 0:                                  # a level emptied as -0.0
            bs.bid_sz[i][0] = -0.0
        elif kind == 1:                                # its sign flipped, a deep ask at -0.0
            bs.bid_sz[i][0] = 0.0
            bs.ask_sz[i][3] = -0.0
        elif kind == 2:                                # the bids a tick lower, sizes kept
            bs.bid_px[i] -= tick
        else:                                          # refilled
            bs.bid_sz[i][0] = 5.0
            bs.ask_sz[i][3] = 7.0
    assert np.signbit(bs.bid_sz).any() and (bs.bid_sz >= 0).all()
    _check_parity(isa, bs)
