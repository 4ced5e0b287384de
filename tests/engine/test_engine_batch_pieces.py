"""Engine.step_batch in pieces (fp_step_batch_piece): the GIL is taken back between two pieces
to run signal handlers, so Ctrl-C stops a long batch. The pieces must not show: answers,
refusals and the engine's state are those of step() row by row and of the batch in one
piece, wherever the pieces fall; an interrupt leaves the rows applied so far applied, with
their answers on the exception (.applied, .result), and the engine usable.

_batch_piece_ns(1) makes every piece the least the C side runs (256 rows, one clock read):
deterministic piece boundaries; _batch_piece_ns(0) runs a batch in one piece.
"""
import _thread
import signal
import threading
import time

import numpy as np
import pytest

from fastpath import Engine, EngineBusyError, InputError, _engine
from fastpath._build import DEMO_MODEL
from fastpath.model import CachePolicy, Layer, Model
from helpers.builders import engine_cfg, windowed_model

PIECE = 256          # rows of a piece with a 1 ns budget (FP_BATCH_CLOCK_ROWS in fp_engine.c)
POLICY = CachePolicy(enabled=True, cos_threshold=0.999, norm_tol=0.05, max_age_ns=10**12,
                     max_run=1000)


@pytest.fixture
def pieces():
    """set(ns): step_batch's piece budget for the test, restored after it."""
    old = _engine._batch_piece_ns()
    yield _engine._batch_piece_ns
    _engine._batch_piece_ns(old)


def _stream(m, n, seed):
    """n rows for model m over 5 symbols with runs of repeated rows (so the cache hits and
    the hit/run state crosses piece boundaries), increasing timestamps per symbol."""
    rng = np.random.default_rng(seed)
    raws = rng.standard_normal((n, m.raw_len)).astype(np.float32)
    for a in range(0, n, 97):
        raws[a + 1:a + 40] = raws[a] + 1e-4 * rng.standard_normal((len(raws[a + 1:a + 40]),
                                                                     m.raw_len))
    syms = rng.integers(0, 5, n).astype(np.int64)
    ts = np.arange(n, dtype=np.int64) * 1000
    return raws, syms, ts


def _rowwise(eng, raws, syms, ts):
    rs = [eng.step(raws[i], int(syms[i]), ts_ns=int(ts[i])) for i in range(len(raws))]
    return (np.float32([r.signal for r in rs]), np.float32([r.confidence for r in rs]),
            np.array([r.cached for r in rs], bool))


def _state(eng):
    s = eng.stats()
    return s["ticks"], s["hits"], s["misses"], tuple(sorted(s["miss_reasons"].items()))


def _same(res, ref):
    """bitwise: signal, confidence, cached"""
    sig, conf, cached = ref
    assert res.signal.dtype == np.float32 and res.confidence.dtype == np.float32
    np.testing.assert_array_equal(res.signal.view(np.uint32), sig.view(np.uint32))
    np.testing.assert_array_equal(res.confidence.view(np.uint32), conf.view(np.uint32))
    np.testing.assert_array_equal(res.cached, cached)


@pytest.mark.parametrize("n", [PIECE - 1, PIECE, PIECE + 1, 3 * PIECE + 7])
def test_pieces_answer_as_rows_and_as_one_piece(pieces, n):
    m = windowed_model(np.random.default_rng(23))
    raws, syms, ts = _stream(m, n, n)
    ref = _rowwise(Engine(m, config=engine_cfg("scalar")), raws, syms, ts)
    pieces(0)
    whole = Engine(m, config=engine_cfg("scalar"))
    one = whole.step_batch(raws, syms, ts)
    pieces(1)
    eng = Engine(m, config=engine_cfg("scalar"))
    res = eng.step_batch(raws, syms, ts)
    _same(one, ref)
    _same(res, ref)
    assert res.cached.sum() > 0 and (~res.cached).sum() > 0
    assert _state(eng) == _state(whole)
    assert (res.total_ns > 0).all()
    # the engines go on alike: the next batch (pieces again) answers the same on both
    more, msyms, mts = _stream(m, PIECE + 3, n + 1)
    mts = mts + ts[-1] + 1000
    _same(eng.step_batch(more, msyms, mts), _rowwise(whole, more, msyms, mts))


def test_pieces_every_kernel_set(pieces, isa):
    m = windowed_model(np.random.default_rng(5))
    raws, syms, ts = _stream(m, 2 * PIECE + 1, 1)
    pieces(1)
    res = Engine(m, config=engine_cfg(isa)).step_batch(raws, syms, ts)
    _same(res, _rowwise(Engine(m, config=engine_cfg(isa)), raws, syms, ts))


def test_engine_clock_across_pieces(pieces):
    """Without ts_ns the rows are checked against the engine clock as one batch, and each
    piece applies at the clock's later time: no piece boundary is a time going backwards."""
    m = windowed_model(np.random.default_rng(2))
    raws, syms, _ = _stream(m, 3 * PIECE + 7, 2)
    pieces(1)
    eng = Engine(m, config=engine_cfg("scalar"))
    eng.step(raws[0], 0)                      # a last tick on the engine clock before the batch
    res = eng.step_batch(raws, syms)
    assert len(res.signal) == len(raws) and eng.stats()["ticks"] == len(raws) + 1


def test_bad_row_in_a_later_piece_applies_none(pieces):
    """pass 1 runs in pieces too: a bad row (non-finite, time going backwards) in the last
    piece is refused before any row is applied, with the one-piece batch's words."""
    m = windowed_model(np.random.default_rng(4))
    n = 3 * PIECE + 7
    raws, syms, ts = _stream(m, n, 4)
    bad_ts = ts.copy()
    bad_ts[3 * PIECE + 2] = ts[5]             # behind the earlier rows of its symbol
    bad_raw = raws.copy()
    bad_raw[3 * PIECE + 1, 3] = np.inf
    for r, t in ((raws, bad_ts), (bad_raw, ts)):
        msgs = []
        for budget in (0, 1):
            pieces(budget)
            eng = Engine(m, config=engine_cfg("scalar"))
            with pytest.raises(InputError) as ei:
                eng.step_batch(r, syms, t)
            assert ei.value.applied == 0 and len(ei.value.result.signal) == 0
            assert "no row was applied" in str(ei.value)
            assert eng.stats()["ticks"] == 0
            msgs.append(str(ei.value))
        assert msgs[0] == msgs[1]


def _overflow_model():
    """2 -> 4 -> 2 whose first layer overflows float32 for an input ~1e10: the model stage
    refuses that row (nothing in pass 1 sees it)."""
    w1 = np.array([[1e30, 0], [-1e30, 0], [1e30, 1e30], [1, 1]], np.float32)
    w2 = np.array([[1, -1, 1, 1e-3], [1, 1, -1, 1e-3]], np.float32)
    return Model((Layer(w1, np.zeros(4, np.float32), "relu"),
                  Layer(w2, np.zeros(2, np.float32), "identity")), None, POLICY)


def test_model_refusal_in_a_later_piece(pieces):
    m = _overflow_model()
    n, bad = 3 * PIECE + 7, 2 * PIECE + 100
    raws, syms, ts = _stream(m, n, 7)
    raws *= np.float32(1e-3)
    raws[bad] = 1e10
    errs = []
    for budget in (0, 1):
        pieces(budget)
        eng = Engine(m, config=engine_cfg("scalar"))
        with pytest.raises(InputError) as ei:
            eng.step_batch(raws, syms, ts)
        errs.append((str(ei.value), ei.value.applied, _state(eng)))
        e = ei.value
        assert e.applied == bad and f"row {bad}" in str(e)
        twin = Engine(m, config=engine_cfg("scalar"))
        _same(e.result, _rowwise(twin, raws[:bad], syms[:bad], ts[:bad]))
        assert e.result.cached.sum() > 0
        assert _state(eng) == _state(twin)
        # not busy: the rest of the batch goes in
        res = eng.step_batch(raws[bad + 1:], syms[bad + 1:], ts[bad + 1:])
        _same(res, _rowwise(twin, raws[bad + 1:], syms[bad + 1:], ts[bad + 1:]))
    assert errs[0] == errs[1]


def _long_batch(n=20_000):
    m = windowed_model(np.random.default_rng(11), hidden=(128, 128))
    raws, syms, ts = _stream(m, n, 11)
    return m, raws, syms, ts


def _interrupted(eng, raws, syms, ts, start, stop):
    """step_batch with start() arming an interrupt and stop() disarming it: the exception
    it raised, or None when the batch ended first."""
    start()
    try:
        eng.step_batch(raws, syms, ts)
        stop()
    except BaseException as exc:     # noqa: B036 - KeyboardInterrupt is the point
        stop()
        return exc
    return None


def _check_stopped(m, eng, exc, raws, syms, ts):
    n = len(raws)
    k = exc.applied
    assert 0 < k < n, k
    assert len(exc.result.signal) == k
    assert f"step_batch stopped after {k} of {n} rows" in "".join(exc.__notes__)
    twin = Engine(m, config=engine_cfg("scalar"))
    _same(exc.result, _rowwise(twin, raws[:k], syms[:k], ts[:k]))
    assert _state(eng) == _state(twin)
    # usable: the rest of the batch goes in and ends where one whole batch ends
    rest = eng.step_batch(raws[k:], syms[k:], ts[k:])
    whole = Engine(m, config=engine_cfg("scalar"))
    ref = whole.step_batch(raws, syms, ts)
    _same(rest, (ref.signal[k:], ref.confidence[k:], ref.cached[k:]))
    assert _state(eng) == _state(whole)
    x = np.ones(m.raw_len, np.float32)
    a = eng.step(x, 1, ts_ns=int(ts[-1]) + 1)
    b = whole.step(x, 1, ts_ns=int(ts[-1]) + 1)
    assert (a.signal, a.cached) == (b.signal, b.cached)


def _timed(m, raws, syms, ts):
    t0 = time.perf_counter()
    Engine(m, config=engine_cfg("scalar")).step_batch(raws, syms, ts)
    return time.perf_counter() - t0


def test_ctrl_c_stops_a_long_batch():
    """_thread.interrupt_main() is what Ctrl-C does (SIGINT's default handler raises
    KeyboardInterrupt in the main thread), here from a timer thread halfway through the
    batch, with the default piece budget."""
    m, raws, syms, ts = _long_batch()
    full = _timed(m, raws, syms, ts)
    for attempt in range(3):
        eng = Engine(m, config=engine_cfg("scalar"))
        timer = threading.Timer(full * 0.5, _thread.interrupt_main)
        exc = _interrupted(eng, raws, syms, ts, timer.start, timer.cancel)
        timer.join()
        if isinstance(exc, KeyboardInterrupt) and 0 < getattr(exc, "applied", -1) < len(raws):
            break
        full *= 0.5 if exc is None else 1.5      # the machine was faster or slower than timed
    assert isinstance(exc, KeyboardInterrupt), exc
    _check_stopped(m, eng, exc, raws, syms, ts)


class Alarm(Exception):
    pass


def test_signal_handler_exception_carries_the_rows(pieces):
    """Any exception a signal handler raises stops the batch the same way (here SIGALRM
    from setitimer), with small pieces."""
    m, raws, syms, ts = _long_batch()
    pieces(1_000_000)
    full = _timed(m, raws, syms, ts)
    armed = [True]

    def handler(signum, frame):
        if armed[0]:
            raise Alarm("time is up")

    old = signal.signal(signal.SIGALRM, handler)
    try:
        for attempt in range(3):
            eng = Engine(m, config=engine_cfg("scalar"))
            armed[0] = True

            def stop():
                armed[0] = False
                signal.setitimer(signal.ITIMER_REAL, 0)

            exc = _interrupted(eng, raws, syms, ts,
                               lambda: signal.setitimer(signal.ITIMER_REAL, full * 0.5), stop)
            if isinstance(exc, Alarm) and 0 < getattr(exc, "applied", -1) < len(raws):
                break
            full *= 0.5 if exc is None else 1.5
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert isinstance(exc, Alarm), exc
    _check_stopped(m, eng, exc, raws, syms, ts)


def test_handler_that_steps_the_engine_is_refused(pieces):
    """A signal handler that steps the engine mid-batch finds it busy (the batch's state is
    half applied): EngineBusyError out of step_batch with the rows applied, and the engine
    free afterwards."""
    m, raws, syms, ts = _long_batch(8_000)
    pieces(1)
    eng = Engine(m, config=engine_cfg("scalar"))
    seen = []

    def handler(signum, frame):
        if not seen:
            seen.append(1)
            eng.step(raws[0], 0)

    old = signal.signal(signal.SIGALRM, handler)
    try:
        exc = _interrupted(eng, raws, syms, ts,
                           lambda: signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001),
                           lambda: signal.setitimer(signal.ITIMER_REAL, 0))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    if exc is None:
        pytest.skip("the batch ended before the first alarm")
    assert isinstance(exc, EngineBusyError), exc
    assert 0 <= exc.applied < len(raws) and eng.stats()["ticks"] == exc.applied
    eng.step(raws[0], 0, ts_ns=int(ts[-1]) + 1)           # free again


def test_off_the_main_thread_one_piece(pieces):
    """A batch on another thread runs in one piece (no signal handler could run between
    two): its answers are the same."""
    m = windowed_model(np.random.default_rng(8))
    raws, syms, ts = _stream(m, 3 * PIECE + 7, 8)
    pieces(1)
    out = {}
    t = threading.Thread(target=lambda: out.setdefault(
        "r", Engine(m, config=engine_cfg("scalar")).step_batch(raws, syms, ts)))
    t.start()
    t.join()
    _same(out["r"], _rowwise(Engine(m, config=engine_cfg("scalar")), raws, syms, ts))


# --- Ctrl-C around a long batch -------------------------------------------------------------


WAIT = 10.0     # seconds any wait of these tests may take before the test fails instead of hanging


def _raw(seed=0, n=256):
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


def _batch(rng, n, syms, t0=1000):
    raws = rng.standard_normal((n, 256)).astype(np.float32)
    symbols = np.asarray([syms[i % len(syms)] for i in range(n)], np.int32)
    ts = t0 + np.arange(n, dtype=np.int64) * 1000
    return raws, symbols, ts


def test_keyboard_interrupt_around_step_batch_leaves_the_rows_it_says():
    """Ctrl-C while step_batch runs (it takes the GIL back between pieces of ~50 ms to let the
    interrupt in): the engine holds exactly the rows the KeyboardInterrupt's .applied says,
    their answers in .result, or all of the batch when the interrupt came after the call; it is
    not left busy, and answers the next tick as a single-threaded replay of those rows does."""
    import _thread
    eng = Engine(DEMO_MODEL)
    rng = np.random.default_rng(5)
    raws, syms, ts = _batch(rng, 100_000, (0,))
    timer = threading.Timer(0.01, _thread.interrupt_main)
    timer.start()
    k = None
    try:
        eng.step_batch(raws, syms, ts)
    except KeyboardInterrupt as exc:
        k = exc.applied
        assert len(exc.result.signal) == k
    finally:
        timer.join(WAIT)
    if k is None:                   # the interrupt came after the call: take it here
        try:
            threading.Event().wait(1.0)
        except KeyboardInterrupt:
            pass
        k = len(raws)
    assert eng.ticks == k
    eng.stats()                     # not busy
    ref = Engine(DEMO_MODEL)
    if k:
        ref.step_batch(raws[:k], syms[:k], ts[:k])
    probe = _raw(11)
    a, b = eng.step(probe, 0, 10**12), ref.step(probe, 0, 10**12)
    assert (a.signal, a.confidence, a.cached) == (b.signal, b.confidence, b.cached)
