"""Defects found in the serving loop and the control plane by a review: each test fails on the
code before its fix.

Every wait is bounded (an alarm in this process, timeouts on child processes), so a hang
fails the test instead of stalling the suite; nothing asserts on wall-clock time.
"""
import json
import mmap
import os
import signal
import struct
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import fastpath
from fastpath import InputError, ServeError
from fastpath._serve import segment_path
from fastpath.control import doctor
from fastpath.control.host import Host, read_topology
from fastpath.serving import segment as seg

# the serve tests' helpers: config, unique segment names, a SIGALRM deadline
from helpers.serving import PKG_ROOT, _wait_stopped, cfg, deadline, uname  # noqa: E402
from helpers.serving import CLIENTS_OFF, _dead_pid, _entry, raw_zero  # noqa: F401


# ------------------------------------------------------------------ per-tick errors by poll()
def test_poll_error_names_the_ticks_own_symbol_and_ts():
    """An error taken by poll() said "symbol -1" and "the engine clock (no ts_ns given)" for a
    tick sent with symbol 2 and ts_ns 500: the reply names only its seq, and the client did
    not keep what it had sent."""
    name = uname()
    raw = raw_zero()
    with fastpath.serve(name, None, cfg()), fastpath.connect(name) as c:
        c.step(raw, 2, 1000)
        s_ok = c.submit(raw, 3, 10)
        s_bad = c.submit(raw, 2, 500)
        s_none = c.submit(raw, 2)          # the engine clock: no ts_ns given
        got = {}
        with deadline(5):
            while len(got) < 3:
                got.update(c.poll())
        assert isinstance(got[s_ok], fastpath.Result)
        err = got[s_bad]
        assert isinstance(err, InputError)
        assert "ts_ns 500" in str(err) and "symbol 2 " in str(err), str(err)
        assert "-1" not in str(err)
        # the engine clock (ns since boot, far past 1000) is not earlier: this one passes
        assert isinstance(got[s_none], fastpath.Result)


def test_poll_error_records_survive_ring_wrap():
    """The per-request record is indexed by seq: after many ring turns the error still names
    the right tick."""
    name = uname()
    raw = raw_zero()
    with fastpath.serve(name, None, cfg(ring_slots=4)), fastpath.connect(name) as c:
        for i in range(1, 40):
            c.step(raw, i % 5, 1_000_000 + i)
        c.submit(raw, 1, 999)              # earlier than symbol 1's last tick
        c.submit(raw, 7, 2_000_000)
        got = {}
        with deadline(5):
            while len(got) < 2:
                got.update(c.poll())
        errs = [v for v in got.values() if isinstance(v, Exception)]
        assert len(errs) == 1 and "ts_ns 999" in str(errs[0]) and "symbol 1 " in str(errs[0])


# ------------------------------------------------------------------ segment ownership
def test_stopping_a_replaced_server_leaves_the_new_servers_segment():
    """A server whose segment file was replaced (an operator removed it, or a new server took
    over the name) removed the new server's file when it stopped: the new server kept running,
    but nobody could connect to it any more."""
    name = uname()
    raw = raw_zero()
    a = fastpath.serve(name, None, cfg())
    os.unlink(a.path)
    b = fastpath.serve(name, None, cfg())
    try:
        a.stop()
        assert os.path.exists(b.path)
        with fastpath.connect(name, timeout=2) as c:
            c.step(raw, 0)
    finally:
        b.stop()
    assert not os.path.exists(b.path)


SERVER = textwrap.dedent("""
    import json, sys, fastpath
    cfg = {"engine": {"n_symbols": 16}, "serve": {"place": False, "idle": "yield",
                                                  **json.loads(sys.argv[2])}}
    srv = fastpath.serve(sys.argv[1], None, cfg)
    print("ready", flush=True)
    sys.stdin.read()
""")


def test_a_stalled_live_server_is_not_replaced():
    """A server stopped by a signal (alive, its loop not beating) was replaced by the next
    `fastpath serve` of the same name: once resumed, two servers ran under one name, its
    clients on the old rings and new ones on the new, each engine seeing part of the feed."""
    name = uname()
    env = dict(os.environ, PYTHONPATH=PKG_ROOT)
    p = subprocess.Popen([sys.executable, "-c", SERVER, name,
                          json.dumps({"stall_timeout_ms": 200})], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, env=env, text=True, cwd=PKG_ROOT)
    try:
        assert p.stdout.readline().strip() == "ready"
        os.kill(p.pid, signal.SIGSTOP)
        _wait_stopped(p.pid)
        time.sleep(0.3)                    # past the stall timeout: the loop counts as stalled
        with pytest.raises(ServeError, match=rf"held by pid {p.pid}.*alive"):
            fastpath.serve(name, None, cfg(stall_timeout_ms=200))
        assert os.path.exists(segment_path(name))
    finally:
        os.kill(p.pid, signal.SIGCONT)
        p.kill()
        p.wait(timeout=10)
        if os.path.exists(segment_path(name)):
            os.unlink(segment_path(name))


def test_mapped_by_reads_this_process_maps(tmp_path):
    path = str(tmp_path / "seg")
    with open(path, "wb") as f:
        f.write(b"\0" * 4096)
    assert seg.mapped_by(os.getpid(), path) is False
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 4096) as m:
        assert seg.mapped_by(os.getpid(), path) is True
        m[0] = 1
    assert seg.mapped_by(os.getpid(), str(tmp_path / "absent")) is None


def _have_own_slot_reaped(srv, m):
    """Slot 0 (this process's, ACTIVE: the offset is right) made to look like a process the
    server cannot find, then until the worker has taken it back."""
    assert _entry(m, 0) == (2, os.getpid())
    struct.pack_into("<i", m, CLIENTS_OFF + 4, _dead_pid())
    with deadline(10):
        while srv.stats()["clients_reaped"] == 0:
            time.sleep(0.001)


def test_client_whose_rings_were_taken_back_gets_an_error_not_a_hang():
    """The worker frees the slot of a client whose pid it cannot see (dead, or in another PID
    namespace: a client in a container without --pid=host). That client then spun forever in
    step(): its requests sat in rings the worker no longer read. And its close() wrote CLOSING
    into the slot, which by then belonged to the next client, ending that client's session."""
    name = uname()
    raw = raw_zero()
    with fastpath.serve(name, None, cfg(max_clients=1)) as srv:
        c = fastpath.connect(name)
        c.step(raw, 0)
        with open(srv.path, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
            _have_own_slot_reaped(srv, m)
            with deadline(10), pytest.raises(ServeError, match="took this client's rings back"):
                c.step(raw, 0)
            with pytest.raises(ServeError, match="closed"):
                c.poll()
            # the slot is free again: the next client gets it
            with fastpath.connect(name) as c2, deadline(10):
                c.close()                                  # must not end c2's session
                del c
                r = c2.step(raw, 1)
                assert r.seq == 1
                time.sleep(0.01)                           # a few heartbeats (reaping)
                assert _entry(m, 0)[0] == 2
                assert c2.step(raw, 1).seq == 2


def test_client_whose_rings_were_taken_back_errors_in_submit_spin():
    """on_full = "spin": a client submitting into rings the worker no longer reads fills its
    ring and spins; it must end with the error too."""
    name = uname()
    raw = raw_zero()
    with fastpath.serve(name, None, cfg(ring_slots=4)) as srv:
        c = fastpath.connect(name)
        c.step(raw, 0)
        with open(srv.path, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
            _have_own_slot_reaped(srv, m)
            with deadline(10), pytest.raises(ServeError, match="rings back"):
                for _ in range(16):
                    c.submit(raw, 0)
        c.close()


# ------------------------------------------------------------------ segment size vs /dev/shm
def test_segment_larger_than_shm_is_refused_up_front(tmp_path):
    """tmpfs files are sparse: a segment larger than /dev/shm could hold (64 MB in a default
    docker container) was created, and the worker's pre-fault of its pages killed the server
    with SIGBUS. It is refused at creation with a message saying what to change."""
    vfs = os.statvfs(seg.SHM_DIR)
    too_big = vfs.f_blocks * vfs.f_frsize + (1 << 30)
    path = os.path.join(seg.SHM_DIR, f"fastpath.{uname()}")
    try:
        with pytest.raises(OSError, match=r"cannot reserve .*ring_slots.*--shm-size"):
            fd, *_ = seg.create(path, too_big, 0o600, "none")
            os.close(fd)
        assert not os.path.exists(path)
    finally:
        if os.path.exists(path):
            os.unlink(path)


def test_server_with_a_segment_too_big_for_shm_is_an_error_in_a_child():
    """The same through `fastpath serve`: an exit with a message, never a signal."""
    vfs = os.statvfs(seg.SHM_DIR)
    # a client region is ring_slots x (request + reply slot); find slots that overflow the fs
    per_slot = 64 + ((64 + 4 * fastpath.get_default_engine().raw_len + 63) // 64) * 64
    slots = 1 << 16
    clients = min(64, max(1, -(-(vfs.f_blocks * vfs.f_frsize + (1 << 30)) // (slots * per_slot))))
    if slots * per_slot * clients <= vfs.f_blocks * vfs.f_frsize:
        pytest.skip(f"{seg.SHM_DIR} is larger than the largest segment the config allows")
    cfgfile = f"/tmp/{uname()}.toml"
    with open(cfgfile, "w") as f:
        f.write(f"[serve]\nring_slots = {slots}\nmax_clients = {clients}\nplace = false\n")
    try:
        env = dict(os.environ, PYTHONPATH=PKG_ROOT)
        p = subprocess.run([sys.executable, "-m", "fastpath.cli", "serve", "--name", uname(),
                            "--config", cfgfile], capture_output=True, text=True, timeout=120,
                           env=env, cwd=PKG_ROOT)
        assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
        assert "cannot reserve" in p.stderr and "Traceback" not in p.stderr
    finally:
        os.unlink(cfgfile)


# ------------------------------------------------------------------ boot-line cpulists
@pytest.mark.parametrize("text,flags,want", [
    ("all", False, list(range(8))),
    ("1-N", False, list(range(1, 8))),
    ("N", False, [7]),
    ("domain,managed_irq,2-3", True, [2, 3]),
    ("nohz,domain,1-N", True, list(range(1, 8))),
    ("0-7:2", False, []),
    ("junk", False, []),
])
def test_boot_cpulist_reads_what_the_kernel_reads(text, flags, want):
    from fastpath.control.host import boot_cpulist
    assert boot_cpulist(text, 7, flags) == want


def test_doctor_on_a_host_booted_with_all_and_n(tmp_path):
    """nohz_full=1-N and rcu_nocbs=all are valid kernel parameters (5.13+): doctor, placement
    and so `fastpath serve` died with a ValueError traceback on such a host."""
    files = {
        "sys/devices/system/cpu/online": "0-3",
        "sys/devices/system/cpu/possible": "0-3",
        "proc/cmdline": "BOOT_IMAGE=/vmlinuz isolcpus=nohz,domain,2-N nohz_full=1-N "
                        "rcu_nocbs=all quiet -- isolcpus=0",
    }
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    host = Host(str(tmp_path))
    topo = read_topology(host)
    assert (topo.isolated, topo.nohz_full, topo.rcu_nocbs) == ([2, 3], [1, 2, 3], [0, 1, 2, 3])
    res = doctor.run_checks(host, core=3, topo=topo)
    by = {c["name"]: c for c in res["checks"]}
    assert by["isolcpus"]["status"] == by["nohz_full"]["status"] == "pass"
    assert by["rcu_nocbs"]["status"] == "pass"


# ------------------------------------------------------------------ EngineConfig sections
@pytest.mark.parametrize("kw,match", [
    ({"serve": {"ring_slots": 3}}, r"serve\.ring_slots must be a power of two, got 3"),
    ({"serve": {"ringslots": 8}}, r"unknown key serve\.ringslots"),
    ({"cache": {"enabled": 1}}, r"cache\.enabled must be bool, got int 1"),
    ({"placement": None}, r"section placement must be a PlacementConfig .*got NoneType"),
    ({"memory": "none"}, r"section memory must be a MemoryConfig .*got str"),
])
def test_engine_config_sections_given_as_tables_are_checked(kw, match):
    """EngineConfig(serve={"ring_slots": 3}) was accepted unchecked (a non-power-of-two ring
    reached the server) or failed later with an AttributeError; it is a ConfigError naming
    the key, as the same table from a TOML file is."""
    from fastpath.control.config import EngineConfig
    with pytest.raises(fastpath.ConfigError, match=match):
        EngineConfig(**kw)


def test_engine_config_sections_given_as_tables_are_used():
    from fastpath.control.config import EngineConfig, ServeConfig
    c = EngineConfig(serve={"ring_slots": 8, "place": False})
    assert isinstance(c.serve, ServeConfig) and c.serve.ring_slots == 8 and not c.serve.place


def test_two_servers_starting_at_once_on_one_name(monkeypatch):
    """Two servers started together both found no live segment; the one that lost the race
    to create the file died with a bare FileExistsError. It is a ServeError naming the
    name, as a live server there is."""
    name = uname()
    real_create = seg.create

    def racing_create(path, *a, **kw):
        # the other server wins: its file appears between the check and the create
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
        return real_create(path, *a, **kw)

    monkeypatch.setattr(seg, "create", racing_create)
    try:
        with pytest.raises(ServeError, match="another server created"):
            fastpath.serve(name, None, cfg())
    finally:
        if os.path.exists(segment_path(name)):
            os.unlink(segment_path(name))


def test_stale_segment_of_a_reused_pid_is_replaced_at_once():
    """A crashed server's pid now belongs to another process (a container restarted: the new
    server is pid 1 again, or any unrelated process): its heartbeat is stale and that process
    does not map the segment. The new server was refused ("already served") until the stall
    timeout ran out; it replaces the segment at once."""
    name = uname()
    srv = fastpath.serve(name, None, cfg())
    with open(srv.path, "rb") as f:
        image = bytearray(f.read())
    srv.stop()
    sleeper = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                               stdin=subprocess.PIPE)
    try:
        # the image reads as a server that was RUNNING when it died, its pid now the sleeper's
        struct.pack_into("<i", image, 56, sleeper.pid)
        with open(srv.path, "wb") as f:
            f.write(image)
        time.sleep(0.1)                     # past dead_after_ms, well inside the stall timeout
        with fastpath.serve(name, None, cfg()) as srv2:
            assert srv2.replaced == sleeper.pid
    finally:
        sleeper.kill()
        sleeper.wait(timeout=10)
        if os.path.exists(segment_path(name)):
            os.unlink(segment_path(name))


def test_placement_and_doctor_on_a_host_with_sys_hidden(tmp_path):
    """With /sys hidden (a hardened container, some sandboxes) no CPU was "online": doctor
    failed and `fastpath serve` refused to start ("no online CPU is allowed"). The CPUs the
    process may run on (/proc/self/status) stand in."""
    from fastpath.control.placement import place
    p = tmp_path / "proc" / "self" / "status"
    p.parent.mkdir(parents=True)
    p.write_text("Name:\tpython\nCpus_allowed:\tf\nCpus_allowed_list:\t0-3\n")
    host = Host(str(tmp_path))
    assert read_topology(host).cpus == [0, 1, 2, 3]
    res = doctor.run_checks(host)
    assert res["core"] in (1, 2, 3)                   # CPU 0 last
    rep = place({"placement": {"policy": "other", "priority": 0}}, host=host, busy={},
                apply_now=False)
    assert rep.core == res["core"]


# ------------------------------------------------------------------ command line
@pytest.mark.parametrize("extra,what", [
    (["--window", "-3"], "--window"),           # was an IndexError traceback from the fit
    (["--window", "0"], "--window"),            # was a RuntimeWarning, then a ModelError
    (["--max-error", "nan"], "--max-error"),    # was checked only after the whole fit
    (["--max-error", "-1"], "--max-error"),
])
def test_calibrate_bad_numbers_are_usage_errors(tmp_path, capsys, extra, what):
    from fastpath import cli
    from fastpath._build import DEMO_MODEL
    ticks = tmp_path / "t.npy"
    np.save(ticks, np.zeros((50, fastpath.get_default_engine().raw_len), np.float32))
    with pytest.raises(SystemExit) as exc:
        cli.main(["calibrate", "--ticks", str(ticks), "--model", DEMO_MODEL,
                  "--out", str(tmp_path / "o.fpm"), *extra])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {what}" in err and "Traceback" not in err
    assert not (tmp_path / "o.fpm").exists()


# ------------------------------------------------------------------ heartbeat of an idle worker
def test_idle_sleeping_server_keeps_beating():
    """idle = "sleep": the loop read the clock every 64 rounds only, so with idle_sleep_ns at
    10 ms a heartbeat came every ~650 ms, and a client waiting for an answer (or connecting)
    called the idle, healthy server "not responding" once the beat was older than
    stall_timeout_ms."""
    name = uname()
    raw = raw_zero()
    conf = cfg(idle="sleep", idle_spin_ns=0, idle_sleep_ns=10_000_000, stall_timeout_ms=300)
    with fastpath.serve(name, None, conf):
        for i in range(8):
            time.sleep(0.2)
            with deadline(10), fastpath.connect(name, timeout=2) as c:
                c.step(raw, 0)
