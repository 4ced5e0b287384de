"""Signals and interrupts around serving: handlers that call into a server or client while
it is inside a call, Ctrl-C at each step of making or removing the segment, SIGTERM and
Ctrl-C during the exit drain. Scripts that could crash or hang run in a child process."""
import gc
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import fastpath
from fastpath._serve import segment_path
from fastpath import _memory, _segment as segment
from fastpath.serving import server as server_mod
from helpers.serving import (
    CFG_JSON, Interrupt, PKG_ROOT, TESTS_DIR, _wait_stopped, cfg, deadline, serve_cli,
    server_process, uname)


# ------------------------------------------------------------------ leaks
def _maps_of(dev_ino):
    dev, ino = dev_ino
    want = f"{os.major(dev):02x}:{os.minor(dev):02x}"
    n = 0
    with open("/proc/self/maps") as f:
        for line in f:
            p = line.split(None, 5)
            if len(p) >= 5 and p[4] == str(ino) and p[3].lower() == want:
                n += 1
    return n


def test_connect_interrupted_while_waiting_for_a_slot_unmaps_the_segment():
    """Regression: Ctrl-C while connect waited for a slot left the segment mapped for good."""
    name = uname()
    srv = fastpath.serve(name, config=cfg(max_clients=1))
    try:
        st = os.stat(segment_path(name))
        ident = (st.st_dev, st.st_ino)
        c1 = fastpath.connect(name, timeout=5)

        def boom(*_):
            raise Interrupt()
        old = signal.signal(signal.SIGALRM, boom)
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        try:
            # the handler runs inside the wait, or (on a loaded host, where it can be held
            # until connect's own checks run) at its timeout: either way the segment goes
            with pytest.raises(Interrupt):
                fastpath.connect(name, timeout=10)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        c1.close()
    finally:
        srv.stop()
    gc.collect()
    assert _maps_of(ident) == 0


def test_ctrl_c_in_a_clients_step_says_which_seq_was_sent():
    """Regression: an interrupted step() did not say which seq its sent tick will be answered
    under."""

    class Alarm(Exception):
        pass

    def on_alarm(signum, frame):
        raise Alarm()

    name = uname()
    raw = np.zeros(fastpath.get_default_engine().raw_len, np.float32)
    with server_process(name, stall_timeout_ms=60_000) as p:
        c = fastpath.connect(name, timeout=5)
        assert c.step(raw, 0).seq == 1
        os.kill(p.pid, signal.SIGSTOP)
        old = signal.signal(signal.SIGALRM, on_alarm)
        try:
            _wait_stopped(p.pid)
            signal.setitimer(signal.ITIMER_REAL, 0.05)
            try:
                c.step(raw, 3)
            except Alarm as exc:
                caught = exc
            else:
                raise AssertionError("the step was answered by a stopped server")
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
            os.kill(p.pid, signal.SIGCONT)
        assert caught.seq == 2
        assert any("seq 2" in n and "poll()" in n for n in caught.__notes__)
        got = []
        with deadline(60):
            while not got:
                got = c.poll()
        assert [s for s, _ in got] == [2]
        c.close()


def _interrupt(*_a, **_k):
    raise KeyboardInterrupt


@pytest.mark.parametrize("huge", ["none", "thp"])
def test_ctrl_c_while_the_segment_is_reserved_leaves_no_file(tmp_path, monkeypatch, huge):
    path = str(tmp_path / "fastpath.seg")
    monkeypatch.setattr(segment, "shmem_thp_mode", lambda path=None: "advise")
    monkeypatch.setattr(segment, "_reserve", _interrupt)
    with pytest.raises(KeyboardInterrupt):
        segment.create(path, 1 << 20, 0o600, huge)
    assert os.listdir(tmp_path) == []


def test_ctrl_c_while_a_hugetlbfs_segment_is_made_leaves_no_file(tmp_path, monkeypatch):
    """Regression: Ctrl-C while a hugetlbfs segment was made left its file (and the pool's
    pages)."""
    mnt = tmp_path / "hugepages"
    mnt.mkdir()
    monkeypatch.setattr(segment, "hugetlbfs_mounts", lambda: {segment.MB2: str(mnt)})
    monkeypatch.setattr(os, "symlink", _interrupt)
    path = str(tmp_path / "fastpath.seg")
    with pytest.raises(KeyboardInterrupt):
        segment.create(path, 1 << 20, 0o600, "2m")
    assert os.listdir(mnt) == [] and not os.path.lexists(path)


def _run_client(script, name, server_pid, how, timeout):
    """A client script (argv: name, the server's pid, how) in its own process."""
    return subprocess.run([sys.executable, str(script), name, str(server_pid), how],
                          capture_output=True, text=True, cwd=PKG_ROOT,
                          env=dict(os.environ, PYTHONPATH=PKG_ROOT), timeout=timeout)


CLOSE_IN_HANDLER = r"""
import os, signal, sys
import numpy as np
import fastpath
name, server_pid, how = sys.argv[1], int(sys.argv[2]), sys.argv[3]
c = fastpath.connect(name, timeout=5, stall_timeout=30)
raw = np.zeros(c.raw_len, np.float32)
c.step(raw, 0)


def stopped(pid):                   # every thread of it (the worker's too) stopped by now
    tasks = os.listdir(f"/proc/{pid}/task")
    for t in tasks:
        with open(f"/proc/{pid}/task/{t}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] not in "Tt":
                return False
    return True


os.kill(server_pid, signal.SIGSTOP)
while not stopped(server_pid):
    pass
if how == "submit":                 # fill the request ring: the next submit waits for room
    for _ in range(c.server_stats()["slots"]):
        c.submit(raw, 0)
waiting = False


def on_alarm(*_):
    if not waiting:         # a slow host: the call has not begun yet (closed now, it raised
        signal.setitimer(signal.ITIMER_REAL, 0.05)      # "is closed" from its first check)
        return
    c.close()


signal.signal(signal.SIGALRM, on_alarm)
signal.setitimer(signal.ITIMER_REAL, 0.1)
waiting = True              # a store: no handler runs between it and the call's wait
try:
    c.step(raw, 0) if how == "step" else c.submit(raw, 0)
except fastpath.ServeError as exc:
    print("raised:", exc, getattr(exc, "seq", None))
"""


@pytest.mark.parametrize("how", ["step", "submit"])
def test_close_from_a_signal_handler_during_a_wait_is_an_error_not_a_segfault(tmp_path, how):
    script = tmp_path / "client.py"
    script.write_text(CLOSE_IN_HANDLER)
    name = uname()
    p = serve_cli(tmp_path, name, 'ring_slots = 4\non_full = "spin"\n')
    try:
        assert p.stdout.readline().startswith(f"serving '{name}'")
        # the wait's signal check ran the handler, which unmapped the rings the wait then
        # read: SIGSEGV (-11)
        r = _run_client(script, name, p.pid, how, 120)
        assert r.returncode == 0, r.stderr
        assert "was closed while this call waited" in r.stdout
        if how == "step":
            assert r.stdout.split()[-1] == "2"     # the tick it had sent
    finally:
        os.kill(p.pid, signal.SIGCONT)
        p.terminate()
        p.communicate(timeout=60)


TAKE_IN_HANDLER = r"""
import os, signal, sys
import numpy as np
import fastpath
name, server_pid, how = sys.argv[1], int(sys.argv[2]), sys.argv[3]
c = fastpath.connect(name, timeout=5, stall_timeout=30)
raw = np.zeros(c.raw_len, np.float32)
c.step(raw, 0)
got = []


waiting = False


def handler(*_):
    if not waiting:
        # a slow host: step() has not sent its tick yet. Acting now, the poll below waited for
        # ever for an answer to nothing (the test's 60 s timeout)
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        return
    # the answer arrives and is taken inside the wait, by this handler
    os.kill(server_pid, signal.SIGCONT)
    if how == "poll":
        while not got:
            got.extend(c.poll())
    else:
        got.append(c.step(raw, 0))          # a nested step stashes the outer one's answer


signal.signal(signal.SIGALRM, handler)
os.kill(server_pid, signal.SIGSTOP)
while not stopped(server_pid):
    pass
signal.setitimer(signal.ITIMER_REAL, 0.1)
waiting = True              # a store: no handler runs between it and step()'s wait
try:
    r = c.step(raw, 0)
    print("answered", r.seq, [getattr(g, "seq", g) for g in got])
except fastpath.ServeError as exc:
    print("raised:", exc, [seq for seq, _ in got])
"""


@pytest.mark.parametrize("how", ["poll", "step"])
def test_an_answer_taken_inside_steps_wait_does_not_hang_it(tmp_path, how):
    script = tmp_path / "client.py"
    # the helper that waits for SIGSTOP to land, from the close-in-handler script
    helper = CLOSE_IN_HANDLER[CLOSE_IN_HANDLER.index("def stopped"):
                              CLOSE_IN_HANDLER.index("os.kill(server_pid, signal.SIGSTOP)")]
    script.write_text(TAKE_IN_HANDLER.replace("got = []\n", "got = []\n" + helper, 1))
    name = uname()
    p = serve_cli(tmp_path, name)
    try:
        assert p.stdout.readline().startswith(f"serving '{name}'")
        # it waited forever for an answer already taken (the server alive: no ServerGone)
        r = _run_client(script, name, p.pid, how, 60)
        assert r.returncode == 0, r.stderr
        if how == "poll":
            assert r.stdout.startswith("raised: the answer to tick 2 was taken by a poll()")
            assert r.stdout.rstrip().endswith("[2]")
        else:
            assert r.stdout.split() == ["answered", "2", "[3]"]
    finally:
        os.kill(p.pid, signal.SIGCONT)
        p.terminate()
        p.communicate(timeout=60)


def python_c(code, *args, timeout=120, **kw):
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
            # stop again until the alarm lands inside one: a pause() here hung for good when
            # the alarm fired between the `seen` check and the pause
            srv.stop()
            assert srv.stats()["state"] == "stopped"
    signal.setitimer(signal.ITIMER_REAL, 0)
    if inner == "stop":
        assert seen[-1] == "stopped", seen
        assert not os.path.exists(path), path
    srv.stop()
    assert srv.stats()["state"] == "stopped" and len(srv.latency_records()) == 1
    assert not os.path.exists(path), path
print("ok", rounds)
""".replace("CFG", CFG_JSON)


def _nested(outer, inner, rounds):
    base = uname()
    paths = [segment_path(f"{base}-{i}") for i in range(rounds)]
    try:
        # a deadlock is a timeout here, a use of a closed worker a crash (rc -11)
        r = python_c(NESTED, base, rounds, outer, inner, timeout=120)
    finally:
        left = [p for p in paths if os.path.exists(p)]
        for p in left:          # a child killed by the timeout leaves its segment
            os.unlink(p)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["ok", str(rounds)]
    assert not left


@pytest.mark.parametrize("outer,inner", [("stats", "stop"), ("stats", "stats"),
                                         ("stop", "stop"), ("stop", "stats")])
def test_a_call_from_a_signal_handler_inside_another_neither_deadlocks_nor_crashes(outer, inner):
    """Regression: stop() or stats() from a signal handler run inside stats() or stop() of the
    same server deadlocked on the server's lock or used its closed worker."""
    _nested(outer, inner, 30)


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
""".replace("CFG", CFG_JSON)


def _exit_drain_ended_by(sig):
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


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_during_the_exit_drain_ends_it_and_removes_the_segment(sig):
    """Regression: Ctrl-C or SIGTERM during the exit hook's drain neither ended it nor left
    the segment removed."""
    assert _exit_drain_ended_by(sig) == 0


def test_an_interrupt_while_the_server_makes_its_thread_leaves_no_segment(monkeypatch):

    class Interrupted:
        def __init__(self, *a, **kw):
            raise KeyboardInterrupt     # a Ctrl-C landing in threading.Thread's own code

    monkeypatch.setattr(server_mod.threading, "Thread", Interrupted)
    name = uname()
    with pytest.raises(KeyboardInterrupt):
        fastpath.serve(name, config=cfg())
    # the Worker was made first and dropped: its finalizer only unmaps
    assert not os.path.exists(segment_path(name))


def test_an_interrupt_while_the_worker_reports_its_segment_leaves_no_segment(monkeypatch):
    """Regression: Ctrl-C while the worker read smaps for its report left the segment file
    behind."""

    real = _memory.smaps_entry

    def interrupted(addr):
        if os.path.exists(segment_path(name)):     # the segment's report (not the engine's)
            raise KeyboardInterrupt
        return real(addr)

    monkeypatch.setattr(_memory, "smaps_entry", interrupted)
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
""".replace("CFG", CFG_JSON)


def test_a_close_inside_poll_step_or_submit_is_an_error_not_a_segfault():
    for how in ("poll", "step", "submit"):
        r = python_c(CLOSE_INSIDE, uname(), how, timeout=120)
        # the loop taking answers read the unmapped rings: SIGSEGV (-11)
        assert r.returncode == 0, (how, r.returncode, r.stderr[-2000:])
        assert "was closed while this call waited" in r.stdout, (how, r.stdout)


def test_a_close_inside_server_stats_is_no_segfault():
    """Regression: a gc callback closing the client inside server_stats() unmapped the header
    under its reads."""
    code = CLOSE_INSIDE.replace(
        'out = c.poll() if how == "poll" else c.step(raw, 0) if how == "step" else '
        'c.submit(raw, 0)', 'out = c.server_stats()').replace(
        'len(out) if how == "poll" else out', 'out["served"], len(out["clients"])')
    assert 'out = c.server_stats()' in code
    r = python_c(code, uname(), "stats", timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.stdout.split() == ["returned", "4", "1"], r.stdout


def test_an_exit_drain_that_times_out_says_what_it_left():
    """Regression: the exit hook's drain gave up on a client that took no answers without a
    word."""
    name = uname()
    r = python_c(EXIT_DRAIN, name, 100, timeout=120, input="go\n")
    assert r.returncode == 0, r.stderr
    assert not os.path.exists(segment_path(name))
    assert (f"server {name!r}: the exit's drain ended after [serve] drain_timeout_ms = 100: "
            f"1 request(s) clients sent stay unanswered") in r.stderr, r.stderr


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
""".replace("CFG", CFG_JSON).replace("TESTS", TESTS_DIR)


def test_a_stop_inside_a_wait_does_not_hide_the_answers_its_drain_gave():
    """Regression: step() reported an answer the drain published as never come (ServerGone)."""
    for how in ("step", "poll"):
        r = python_c(STOP_INSIDE_STEP, uname(), how, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        want = ["answered", "41", "40"] if how == "step" else ["answered", "40"]
        assert r.stdout.split() == want, (how, r.stdout)


def test_an_interrupt_right_after_the_segment_file_is_opened_leaves_no_file(monkeypatch):
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


SERVE_UNTIL_TERM = r"""
import signal, sys, time
import fastpath
sys.path.insert(0, "TESTS")
from helpers.serving import cfg
if sys.argv[2] == "exit":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
srv = fastpath.serve(sys.argv[1], config=cfg())
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


def test_sigterm_to_an_in_process_server_as_the_docs_say():
    """SIGTERM kills an in-process server as kill -9 does unless a handler exits; with one, the
    segment is removed, as the docs say."""
    code = SERVE_UNTIL_TERM.replace("TESTS", TESTS_DIR)
    for how in ("exit", "default"):
        name = uname()
        p = subprocess.Popen([sys.executable, "-c", code, name, how], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=PKG_ROOT,
                             env=dict(os.environ, PYTHONPATH=PKG_ROOT))
        try:
            assert p.stdout.readline().strip() == "ready", p.stderr.read()
            c = fastpath.connect(name, timeout=5)
            assert c.step(np.zeros(256, np.float32), 0).seq == 1
            p.send_signal(signal.SIGTERM)
            rc = p.wait(timeout=60)
        finally:
            p.kill()
            p.wait()
        if how == "exit":
            # the handler's exit ran the exit hook: drained, segment removed
            assert rc == 143, p.stderr.read()
            assert not os.path.exists(segment_path(name))
            c.close()
        else:
            # killed: the segment stays, the client finds the server gone, and a new
            # server under the name replaces the file
            assert rc == -signal.SIGTERM
            assert os.path.exists(segment_path(name))
            try:
                c.step(np.zeros(256, np.float32), 0)
                raise AssertionError("a step to a killed server returned")
            except fastpath.ServerGone:
                pass
            c.close()
            with fastpath.serve(name, config=cfg()) as srv:
                assert srv.name == name
            assert not os.path.exists(segment_path(name))


def test_an_interrupt_inside_the_segment_removal_still_removes_it(monkeypatch):
    """Regression: Ctrl-C inside Worker.close()'s removal left the segment file in /dev/shm."""
    real = segment.remove
    calls = []

    def interrupted(path, ident=None):
        calls.append(path)
        if len(calls) == 1:
            raise KeyboardInterrupt     # lands before the unlink
        return real(path, ident)

    name = uname()
    srv = fastpath.serve(name, config=cfg())
    monkeypatch.setattr(segment, "remove", interrupted)
    with pytest.raises(KeyboardInterrupt):
        srv.stop()
    monkeypatch.undo()
    assert len(calls) == 2 and not os.path.exists(segment_path(name))
