"""Engine.step_book refuses a bad update with an InputError naming the field and level, and
leaves the symbol's book, window, cache and counters as they were: an engine that got the
refused call answers the next updates exactly as a twin that never saw it."""
import numpy as np
import pytest

from fastpath import Engine, lob
from fastpath.errors import InputError
from helpers.book import book_engine, book_update, spoil_crossed, spoil_order, spoil_set as put
from helpers.builders import engine_cfg, windowed_model

N_WARM = 40


def _warm_pair(isa):
    bs = lob.generate_stream(N_WARM + 10, 1, seed=9)
    engines = (book_engine(isa), book_engine(isa))
    for eng in engines:
        eng.set_tick_size(0, 0.01)
        for i in range(N_WARM):
            eng.step_book(0, bs.bid_px[i], bs.bid_sz[i], bs.ask_px[i], bs.ask_sz[i],
                          int(bs.ts_ns[i]), float(bs.trade_vol[i]), int(bs.trade_cnt[i]),
                          float(bs.last_trade_sz[i]))
    return engines, bs










CASES = [
    ("crossed", spoil_crossed(False), r"crossed or locked book: bid_px level 1"),
    ("locked", spoil_crossed(True), r"crossed or locked book: bid_px level 1"),
    ("nan price", put("ask_px", 6, np.nan), r"ask_px level 7 is nan: must be a finite price"),
    ("inf price", put("bid_px", 0, np.inf), r"bid_px level 1 is inf: must be a finite price"),
    ("zero price", put("bid_px", 9, 0.0), r"bid_px level 10 is 0: must be a finite price > 0"),
    ("negative price", put("bid_px", 9, -1.0), r"bid_px level 10 is -1: must be a finite price"),
    ("negative size", put("ask_sz", 2, -1.0), r"ask_sz level 3 is -1: must be a finite size"),
    ("nan size", put("bid_sz", 4, np.nan), r"bid_sz level 5 is nan"),
    ("bids out of order", spoil_order("bid_px"), r"bid_px level 5 is .* out of order: above level 4"),
    ("asks out of order", spoil_order("ask_px"), r"ask_px level 5 is .* out of order: below level 4"),
    ("nan trade volume", put("trade_vol", None, np.nan), r"trade_vol is nan: must be finite"),
    ("negative count", put("trade_cnt", None, -1), r"trade_cnt is -1: must be finite and >= 0"),
    ("negative last size", put("last_trade_sz", None, -2.0), r"last_trade_sz is -2"),
    ("time backwards", put("ts_ns", None, 0), r"ts_ns 0 is earlier than the last tick"),
    ("trade volume not a number", put("trade_vol", None, "1.5"), r"trade_vol must be a number"),
    ("huge trade count", put("trade_cnt", None, 10**400), r"trade_cnt 1000.* does not fit"),
    ("nine levels", lambda u: {**u, "bid_sz": u["bid_sz"][:9]},
     r"bid_sz must have 10 levels.*got shape \(9,\)"),
    ("eleven levels", lambda u: {**u, "ask_px": np.append(u["ask_px"], 1e9)},
     r"ask_px must have 10 levels.*got shape \(11,\)"),
    ("depth past float64", lambda u: {**u, "bid_sz": np.full(10, 1.7e308)},
     r"raw field \d+ .* beyond float32's range"),
]


@pytest.mark.parametrize("what,make,msg", CASES, ids=[c[0] for c in CASES])
def test_bad_update_refused_state_unchanged(isa, what, make, msg):
    """A bad book update changed the symbol's state or was not refused with its field named."""
    (a, b), bs = _warm_pair(isa)
    before = a.book_state(0)
    with pytest.raises(InputError, match=msg):
        a.step_book(0, **make(book_update(bs, N_WARM)))
    assert a.book_state(0) == before == b.book_state(0)
    assert a.stats()["ticks"] == b.stats()["ticks"]
    for i in range(N_WARM, N_WARM + 10):
        ra, rb = a.step_book(0, **book_update(bs, i)), b.step_book(0, **book_update(bs, i))
        assert (ra.signal, ra.confidence, ra.cached) == (rb.signal, rb.confidence, rb.cached)
    assert a.book_state(0) == b.book_state(0)


def test_tick_size_too_small_for_float32_is_refused_by_field(isa):
    (a, _), bs = _warm_pair(isa)
    a.reset(0)
    a.set_tick_size(0, 1e-300)
    with pytest.raises(InputError, match=r"raw field 0 .* beyond float32"):
        a.step_book(0, **book_update(bs, 0))
    assert a.book_state(0)["updates"] == 0


@pytest.mark.parametrize("tick", [0, 0.0, -0.01, float("nan"), float("inf"), "0.01", True])
def test_bad_tick_size_refused(tick):
    eng = book_engine("scalar")
    with pytest.raises(InputError, match="tick_size"):
        eng.set_tick_size(0, tick)
    assert eng.book_state(0) is None


def test_step_book_before_tick_size_names_set_tick_size():
    eng = book_engine("scalar")
    bs = lob.generate_stream(5, 1, seed=1)
    with pytest.raises(InputError, match=r"set_tick_size\(3, tick_size\)"):
        eng.step_book(3, **book_update(bs, 0))
    assert eng.stats()["ticks"] == 0


def test_other_tick_size_needs_reset_and_reset_clears_the_book(isa):
    (a, _), bs = _warm_pair(isa)
    with pytest.raises(InputError, match=r"reset\(0\)"):
        a.set_tick_size(0, 0.05)
    assert a.book_state(0)["updates"] > 0 and a.book_state(0)["tick_size"] == 0.01
    a.reset(0)
    assert a.book_state(0)["updates"] == 0 and a.book_state(0)["last_trade"] is None
    a.set_tick_size(0, 0.05)
    a.step_book(0, **book_update(bs, 0))
    assert a.book_state(0)["tick_size"] == 0.05


def test_symbol_out_of_range_refused():
    eng = book_engine("scalar")
    bs = lob.generate_stream(5, 1, seed=1)
    with pytest.raises(InputError, match="symbol 99 out of range"):
        eng.step_book(99, **book_update(bs, 0))


def test_model_not_over_the_book_vector_refused():
    """A model whose raw vector is not the book's 256 values is refused by name."""
    eng = Engine(windowed_model(np.random.default_rng(0)), config=engine_cfg("scalar"))
    eng.set_tick_size(0, 0.01)
    bs = lob.generate_stream(5, 1, seed=1)
    with pytest.raises(InputError, match=r"raw_len 256\); this one reads 40"):
        eng.step_book(0, **book_update(bs, 0))
    assert eng.stats()["ticks"] == 0 and eng.book_state(0)["updates"] == 0
