"""A process that forks while it serves or holds a client: the child can neither take its
parent's answers nor stop its server, and can connect on its own."""
import os
import signal
import threading

import numpy as np

import fastpath
from fastpath import ServeError
from fastpath._build import DEMO_MODEL
from helpers.serving import cfg, deadline, fork_child, raw_zero, ticks, uname


# ------------------------------------------------------------------ fork
def test_forked_child_cannot_take_the_parents_replies():
    """Regression: a forked child used its parent's Client rings and the parent got the child's
    answers."""
    name = uname()
    raws = ticks(3, fastpath.get_default_engine().raw_len, seed=3)
    local = fastpath.Engine(DEMO_MODEL, config=cfg())
    want = [local.step(raws[0], 0, 100), local.step(raws[2], 0, 300)]
    with fastpath.serve(name, None, cfg()), fastpath.connect(name) as c:
        assert c.step(raws[0], 0, 100).signal == want[0].signal

        def child():
            return repr(c.step(raws[1], 1, 200).signal)
        out = fork_child(child)
        assert out.startswith("ServeError") and "fork" in out and "connect" in out, out
        with deadline(60):
            r = c.step(raws[2], 0, 300)
        assert r.seq == 2
        assert (r.signal, r.confidence) == (want[1].signal, want[1].confidence)
        assert c.outstanding == 0


def test_forked_child_exiting_does_not_stop_the_parents_server():
    """Regression: a forked child's exit hook stopped the parent's server."""
    name = uname()
    raw = raw_zero()
    with fastpath.serve(name, None, cfg()) as srv, fastpath.connect(name) as c:
        c.step(raw, 0, 100)

        def child():
            # what a normal exit of the child runs: the atexit stop of every server, then
            # the collection of the Server (its Worker) the child inherited
            from fastpath.serving import server
            server._stop_all()
            srv.stop()
            srv._worker = None
            import gc
            gc.collect()
            return "exit"
        assert fork_child(child) == "exit"
        with deadline(60):
            assert c.step(raw, 0, 200).seq == 2
        assert srv.running and srv.stats()["state"] == "running"
        assert os.path.exists(srv.path)


def test_forked_child_can_connect_on_its_own():
    """A fresh connect in a forked child works, as the fork error tells it to do."""
    name = uname()
    raw = raw_zero()
    with fastpath.serve(name, None, cfg()), fastpath.connect(name) as c:
        c.step(raw, 0, 100)

        def child():
            with fastpath.connect(name) as c2:
                return str(c2.step(raw, 5, 100).seq)
        assert fork_child(child) == "1"
        assert c.step(raw, 0, 200).seq == 2


def test_a_forked_child_is_told_the_server_is_its_parents():
    name = uname()
    srv = fastpath.serve(name, config=cfg())
    try:
        with fastpath.connect(name, timeout=5) as c:
            c.step(np.zeros(c.raw_len, np.float32), 0)     # one latency record
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:                                        # pragma: no cover (child)
            out = []
            for what, f in (("repr", lambda: repr(srv)), ("stats", srv.stats),
                            ("latency_records", srv.latency_records)):
                try:
                    out.append(f"{what} -> {f()!r}")
                except Exception as exc:
                    out.append(f"{what} !! {type(exc).__name__}: {exc}")
            os.write(w, "\n".join(out).encode())
            os._exit(0)
        os.close(w)
        with os.fdopen(r) as f:
            got = f.read().splitlines()
        os.waitpid(pid, 0)
        # in the child: repr and stats name the parent's server (it serves on there), and
        # the latency records are not a copy frozen at the fork
        want = f"Server(name='{name}', state='served by process {os.getpid()}')"
        assert got[0] == f"repr -> {want!r}"
        for line in got[1:]:
            assert f"is run by process {os.getpid()}" in line and "is a fork of it" in line, line
        assert srv.stats()["state"] == "running"
        assert len(srv.latency_records()) == 1
    finally:
        srv.stop()


def test_a_fork_while_another_thread_holds_the_servers_lock_does_not_hang_the_child():
    """Regression: a fork while another thread held the server's lock hung the child's stop()
    and stats()."""

    srv = fastpath.serve(uname(), config=cfg())
    held, release = threading.Event(), threading.Event()

    def inside_stats():             # stands for a monitoring thread inside srv.stats()
        with srv._lock:
            held.set()
            release.wait(60)

    t = threading.Thread(target=inside_stats)
    t.start()
    try:
        assert held.wait(30)
        pid = os.fork()
        if pid == 0:                                        # pragma: no cover (child)
            code = 3
            try:
                signal.alarm(30)                            # a hang: killed by SIGALRM
                try:
                    srv.stats()
                except ServeError as exc:                   # "is run by process <parent>"
                    assert "is a fork of it" in str(exc)
                srv.stop()
                code = 0
            finally:
                os._exit(code)
        release.set()
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
        assert srv.stats()["state"] == "running"
    finally:
        release.set()
        t.join(30)
        srv.stop()
