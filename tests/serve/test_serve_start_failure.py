"""A server whose start fails or times out removes its shared-memory segment; a served client
refuses a masked array instead of reading under its mask."""

import os

import numpy as np
import pytest

import fastpath


F32 = np.float32


def test_a_server_that_fails_to_start_removes_its_segment(monkeypatch):
    """Defect guarded: a server whose start timed out (placement slower than start_timeout) left
    its segment in /dev/shm until the next serve under that name; the failed start removes it."""
    import time
    from fastpath import ServeError
    from fastpath.serving import server as S
    from helpers.serving import cfg, uname

    def slow_place(self):
        time.sleep(0.5)
        return {"placed": False, "why": "test: slow placement"}

    monkeypatch.setattr(S.Server, "_place", slow_place)
    name = uname()
    with pytest.raises(ServeError, match="did not start within"):
        S.Server(name, config=cfg(), start_timeout=0.05)
    path = f"/dev/shm/fastpath.{name}"
    time.sleep(0.7)            # the thread has left _place: the old code's loop ran and returned
    assert not os.path.exists(path), os.listdir("/dev/shm")
    # the name is free for a real server at once, with nothing to replace
    srv = fastpath.serve(name, config=cfg())
    try:
        assert not srv.replaced
    finally:
        srv.stop()


def test_a_served_client_refuses_masked_values():
    """fastpath.connect(...).step() read a masked array's data under its mask as if valid, as
    Engine.step did (fixed beside it): refused now, and an unmasked one still served."""
    from fastpath import InputError
    from helpers.serving import cfg, uname
    name = uname()
    eng = fastpath.get_default_engine()
    raw = np.zeros(eng.raw_len, F32)
    m = np.ma.array(raw.copy())
    m[5] = np.ma.masked
    with fastpath.serve(name, config=cfg()), fastpath.connect(name) as c:
        with pytest.raises(InputError, match="masked array with 1 masked value"):
            c.step(m, 0, 5)
        assert c.step(np.ma.array(raw), 0, 6).signal == c.step(raw, 1, 6).signal


def test_a_start_timed_out_with_placement_stuck_still_removes_its_segment(monkeypatch):
    """A server whose start timed out while its placement was still stuck past the wait for
    the thread (2 s) was handed to the exit hook through a WeakSet: nothing else held it, so
    once the thread ended (the placement returned, the loop saw the stop) the server was
    collected, and the worker's finalizer unmaps but does not remove the segment: it stayed
    in /dev/shm until the next serve under that name. The thread removes it now, as soon as
    the placement returns."""
    import gc
    import os
    import threading
    from fastpath import ServeError
    from fastpath.serving import server as S
    from helpers.serving import cfg, uname

    go = threading.Event()

    def stuck_place(self):
        go.wait(30)
        return {"placed": False, "why": "test: placement stuck"}

    monkeypatch.setattr(S.Server, "_place", stuck_place)
    monkeypatch.setattr(S, "_START_JOIN_S", 0.05, raising=False)
    name = uname()
    path = f"/dev/shm/fastpath.{name}"
    try:
        with pytest.raises(ServeError, match="did not start within"):
            S.Server(name, config=cfg(), start_timeout=0.05)
        assert os.path.exists(path)       # the placement has not returned yet
    finally:
        go.set()
    for t in threading.enumerate():
        if t.name == f"fastpath-serve:{name}":
            t.join(30)
    gc.collect()
    assert not os.path.exists(path), sorted(os.listdir("/dev/shm"))
