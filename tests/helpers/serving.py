"""Serving test helpers: configs, unique segment names, deadlines, server and child processes,
raw access to the segment's client table, and waits on the server's loop (heartbeats) instead
of fixed sleeps."""
from contextlib import contextmanager
import mmap
import os
import signal
import struct
import subprocess
import sys
import textwrap
import time
import uuid

import numpy as np

from fastpath._serve import segment_path
import fastpath


def raw_zero():
    return np.zeros(fastpath.get_default_engine().raw_len, np.float32)


# ------------------------------------------------------------------ a client's rings taken back
# offsets in fp_seg_header (fastpath/include/fp_ring.h): the client table starts after the
# placement report; each entry is one 64-byte line, state (u32) then pid (i32)
CLIENTS_OFF = 8576


def _entry(m, idx):
    return struct.unpack_from("<Ii", m, CLIENTS_OFF + 64 * idx)


def _dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait(timeout=30)
    return p.pid


def serve_cli(tmp_path, name, serve_toml="", args=(), **popen):
    """`fastpath serve --name name` in a child process (unplaced, idle = "yield"), its
    [serve] table extended by serve_toml; args: more options; stdout and stderr piped as
    text; popen: more subprocess.Popen arguments."""
    conf = tmp_path / "serve.toml"
    conf.write_text('[serve]\nplace = false\nidle = "yield"\n' + serve_toml)
    env = dict(os.environ, PYTHONPATH=PKG_ROOT)
    return subprocess.Popen([sys.executable, "-m", "fastpath.cli", "serve", "--name", name,
                             "--config", str(conf), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, text=True, cwd=PKG_ROOT, **popen)


def held_server(name):
    """A server whose drain can be held (2-slot rings, on_full "reject", a 60 s drain) and
    one client of it: (srv, c); _stuck(c) then holds the drain."""
    srv = fastpath.serve(name, config=cfg(ring_slots=2, on_full="reject",
                                          drain_timeout_ms=60_000))
    try:
        return srv, fastpath.connect(name, timeout=5)
    except BaseException:
        srv.stop()
        raise


def _stuck(c):
    """Leave c (its server's rings 2 slots) with its reply ring full and one request the
    drain must wait for."""
    raw = np.zeros(c.raw_len, np.float32)
    for i in range(2):          # answered: the reply ring (2 slots) is full
        c.submit(raw, 0, i + 1)
    while c.server_stats()["served"] < 2:
        time.sleep(0.0005)
    c.submit(raw, 0, 3)         # held: the drain waits for room in c's reply ring


def _stopped(pid):
    """Every thread of pid stopped (SIGSTOP takes effect asynchronously)."""
    for t in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{t}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] not in "Tt":
                return False
    return True


_OFF_CLIENTS, _ENTRY = 8576, 64           # fp_client_entry: state u32, pid i32, gen, served


def _store(path, off, fmt, *values):
    """One store into the live segment from a second mapping, as another process makes it."""
    with open(path, "r+b") as f:
        m = mmap.mmap(f.fileno(), 0)
        try:
            struct.pack_into(fmt, m, off, *values)
        finally:
            m.close()


def _load(path, off, fmt):
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        try:
            return struct.unpack_from(fmt, m, off)
        finally:
            m.close()


# kind to a shared 2-core host: the worker yields once idle for 50 us; no pinning in tests
BASE = {"engine": {"n_symbols": 16}, "serve": {"place": False, "idle": "yield",
                                                "idle_spin_ns": 50_000}}


# where the imported fastpath lives (site-packages, or the checkout for an editable install):
# child processes must import the same build, not the source tree beside the tests
PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(fastpath.__file__)))


def cfg(engine=None, **serve):
    """The test config: BASE with `engine` merged into its [engine] table, `serve` into its
    [serve] table."""
    return {"engine": {**BASE["engine"], **(engine or {})}, "serve": {**BASE["serve"], **serve}}


def run_cli(args, tmp_path, timeout=120, **kw):
    """`python -m fastpath.cli *args` run in tmp_path (outside the checkout), the imported
    fastpath's root on PYTHONPATH; output captured as bytes."""
    env = dict(os.environ, PYTHONPATH=PKG_ROOT)
    return subprocess.run([sys.executable, "-m", "fastpath.cli", *args], capture_output=True,
                          env=env, cwd=tmp_path, timeout=timeout, **kw)


def uname():
    return f"test-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@contextmanager
def deadline(seconds):
    """Raise TimeoutError in this thread if the block runs longer than `seconds`."""
    def boom(*_):
        raise TimeoutError(f"took longer than {seconds} s")
    old = signal.signal(signal.SIGALRM, boom)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def ticks(n, raw_len, seed=0):
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((8, raw_len)).astype(np.float32)
    # small moves around a few levels, so a cached model gets hits as well as misses
    return np.ascontiguousarray(base[rng.integers(0, 8, n)]
                                + 0.01 * rng.standard_normal((n, raw_len)).astype(np.float32))


SERVER = textwrap.dedent("""
    import json, sys, fastpath
    serve = {"place": False, "idle": "yield", "idle_spin_ns": 50000, **json.loads(sys.argv[2])}
    srv = fastpath.serve(sys.argv[1], config={"serve": serve})
    print("ready", flush=True)
    sys.stdin.read()
""")


@contextmanager
def server_process(name, **serve):
    import json
    env = dict(os.environ, PYTHONPATH=PKG_ROOT)
    p = subprocess.Popen([sys.executable, "-c", SERVER, name, json.dumps(serve)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, env=env, text=True, cwd=PKG_ROOT)
    try:
        assert p.stdout.readline().strip() == "ready"
        yield p
    finally:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)
        if os.path.exists(segment_path(name)):
            os.unlink(segment_path(name))


def _wait_stopped(pid, limit_s=5.0):
    """Until every thread of pid is in state T (stopped) in /proc."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        states = []
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
            except OSError:
                continue
        if states and all(st in ("T", "t") for st in states):
            return
        time.sleep(0.001)
    raise AssertionError(f"process {pid} did not stop within {limit_s} s")


# fp_client_entry.state values (fastpath/include/fp_ring.h)
CL_FREE, CL_CLAIMED, CL_ACTIVE, CL_CLOSING = 0, 1, 2, 3


def store_entry(path, idx, state, pid):
    """Client table entry idx set to (state, pid) in one 8-byte store, as a claim's
    compare-and-swap makes it: no reap pass of the loop can run between the two halves."""
    import ctypes
    with open(path, "r+b") as f:
        m = mmap.mmap(f.fileno(), 0)
        try:
            word = ctypes.c_uint64.from_buffer(m, CLIENTS_OFF + 64 * idx)
            word.value = (state & 0xFFFFFFFF) | ((pid & 0xFFFFFFFF) << 32)
            del word
        finally:
            m.close()


def wait_beats(srv, k, timeout=30.0, each=None):
    """Return once the server's loop has beaten k more times (its heartbeat age fell k times:
    each beat restarts it, and each beat is followed by a reap pass); each(), if given, is
    called between two looks."""
    end = time.monotonic() + timeout
    prev, seen = srv.stats()["heartbeat_age_ns"], 0
    while seen < k:
        assert time.monotonic() < end, f"the loop beat {seen} of {k} times in {timeout} s"
        if each is not None:
            each()
        age = srv.stats()["heartbeat_age_ns"]
        seen += age < prev
        prev = age
        time.sleep(0.0005)


def wait_loop_time(srv, seconds, timeout=60.0):
    """Return once the server's loop has run for `seconds` by its own clock from now and
    beaten twice after that (so a reap pass saw the slots that late): for checks that
    something does NOT happen within a grace the loop measures."""
    end = time.monotonic() + timeout
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        assert time.monotonic() < end
        time.sleep(0.005)
    wait_beats(srv, 2, timeout=max(1.0, end - time.monotonic()))


# the tests/ directory, for child processes that import helpers
TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# the test config as JSON text, for scripts run in a child process
CFG_JSON = ('{"engine": {"n_symbols": 16}, "serve": {"place": False, "idle": "yield", '
            '"idle_spin_ns": 50000}}')


class Interrupt(Exception):
    """Raised by a stand-in for a KeyboardInterrupt at a chosen point (never an OSError, so
    nothing on the way catches it)."""


def python_c(code, *args, timeout=120, **kw):
    """`python -c code *args` in the imported fastpath's root, output captured as text."""
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True,
                          text=True, cwd=PKG_ROOT, env=dict(os.environ, PYTHONPATH=PKG_ROOT),
                          timeout=timeout, **kw)


def fork_child(fn):
    """Run fn() in a forked child; its outcome (a string) comes back through a pipe; the
    child leaves with os._exit (under pytest a SystemExit would resume the tests in the child)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            out = fn()
        except BaseException as exc:       # noqa: BLE001 - reported to the parent
            out = f"{type(exc).__name__}: {exc}"
        os.write(w, str(out).encode()[:4000])
        os.close(w)
        os._exit(0)
    os.close(w)
    with deadline(60):
        _, status = os.waitpid(pid, 0)
        text = os.read(r, 4096).decode()
    os.close(r)
    assert os.WIFEXITED(status), status
    return text


def stop_in_thread(srv, timeout=60.0):
    """srv.stop() in a thread, returned once the server's state reads "stopping"."""
    import threading
    t = threading.Thread(target=srv.stop)
    t.start()
    end = time.monotonic() + timeout
    while srv.stats()["state"] != "stopping":
        assert time.monotonic() < end, "the server never began its stop"
        time.sleep(0.001)
    return t


def compile_producer(out_dir, name, source, std="c99", include=None, libs=()):
    """A C producer built against fastpath/include/fp_ring.h (or `include`): `source` is C text
    (written to out_dir/name.c) or the path of a .c file; warnings are errors. -> the
    executable's path."""
    if isinstance(source, str) and "\n" in source:
        src = os.path.join(out_dir, f"{name}.c")
        with open(src, "w") as f:
            f.write(source)
    else:
        src = str(source)
    exe = os.path.join(out_dir, name)
    subprocess.run(["cc", f"-std={std}", "-O2", "-Wall", "-Wextra", "-Werror",
                    f"-I{include or fastpath.get_include()}", src, "-o", exe, *libs],
                   check=True, timeout=120)
    return exe
