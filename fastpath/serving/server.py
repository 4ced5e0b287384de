"""fastpath.serve / `fastpath serve`: the worker thread, its placement and its lifetime.

Design: the Worker (fastpath._serve) owns the segment and its own engine; this module only
starts its C loop in a thread, places that thread with the control plane first (pinning must
happen in the thread that spins), publishes the placement report in the segment for clients,
and makes sure the segment is removed however the process ends short of kill -9 (a new server
replaces what kill -9 leaves).
"""
from __future__ import annotations

import atexit
import threading
import weakref

_live: "weakref.WeakSet[Server]" = weakref.WeakSet()


class Server:
    """A running serving loop (see fastpath.serve). Context manager; stop() drains and removes
    the segment."""

    def __init__(self, name: str, model=None, config=None, start_timeout: float = 10.0):
        from fastpath._build import DEMO_MODEL, resolve
        from fastpath._serve import Worker
        from fastpath.errors import ServeError
        m, rc, _backend, _why = resolve(model if model is not None else DEMO_MODEL, "cpu", config)
        self.name = name
        self.config = rc
        self.serve_config = rc.source.serve
        self._worker = Worker(name, m, rc, self.serve_config)
        self.replaced = self._worker.replaced
        self.placement: dict | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"fastpath-serve:{name}",
                                        daemon=True)
        self._thread.start()
        import time
        deadline = time.monotonic() + start_timeout
        while self._worker.state == "starting" and self._thread.is_alive():
            if time.monotonic() > deadline:
                self._worker.stop()
                raise ServeError(f"server {name!r} did not start within {start_timeout} s")
            time.sleep(0.001)
        if self._error is not None:
            self._thread.join()
            self._worker.close()
            raise self._error
        _live.add(self)

    def _run(self) -> None:
        try:
            self.placement = self._place()
            self._worker.set_placement(self.placement)
        except BaseException as exc:      # reported by __init__, in the caller's thread
            self._error = exc
            return
        self._worker.run()

    def _place(self) -> dict:
        if not self.serve_config.place:
            return {"placed": False, "why": "serve.place = false"}
        from fastpath.control.placement import place
        try:
            rep = place(self.config.source)
        except OSError as exc:
            return {"placed": False, "why": f"placement failed: {exc}"}
        out = rep.to_dict()
        out["placed"] = rep.affinity_applied
        out["lines"] = rep.lines()
        return out

    @property
    def path(self) -> str:
        return self._worker.path

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stats(self) -> dict:
        """Segment counters: served, errors, rejected_full, queue_depth, clients, ..."""
        return self._worker.stats()

    def latency_records(self):
        return self._worker.latency_records()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop accepting, answer what was accepted, end the loop, remove the segment."""
        if self._worker is None:
            return
        self._worker.stop()
        self._thread.join(timeout)
        if self._thread.is_alive():
            from fastpath.errors import ServeError
            raise ServeError(f"server {self.name!r} did not stop within {timeout} s")
        self._worker.close()
        self._worker = None
        _live.discard(self)

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = self._worker.state if self._worker is not None else "closed"
        return f"Server(name={self.name!r}, state={state!r})"


def serve(name: str, model=None, config=None) -> Server:
    """Serve `model` (default: the demo model) under `name`: the C loop runs in a new thread
    of this process, GIL released, placed by config [placement]; clients connect with
    fastpath.connect(name). A stale segment from a crashed server is replaced; a live one is a
    ServeError."""
    return Server(name, model, config)


@atexit.register
def _stop_all() -> None:
    for srv in list(_live):
        try:
            srv.stop(timeout=2.0)
        except Exception:
            pass
