"""Session 26 review of the serving loop's stop (second signal, end_drain) and its edges.

- fp_client_try_submit (fp_ring.h, what C feed handlers call) refused nothing once the server's
  stop had begun: only the Python client checked the state. A C client that went on submitting
  kept the drain busy for the whole drain_timeout_ms, and a tick sent once the drain had ended
  was never answered. It returns FP_RING_ERR_GONE now, and the Python client says ServerGone
  for it (never RingFull, with on_full = "reject").
- A second signal to `fastpath serve` landing after the drain had finished (stop() returned,
  the handlers not yet restored) exited 130 and said requests were left unanswered: nothing
  was. Server.end_drain() says whether a drain was still there to end.
- A second signal while `fastpath serve` was still starting (a long placement or model load)
  did nothing: the start went on for up to its 10 s timeout, deaf to Ctrl-C. It gives the
  start up now (KeyboardInterrupt, the segment removed).
- Server.stop(timeout=) with a bad value set the stop flag, then raised TypeError from
  Thread.join (or "did not stop within -1 s"), leaving a stopping server unclosed; a bad
  Server(start_timeout=) raised TypeError (`float + str`) once the loop had started, or waited
  forever (nan). Both are InputErrors naming the argument, before anything starts or stops.
- A submit refused because the server had stopped said "is stopped" alone (whether the tick
  was sent left open).
- A step() that gave up on a stopped or stalled server did not say which tick it had sent (a
  KeyboardInterrupt there carries .seq, this did not).
- A signal handler that called client.close() while step() or a submit waited (the wait runs
  handlers in its signal check) unmapped the rings the wait read next: a segfault.
- In a forked child, repr(server) raised ServeError, server.stats() said the server "is
  closed" (it serves on in the parent), and latency_records() returned the child's copy,
  frozen at the fork, as if current.
- A signal handler that took step()'s answer while it waited (its own poll(), or a nested
  step() that kept it for poll()) left step() waiting forever for an answer already taken.
- `fastpath serve` whose drain timed out on a client that took no answers said nothing of
  the requests it left unanswered.
"""
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import fastpath
from fastpath import InputError, RingFull, ServerGone
from fastpath._serve import segment_path
from fastpath.serving import server as server_mod
from helpers.serving import PKG_ROOT, cfg, deadline, uname
from helpers.serving import _stuck, held_server, serve_cli
from helpers.serving import _stopped  # noqa: F401

C_SUBMIT_AFTER_STOP = r"""
#include "fp_ring.h"
#include <stdlib.h>
int main(int argc, char **argv) {
    fp_seg s;
    fp_client c;
    char line[16];
    uint64_t seq = 0;
    (void)argc;
    if (fp_seg_attach(argv[1], &s) != FP_RING_OK || fp_client_open(&s, &c) != FP_RING_OK)
        return 3;
    printf("ready\n");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin))
        return 2;
    float *raw = calloc(s.h->raw_len, sizeof(float));
    int rc = fp_client_try_submit(&c, raw, 0, -1, &seq);
    printf("%d %llu\n", rc, (unsigned long long)seq);
    fflush(stdout);
    fp_client_close(&c);
    fp_seg_detach(&s);
    free(raw);
    return 0;
}
"""


def _run_client(script, name, server_pid, how, timeout):
    """A client script (argv: name, the server's pid, how) in its own process."""
    return subprocess.run([sys.executable, str(script), name, str(server_pid), how],
                          capture_output=True, text=True, cwd=PKG_ROOT,
                          env=dict(os.environ, PYTHONPATH=PKG_ROOT), timeout=timeout)


def _stop_in_thread(srv):
    t = threading.Thread(target=srv.stop)
    t.start()
    while srv.stats()["state"] != "stopping":
        time.sleep(0.001)
    return t


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH")
def test_c_client_submit_is_refused_once_the_stop_begins(tmp_path):
    src, exe = tmp_path / "late.c", tmp_path / "late"
    src.write_text(C_SUBMIT_AFTER_STOP)
    subprocess.run(["cc", "-std=c99", "-O2", "-Wall", "-Wextra", "-Werror",
                    f"-I{fastpath.get_include()}", str(src), "-o", str(exe)], check=True,
                   timeout=60)
    name = uname()
    srv, c = held_server(name)
    p = subprocess.Popen([str(exe), name], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    t = None
    try:
        with deadline(60):
            assert p.stdout.readline() == "ready\n"
            _stuck(c)                  # the drain waits on c: it stays "stopping"
            t = _stop_in_thread(srv)
            p.stdin.write("go\n")
            p.stdin.flush()
            rc, seq = map(int, p.stdout.readline().split())
        # FP_RING_ERR_GONE (-5), nothing sent (it was FP_RING_OK: served by the drain, or
        # never answered once the drain had ended)
        assert (rc, seq) == (-5, 0)
        assert p.wait(timeout=30) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)
        srv.end_drain()
        if t is not None:
            t.join(30)
        c.close()
        srv.stop()


def test_python_client_with_on_full_reject_is_told_the_server_is_stopping():
    name = uname()
    srv, c = held_server(name)
    c2 = fastpath.connect(name, timeout=5)
    t = None
    try:
        with deadline(60):
            _stuck(c)
            t = _stop_in_thread(srv)
            raw = np.zeros(c2.raw_len, np.float32)
            with pytest.raises(ServerGone, match="is stopping: request not sent") as ei:
                c2.submit(raw, 0, 1)
            assert not isinstance(ei.value, RingFull)
            assert c2.outstanding == 0
    finally:
        srv.end_drain()
        if t is not None:
            t.join(30)
        c.close()
        c2.close()
        srv.stop()


def test_end_drain_says_whether_there_was_a_drain_to_end():
    name = uname()
    srv, c = held_server(name)
    t = None
    try:
        with deadline(60):
            _stuck(c)
            t = _stop_in_thread(srv)
            assert srv.end_drain() is True
            t.join(30)
        assert not t.is_alive()
        assert srv.end_drain() is False         # stopped and closed: nothing to end
        assert srv.final_stats["queue_depth"] == 1   # the tick the forced stop left
    finally:
        if t is not None:
            t.join(30)
        c.close()
        srv.stop()


class _Out:
    """stdout for run_foreground: the first line ("serving ...") sends the first signal."""

    def __init__(self):
        self.lines = []

    def write(self, s):
        self.lines.append(s)
        if s.startswith("serving "):
            os.kill(os.getpid(), signal.SIGTERM)

    def flush(self):
        pass


def test_second_signal_after_the_drain_finished_exits_0(monkeypatch, capsys):
    """A signal after the drain completed (stop() returned) ended nothing: exit 0, and no
    claim that requests were left unanswered."""
    real_stop = server_mod.Server.stop

    def stop_then_signal(self, timeout=None):
        real_stop(self, timeout)
        os.kill(os.getpid(), signal.SIGINT)     # the second signal, the drain done
        for _ in range(100):                    # let the handler run here
            time.sleep(0.001)

    monkeypatch.setattr(server_mod.Server, "stop", stop_then_signal)
    name = uname()
    out = _Out()
    with deadline(60):
        rc = server_mod.run_foreground(name, None, cfg(), out=out)
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "the drain was ended" not in err
    assert any(line.startswith(f"stopped '{name}'") for line in out.lines)
    assert not os.path.exists(segment_path(name))


def test_second_signal_while_starting_gives_the_start_up(monkeypatch):
    release = threading.Event()

    def slow_place(self):
        # the start takes long (a placement, a model load): Ctrl-C twice meanwhile
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)
        release.wait(60)
        return {"placed": False, "why": "test"}

    monkeypatch.setattr(server_mod.Server, "_place", slow_place)
    name = uname()
    try:
        with deadline(60):
            # it was ServeError "did not start within 10 s": the second signal did nothing
            with pytest.raises(KeyboardInterrupt):
                server_mod.run_foreground(name, None, cfg(), out=_Out())
    finally:
        release.set()
    with deadline(30):
        while os.path.exists(segment_path(name)):     # closed by the abandoned thread
            time.sleep(0.01)
    # the handlers are restored
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.parametrize("bad", ["5", -1, float("nan"), True])
def test_stop_timeout_is_checked_before_anything_is_stopped(bad):
    name = uname()
    srv = fastpath.serve(name, config=cfg())
    try:
        with pytest.raises(InputError,
                           match=r"Server.stop: timeout must be a finite number of seconds >= 0"):
            srv.stop(timeout=bad)
        assert srv.stats()["state"] == "running"
        with fastpath.connect(name, timeout=5) as c:
            c.step(np.zeros(c.raw_len, np.float32), 0)
    finally:
        srv.stop()
    assert not os.path.exists(segment_path(name))


@pytest.mark.parametrize("bad", ["5", 0, -1, float("nan"), None])
def test_server_start_timeout_is_checked_before_the_start(bad):
    name = uname()
    with pytest.raises(InputError, match=r"start_timeout must be a finite number of seconds > 0"):
        fastpath.Server(name, None, cfg(), start_timeout=bad)
    assert not os.path.exists(segment_path(name))


def test_a_submit_to_a_stopped_server_says_the_tick_was_not_sent():
    name = uname()
    srv = fastpath.serve(name, config=cfg())
    c = fastpath.connect(name, timeout=5)
    try:
        srv.stop()
        # it was "server ... is stopped" alone, whether the tick went out left open
        with pytest.raises(ServerGone, match=r"is stopped: request not sent"):
            c.submit(np.zeros(c.raw_len, np.float32), 0)
        assert c.outstanding == 0
    finally:
        c.close()


def test_step_that_gives_up_on_a_stalled_server_names_the_tick_it_sent(tmp_path):
    name = uname()
    p = serve_cli(tmp_path, name)
    try:
        assert p.stdout.readline().startswith(f"serving '{name}'")
        c = fastpath.connect(name, timeout=5, stall_timeout=0.2)
        raw = np.zeros(c.raw_len, np.float32)
        c.step(raw, 0)                          # seq 1, answered
        os.kill(p.pid, signal.SIGSTOP)
        with deadline(60):
            while not _stopped(p.pid):          # SIGSTOP takes effect asynchronously
                time.sleep(0.001)
            with pytest.raises(ServerGone, match="not responding") as ei:
                c.step(raw, 0)
        # it said nothing of the tick it had sent (a KeyboardInterrupt there carries it)
        assert ei.value.seq == 2
        assert any("sent as seq 2" in n for n in ei.value.__notes__)
        c.close()
    finally:
        os.kill(p.pid, signal.SIGCONT)
        p.terminate()
        p.communicate(timeout=60)


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
        # repr raised ServeError; stats said "is closed" (it serves on, in the parent); the
        # latency records were the child's copy, frozen at the fork
        want = f"Server(name='{name}', state='served by process {os.getpid()}')"
        assert got[0] == f"repr -> {want!r}"
        for line in got[1:]:
            assert f"is run by process {os.getpid()}" in line and "is a fork of it" in line, line
        assert srv.stats()["state"] == "running"
        assert len(srv.latency_records()) == 1
    finally:
        srv.stop()


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


def test_fastpath_serve_says_what_a_drain_that_timed_out_left(tmp_path):
    name = uname()
    p = serve_cli(tmp_path, name, 'ring_slots = 2\non_full = "reject"\ndrain_timeout_ms = 100\n')
    try:
        assert p.stdout.readline().startswith(f"serving '{name}'")
        c = fastpath.connect(name, timeout=5)
        with deadline(60):
            _stuck(c)                           # the drain times out on its held tick
            p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
        c.close()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)
    assert p.returncode == 0, err
    assert f"stopped '{name}': 2 served" in out
    # it said nothing: as if every request had been answered
    assert "drain_timeout_ms = 100 with 1 request(s) clients sent unanswered" in err
