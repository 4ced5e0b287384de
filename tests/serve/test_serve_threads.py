"""Serving under threads: a server stopped from two threads, a start interrupted by Ctrl-C, a
client used from a thread other than its own."""

import os
import threading

import pytest

import fastpath
from helpers.threads import WAIT, raw_tick as _raw, run_in_thread as _run


def test_server_stopped_from_two_threads(tmp_path):
    """Defect guarded: Server.stop() from two threads at once closed the worker twice
    (AttributeError or ServeError "is closed"); one closes, the other returns, final_stats is
    kept."""
    errs = []
    for i in range(5):
        srv = fastpath.serve(f"fp-thr-stop2-{os.getpid()}-{i}",
                             config={"serve": {"place": False}})
        gate = threading.Barrier(2, timeout=WAIT)

        def stopper():
            gate.wait()
            try:
                srv.stop()
            except BaseException as exc:
                errs.append(repr(exc))
        ts = [threading.Thread(target=stopper, daemon=True) for _ in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(WAIT)
            assert not t.is_alive()
        assert not srv.running
        assert srv.final_stats is not None and srv.stats() == srv.final_stats
        assert not os.path.exists(srv.path)
    assert errs == []


def test_server_start_interrupted_leaves_no_server(monkeypatch):
    """Defect guarded: Ctrl-C while fastpath.serve() waited for its thread to start left the
    thread serving with no handle and its segment in /dev/shm; the start is given up as a
    timed-out one is."""
    import _thread

    from fastpath._serve import segment_path
    from fastpath.serving import server as S
    placing, release = threading.Event(), threading.Event()

    def slow_place(self):
        placing.set()
        assert release.wait(WAIT)
        return {"placed": False, "why": "test"}
    monkeypatch.setattr(S.Server, "_place", slow_place)
    monkeypatch.setattr(S, "_START_JOIN_S", 0.1)

    def interrupter():
        if placing.wait(WAIT):
            _thread.interrupt_main()
    threading.Thread(target=interrupter, daemon=True).start()
    name = f"fp-thr-intr-{os.getpid()}"
    with pytest.raises(KeyboardInterrupt):
        try:
            fastpath.serve(name, config={"serve": {"place": True}})
        finally:
            release.set()
    th = [t for t in threading.enumerate() if t.name == f"fastpath-serve:{name}"]
    for t in th:
        t.join(5.0)
        assert not t.is_alive(), "the interrupted server's loop is still running"
    assert not os.path.exists(segment_path(name))


def test_client_used_from_a_second_thread_is_refused():
    from fastpath.errors import ServeError
    name = f"fp-thr-cli-{os.getpid()}"
    with fastpath.serve(name, config={"serve": {"place": False}}):
        c = fastpath.connect(name)
        try:
            raw = _raw(4)
            c.step(raw, 0)
            t, box = _run(c.step, raw, 0)
            t.join(WAIT)
            assert not t.is_alive()
            assert isinstance(box.get("e"), ServeError), box
        finally:
            c.close()
