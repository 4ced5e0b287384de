"""Review 24: the serving loop and the command line (serve, doctor, calibrate) under input
and situations a demanding user meets: each test failed before its fix.

Nothing asserts on wall-clock time; waits in this process run under an alarm, subprocesses
under a timeout, and the `fastpath` command runs with its cwd outside the checkout and the
imported fastpath's root on PYTHONPATH (the installed package in CI).
"""
import gc
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import fastpath
from fastpath import ConfigError, InputError
from fastpath._serve import segment_path
from helpers.serving import deadline, uname

# kind to a shared 2-core host: the worker yields once idle for 50 us; no pinning in tests
BASE = {"engine": {"n_symbols": 16}, "serve": {"place": False, "idle": "yield",
                                                "idle_spin_ns": 50_000}}
PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(fastpath.__file__)))


def cfg(engine=None, **serve):
    return {"engine": {**BASE["engine"], **(engine or {})}, "serve": {**BASE["serve"], **serve}}


def cli(args, tmp_path, timeout=120, **kw):
    env = dict(os.environ, PYTHONPATH=PKG_ROOT)
    return subprocess.run([sys.executable, "-m", "fastpath.cli", *args], capture_output=True,
                          env=env, cwd=tmp_path, timeout=timeout, **kw)


# ------------------------------------------------------------------ server names
@pytest.mark.parametrize("call", ["serve", "connect"])
def test_a_server_name_that_is_not_utf8_is_an_input_error(call):
    """A name from a shell argument holding a byte that is not UTF-8 ('\\udcff' once Python
    decoded it) raised UnicodeEncodeError from deep in the bindings."""
    name = "md\udcff"
    with pytest.raises(InputError, match="server name"):
        if call == "serve":
            fastpath.serve(name, config=cfg())
        else:
            fastpath.connect(name, timeout=0)


def test_cli_serve_with_a_name_that_is_not_utf8_is_a_usage_error(tmp_path):
    r = cli(["serve", "--name", b"md\xff"], tmp_path)
    err = r.stderr.decode(errors="replace")
    assert r.returncode == 2, err
    assert "Traceback" not in err
    assert "server name" in err


# ------------------------------------------------------------------ config honoured
def test_serve_refuses_a_config_asking_for_the_gpu_backend():
    """[engine] backend = "gpu" was dropped without a word: the worker always steps a CPU
    engine, and the config said otherwise."""
    name = uname()
    with pytest.raises(ConfigError, match=r"engine\.backend = 'gpu'"):
        fastpath.serve(name, config=cfg(engine={"backend": "gpu"}))
    assert not os.path.lexists(segment_path(name))


# ------------------------------------------------------------------ --stats figures
def _pcts(col):
    p50, p99 = np.percentile(col, [50, 99])
    return f"{p50:.0f}/{p99:.0f}"


def test_stats_line_reports_no_latency_for_an_interval_of_refused_ticks_only():
    """A refused tick counts in `served` but writes no latency record: a second of refused
    ticks only reported the percentiles of ticks served in earlier seconds."""
    from fastpath.serving.server import _stats_line
    name = uname()
    raw = np.zeros(256, np.float32)
    with fastpath.serve(name, config=cfg()) as srv, fastpath.connect(name, timeout=5) as c, \
            deadline(60):
        for i in range(5):
            c.step(raw, 0, 1_000_000 * (i + 1))
        line, prev = _stats_line(srv, {}, 1.0)
        lat = srv.latency_records()
        assert len(lat) == 5
        assert f"total p50/p99 {_pcts(lat[:, 3])} ns" in line
        for _ in range(3):
            with pytest.raises(InputError, match="earlier than"):
                c.step(raw, 0, 1)
        line, prev = _stats_line(srv, prev, 1.0)
        assert "errors 3" in line
        assert "p50/p99" not in line, line
        # one served, two refused: the one served tick's record alone
        c.step(raw, 0, 10_000_000)
        for _ in range(2):
            with pytest.raises(InputError):
                c.step(raw, 0, 1)
        line, prev = _stats_line(srv, prev, 1.0)
        last = srv.latency_records()[-1:]
        assert f"total p50/p99 {_pcts(last[:, 3])} ns" in line, line
        # the previous read fell between the loop's update of served and of errors (served
        # has a batch's two refusals, errors not yet): this second answered nothing
        torn = dict(prev, errors=prev["errors"] - 2)
        line, _ = _stats_line(srv, torn, 1.0)
        assert "p50/p99" not in line, line


def test_stats_line_leaves_out_stages_that_are_not_timed():
    """With [engine] stage_times = false the feature and cache columns of the records are 0
    (not measured): --stats printed them as 'feature p50/p99 0/0 ns'."""
    from fastpath.serving.server import _stats_line
    name = uname()
    raw = np.zeros(256, np.float32)
    with fastpath.serve(name, config=cfg(engine={"stage_times": False})) as srv, \
            fastpath.connect(name, timeout=5) as c, deadline(60):
        for i in range(4):
            c.step(raw, i, 1_000_000)
        line, _ = _stats_line(srv, {}, 1.0)
        lat = srv.latency_records()
    assert "feature p50" not in line and "cache p50" not in line, line
    assert f"total p50/p99 {_pcts(lat[:, 3])} ns" in line
    assert f"wait p50/p99 {_pcts(lat[:, 4])} ns" in line


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


class _Interrupt(Exception):
    pass


def test_connect_interrupted_while_waiting_for_a_slot_unmaps_the_segment():
    """Ctrl-C (or any exception from a signal handler) while connect waited for a free
    client slot left the segment mapped in the process for good: after the server removed
    it, its memory in /dev/shm stayed taken until the process exited."""
    name = uname()
    srv = fastpath.serve(name, config=cfg(max_clients=1))
    try:
        st = os.stat(segment_path(name))
        ident = (st.st_dev, st.st_ino)
        c1 = fastpath.connect(name, timeout=5)

        def boom(*_):
            raise _Interrupt()
        old = signal.signal(signal.SIGALRM, boom)
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        try:
            with pytest.raises(_Interrupt):
                fastpath.connect(name, timeout=60)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        c1.close()
    finally:
        srv.stop()
    gc.collect()
    assert _maps_of(ident) == 0


# ------------------------------------------------------------------ doctor
def test_doctor_jitter_does_not_claim_a_core_it_could_not_pin_to(monkeypatch, capsys):
    """--jitter on a core the process may not run on (a container's cpuset: the host's CPUs
    are online, sched_setaffinity refuses them) said 'cannot pin' on stderr, then reported
    the histogram as measured on that core, in the JSON "cpu" too."""
    from fastpath import cli
    from fastpath.control.host import format_cpulist
    here = sorted(os.sched_getaffinity(0))

    def refuse(pid, cpus):
        raise OSError(22, "Invalid argument")
    monkeypatch.setattr(os, "sched_setaffinity", refuse)
    rc = cli.main(["doctor", "--core", str(here[0]), "--jitter", "0.02", "--json"])
    out = capsys.readouterr()
    assert rc in (0, 1), out.err
    j = json.loads(out.out)["jitter"]
    assert j["cpu"] is None
    assert j["ran_on"] == format_cpulist(here)
    assert f"cannot pin to CPU {here[0]}" in out.err
    rc = cli.main(["doctor", "--core", str(here[0]), "--jitter", "0.02"])
    assert f"not pinned to CPU {here[0]}" in capsys.readouterr().out


# ------------------------------------------------------------------ liveness under load
def test_a_server_working_through_a_backlog_is_not_called_stalled():
    """The loop read its clock every 64 rounds, and a busy round lasts as long as its
    requests: behind a backlog of a model taking about 1 ms a tick the heartbeat went
    unbeaten for seconds, and a client waiting for its answer got ServerGone ('not
    responding ... stopped by a signal or a debugger?') from a healthy server."""
    from helpers.builders import random_model
    from fastpath.model import CachePolicy
    rng = np.random.default_rng(24)
    m = random_model(rng, [1024, 2048, 2048, 2], policy=CachePolicy(enabled=False))
    raw = rng.standard_normal(1024).astype(np.float32)
    want = fastpath.Engine(m, config={"engine": {"n_symbols": 16}}).step(raw, 1).signal
    name = uname()
    with fastpath.serve(name, m, cfg(ring_slots=2048)), \
            fastpath.connect(name, timeout=5, stall_timeout=1.0) as c, deadline(120):
        for _ in range(2000):
            c.submit(raw, 0)
        r = c.step(raw, 1)
        assert r.signal == want
        assert len(c.poll()) == 2000


# ------------------------------------------------------------------ doctor's pool check
@pytest.mark.parametrize("huge,pools,want", [
    # a 3 MB arena and a 2.3 MB segment take 2 + 2 pages of 2 MB, not ceil(5.3 MB) = 3
    ("auto", {"2048kB": (3, 3)}, "warn"),
    ("auto", {"2048kB": (4, 4)}, "pass"),
    # and one 1 GB page each, not one for both
    ("1g", {"1048576kB": (1, 1), "2048kB": (0, 0)}, "warn"),
    ("1g", {"1048576kB": (2, 2)}, "pass"),
])
def test_doctor_hugetlb_pool_rounds_each_mapping_to_pages(tmp_path, huge, pools, want):
    """The pool check summed the engine arena's and the serve segment's bytes and rounded
    once; each is its own mapping rounded up to whole pages, so a pool one page short of
    what the two take passed."""
    from fastpath.control import doctor
    from fastpath.control.host import Host
    from fastpath.control.memory import serve_segment_bytes
    files = {"proc/meminfo": "MemTotal: 1000 kB\n", "sys/devices/system/cpu/online": "0-1",
             "sys/devices/system/cpu/possible": "0-1"}
    for size, (free, total) in pools.items():
        files[f"sys/kernel/mm/hugepages/hugepages-{size}/free_hugepages"] = str(free)
        files[f"sys/kernel/mm/hugepages/hugepages-{size}/nr_hugepages"] = str(total)
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    seg = serve_segment_bytes(256, 2048, 1)
    assert 2 << 20 < seg < 3 << 20
    res = doctor.run_checks(Host(str(tmp_path)), core=0, policy="other", priority=0,
                            config={"memory": {"huge_pages": huge},
                                    "serve": {"ring_slots": 2048, "max_clients": 1}},
                            arena_bytes=3 << 20, serve=True, raw_len=256)
    check = {c["name"]: c for c in res["checks"]}["hugetlb_pool"]
    assert check["status"] == want, check


# ------------------------------------------------------------------ calibrate --out
@pytest.mark.parametrize("out,says", [
    ("m.onnx", "names an ONNX file"),
    (".", "is a directory"),
    ("no/such/dir/m.fpm", "no directory"),
])
def test_calibrate_refuses_an_unwritable_out_before_fitting(tmp_path, out, says):
    """--out was first tried after the whole fit (minutes with --max-error): a .onnx name or
    a directory was refused then, and a missing folder was reported under the name of the
    save's temp file ('m.fpm.tmp1234.5678')."""
    from fastpath._build import DEMO_MODEL
    rng = np.random.default_rng(0)
    np.save(tmp_path / "t.npy", rng.normal(100, 1, (64, 256)).astype(np.float32))
    r = cli(["calibrate", "--ticks", "t.npy", "--model", DEMO_MODEL, "--out", out], tmp_path)
    err = r.stderr.decode()
    assert r.returncode == 2, err
    assert "--out" in err and says in err, err
    assert ".tmp" not in err
    assert "feature spec" not in r.stdout.decode()        # refused before the fit


# ------------------------------------------------------------------ stop
def test_stop_waits_for_the_drain_the_config_allows():
    """stop() gave up after a fixed 10 s while [serve] drain_timeout_ms (up to 60 s) kept the
    loop waiting for a client that does not take its answers: ServeError, and the segment
    was left in /dev/shm (`fastpath serve` on SIGTERM exited 2)."""
    name = uname()
    # "reject": a submit never takes replies off the ring while it waits for room
    srv = fastpath.serve(name, config=cfg(ring_slots=2, on_full="reject",
                                          drain_timeout_ms=10_050))
    c = fastpath.connect(name, timeout=5)
    raw = np.zeros(c.raw_len, np.float32)
    with deadline(60):
        for i in range(2):         # answered: the reply ring is full
            c.submit(raw, 0, i + 1)
        while srv.stats()["served"] < 2:
            pass
        for i in range(2, 4):      # held behind the full reply ring
            c.submit(raw, 0, i + 1)
        srv.stop()
    assert not srv.running
    assert not os.path.lexists(segment_path(name))
    assert srv.final_stats["served"] == 2
    c.close()


# ------------------------------------------------------------------ calibrate --weights
def test_calibrate_weights_measures_a_model_that_already_has_them(tmp_path):
    """--weights bf16 on a bf16 bundle printed nothing, where the help (and the README)
    promise the signal error against fp32 weights measured on the ticks."""
    from fastpath._build import DEMO_MODEL
    from fastpath.model import Model
    from fastpath.tuning import weights_error
    Model.load(DEMO_MODEL).with_weights("bf16").save(tmp_path / "b.fpm")
    rng = np.random.default_rng(3)
    raws = rng.normal(100, 1, (300, 256)).astype(np.float32)
    np.save(tmp_path / "t.npy", raws)
    r = cli(["calibrate", "--ticks", "t.npy", "--model", "b.fpm", "--out", "o.fpm",
             "--weights", "bf16"], tmp_path)
    out = r.stdout.decode()
    assert r.returncode == 0, r.stderr.decode()
    m = Model.load(tmp_path / "o.fpm")
    assert m.weights == "bf16"
    e = weights_error(m, raws, "bf16")
    assert (f"weights: bf16 hidden layers (signal against fp32 on these ticks: max |d| "
            f"{e['max_abs']:.4g} (tick {e['worst_tick']})") in out, out


# ------------------------------------------------------------------ one name, one server
def test_a_segment_another_server_is_still_creating_is_not_replaced():
    """Two servers started under one name at once: the second found the first's file
    between its creation and its header (the magic is written last), removed it as an
    "unreadable" leftover and served its own, while the first served a file nobody could
    reach. The file stands in for the first server's (zeros, just made)."""
    from fastpath import ServeError
    name = uname()
    path = segment_path(name)
    with open(path, "wb") as f:
        f.write(bytes(64 << 10))
    try:
        with pytest.raises(ServeError, match="another server is creating"):
            fastpath.serve(name, config=cfg())
        assert os.path.getsize(path) == 64 << 10          # left to its maker
        # a crashed start's leftover (the same zeros, old) is replaced as before
        old = os.stat(path).st_mtime - 60
        os.utime(path, (old, old))
        with fastpath.serve(name, config=cfg()) as srv, fastpath.connect(name) as c:
            assert srv.replaced == "unreadable"
            assert c.step(np.zeros(c.raw_len, np.float32), 0, 100).seq == 1
    finally:
        if os.path.lexists(path):
            os.unlink(path)


def test_a_stopping_server_draining_a_backlog_is_not_called_stalled():
    """The drain answered every accepted request in one round, the heartbeat unbeaten for
    as long as that took: behind a backlog of ~1 ms ticks a client taking its answers got
    ServerGone ('not responding') before they came. All of them come, each as a local
    engine answers the same tick (drain_timeout_ms, shorter than the backlog, bounds only a
    wait that makes no progress)."""
    from helpers.builders import random_model
    from fastpath.model import CachePolicy
    rng = np.random.default_rng(24)
    m = random_model(rng, [1024, 2048, 2048, 2], policy=CachePolicy(enabled=False))
    raws = rng.standard_normal((4, 1024)).astype(np.float32)
    eng = fastpath.Engine(m, config={"engine": {"n_symbols": 16}})
    want = [eng.step(raws[i], i).signal for i in range(4)]
    name = uname()
    srv = fastpath.serve(name, m, cfg(ring_slots=2048, drain_timeout_ms=100))
    try:
        with fastpath.connect(name, timeout=5, stall_timeout=0.5) as c, deadline(120):
            for k in range(1500):
                c.submit(raws[k % 4], k % 4)
            srv._worker.stop()          # ask for the drain without waiting for it
            got = []
            while len(got) < 1500:
                got += c.poll()
        assert [seq for seq, _ in got] == list(range(1, 1501))
        assert [r.signal for _, r in got] == [want[k % 4] for k in range(1500)]
    finally:
        srv.stop()


def test_two_servers_replacing_one_crashed_segment_do_not_remove_each_other(tmp_path,
                                                                             monkeypatch):
    """Two servers replacing the segment of a crashed one at the same moment: the second
    removed "the crashed segment" by its name, after the first had already replaced it,
    so it removed the first's new segment and served its own; the first went on serving a
    file nobody could reach. Now the second removes only the file it judged, and finds the
    name taken."""
    from fastpath import ServeError
    from fastpath.serving import segment as segmod
    name = uname()
    env = dict(os.environ, PYTHONPATH=PKG_ROOT)
    code = ("import sys, time, fastpath\n"
            "srv = fastpath.serve(sys.argv[1], config={'serve': {'place': False, "
            "'idle': 'sleep'}})\nprint('ready', flush=True)\ntime.sleep(120)\n")
    p = subprocess.Popen([sys.executable, "-c", code, name], stdout=subprocess.PIPE, env=env,
                         cwd=tmp_path, text=True)
    try:
        assert p.stdout.readline() == "ready\n"
    finally:
        p.kill()
        p.wait(timeout=30)
    assert os.path.exists(segment_path(name))          # left by the crash
    real_remove = segmod.remove
    first = {}

    def racing_remove(path, ident=None):
        if path == segment_path(name) and "srv" not in first:
            # the other server, started at the same moment, replaces the crashed one first
            first["srv"] = None
            first["srv"] = fastpath.serve(name, config=cfg())
        return real_remove(path, ident)
    monkeypatch.setattr(segmod, "remove", racing_remove)
    try:
        with pytest.raises(ServeError, match="at the same time"):
            fastpath.serve(name, config=cfg())
        srv = first["srv"]
        assert srv.replaced == p.pid
        with fastpath.connect(name, timeout=5) as c, deadline(60):
            c.step(np.zeros(c.raw_len, np.float32), 0, 100)
        assert srv.stats()["served"] == 1          # its segment is the one clients reach
    finally:
        if first.get("srv") is not None:
            first["srv"].stop()
        if os.path.lexists(segment_path(name)):
            os.unlink(segment_path(name))


def test_connect_to_a_stopping_server_says_it_is_stopping():
    """connect() to a server draining on stop waited out its whole timeout, then said that
    no server was serving the name."""
    from fastpath import ServerGone
    name = uname()
    srv = fastpath.serve(name, config=cfg(ring_slots=2, on_full="reject",
                                          drain_timeout_ms=30_000))
    try:
        with fastpath.connect(name, timeout=5) as stuck, deadline(60):
            raw = np.zeros(stuck.raw_len, np.float32)
            for i in range(2):          # answered: the reply ring is full
                stuck.submit(raw, 0, i + 1)
            while srv.stats()["served"] < 2:
                pass
            stuck.submit(raw, 0, 3)     # held: the drain waits for it
            srv._worker.stop()
            while srv.stats()["state"] != "stopping":
                pass
            with pytest.raises(ServerGone, match=f"server '{name}' .* is stopping"):
                fastpath.connect(name, timeout=2)
    finally:
        srv.stop()          # the stuck client closed: the drain ends


def test_connect_to_a_server_still_starting_says_so():
    """A segment whose server had not started its loop by connect's timeout was reported as
    'no server is serving' the name."""
    from fastpath import ServeError
    from fastpath._build import DEMO_MODEL, resolve
    from fastpath._serve import Worker
    name = uname()
    m, rc, _, _ = resolve(DEMO_MODEL, "cpu", cfg())
    w = Worker(name, m, rc, rc.source.serve, rc.source.memory)       # its loop never runs
    try:
        assert w.state == "starting"
        with pytest.raises(ServeError, match=f"server '{name}' .* did not start serving"):
            fastpath.connect(name, timeout=0.2)
    finally:
        w.close()
    assert not os.path.lexists(segment_path(name))


# ------------------------------------------------------------------ host figures
def test_busy_fraction_does_not_count_guest_time_twice(tmp_path):
    """/proc/stat's guest and guest_nice columns are already inside user and nice: summed
    again, a CPU that ran a VM for 20 of 100 jiffies read as 33% busy, and doctor failed
    the SMT sibling check (> 25%) of a core that was 20% busy."""
    from fastpath.control.host import Host
    stat = tmp_path / "proc" / "stat"
    stat.parent.mkdir(parents=True)
    host = Host(str(tmp_path))
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  0 0 0 0 0 0 0 0 0 0\ncpu0 0 0 0 0 0 0 0 0 0 0\n")
    a = host.cpu_times()
    stat.write_text("cpu  20 0 0 80 0 0 0 0 20 0\ncpu0 20 0 0 80 0 0 0 0 20 0\n")
    b = host.cpu_times()
    busy = (b[0][0] - a[0][0]) / (b[0][1] - a[0][1])
    assert busy == pytest.approx(0.20)


def test_a_fifo_planted_under_the_name_does_not_hang_the_server():
    """/dev/shm is writable by every user: a named pipe under a segment's name is replaced,
    never opened in a way that waits for a writer."""
    name = uname()
    path = segment_path(name)
    os.mkfifo(path)

    def boom(*_):
        raise _Interrupt("the server's start hung on the FIFO")     # no OSError: never caught
    old = signal.signal(signal.SIGALRM, boom)
    signal.setitimer(signal.ITIMER_REAL, 20)
    try:
        with fastpath.serve(name, config=cfg()) as srv, fastpath.connect(name) as c:
            assert srv.replaced == "unreadable"
            assert c.step(np.zeros(c.raw_len, np.float32), 0, 100).seq == 1
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        if os.path.lexists(path):
            os.unlink(path)


def test_doctor_jitter_stops_on_ctrl_c(tmp_path):
    """The probe spun in C for all of --jitter (up to an hour) without looking at signals:
    Ctrl-C did nothing until it ended, then printed a traceback. It stops within a piece
    (a second) and says it was interrupted."""
    env = dict(os.environ, PYTHONPATH=PKG_ROOT)
    p = subprocess.Popen([sys.executable, "-m", "fastpath.cli", "doctor", "--jitter", "120"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=tmp_path,
                         text=True)
    try:
        import time
        time.sleep(3)                 # the checks, then the probe
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)
    assert p.returncode == 130, err
    assert "fastpath doctor: interrupted" in err
    assert "Traceback" not in err


def test_queue_depth_is_never_read_as_negative():
    """The stats read a client's head, then the worker's tail: a request published and taken
    between the two reads (or the slot freed between them) left the tail past the head, and
    the unsigned difference read as 18446744073709551615 requests queued. The cursors are
    set here as such a read sees them, then put back."""
    import mmap
    import struct
    name = uname()
    with fastpath.serve(name, config=cfg()) as srv, fastpath.connect(name) as c, deadline(60):
        c.step(np.zeros(c.raw_len, np.float32), 0, 100)
        slot = srv.stats()["clients"][0]["slot"]
        with open(segment_path(name), "r+b") as f:
            mm = mmap.mmap(f.fileno(), 0)
        try:
            # fp_seg_header: magic, version, header_bytes, raw_len, n_symbols, slots,
            # max_clients, req_slot_bytes, rep_slot_bytes, client_region_bytes
            header_bytes, = struct.unpack_from("<I", mm, 12)
            region, = struct.unpack_from("<Q", mm, 40)
            ctl = header_bytes + slot * region
            head, = struct.unpack_from("<Q", mm, ctl)            # req_head.v
            tail, = struct.unpack_from("<Q", mm, ctl + 64)       # req_tail.v
            assert head == tail == 1
            struct.pack_into("<Q", mm, ctl, 0)                   # a head read before the tail
            st = srv.stats()
            struct.pack_into("<Q", mm, ctl, head)
        finally:
            mm.close()
        assert st["queue_depth"] == 0, st["queue_depth"]
        assert st["clients"][0]["queued"] == 0
