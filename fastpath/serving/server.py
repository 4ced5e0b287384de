"""fastpath.serve / `fastpath serve`: the worker thread, its placement and its lifetime.

Design: the Worker (fastpath._serve) owns the segment and its own engine; this module only
starts its C loop in a thread, places that thread with the control plane first (pinning must
happen in the thread that spins), publishes the placement report in the segment for clients,
and makes sure the segment is removed however the process ends through Python's exit: a return
from main, sys.exit, an uncaught exception, Ctrl-C (SIGINT's KeyboardInterrupt). A signal whose
action is the default kill (kill -9, and SIGTERM unless the program handles it) ends the process
with no exit hook run: the segment is left, and the next server under the name replaces it. A
program that serves in-process and wants SIGTERM to drain turns it into an exit:
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143)). (`fastpath serve` does that itself.)
"""
from __future__ import annotations

import atexit
import copy
import math
import numbers
import os
import signal
import sys
import threading
import time
import weakref

import numpy as np

from fastpath._build import DEMO_MODEL, resolve
from fastpath._checks import check_seconds
from fastpath._serve import Worker
from fastpath.control.placement import place
from fastpath.errors import ConfigError, InputError, ServeError

_live: "weakref.WeakSet[Server]" = weakref.WeakSet()
_servers: "weakref.WeakSet[Server]" = weakref.WeakSet()    # every Server, for the fork hook
_START_JOIN_S = 2.0     # a start that timed out: how long to wait for the thread to see the stop


class Server:
    """A running serving loop (see fastpath.serve). Context manager; stop() drains and removes
    the segment."""

    def __init__(self, name: str, model=None, config=None, start_timeout: float = 10.0,
                 tick_sizes=None):
        # before anything starts: a bad one raised TypeError from the wait (`float + str`,
        # naming no argument) with the loop already started, or waited forever (nan)
        start_timeout = check_seconds("Server: start_timeout", start_timeout, True, None)
        m, rc, _backend, _why = resolve(model if model is not None else DEMO_MODEL, "cpu", config)
        ticks = tick_sizes_arg(tick_sizes, rc.n_symbols)
        if rc.source.backend == "gpu":
            # the loop steps a CPU engine (fp_worker.c): a config asking for the GPU was
            # served on the CPU without a word
            raise ConfigError(f"engine.backend = 'gpu' ({rc.source.source}): the serving loop "
                              f"runs the engine on the CPU; set engine.backend = 'cpu' (or "
                              f"'auto') to serve this config, or step a GPU Engine in-process")
        self.name = name
        self._pid = os.getpid()
        self.config = rc
        self.serve_config = rc.source.serve
        self.placement: dict | None = None
        self.final_stats: dict | None = None
        self._final_lat = None       # latency_records() as they were at stop()
        self._error: BaseException | None = None
        self._abandoned = False     # the start timed out: the thread removes the segment
        # stop() from two threads (a control thread and a `with` exit, or the exit hook) raced
        # to close the worker: the second raised AttributeError / "is closed"; and stats() /
        # latency_records() read a worker another thread's stop() was closing (its latency
        # ring freed under a copy that runs without the GIL). Held briefly, never across join.
        # Reentrant: a signal handler that called stop() (or stats()) while this thread was
        # inside stats() deadlocked on a plain Lock. _using counts the calls reading the
        # worker now (more than one: a handler's call nested in another); a stop() nested in
        # one leaves the worker to the outermost, which closes it on its way out (closed
        # under it, the outer read an unmapped segment: a segfault)
        self._lock = threading.RLock()
        self._using = 0
        self._to_close = None
        self._joining: set = set()  # the threads in _wait's join now
        self._loop_ended = False    # the worker's run() has returned
        _servers.add(self)
        self._thread = threading.Thread(target=self._run, name=f"fastpath-serve:{name}",
                                        daemon=True)
        self._worker = Worker(name, m, rc, self.serve_config, rc.source.memory, ticks)
        self.tick_sizes = dict(ticks)
        try:
            # everything from the segment's making on inside: an interrupt between it and the
            # start (a Ctrl-C while this made the thread) dropped the worker, whose finalizer
            # only unmaps, and left the segment in /dev/shm with a header naming this live
            # process (the next serve under the name in it: "already served by pid ...")
            self._path = self._worker.path     # still known once stop() has released it
            self.replaced = self._worker.replaced
            self._thread.start()
            deadline = time.monotonic() + start_timeout
            while self._worker.state == "starting" and self._thread.is_alive():
                if time.monotonic() > deadline:
                    self._abandon()
                    raise ServeError(f"server {name!r} did not start within {start_timeout} s")
                time.sleep(0.001)
        except ServeError:
            raise
        except BaseException:
            # Ctrl-C (or any exception) while waiting: the caller never gets this Server, and
            # its loop went on serving under the name with no handle to stop it, its segment
            # left behind at exit (the exit hook knows only servers that started)
            self._abandon()
            raise
        if self._error is not None:
            try:
                self._thread.join()
            finally:
                self._worker.close()
            raise self._error
        _live.add(self)

    def _abandon(self) -> None:
        """A start given up: the segment goes with it, never left in /dev/shm until the next
        serve under this name: closed here once the thread has seen the stop, else
        (placement still stuck) by the thread when the placement returns. Not by the exit
        hook: _live holds a server weakly, and nothing holds this one once the thread has
        ended (the worker's own finalizer only unmaps)."""
        self._abandoned = True
        self._worker.stop()
        if self._thread.ident is not None:      # an interrupt may come before it started
            self._thread.join(_START_JOIN_S)
        if not self._thread.is_alive():
            self._close_abandoned()

    def _close_abandoned(self) -> None:
        with self._lock:
            w, self._worker = self._worker, None
            if w is not None:
                self._close(w)

    def _close(self, w) -> None:
        """Close the worker let go of (under the lock): now, or, while a call of this thread
        still reads it (a stop() run by a signal handler inside stats()), when that call
        leaves (_done)."""
        if self._using:
            self._to_close = w
        else:
            w.close()

    def _done(self) -> None:
        """The end of a call that read the worker (under the lock, self._using already
        lowered): close what a stop() nested in it let go of."""
        w = self._to_close
        if w is not None and not self._using:
            self._to_close = None
            w.close()

    def _run(self) -> None:
        try:
            self.placement = self._place()
            if self._abandoned:
                self._close_abandoned()
                return
            seg = self._worker.segment
            self.placement["segment"] = seg
            self.placement.setdefault("lines", []).append(segment_line(seg))
            self._worker.set_placement(self.placement)
        except BaseException as exc:      # reported by __init__, in the caller's thread
            self._error = exc
            return
        try:
            self._worker.run()
        finally:
            self._loop_ended = True
        if self._abandoned:
            # the start was given up after the loop began (the stop ended it): nobody else
            # closes the segment once __init__ has stopped waiting for this thread
            self._close_abandoned()

    def _wait(self, timeout: float) -> bool:
        """Wait up to timeout s for the loop to end -> whether it did."""
        me = threading.get_ident()
        if me not in self._joining:
            self._joining.add(me)
            try:
                self._thread.join(timeout)
            finally:
                self._joining.discard(me)
            return not self._thread.is_alive()
        # a stop() that a signal handler runs inside this thread's own join above: a join
        # there waited for the lock the outer join held at that moment (Thread.join is not
        # reentrant), its whole timeout, and raised "did not stop"
        end = time.monotonic() + timeout
        while not self._loop_ended:
            if time.monotonic() > end:
                return False
            time.sleep(0.001)
        return True

    def _place(self) -> dict:
        if not self.serve_config.place:
            return {"placed": False, "why": "serve.place = false"}
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
        return self._path

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stats(self) -> dict:
        """The serving loop's counters; once stop() has returned, the counters it left
        (final_stats). served, errors, busy_ns, idle_polls, clients_reaped, each client's
        served, state and heartbeat_age_ns are the loop's own, kept in this process's memory
        (no client can change them). rejected_full is counted by the clients themselves in
        the shared segment (a refusal under on_full = "reject" happens in the client), so
        any process that maps the segment can change it; clients (slot, pid) and
        queue_depth come from the client table and ring cursors the clients write (queued
        per client at most ring_slots). A client's server_stats() reads the copy the loop
        publishes in the segment about once a heartbeat."""
        return self._read("stats", "final_stats", lambda w: w.stats())

    def latency_records(self):
        """(n, 5) uint32 ns of the last ticks answered (a refused one writes no record),
        oldest first: feature, cache, infer, total, wait (submit to pickup); with [engine]
        stage_times = false the first three are 0; each record whole (see
        fastpath._serve.Worker). Once
        stop() has returned, the records as they were then."""
        return self._read("latency_records", "_final_lat", lambda w: w.latency_records())

    def _read(self, what: str, kept: str, read):
        """read(worker) under the lock, the worker counted as in use (a stop() that a signal
        handler runs inside it leaves the close to this call); once stopped, attribute
        `kept` (what stop() kept of it) or the ServeError of _stopped (before, stats() of a
        stopped server was an AttributeError)."""
        with self._lock:
            self._using += 1
            try:
                w = self._worker
                if w is None:
                    return self._stopped(what, getattr(self, kept))
                return read(w)
            finally:
                # first, with nothing that can run a signal handler before it
                self._using -= 1
                self._done()

    def _stopped(self, what: str, kept):
        if kept is None:
            raise ServeError(f"server {self.name!r} is closed and kept no {what} (stopped "
                             f"from a forked child, which does not own the loop)")
        return copy.deepcopy(kept)

    def stop(self, timeout: float | None = None) -> None:
        """Stop accepting, answer what was accepted, end the loop, remove the segment.
        timeout (s): how long to wait for the loop to end; None: [serve] drain_timeout_ms
        plus 10 s (the drain waits that long for a client that does not take its answers:
        a fixed 10 s gave up on a drain the config allows up to 60 s, and left the
        segment behind). Safe in a signal handler, one that interrupted another call of
        this server included: a stats() it interrupted still returns its counters, and the
        segment goes when that call returns."""
        if timeout is None:
            timeout = self.serve_config.drain_timeout_ms / 1000 + 10.0
        else:
            # checked before the stop flag is set: a bad value raised from Thread.join (a
            # TypeError, or "did not stop within -1 s") with the loop already stopping and
            # its segment left for the exit hook
            timeout = check_seconds("Server.stop: timeout", timeout, False, None,
                                    " (or None: [serve] drain_timeout_ms plus 10 s)")
        with self._lock:
            w = self._worker
            if w is None:
                return
            if os.getpid() != self._pid:
                # a forked child (its atexit included): the loop and the segment are the
                # parent's, and stopping them here would end the parent's server
                self._worker = None
                return
            w.stop()
        if not self._wait(timeout):
            raise ServeError(f"server {self.name!r} did not stop within {timeout} s")
        with self._lock:
            if self._worker is not w:
                return          # another stop() (a thread's, a signal handler's) closed it
            self._using += 1
            try:
                st, lat = w.stats(), w.latency_records()
                if self._worker is w:   # not done meanwhile by a stop() a handler ran
                    self.final_stats, self._final_lat = st, lat
                    self._worker = None
                    self._to_close = w
            finally:
                self._using -= 1
                self._done()
        _live.discard(self)

    def end_drain(self) -> bool:
        """End a stop's drain at its next round (safe in a signal handler: takes no lock):
        what clients sent and were not answered stays unanswered, and their clients raise
        ServerGone. Before stop(), the stop it asks for skips the drain as well. True when
        the loop had not ended yet; False when there was no drain left to end (the loop
        had returned, the server is closed, or this is a forked child, which does not own
        the loop)."""
        w = self._worker            # once: stop() may clear it meanwhile
        if w is not None and os.getpid() == self._pid:
            return w.stop(force=True)
        return False

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        w = self._worker        # once: another thread's stop() may clear it between two reads
        if w is None:
            state = "closed"
        elif os.getpid() != self._pid:
            # a forked child: w.state raised ServeError out of repr()
            state = f"served by process {self._pid}"
        else:
            try:
                state = w.state
            except ServeError:
                state = "closed"    # closed by a stop() after the read above
        return f"Server(name={self.name!r}, state={state!r})"


def _after_fork_in_child() -> None:
    # a lock another thread held at the fork (its stats() or latency_records() under way)
    # stays held in the child, where that thread does not exist: the child's stop() (its exit
    # hook) or stats() waited for it forever. The forking thread's own calls hold the old
    # lock and release that one.
    for srv in list(_servers):
        srv._lock = threading.RLock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def segment_line(seg: dict) -> str:
    """One line on what backs the segment and why not something better."""
    refused = "; ".join(f"{m}: {why}" for m, why in seg["tried"] if why != "ok")
    line = f"segment: {seg['bytes']} bytes on {seg['pages']} pages ({seg['method']})"
    if refused:
        line += f"; not used: {refused}"
    if "mlock" in seg and seg["mlock"] != "ok":
        line += f"; mlock: {seg['mlock']}"
    return line


def tick_sizes_arg(tick_sizes, n_symbols: int) -> dict:
    """serve()'s tick_sizes as {symbol: tick size}: None (no book; book updates are refused
    for want of a tick size), one number for every symbol, or a mapping symbol -> number;
    each tick size finite and > 0, each symbol an int in 0..n_symbols - 1 (InputError)."""
    if tick_sizes is None:
        return {}
    if _is_number(tick_sizes):
        return {s: _tick(tick_sizes, "tick_sizes") for s in range(n_symbols)}
    if not hasattr(tick_sizes, "items"):
        raise InputError(f"tick_sizes must be a number (every symbol) or a mapping symbol -> "
                         f"tick size, got {type(tick_sizes).__name__}")
    out = {}
    for sym, tick in tick_sizes.items():
        if (isinstance(sym, bool) or not isinstance(sym, numbers.Integral)
                or not 0 <= sym < n_symbols):
            raise InputError(f"tick_sizes: symbol {sym!r} must be an int in 0..{n_symbols - 1} "
                             f"(the engine's n_symbols is {n_symbols})")
        out[int(sym)] = _tick(tick, f"tick_sizes[{int(sym)}]")
    return out


def _is_number(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, numbers.Real)


def _tick(v, what: str) -> float:
    if not _is_number(v) or not (math.isfinite(float(v)) and float(v) > 0):
        raise InputError(f"{what} must be a finite number > 0 (price units per tick), "
                         f"got {v!r}")
    return float(v)


def serve(name: str, model=None, config=None, tick_sizes=None) -> Server:
    """Serve `model` (default: the demo model) under `name`: the C loop runs in a new thread
    of this process, GIL released, placed by config [placement]; clients connect with
    fastpath.connect(name). A stale segment from a crashed server is replaced; a live one is a
    ServeError. tick_sizes: the live books' tick sizes for book update requests
    (client.step_book, fp_client_try_submit_book): one number for every symbol, or
    {symbol: tick size}; a book update for a symbol without one is refused. Fixed for the
    server's life (the books' averages are in ticks)."""
    return Server(name, model, config, tick_sizes=tick_sizes)


@atexit.register
def _stop_all() -> None:
    """The exit's drain of the servers still running. A Ctrl-C (SIGINT) or SIGTERM meanwhile
    ends it, as a second signal ends `fastpath serve`'s: the KeyboardInterrupt escaped this
    hook (an "Exception ignored" traceback) with the loop still running, and the segment
    was left in /dev/shm. What a drain left unanswered is said on stderr."""
    servers = list(_live)
    if not servers:
        return
    ended: list = []

    def on_signal(signum, _frame):
        if not ended:
            ended.append(signal.Signals(signum).name)
        for srv in servers:
            srv.end_drain()

    old = {}
    try:
        for s in (signal.SIGINT, signal.SIGTERM):
            try:
                if signal.getsignal(s) is not signal.SIG_IGN:
                    old[s] = signal.signal(s, on_signal)
            except (ValueError, OSError):
                pass            # not the main thread (an exit hook run by hand): no handler
        for srv in servers:
            _stop_at_exit(srv, ended, sys.stderr)
    finally:
        for s, h in old.items():
            try:
                signal.signal(s, h)
            except (ValueError, OSError, TypeError):
                pass


def _stop_at_exit(srv: Server, ended: list, err) -> None:
    timeout = srv.serve_config.drain_timeout_ms / 1000 + 2.0
    if ended:
        srv.end_drain()         # a signal before this server's turn: no drain for it either
    try:
        srv.stop(timeout=timeout)
    except KeyboardInterrupt:
        # raised where no handler of the hook's was in place: end the drain, close the rest
        if not ended:
            ended.append("KeyboardInterrupt")
        srv.end_drain()
        try:
            srv.stop(timeout=timeout)
        except BaseException:
            return
    except Exception:
        return
    st = srv.final_stats
    if not st or not st["queue_depth"]:
        return
    why = (f"the exit's drain was ended by {ended[0]}" if ended else
           f"the exit's drain ended after [serve] drain_timeout_ms = "
           f"{srv.serve_config.drain_timeout_ms}")
    try:
        print(f"fastpath: server {srv.name!r}: {why}: {st['queue_depth']} request(s) clients "
              f"sent stay unanswered (their clients raise ServerGone)", file=err, flush=True)
    except (OSError, ValueError, AttributeError):
        pass                    # stderr closed or gone at exit


def _stats_line(srv: Server, prev: dict, dt: float) -> tuple:
    st = srv.stats()
    n = st["served"] - prev.get("served", 0)
    parts = [f"{n / dt:10.0f} req/s", f"queue {st['queue_depth']:4d}",
             f"clients {len(st['clients'])}", f"errors {st['errors']}",
             f"rejected {st['rejected_full']}"]
    # only a tick the engine answered writes a record: a refused one (counted in served and
    # errors) does not, and taking the last n records reported earlier seconds' ticks. The
    # loop adds to served before errors: a read between the two over-counts the answered,
    # and the next second's difference can be negative (lat[-(-2):] is all but two records)
    ok = (st["served"] - st["errors"]) - (prev.get("served", 0) - prev.get("errors", 0))
    if ok > 0:
        lat = srv.latency_records()[-ok:]
        stages = enumerate(("feature", "cache", "infer", "total", "wait"))
        if not srv.config.source.stage_times:
            # [engine] stage_times = false: only the total is timed, the stages' columns hold 0
            stages = [(3, "total"), (4, "wait")]
        for j, stage in stages:
            col = lat[:, j] if stage != "infer" else lat[lat[:, 2] > 0, 2]
            if len(col):
                p50, p99 = np.percentile(col, [50, 99])
                parts.append(f"{stage} p50/p99 {p50:.0f}/{p99:.0f} ns")
    return "  ".join(parts), st


def run_foreground(name: str, model=None, config=None, stats: bool = False, out=None,
                   tick_sizes=None) -> int:
    """`fastpath serve`: serve until SIGINT or SIGTERM, then drain, remove the segment and
    return 0; a second signal during the drain ends it at once (what is left unanswered,
    its clients raise ServerGone) and returns 130; with stats, a line a second: throughput,
    queue depth, per-stage p50/p99."""
    out = out or sys.stdout
    # a plain flag, not a threading.Event: Event.set() takes the Event's lock (a plain Lock),
    # and a handler that ran while this thread held it, inside Event.wait()'s own Python code
    # (a SIGTERM right after a SIGCONT, as the wait timed out), deadlocked the server for good
    stop: list = []
    held = {}

    def on_signal(signum, _frame):
        if stop:
            if "srv" not in held:
                # the second signal while the server starts (a placement or a model load
                # that takes long): it waited out start_timeout (10 s), deaf to Ctrl-C;
                # Server() gives the start up (removing its segment) on this interrupt
                raise KeyboardInterrupt
            # the second signal: a drain behind a client that does not take its answers
            # waits drain_timeout_ms (up to a minute), and Ctrl-C did nothing meanwhile.
            # Only a drain still under way is ended: one that had finished answered all
            # (a signal landing after it said otherwise, and exited 130)
            if held["srv"].end_drain():
                held["forced"] = True
        stop.append(signum)

    # SIGHUP too (the terminal or ssh session closed): it killed the server, leaving the
    # segment in /dev/shm; not where it is ignored (nohup), which must keep serving
    sigs = [signal.SIGINT, signal.SIGTERM]
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        sigs.append(signal.SIGHUP)
    old = {s: signal.signal(s, on_signal) for s in sigs}
    try:
        srv = held["srv"] = Server(name, model, config, tick_sizes=tick_sizes)
        try:
            print(f"serving {name!r} at {srv.path} (pid {__import__('os').getpid()}); "
                  f"SIGINT or SIGTERM stops it (a second one ends its drain)", file=out,
                  flush=True)
            pl = srv.placement or {}
            for line in ([pl["why"]] if "why" in pl else []) + pl.get("lines", []):
                print(f"placement: {line}", file=out, flush=True)
            prev, t_prev = {}, time.monotonic()
            # short sleeps: a signal's handler runs inside one and the flag is seen within
            # 50 ms (a sleep a handler interrupts resumes for what is left of it)
            while True:
                time.sleep(0.05)
                if stop:
                    break
                if not srv.running:
                    print("fastpath serve: the worker loop ended", file=sys.stderr)
                    return 1
                now = time.monotonic()
                if stats and now - t_prev >= 1.0:
                    line, prev = _stats_line(srv, prev, now - t_prev)
                    t_prev = now
                    print(line, file=out, flush=True)
        finally:
            try:
                if stop:
                    print(f"stopping {name!r}: answering what clients sent (a second SIGINT "
                          f"or SIGTERM ends the drain)", file=out, flush=True)
            finally:
                # a print that failed (the terminal gone: SIGHUP, EIO; a closed pipe) skipped
                # the stop: the loop served on until the exit hook's drain
                srv.stop()
        st = srv.final_stats
        print(f"stopped {name!r}" + (f": {st['served']} served, {st['errors']} errors" if st
                                     else ""), file=out, flush=True)
        if held.get("forced"):
            left = f"{st['queue_depth']} request(s)" if st else "requests"
            print(f"fastpath serve: the drain was ended by a second signal: {left} clients "
                  f"sent stay unanswered (their clients raise ServerGone)", file=sys.stderr,
                  flush=True)
            return 130
        if st and st["queue_depth"]:
            # the drain gave up on a client that took no answers: that was said nowhere, as
            # if every request had been answered
            print(f"fastpath serve: the drain ended after [serve] drain_timeout_ms = "
                  f"{srv.serve_config.drain_timeout_ms} with {st['queue_depth']} request(s) "
                  f"clients sent unanswered (held behind answers their clients did not take; "
                  f"they raise ServerGone)", file=sys.stderr, flush=True)
        return 0
    finally:
        for s, h in old.items():
            signal.signal(s, h)
