"""Book updates as a serving request kind: replaying a stream through a served engine's
step_book (fastpath.connect(...).step_book) gives the signals, confidences and cache decisions
of an in-process Engine.step_book replay bit for bit, on the generated stream (several symbols,
every regime), a LOBSTER file and the Binance capture, on every kernel set; raw ticks and book
updates share one ring."""
import os

import numpy as np
import pytest

import fastpath
from fastpath import lob
from fastpath._build import DEMO_MODEL
from helpers.book import lobster_files
from helpers.book_serving import book_server, counted, local_engine, replay, tick_sizes, update
from helpers.builders import DATA_DIR
from helpers.serving import cfg, uname


def _check(isa, bs, rows=None):
    ticks = tick_sizes(bs)
    want = replay(local_engine(isa, ticks).step_book, bs, rows)
    with book_server(isa, ticks) as (srv, c):
        got = replay(c.step_book, bs, rows)
        st = counted(srv, len(want))
    np.testing.assert_array_equal(got, want)
    assert st["served"] == len(want) and st["errors"] == 0


def test_generated_stream_served_equals_in_process(isa):
    bs = lob.generate_stream(2_000, 3, seed=11)
    assert set(np.unique(bs.regime)) == {0, 1, 2}
    _check(isa, bs)


def test_lobster_file_served_equals_in_process(isa, tmp_path):
    bs = lob.read_lobster(*lobster_files(tmp_path, lob.generate_stream(1_500, 1, seed=4)))
    assert (bs.trade_cnt > 0).any()
    _check(isa, bs)


def test_binance_capture_served_equals_in_process(isa):
    if not os.path.isdir(DATA_DIR):
        pytest.skip(f"the Binance capture is not here ({DATA_DIR})")
    bs = lob.read_binance(DATA_DIR)
    _check(isa, bs, range(min(len(bs), 2_000)))


def test_book_updates_and_raw_ticks_share_a_ring(isa):
    """Book updates and raw vectors interleaved on one client are each answered as the
    in-process engine answers them (the slot's kind, not what it held before, decides)."""
    bs = lob.generate_stream(300, 2, seed=5)
    ticks = tick_sizes(bs)
    eng = local_engine(isa, ticks)
    raws = np.random.default_rng(3).standard_normal((len(bs), 256)).astype(np.float32)
    with book_server(isa, ticks, ring_slots=4) as (_, c):
        for i in range(len(bs)):
            u = update(bs, i)
            a, b = c.step_book(**u), eng.step_book(**u)
            assert (a.signal, a.confidence, a.cached) == (b.signal, b.confidence, b.cached)
            # symbol 5 has no book: raw ticks on the engine clock beside the book's symbols
            a, b = c.step(raws[i], 5, i + 1), eng.step(raws[i], 5, i + 1)
            assert (a.signal, a.confidence, a.cached) == (b.signal, b.confidence, b.cached)
            assert a.latency.book_ns == 0


def test_served_result_carries_the_book_stage(isa):
    bs = lob.generate_stream(20, 1, seed=2)
    with book_server(isa, tick_sizes(bs)) as (_, c):
        r = c.step_book(**update(bs, 0))
    assert r.seq == 1 and r.wait_ns >= 0
    assert 0 <= r.latency.book_ns <= r.latency.total_ns


def test_stage_times_off_reports_book_ns_unmeasured():
    bs = lob.generate_stream(20, 1, seed=2)
    name = uname()
    conf = cfg(engine={"stage_times": False})
    with fastpath.serve(name, DEMO_MODEL, conf, tick_sizes=0.01) as _srv:
        with fastpath.connect(name, timeout=10) as c:
            r = c.step_book(**update(bs, 0))
    assert r.latency.book_ns == -1 and r.latency.total_ns > 0
