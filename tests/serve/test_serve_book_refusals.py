"""A bad book update sent to a served engine (client.step_book) is refused with the message
Engine.step_book gives for the same update, and changes nothing: the served symbol answers its
next updates exactly as an in-process twin that never saw the bad one. Argument errors are
caught by the client before anything is sent; an update the server's engine refuses comes back
as a reply naming the field and level."""
import re

import numpy as np
import pytest

import fastpath
from fastpath import Engine, lob
from fastpath._build import DEMO_MODEL
from fastpath._client import _reply_error
from fastpath.errors import InputError
from helpers.book import book_update, spoil_crossed, spoil_order, spoil_set
from helpers.book_serving import counted
from helpers.serving import cfg, uname

N_WARM = 30
N_SYMBOLS = 32
NO_TICK = N_SYMBOLS - 1         # the one symbol the server has no tick size for
CONF = {"engine": {"n_symbols": N_SYMBOLS}}


@pytest.fixture(scope="module")
def served():
    """(server, client): the demo model, tick size 0.01 for every symbol but NO_TICK."""
    name = uname()
    ticks = {s: 0.01 for s in range(N_SYMBOLS - 1)}
    with fastpath.serve(name, DEMO_MODEL, cfg(engine=CONF["engine"]), tick_sizes=ticks) as srv:
        with fastpath.connect(name, timeout=10) as c:
            yield srv, c










# (id, spoil the update, refused by the server's engine (True) or by the client's checks)
CASES = [
    ("crossed", spoil_crossed(False), True),
    ("locked", spoil_crossed(True), True),
    ("nan price", spoil_set("ask_px", 6, np.nan), True),
    ("inf price", spoil_set("bid_px", 0, np.inf), True),
    ("zero price", spoil_set("bid_px", 9, 0.0), True),
    ("negative price", spoil_set("ask_px", 9, -1.0), True),
    ("negative size", spoil_set("ask_sz", 2, -1.0), True),
    ("nan size", spoil_set("bid_sz", 4, np.nan), True),
    ("bids out of order", spoil_order("bid_px"), True),
    ("asks out of order", spoil_order("ask_px"), True),
    ("nan trade volume", spoil_set("trade_vol", None, np.nan), True),
    ("negative count", spoil_set("trade_cnt", None, -1), True),
    ("negative last size", spoil_set("last_trade_sz", None, -2.0), True),
    ("time backwards", spoil_set("ts_ns", None, 0), True),
    ("depth past float64", lambda u: {**u, "bid_sz": np.full(10, 1.7e308)}, True),
    ("trade volume not a number", spoil_set("trade_vol", None, "1.5"), False),
    ("huge trade count", spoil_set("trade_cnt", None, 10**400), False),
    ("nine levels", lambda u: {**u, "bid_sz": u["bid_sz"][:9]}, False),
    ("eleven levels", lambda u: {**u, "ask_px": np.append(u["ask_px"], 1e9)}, False),
    ("no ts_ns", spoil_set("ts_ns", None, None), False),
    ("negative ts_ns", spoil_set("ts_ns", None, -5), False),
    ("symbol out of range", spoil_set("symbol", None, 99), False),
]


def _engine():
    eng = Engine(DEMO_MODEL, config=CONF)
    for s in range(N_SYMBOLS - 1):
        eng.set_tick_size(s, 0.01)
    return eng


@pytest.mark.parametrize("k", range(len(CASES)), ids=[c[0] for c in CASES])
def test_bad_update_same_message_state_unchanged(served, k):
    """A bad book update sent to a server changed the symbol's served state, or was refused
    with another message than Engine.step_book's."""
    srv, c = served
    _, spoil, by_server = CASES[k]
    sym = k                      # a symbol of its own on the shared server
    bs = lob.generate_stream(N_WARM + 10, 1, seed=9)
    ref, twin = _engine(), _engine()
    for i in range(N_WARM):
        u = book_update(bs, i, sym)
        a, b, t = c.step_book(**u), ref.step_book(**u), twin.step_book(**u)
        assert (a.signal, a.confidence, a.cached) == (b.signal, b.confidence, b.cached)
    bad = spoil(book_update(bs, N_WARM, sym))
    with pytest.raises(InputError) as want:
        ref.step_book(**bad)
    errors = counted(srv, a.seq)["errors"]
    with pytest.raises(InputError) as got:
        c.step_book(**bad)
    assert str(got.value) == str(want.value)
    for i in range(N_WARM, N_WARM + 10):
        u = book_update(bs, i, sym)
        r, t = c.step_book(**u), twin.step_book(**u)
        assert (r.signal, r.confidence, r.cached) == (t.signal, t.confidence, t.cached)
        if i == N_WARM:
            # refused by the server's engine: one request sent and answered with an error;
            # by the client's checks: none sent (the client's seq tells)
            assert r.seq == a.seq + 1 + int(by_server)
    assert counted(srv, r.seq, errors + int(by_server))["errors"] == errors + int(by_server)


def test_symbol_without_tick_size_refused_naming_the_server_setting(served):
    """A book update for a symbol the server has no tick size for is refused (the fix named:
    serve's tick_sizes), and the symbol stays without a book."""
    _, c = served
    bs = lob.generate_stream(5, 1, seed=1)
    with pytest.raises(InputError, match=rf"symbol {NO_TICK} has no tick size on server "
                                         rf".*tick_sizes=\{{{NO_TICK}: tick_size\}}"):
        c.step_book(**book_update(bs, 0, NO_TICK))
    with pytest.raises(InputError, match="has no tick size"):
        c.step_book(**book_update(bs, 1, NO_TICK))


def test_model_not_over_the_book_vector_refused_before_sending(model):
    """A server whose model reads another raw vector: step_book refused by the client with
    Engine.step_book's message, nothing sent."""
    name = uname()
    bs = lob.generate_stream(5, 1, seed=1)
    eng = Engine(model, config=cfg())
    eng.set_tick_size(0, 0.01)
    with pytest.raises(InputError) as want:
        eng.step_book(**book_update(bs, 0, 0))
    with fastpath.serve(name, model, cfg(), tick_sizes={0: 0.01}):
        with fastpath.connect(name, timeout=10) as c:
            with pytest.raises(InputError) as got:
                c.step_book(**book_update(bs, 0, 0))
            # nothing was sent: the next request is the client's first
            assert c.step(np.zeros(c.raw_len, np.float32), 0, 1).seq == 1
    assert str(got.value) == str(want.value)


@pytest.mark.parametrize("ticks,msg", [
    (0.0, r"tick_sizes must be a finite number > 0"),
    (float("nan"), r"tick_sizes must be a finite number > 0"),
    ({0: -1.0}, r"tick_sizes\[0\] must be a finite number > 0"),
    ({0: "0.01"}, r"tick_sizes\[0\] must be a finite number > 0"),
    ({16: 0.01}, r"tick_sizes: symbol 16 must be an int in 0..15"),
    ({True: 0.01}, r"tick_sizes: symbol True must be an int"),
    ([0.01], r"tick_sizes must be a number \(every symbol\) or a mapping"),
])
def test_bad_tick_sizes_refused_before_serving(ticks, msg):
    name = uname()
    with pytest.raises(InputError, match=msg):
        fastpath.serve(name, config=cfg(), tick_sizes=ticks)
    with pytest.raises(fastpath.ServeError):
        fastpath.connect(name, timeout=0)


@pytest.mark.parametrize("why,where,msg", [
    (1, 2 * 256 + 6, r"ask_px level 7 refused \(code 1\)"),
    (4, 0, r"crossed or locked book; best bid must be below best ask"),
    (5, 1, r"trade_cnt refused: must be finite and >= 0"),
    (7, 0, r"symbol 3 has no tick size on the server"),
    (3, 9 * 256, r"book update refused \(code 3, field 2304\)"),
])
def test_refusal_taken_by_poll_names_the_field_without_the_values(why, where, msg):
    """A book refusal taken off the ring by poll() (step_book interrupted while it waited),
    where the update's values are not at hand: the field and level from the reply alone."""
    exc = _reply_error(-9, 5, 3, 100, 0.0, 0.0, why, where)
    assert isinstance(exc, InputError)
    assert str(exc).startswith("book update refused (request 5, symbol 3): ")
    assert re.search(msg, str(exc))
