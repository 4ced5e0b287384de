"""The shared-memory segment file: its name, mode and backing (shm, THP, hugetlbfs), one
server per name, replacing what a crashed server left, links and FIFOs planted under the
name, and a segment larger than the host can hold."""
import json
import mmap
import os
import resource
import signal
import struct
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import fastpath
from fastpath import ServeError
from fastpath._serve import segment_path
from fastpath.control import memory
from fastpath import _segment as segment
from helpers.serving import (
    Interrupt, PKG_ROOT, _wait_stopped, cfg, deadline, fork_child, raw_zero, ticks, uname)


# ------------------------------------------------------------------ segment ownership
def test_stopping_a_replaced_server_leaves_the_new_servers_segment():
    """Regression: a server whose segment was replaced removed the new server's file when it
    stopped."""
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
    """Regression: a server stopped by a signal (alive, not beating) was replaced by the next
    server of the name."""
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


def test_mapped_by_reads_which_processes_map_the_segment(tmp_path):
    path = str(tmp_path / "seg")
    with open(path, "wb") as f:
        f.write(b"\0" * 4096)
    assert segment.mapped_by(os.getpid(), path) is False
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 4096) as m:
        assert segment.mapped_by(os.getpid(), path) is True
        m[0] = 1
    assert segment.mapped_by(os.getpid(), str(tmp_path / "absent")) is None


# ------------------------------------------------------------------ segment size vs /dev/shm
def test_segment_larger_than_shm_is_refused_up_front(tmp_path):
    """Regression: a segment larger than /dev/shm holds was created, and its pre-fault killed
    the server (SIGBUS)."""
    vfs = os.statvfs(segment.SHM_DIR)
    too_big = vfs.f_blocks * vfs.f_frsize + (1 << 30)
    path = os.path.join(segment.SHM_DIR, f"fastpath.{uname()}")
    try:
        with pytest.raises(OSError, match=r"cannot reserve .*ring_slots.*--shm-size"):
            fd, *_ = segment.create(path, too_big, 0o600, "none")
            os.close(fd)
        assert not os.path.exists(path)
    finally:
        if os.path.exists(path):
            os.unlink(path)


def test_server_with_a_segment_too_big_for_shm_is_an_error_in_a_child():
    """A segment too big for /dev/shm ends `fastpath serve` with a message, never a signal."""
    vfs = os.statvfs(segment.SHM_DIR)
    # a client region is ring_slots x (request + reply slot); find slots that overflow the fs
    per_slot = 64 + ((64 + 4 * fastpath.get_default_engine().raw_len + 63) // 64) * 64
    slots = 1 << 16
    clients = min(64, max(1, -(-(vfs.f_blocks * vfs.f_frsize + (1 << 30)) // (slots * per_slot))))
    if slots * per_slot * clients <= vfs.f_blocks * vfs.f_frsize:
        pytest.skip(f"{segment.SHM_DIR} is larger than the largest segment the config allows")
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


def test_two_servers_starting_at_once_on_one_name(monkeypatch):
    """Regression: the loser of two servers starting on one name died with a bare
    FileExistsError."""
    name = uname()
    real_create = segment.create

    def racing_create(path, *a, **kw):
        # the other server wins: its file appears between the check and the create
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
        return real_create(path, *a, **kw)

    monkeypatch.setattr(segment, "create", racing_create)
    try:
        with pytest.raises(ServeError, match="another server created"):
            fastpath.serve(name, None, cfg())
    finally:
        if os.path.exists(segment_path(name)):
            os.unlink(segment_path(name))


def test_stale_segment_of_a_reused_pid_is_replaced_at_once():
    """Regression: a crashed server's segment whose pid was reused was not replaced until the
    stall timeout."""
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


# ------------------------------------------------------------------ the segment's path
def test_a_link_planted_at_the_segment_path_does_not_delete_its_target(tmp_path):
    """Regression: a symlink planted at the segment path made a starting server delete the
    link's target."""
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me\n")
    name = uname()
    os.symlink(str(victim), segment_path(name))
    try:
        with fastpath.serve(name, None, cfg()) as srv, fastpath.connect(name) as c:
            assert srv.replaced == "unreadable"
            assert not os.path.islink(srv.path)         # a segment of its own now
            assert c.step(raw_zero(), 0, 100).seq == 1
    finally:
        if os.path.lexists(segment_path(name)):
            os.unlink(segment_path(name))
    assert victim.read_text() == "keep me\n"


def test_a_relative_link_is_not_resolved_against_the_working_directory(tmp_path, monkeypatch):
    name = uname()
    monkeypatch.chdir(tmp_path)
    (tmp_path / f"fastpath.{name}").write_text("keep me\n")
    os.symlink(f"fastpath.{name}", segment_path(name))
    segment.remove(segment_path(name))
    assert not os.path.lexists(segment_path(name))
    assert (tmp_path / f"fastpath.{name}").read_text() == "keep me\n"


def test_the_hugetlbfs_file_behind_a_segment_link_is_still_removed(tmp_path, monkeypatch):
    """A hugetlbfs segment (a link in /dev/shm to a file in the mount) is removed with its
    file."""
    name = uname()
    mnt = tmp_path / "hugepages"
    mnt.mkdir()
    monkeypatch.setattr(segment, "hugetlbfs_points", lambda mounts="/proc/mounts": {str(mnt)})
    real = mnt / f"fastpath.{name}"
    real.write_bytes(b"\0" * 64)
    os.symlink(str(real), segment_path(name))
    segment.remove(segment_path(name))
    assert not os.path.lexists(segment_path(name)) and not real.exists()


def test_hugetlbfs_points_lists_every_mount(tmp_path):
    m = tmp_path / "mounts"
    m.write_text("none /dev/hugepages hugetlbfs rw,relatime,pagesize=2M 0 0\n"
                 "tmpfs /dev/shm tmpfs rw 0 0\n"
                 "none /mnt/huge\\0401g hugetlbfs ro,pagesize=1024M 0 0\n")
    assert segment.hugetlbfs_points(str(m)) == {"/dev/hugepages", "/mnt/huge 1g"}


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_a_segment_this_user_may_not_open_says_what_mode_would_do():
    """Regression: a client of another user was refused with no word on [serve] mode."""
    name = uname()
    with fastpath.serve(name, None, cfg()):
        def child():
            os.setgid(65534)
            os.setuid(65534)
            fastpath.connect(name, timeout=0.05)
            return "connected"
        out = fork_child(child)
    assert out.startswith("ServeError") and "Permission denied" in out, out
    assert "mode 0o600" in out and "[serve] mode" in out and "uid 65534" in out, out


# ------------------------------------------------------------------ what the server got
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_segment_mlock_refusal_says_why_and_the_fix():
    """Regression: the segment's mlock refusal named neither the limit the kernel applied nor
    the fix."""
    config = cfg()
    config["memory"] = {"mlock": True, "huge_pages": "none"}
    # everything the serve path imports, imported here: the other user may not read the
    # interpreter's library
    fastpath.serve(uname(), None, config).stop()
    memory._mlock(0, 0)

    def child():
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (0, 0))
        os.setgid(65534)
        os.setuid(65534)          # no CAP_IPC_LOCK any more: RLIMIT_MEMLOCK 0 decides
        srv = fastpath.serve(uname(), None, config)
        try:
            return json.dumps(srv.placement["segment"]["mlock"])
        finally:
            srv.stop()
    out = fork_child(child)
    assert out.startswith('"'), out
    mlock = json.loads(out)
    assert mlock != "ok"
    assert "RLIMIT_MEMLOCK" in mlock and "fix:" in mlock and "IPC_LOCK" in mlock, mlock


# ------------------------------------------------------------------ one name, one server
def test_a_segment_another_server_is_still_creating_is_not_replaced():
    """Regression: a server removed, as unreadable, the segment another server was still
    creating."""
    name = uname()
    path = segment_path(name)
    with open(path, "wb") as f:
        f.write(bytes(64 << 10))
    try:
        with pytest.raises(ServeError, match="another server is creating"):
            fastpath.serve(name, config=cfg())
        assert os.path.getsize(path) == 64 << 10          # left to its maker
        # a crashed start's leftover (the same zeros, old) is still replaced
        old = os.stat(path).st_mtime - 60
        os.utime(path, (old, old))
        with fastpath.serve(name, config=cfg()) as srv, fastpath.connect(name) as c:
            assert srv.replaced == "unreadable"
            assert c.step(np.zeros(c.raw_len, np.float32), 0, 100).seq == 1
    finally:
        if os.path.lexists(path):
            os.unlink(path)


def test_two_servers_replacing_one_crashed_segment_do_not_remove_each_other(tmp_path,
                                                                             monkeypatch):
    """Regression: of two servers replacing one crashed segment, the second removed the first's
    new segment."""
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
    real_remove = segment.remove
    first = {}

    def racing_remove(path, ident=None):
        if path == segment_path(name) and "srv" not in first:
            # the other server, started at the same moment, replaces the crashed one first
            first["srv"] = None
            first["srv"] = fastpath.serve(name, config=cfg())
        return real_remove(path, ident)
    monkeypatch.setattr(segment, "remove", racing_remove)
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


def test_a_fifo_planted_under_the_name_does_not_hang_the_server():
    """A named pipe planted under a segment's name is replaced, never opened in a way that
    waits."""
    name = uname()
    path = segment_path(name)
    os.mkfifo(path)

    def boom(*_):
        raise Interrupt("the server's start hung on the FIFO")     # no OSError: never caught
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


def test_a_live_server_whose_header_names_a_gone_pid_is_not_replaced():
    """Regression: a live server whose header names a gone pid was replaced (judged by the pid
    alone, not its heartbeat)."""

    p = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                       capture_output=True, text=True, check=True, timeout=60)
    gone = int(p.stdout)        # a pid that has exited (and been reaped)
    name = uname()
    raw = np.zeros(256, np.float32)
    with fastpath.serve(name, None, cfg(ring_slots=4, max_clients=2)) as srv:
        with deadline(60), fastpath.connect(name, timeout=5) as c:
            want = c.step(raw, 1).signal
            with open(srv.path, "r+b") as f:
                m = mmap.mmap(f.fileno(), 0)
                struct.pack_into("<i", m, 56, gone)       # fp_seg_header.server_pid
                m.close()
            with pytest.raises(ServeError, match="already served"):
                fastpath.serve(name, None, cfg(ring_slots=4, max_clients=2))
            assert os.path.exists(srv.path)
            assert c.step(raw, 1).signal == want
            with fastpath.connect(name, timeout=5) as c2:     # new clients reach it still
                assert c2.step(raw, 1).signal == want


def test_segment_mode_and_removal(model):
    name = uname()
    with fastpath.serve(name, model, cfg()) as srv:
        assert os.stat(srv.path).st_mode & 0o777 == 0o600
        assert srv.path == segment_path(name)
    assert not os.path.exists(segment_path(name))     # removed on stop
    with fastpath.serve(name, model, cfg(mode=0o640)) as srv:
        assert os.stat(srv.path).st_mode & 0o777 == 0o640


def test_second_server_on_a_live_name_is_refused(model):
    name = uname()
    with fastpath.serve(name, model, cfg()):
        with pytest.raises(ServeError, match="already served by pid"):
            fastpath.serve(name, model, cfg())


def test_segment_backing_is_reported_with_the_reasons(model):
    """What backs the segment is read back from smaps; each better backing not used says why."""
    name = uname()
    with fastpath.serve(name, model, cfg()) as srv, fastpath.connect(name) as c:
        seg = c.placement["segment"]
        pages = srv.stats()["segment_pages"]
    assert seg == srv.placement["segment"]
    assert seg["tried"][-1] == [seg["method"], "ok"]
    assert all(why and why != "ok" for _, why in seg["tried"][:-1])
    assert seg["bytes"] >= os.sysconf("SC_PAGE_SIZE") and seg["kernel_page_kb"]
    assert pages == {"hugetlb-2m": "hugetlb", "hugetlb-1g": "hugetlb", "thp": "thp",
                     "normal": "normal"}[seg["method"]]
    assert any(line.startswith("segment: ") for line in srv.placement["lines"])
    with fastpath.serve(name, model, {**cfg(), "memory": {"huge_pages": "none"}}) as srv:
        assert srv.placement["segment"]["tried"] == [["normal", "ok"]]


def test_segment_in_a_hugetlbfs_mount_is_reached_through_the_usual_path(model, tmp_path,
                                                                       monkeypatch):
    """A hugetlbfs segment is reached through /dev/shm/fastpath.<name> by Python and C clients,
    and removed with its link."""
    monkeypatch.setattr(segment, "hugetlbfs_mounts", lambda: {segment.MB2: str(tmp_path)})
    name = uname()
    path = segment_path(name)
    raw = ticks(1, model.feature_spec.raw_len)[0]
    with fastpath.serve(name, model, cfg()) as srv:
        assert os.path.islink(path)
        real = os.path.realpath(path)
        assert os.path.dirname(real) == str(tmp_path)
        assert os.stat(real).st_size % segment.MB2 == 0
        assert os.stat(real).st_mode & 0o777 == 0o600
        seg = srv.placement["segment"]
        assert seg["method"] == "hugetlb-2m" and seg["pages"] == "4K"
        with fastpath.connect(name) as c:
            r = c.step(raw, 2, 1000)
            assert c.server_stats()["segment_pages"] == "hugetlb"
        ref = fastpath.Engine(model, config=cfg()).step(raw, 2, 1000)
        assert (r.signal, r.confidence) == (ref.signal, ref.confidence)
    assert not os.path.lexists(path) and not os.path.exists(real)
    # a crash leaves the link and the file: the next server replaces both
    os.symlink(str(tmp_path / "gone"), path)
    with fastpath.serve(name, model, cfg()) as srv:
        assert srv.replaced == "dangling"
    assert not os.path.lexists(path)
