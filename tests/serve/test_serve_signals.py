"""Session 27 review of the serving code: signal handlers, the exit's drain, fork, interrupts.

- Server's lock was a plain threading.Lock: a signal handler that called srv.stop() (or stats(),
  latency_records()) while the main thread was inside stats() / latency_records() (holding
  the lock) deadlocked. The lock is reentrant now, and a stop() nested in another call leaves
  the worker open to that call, which closes it on its way out (closed under it, the outer
  call read an unmapped segment).
- A Ctrl-C during an in-process server's exit drain (the atexit hook, which caught Exception
  only) escaped the hook with the loop still running and left the segment in /dev/shm. A
  SIGINT or SIGTERM there ends the drain, as a second signal ends `fastpath serve`'s; the
  segment is removed and stderr says what was left unanswered (a drain that timed out says so
  too).
- A fork while another thread was inside stats() left the lock held in the child for ever (its
  stop(), its exit hook, hung); an interrupt between making the segment and starting the
  thread, or while the Worker read /proc/self/smaps for its report, left the segment in
  /dev/shm; repr() raised when a stop() closed the worker between its two reads.
- What runs inside a client call's allocations (a gc pass's finalizers and callbacks) may
  close the client: poll(), step(), a spinning submit() and server_stats() went on reading the
  unmapped rings (a segfault).
- Client(...) made directly took a nan / inf / negative timeout or stall_timeout.
- `fastpath serve` died on SIGHUP (its segment left), and skipped its stop when the
  "stopping" line could not be written.
- step() raised ServerGone for an answer the drain had published just before it said
  stopped.
"""
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from fastpath._serve import segment_path
from helpers.serving import PKG_ROOT, uname

CFG = ('{"engine": {"n_symbols": 16}, "serve": {"place": False, "idle": "yield", '
       '"idle_spin_ns": 50000}}')


def _python(code, *args, timeout=120, **kw):
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True,
                          text=True, cwd=PKG_ROOT, env=dict(os.environ, PYTHONPATH=PKG_ROOT),
                          timeout=timeout, **kw)


NESTED = r"""
import os, random, signal, sys
import numpy as np
import fastpath
base, rounds, outer, inner = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
random.seed(27)
for i in range(rounds):
    srv = fastpath.serve(f"{base}-{i}", config=CFG)
    with fastpath.connect(srv.name, timeout=5) as c:
        c.step(np.zeros(c.raw_len, np.float32), 0)     # one latency record
    path = srv.path
    seen = []

    def handler(*_):
        # every public method, the stop among them, from inside whatever the main thread
        # was doing with the same server
        if inner == "stop":
            seen.append(srv.stats()["state"])
            srv.stop()
            seen.append(srv.stats()["state"])
            assert len(srv.latency_records()) == 1
            srv.stop()
            repr(srv)
        else:
            seen.append(len(srv.latency_records()))
            seen.append(srv.stats()["state"])

    signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, random.uniform(0.0005, 0.01))
    while not seen:
        if outer == "stats":
            st = srv.stats()
            assert st["state"] in ("running", "stopped") and st["served"] == 1, st
            assert len(srv.latency_records()) == 1
        else:
            srv.stop()
            assert srv.stats()["state"] == "stopped"
            signal.pause() if not seen else None
    signal.setitimer(signal.ITIMER_REAL, 0)
    if inner == "stop":
        assert seen[-1] == "stopped", seen
        assert not os.path.exists(path), path
    srv.stop()
    assert srv.stats()["state"] == "stopped" and len(srv.latency_records()) == 1
    assert not os.path.exists(path), path
print("ok", rounds)
""".replace("CFG", CFG)


def _nested(outer, inner, rounds):
    base = uname()
    paths = [segment_path(f"{base}-{i}") for i in range(rounds)]
    try:
        # a deadlock is a timeout here, a use of a closed worker a crash (rc -11)
        r = _python(NESTED, base, rounds, outer, inner, timeout=120)
    finally:
        left = [p for p in paths if os.path.exists(p)]
        for p in left:          # a child killed by the timeout leaves its segment
            os.unlink(p)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["ok", str(rounds)]
    assert not left


def test_stop_from_a_signal_handler_inside_stats_neither_deadlocks_nor_crashes():
    _nested("stats", "stop", 30)


def test_stats_from_a_signal_handler_inside_stats_does_not_deadlock():
    _nested("stats", "stats", 30)


def test_calls_from_a_signal_handler_inside_stop():
    _nested("stop", "stop", 30)
    _nested("stop", "stats", 30)


EXIT_DRAIN = r"""
import sys
import numpy as np
import fastpath
name, drain_ms = sys.argv[1], int(sys.argv[2])
cfg = CFG
cfg["serve"].update(ring_slots=2, on_full="reject", drain_timeout_ms=drain_ms)
srv = fastpath.serve(name, config=cfg)
c = fastpath.connect(name, timeout=5)
raw = np.zeros(c.raw_len, np.float32)
for i in range(2):          # answered and never taken: c's reply ring (2 slots) is full
    c.submit(raw, 0, i + 1)
while c.server_stats()["served"] < 2:
    pass
c.submit(raw, 0, 3)         # held: the exit's drain waits for room in c's reply ring
print("ready", flush=True)
sys.stdin.readline()        # the test's own client is connected: a connect once the drain
                            # has begun is refused ("is stopping")
# the interpreter exits here: the exit hook stops srv, its drain held by c
""".replace("CFG", CFG)


def _exit_drain_ended_by(sig):
    import fastpath
    from helpers.serving import deadline
    name = uname()
    p = subprocess.Popen([sys.executable, "-c", EXIT_DRAIN, name, "60000"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=PKG_ROOT,
                         env=dict(os.environ, PYTHONPATH=PKG_ROOT))
    try:
        assert p.stdout.readline() == "ready\n", p.stderr.read()
        with deadline(60):
            with fastpath.connect(name, timeout=5) as c:
                p.stdin.write("go\n")
                p.stdin.flush()
                while c.server_stats()["state"] != "stopping":     # the exit's drain
                    pass
                p.send_signal(sig)
        # the drain alone would wait 60 s
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)
    # the KeyboardInterrupt escaped the hook ("Exception ignored in atexit callback") with the
    # segment left behind
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert not os.path.exists(segment_path(name))
    assert (f"server {name!r}: the exit's drain was ended by {sig.name}: 1 request(s) clients "
            f"sent stay unanswered") in err, err
    return p.returncode


def test_ctrl_c_during_the_exit_drain_ends_it_and_removes_the_segment():
    assert _exit_drain_ended_by(signal.SIGINT) == 0


def test_sigterm_during_the_exit_drain_ends_it_and_removes_the_segment():
    assert _exit_drain_ended_by(signal.SIGTERM) == 0


def test_a_fork_while_another_thread_holds_the_servers_lock_does_not_hang_the_child():
    """A thread inside stats() / latency_records() at the fork held the lock, and held it in
    the child for ever (that thread does not exist there): the child's stop() (its exit hook)
    and stats() waited on it for ever."""
    import threading

    import fastpath
    from fastpath import ServeError
    from helpers.serving import cfg
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


def test_an_interrupt_while_the_server_makes_its_thread_leaves_no_segment(monkeypatch):
    import fastpath
    from fastpath.serving import server as server_mod
    from helpers.serving import cfg

    class Interrupted:
        def __init__(self, *a, **kw):
            raise KeyboardInterrupt     # a Ctrl-C landing in threading.Thread's own code

    monkeypatch.setattr(server_mod.threading, "Thread", Interrupted)
    name = uname()
    with pytest.raises(KeyboardInterrupt):
        fastpath.serve(name, config=cfg())
    # the Worker was made first and dropped: its finalizer only unmaps
    assert not os.path.exists(segment_path(name))


def test_repr_of_a_server_another_thread_is_stopping_never_raises():
    """repr read the worker, then its state: a stop() in between closed it and repr raised
    ServeError "is closed"."""
    import threading

    import fastpath
    from helpers.serving import cfg
    errors = []
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)         # switch threads as often as the GIL allows
    try:
        for _ in range(20):
            srv = fastpath.serve(uname(), config=cfg())
            done = threading.Event()

            def reprs():
                while not done.is_set():
                    try:
                        repr(srv)
                    except Exception as exc:        # noqa: BLE001 (what is tested)
                        errors.append(exc)

            t = threading.Thread(target=reprs)
            t.start()
            srv.stop()
            done.set()
            t.join(30)
            assert repr(srv).endswith("state='closed')")
    finally:
        sys.setswitchinterval(old)
    assert not errors, errors[:3]


def test_an_interrupt_while_the_worker_reports_its_segment_leaves_no_segment(monkeypatch):
    """The Worker reads /proc/self/smaps for its report once the segment is made: a Ctrl-C
    there (or any error after the file was made) left the file in /dev/shm, its header naming
    this live process."""
    import fastpath
    from fastpath.control import memory
    from helpers.serving import cfg

    real = memory.smaps_entry

    def interrupted(addr):
        if os.path.exists(segment_path(name)):     # the segment's report (not the engine's)
            raise KeyboardInterrupt
        return real(addr)

    monkeypatch.setattr(memory, "smaps_entry", interrupted)
    name = uname()
    with pytest.raises(KeyboardInterrupt):
        fastpath.serve(name, config=cfg())
    assert not os.path.exists(segment_path(name))
    monkeypatch.undo()
    fastpath.serve(name, config=cfg()).stop()   # the name is free


CLOSE_INSIDE = r"""
import gc, sys
import numpy as np
import fastpath
from fastpath import ServeError
name, how = sys.argv[1], sys.argv[2]
cfg = CFG
cfg["serve"].update(ring_slots=8, on_full="spin")
srv = fastpath.serve(name, config=cfg)
c = fastpath.connect(name, timeout=5)
raw = np.zeros(c.raw_len, np.float32)
n = 8 if how == "submit" else 4
for i in range(n):
    c.submit(raw, 0)
while c.server_stats()["served"] < n:
    pass
if how == "submit":     # the reply ring full, then the request ring: the submit spins for room
    for i in range(8):
        c.submit(raw, 0)
armed = []


def close_once(phase, info):
    # what runs inside an allocation of the call (a gc pass: finalizers, gc callbacks, the
    # signal handlers they let run) closes the client
    if armed and phase == "start":
        armed.clear()
        c.close()


gc.callbacks.append(close_once)
gc.collect()
gc.set_threshold(1)                 # a gc pass at the call's first allocations
armed.append(1)
try:
    out = c.poll() if how == "poll" else c.step(raw, 0) if how == "step" else c.submit(raw, 0)
    print("returned", len(out) if how == "poll" else out)
except ServeError as exc:
    print("raised:", exc)
gc.set_threshold(700)
srv.stop()
""".replace("CFG", CFG)


def test_a_close_inside_poll_step_or_submit_is_an_error_not_a_segfault():
    for how in ("poll", "step", "submit"):
        r = _python(CLOSE_INSIDE, uname(), how, timeout=120)
        # the loop taking answers read the unmapped rings: SIGSEGV (-11)
        assert r.returncode == 0, (how, r.returncode, r.stderr[-2000:])
        assert "was closed while this call waited" in r.stdout, (how, r.stdout)


def test_a_close_inside_server_stats_is_no_segfault():
    """server_stats() built its dicts while it read the header: a gc pass there (a finalizer,
    a gc callback) that closed the client unmapped the header under the next read."""
    code = CLOSE_INSIDE.replace(
        'out = c.poll() if how == "poll" else c.step(raw, 0) if how == "step" else '
        'c.submit(raw, 0)', 'out = c.server_stats()').replace(
        'len(out) if how == "poll" else out', 'out["served"], len(out["clients"])')
    assert 'out = c.server_stats()' in code
    r = _python(code, uname(), "stats", timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.stdout.split() == ["returned", "4", "1"], r.stdout


def test_a_client_made_directly_checks_its_timeouts():
    """fastpath.serving.client.Client(name, timeout, stall_timeout) took a nan, inf or huge
    timeout (the deadline overflowed: no wait, "no server is serving"), a nan or negative
    stall_timeout (every live server called stalled) and a str (TypeError / ValueError
    naming no argument)."""
    import pytest

    import fastpath
    from fastpath import InputError
    from fastpath.serving.client import Client
    from helpers.serving import cfg
    name = uname()
    for bad in (float("nan"), float("inf"), 1e12, -1, "5", True):
        with pytest.raises(InputError, match=r"^timeout must be a number of seconds in \[0, "):
            Client(name, bad)
    for bad in (float("nan"), -1, 0, "5"):
        with pytest.raises(InputError, match=r"^stall_timeout must be a number of seconds in "
                                             r"\(0, "):
            Client(name, 1.0, bad)
    with fastpath.serve(name, config=cfg()):
        with Client(name, 5, 30) as c:
            assert c.stall_timeout == 30
            c.step(np.zeros(c.raw_len, np.float32), 0)


def test_an_exit_drain_that_times_out_says_what_it_left():
    """The exit hook's drain gave up on a client that took no answers without a word (as
    `fastpath serve` said nothing before session 26)."""
    name = uname()
    r = _python(EXIT_DRAIN, name, 100, timeout=120, input="go\n")
    assert r.returncode == 0, r.stderr
    assert not os.path.exists(segment_path(name))
    assert (f"server {name!r}: the exit's drain ended after [serve] drain_timeout_ms = 100: "
            f"1 request(s) clients sent stay unanswered") in r.stderr, r.stderr


def test_fastpath_serve_stops_on_sighup_and_keeps_serving_under_nohup(tmp_path):
    """A closed terminal (SIGHUP) killed `fastpath serve` and left its segment in /dev/shm."""
    import fastpath
    from helpers.serving import serve_cli
    name = uname()
    p = serve_cli(tmp_path, name)
    try:
        assert p.stdout.readline().startswith(f"serving '{name}'")
        p.send_signal(signal.SIGHUP)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)
    assert p.returncode == 0, (p.returncode, err)
    assert f"stopped '{name}'" in out
    assert not os.path.exists(segment_path(name))
    # ignored (nohup): left ignored, the server is not stopped by it
    name = uname()
    p = serve_cli(tmp_path, name,
                  preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    try:
        assert p.stdout.readline().startswith(f"serving '{name}'")
        with open(f"/proc/{p.pid}/status") as f:
            masks = {k: int(v, 16) for k, v in (ln.split(":\t") for ln in f.read().splitlines()
                                                 if ln.startswith(("SigIgn", "SigCgt")))}
        bit = 1 << (signal.SIGHUP - 1)
        assert masks["SigIgn"] & bit and not masks["SigCgt"] & bit, masks
        p.send_signal(signal.SIGHUP)
        with fastpath.connect(name, timeout=5) as c:
            c.step(np.zeros(c.raw_len, np.float32), 0)
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)
    assert p.returncode == 0, (p.returncode, err)
    assert not os.path.exists(segment_path(name))


def test_fastpath_serve_stops_when_its_stopping_line_cannot_be_written(monkeypatch):
    """The terminal gone (EIO) or a closed pipe: the "stopping" print raised before the stop,
    and the loop served on (its segment there) until the exit hook drained it."""
    import errno

    import pytest

    from fastpath.serving import server as server_mod
    from helpers.serving import cfg

    class Gone:
        def write(self, s):
            if s.startswith("serving "):
                os.kill(os.getpid(), signal.SIGTERM)
            if s.startswith("stopping "):
                raise OSError(errno.EIO, "Input/output error")

        def flush(self):
            pass

    name = uname()
    seen = []
    real_stop = server_mod.Server.stop

    def stop(self, timeout=None):
        seen.append(self)
        real_stop(self, timeout)

    monkeypatch.setattr(server_mod.Server, "stop", stop)
    with pytest.raises(OSError, match="Input/output error"):
        server_mod.run_foreground(name, None, cfg(), out=Gone())
    assert seen and seen[0].final_stats is not None      # stopped, not left to the exit hook
    assert not os.path.exists(segment_path(name))


STOP_INSIDE_STEP = r"""
import signal, sys
import numpy as np
import fastpath
from fastpath.model import CachePolicy
sys.path.insert(0, "TESTS")
from helpers.builders import random_model
name, how = sys.argv[1], sys.argv[2]
rng = np.random.default_rng(27)
m = random_model(rng, [1024, 2048, 2048, 2], policy=CachePolicy(enabled=False))
cfg = CFG
cfg["serve"].update(ring_slots=64, on_full="reject", drain_timeout_ms=60_000)
srv = fastpath.serve(name, m, cfg)
c = fastpath.connect(name, timeout=5, stall_timeout=30)
raw = np.zeros(1024, np.float32)
for k in range(40):                 # a slow model: the last of these waits a while
    c.submit(raw, 0, k + 1)
waiting = False


def on_alarm(*_):
    if not waiting:
        signal.setitimer(signal.ITIMER_REAL, 0.005)
        return
    srv.stop()      # inside the wait: the drain answers everything sent, then says stopped


signal.signal(signal.SIGALRM, on_alarm)
signal.setitimer(signal.ITIMER_REAL, 0.005)
waiting = True
try:
    if how == "step":
        r = c.step(raw, 0, 41)
        print("answered", r.seq, len(c.poll()))
    else:
        got = []
        while len(got) < 40:
            got += c.poll()
        print("answered", len(got))
except fastpath.ServeError as exc:
    print("raised:", exc)
""".replace("CFG", CFG).replace("TESTS", os.path.dirname(os.path.abspath(__file__)))


def test_a_stop_inside_a_wait_does_not_hide_the_answers_its_drain_gave():
    """The drain answers what was sent, then says stopped: step() looked at the ring, then at
    the state, and an answer published between the two was reported as never come
    (ServerGone) while it was there. (poll() between two calls: the next one takes them.)"""
    for how in ("step", "poll"):
        r = _python(STOP_INSIDE_STEP, uname(), how, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        want = ["answered", "41", "40"] if how == "step" else ["answered", "40"]
        assert r.stdout.split() == want, (how, r.stdout)


def test_an_interrupt_right_after_the_segment_file_is_opened_leaves_no_file(monkeypatch):
    import fastpath
    from helpers.serving import cfg
    name = uname()
    path = segment_path(name)
    real = os.fchmod
    fds = []

    def interrupted(fd, mode):
        if os.path.exists(path):
            fds.append((fd, os.fstat(fd).st_ino))
            raise KeyboardInterrupt     # a Ctrl-C landing between the open and the chmod
        return real(fd, mode)

    monkeypatch.setattr(os, "fchmod", interrupted)
    with pytest.raises(KeyboardInterrupt):
        fastpath.serve(name, config=cfg())
    monkeypatch.undo()
    # the empty file stayed (a connect or serve under the name took it for one being made)
    # and its descriptor stayed open
    assert fds and not os.path.exists(path)
    fd, ino = fds[0]
    try:
        leaked = os.fstat(fd).st_ino == ino     # the number may have been reused since
    except OSError:
        leaked = False
    assert not leaked
