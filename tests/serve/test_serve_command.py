"""The `fastpath serve` command: how it starts, what it prints, and how it stops on SIGTERM,
SIGHUP, a second signal and a stop that times out."""
import errno
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import fastpath
from fastpath._serve import segment_path
from fastpath.serving import server as server_mod
from helpers.serving import PKG_ROOT, _stopped, _stuck, cfg, deadline, run_cli, serve_cli, uname


def test_fastpath_serve_with_a_name_that_is_not_utf8_is_a_usage_error(tmp_path):
    r = run_cli(["serve", "--name", b"md\xff"], tmp_path)
    err = r.stderr.decode(errors="replace")
    assert r.returncode == 2, err
    assert "Traceback" not in err
    assert "server name" in err


def test_second_signal_ends_the_drain_of_fastpath_serve(tmp_path):
    name = uname()
    p = serve_cli(tmp_path, name, 'ring_slots = 2\non_full = "reject"\n'
                                  'drain_timeout_ms = 60000\n')
    try:
        first = p.stdout.readline()
        assert first.startswith(f"serving '{name}'") and "a second one ends its drain" in first
        c = fastpath.connect(name, timeout=5)
        with deadline(60):
            _stuck(c)
            p.send_signal(signal.SIGTERM)
            line = p.stdout.readline()
            while line and not line.startswith("stopping"):
                line = p.stdout.readline()
            assert line.startswith(f"stopping '{name}'")
            while c.server_stats()["state"] != "stopping":
                time.sleep(0.0005)
            p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)       # the drain alone would wait 60 s
        c.close()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)
    assert p.returncode == 130, err
    assert f"stopped '{name}': 2 served" in out
    assert "the drain was ended by a second signal" in err
    assert not os.path.exists(segment_path(name))


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
    """A signal after the drain completed ends nothing: exit 0, and no claim of unanswered
    requests."""
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
            # the second signal gives the start up (not a ServeError after the start timeout)
            with pytest.raises(KeyboardInterrupt):
                server_mod.run_foreground(name, None, cfg(), out=_Out())
    finally:
        release.set()
    with deadline(30):
        while os.path.exists(segment_path(name)):     # closed by the abandoned thread
            time.sleep(0.01)
    # the handlers are restored
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


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


def test_fastpath_serve_stops_on_sighup_and_keeps_serving_under_nohup(tmp_path):
    """Regression: a closed terminal (SIGHUP) killed `fastpath serve` and left its segment in
    /dev/shm."""
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
    """Regression: a "stopping" print failing (EIO, closed pipe) raised before the stop, and
    the loop served on."""


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


def test_fastpath_serve_stops_on_a_sigterm_right_after_a_sigcont(tmp_path):
    """Regression: a SIGTERM handled while the main thread held threading.Event's lock (a
    wait resuming after SIGCONT) deadlocked `fastpath serve`.

    The window is narrow; this repeats the sequence that opened it."""
    for _ in range(4):
        name = uname()
        p = serve_cli(tmp_path, name)
        try:
            assert p.stdout.readline().startswith(f"serving '{name}'")
            os.kill(p.pid, signal.SIGSTOP)
            t0 = time.monotonic()
            while not _stopped(p.pid) and time.monotonic() - t0 < 30:
                time.sleep(0.001)
            time.sleep(0.25)                    # the 0.2 s wait times out while stopped
            os.kill(p.pid, signal.SIGCONT)
            p.terminate()
            out, err = p.communicate(timeout=30)
        finally:
            p.kill()
            p.wait()
        assert p.returncode == 0, err
        assert f"stopped '{name}'" in out
        assert not os.path.exists(segment_path(name))


def test_fastpath_serve_stops_cleanly_on_sigterm(tmp_path):
    conf = tmp_path / "serve.toml"
    conf.write_text('[serve]\nplace = false\nidle = "yield"\n')
    name = uname()
    env = dict(os.environ, PYTHONPATH=PKG_ROOT)
    p = subprocess.Popen([sys.executable, "-m", "fastpath.cli", "serve", "--name", name,
                          "--config", str(conf), "--stats"], stdout=subprocess.PIPE, env=env,
                         text=True, cwd=PKG_ROOT)
    try:
        assert p.stdout.readline().startswith(f"serving '{name}'")
        with fastpath.connect(name, timeout=5) as c:
            raw = np.zeros(c.raw_len, np.float32)
            for i in range(10):
                c.step(raw, 0, 1000 * (i + 1))
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=20)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)
    assert p.returncode == 0
    assert f"stopped '{name}': 10 served, 0 errors" in out
    assert not os.path.exists(segment_path(name))
