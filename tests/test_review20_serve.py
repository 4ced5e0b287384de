"""Defects found in the serving loop and the control plane by the session-20 review: each test
fails on the code before its fix.

Every wait is bounded (an alarm in this process, timeouts on child processes), so a hang
fails the test instead of stalling the suite; nothing asserts on wall-clock time.
"""
import json
import os

import numpy as np
import pytest

import fastpath
from fastpath import ServeError
from fastpath._build import DEMO_MODEL

# the serve tests' helpers: config, unique segment names, a SIGALRM deadline
from helpers.serving import cfg, deadline, ticks, uname  # noqa: E402


def raw_zero():
    return np.zeros(fastpath.get_default_engine().raw_len, np.float32)


def _child(fn):
    """Run fn() in a forked child; its outcome (a string) comes back through a pipe; the
    child leaves with os._exit (under pytest a SystemExit would resume the test session)."""
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
    with deadline(30):
        _, status = os.waitpid(pid, 0)
        text = os.read(r, 4096).decode()
    os.close(r)
    assert os.WIFEXITED(status), status
    return text


# ------------------------------------------------------------------ fork
def test_forked_child_cannot_take_the_parents_replies():
    """A child made by fork() inherited the parent's Client and used its ring pair: it
    published under the seq the parent would use next and its reply sat where the parent
    looked next, so the parent's next step() returned the CHILD's answer (symbol 1, ts 200)
    for its own tick (symbol 0, ts 300), and every later answer was one tick late. Now the
    child is told to connect again; the parent's rings are untouched."""
    name = uname()
    raws = ticks(3, fastpath.get_default_engine().raw_len, seed=3)
    local = fastpath.Engine(DEMO_MODEL, config=cfg())
    want = [local.step(raws[0], 0, 100), local.step(raws[2], 0, 300)]
    with fastpath.serve(name, None, cfg()), fastpath.connect(name) as c:
        assert c.step(raws[0], 0, 100).signal == want[0].signal

        def child():
            return repr(c.step(raws[1], 1, 200).signal)
        out = _child(child)
        assert out.startswith("ServeError") and "fork" in out and "connect" in out, out
        with deadline(10):
            r = c.step(raws[2], 0, 300)
        assert r.seq == 2
        assert (r.signal, r.confidence) == (want[1].signal, want[1].confidence)
        assert c.outstanding == 0


def test_forked_child_exiting_does_not_stop_the_parents_server():
    """A forked child that exits normally ran the atexit handler that stops every server of
    the process: it set the stop flag in the parent's live segment, and the parent's server
    stopped serving (its clients got ServerGone)."""
    name = uname()
    raw = raw_zero()
    with fastpath.serve(name, None, cfg()) as srv, fastpath.connect(name) as c:
        c.step(raw, 0, 100)

        def child():
            # what a normal exit of the child runs: the atexit stop of every server, then
            # the collection of the Server (its Worker) the child inherited
            from fastpath.serving import server
            server._stop_all()
            srv.stop()
            srv._worker = None
            import gc
            gc.collect()
            return "exit"
        assert _child(child) == "exit"
        with deadline(10):
            assert c.step(raw, 0, 200).seq == 2
        assert srv.running and srv.stats()["state"] == "running"
        assert os.path.exists(srv.path)


def test_forked_child_can_connect_on_its_own():
    """What the fork error tells the child to do works: a fresh connect in the child."""
    name = uname()
    raw = raw_zero()
    with fastpath.serve(name, None, cfg()), fastpath.connect(name) as c:
        c.step(raw, 0, 100)

        def child():
            with fastpath.connect(name) as c2:
                return str(c2.step(raw, 5, 100).seq)
        assert _child(child) == "1"
        assert c.step(raw, 0, 200).seq == 2


# ------------------------------------------------------------------ client slots
def test_all_slots_taken_says_how_many():
    """The message read "has all its  client slots taken": the count came from the header
    after the segment was unmapped (the pointer already cleared)."""
    name = uname()
    with fastpath.serve(name, None, cfg(max_clients=2)), fastpath.connect(name), \
            fastpath.connect(name):
        with deadline(10), pytest.raises(ServeError, match="all its 2 client slots taken"):
            fastpath.connect(name, timeout=0.05)


def test_reconnect_right_after_close_gets_the_slot():
    """max_clients = 1: close() then connect() at once was refused ("all client slots
    taken"): the worker frees a given-back slot at its next heartbeat, and connect did not
    wait for it although its timeout allowed."""
    name = uname()
    raw = raw_zero()
    with fastpath.serve(name, None, cfg(max_clients=1)):
        for i in range(4):
            with deadline(10), fastpath.connect(name, timeout=5) as c:
                assert c.step(raw, 0, 100 + i).seq == 1


# ------------------------------------------------------------------ served vs local engine
def test_stage_times_off_is_honoured_by_the_server():
    """[engine] stage_times = false: a local Engine leaves the stage fields at -1 (and saves
    their clock reads); the server ignored the setting and timed every stage."""
    config = cfg()
    config["engine"]["stage_times"] = False
    raw = raw_zero()
    local = fastpath.Engine(DEMO_MODEL, config=config).step(raw, 0, 100)
    assert local.latency.feature_ns == -1
    name = uname()
    with fastpath.serve(name, None, config), fastpath.connect(name) as c:
        r = c.step(raw, 0, 100)
    lat = r.latency
    assert (lat.feature_ns, lat.cache_ns, lat.infer_ns) == (-1, -1, -1)
    assert lat.total_ns > 0
    assert (r.signal, r.confidence) == (local.signal, local.confidence)


# ------------------------------------------------------------------ boot-line cpulists
@pytest.mark.parametrize("text,flags,want", [
    # the kernel's own example (kernel-parameters: "cpu lists"): of each group of 25 CPUs
    # from 100 on, the first 2. Read as no CPU at all before.
    ("100-120:2/5", False, [100, 101, 105, 106, 110, 111, 115, 116, 120]),
    ("0-7:2/4", False, [0, 1, 4, 5]),
    ("domain,managed_irq,2-3,8-15:1/4", True, [2, 3, 8, 12]),
    ("all:1/2", False, [0, 2, 4, 6]),
    ("1-N:1/3", False, [1, 4, 7]),
    # a pattern without its group size: the kernel refuses the whole list (isolates
    # nothing); it was read as a step, CPUs 0, 2, 4, 6 "isolated"
    ("0-7:2", False, []),
    ("2,0-7:2", False, []),
    ("0-7:5/4", False, []),              # more used than the group holds
    ("0-7:1/0", False, []),
    ("2, 3", False, [2, 3]),             # white space separates regions as commas do
])
def test_boot_cpulist_group_patterns(text, flags, want):
    from fastpath.control.host import boot_cpulist
    assert boot_cpulist(text, 7 if max(want, default=0) < 8 else 127, flags) == want


def test_doctor_sees_isolation_written_with_a_group_pattern(tmp_path):
    """rcu_nocbs is known from the boot line alone: rcu_nocbs=0-3:1/2 offloads CPUs 0 and 2,
    and doctor said CPU 2 was not in rcu_nocbs."""
    from fastpath.control import doctor
    from fastpath.control.host import Host, read_topology
    files = {"sys/devices/system/cpu/online": "0-3", "sys/devices/system/cpu/possible": "0-3",
             "proc/cmdline": "isolcpus=domain,0-3:1/2 nohz_full=0-3:1/2 rcu_nocbs=0-3:1/2"}
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    host = Host(str(tmp_path))
    topo = read_topology(host)
    assert topo.isolated == topo.nohz_full == topo.rcu_nocbs == [0, 2]
    res = doctor.run_checks(host, core=2, topo=topo)
    by = {c["name"]: c["status"] for c in res["checks"]}
    assert by["isolcpus"] == by["nohz_full"] == by["rcu_nocbs"] == "pass"
    res = doctor.run_checks(host, core=3, topo=topo)
    by = {c["name"]: c["status"] for c in res["checks"]}
    assert by["isolcpus"] == by["nohz_full"] == by["rcu_nocbs"] == "warn"


# ------------------------------------------------------------------ doctor --json
def test_doctor_placement_reports_what_was_asked_not_a_grant(tmp_path):
    """doctor's "placement" said policy_asked "other" 0, granted SCHED_OTHER 0 and an empty
    affinity_now whatever the config asked: it copied an unapplied report's defaults."""
    from fastpath.control import doctor
    res = doctor.run_checks(None, None, "fifo", 50)
    pl = res["placement"]
    assert (pl["policy_asked"], pl["priority_asked"]) == ("fifo", 50)
    assert pl["policy_granted"] is None and pl["priority_granted"] is None
    assert pl["affinity_now"] == sorted(os.sched_getaffinity(0))
    assert pl["affinity_applied"] is False
    json.dumps(res)                     # what --json prints


def test_doctor_fails_a_core_outside_the_process_cpu_set():
    """placement.core (or --core) outside the process's CPU set (a cgroup cpuset, taskset):
    doctor passed its checks while the server, placed from the same config, refuses it."""
    from fastpath.control import doctor
    from fastpath.control.placement import place
    from fastpath.errors import ConfigError
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("needs two CPUs to leave one out")

    def child():
        os.sched_setaffinity(0, {allowed[0]})
        out = {}
        res = doctor.run_checks(None, allowed[1], "other", 0)
        out["doctor"] = [c for c in res["checks"] if c["name"] == "cpu_allowed"]
        out["failed"] = res["failed"]
        try:
            place({"placement": {"core": allowed[1], "policy": "other", "priority": 0}},
                  apply_now=False, busy={})
            out["place"] = "accepted"
        except ConfigError as exc:
            out["place"] = f"ConfigError: {exc}"
        return json.dumps(out)
    out = json.loads(_child(child))
    assert out["place"].startswith("ConfigError")
    assert len(out["doctor"]) == 1 and out["doctor"][0]["status"] == "fail", out
    assert f"CPU {allowed[1]} is not among" in out["doctor"][0]["detail"]
    assert out["failed"] >= 1


# ------------------------------------------------------------------ the segment's path
def test_a_link_planted_at_the_segment_path_does_not_delete_its_target(tmp_path):
    """/dev/shm is writable by every user. A symlink at /dev/shm/fastpath.<name> leading to
    any file made a starting server (often root) replace the "unreadable" segment by
    deleting the file the link pointed at."""
    from fastpath._serve import segment_path
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
    from fastpath._serve import segment_path
    from fastpath.serving import segment as seg
    name = uname()
    monkeypatch.chdir(tmp_path)
    (tmp_path / f"fastpath.{name}").write_text("keep me\n")
    os.symlink(f"fastpath.{name}", segment_path(name))
    seg.remove(segment_path(name))
    assert not os.path.lexists(segment_path(name))
    assert (tmp_path / f"fastpath.{name}").read_text() == "keep me\n"


def test_the_hugetlbfs_file_behind_a_segment_link_is_still_removed(tmp_path, monkeypatch):
    """What the link check must keep doing: a segment on huge pages is a link to the file of
    the same name at the top of a hugetlbfs mount; removing the segment removes both."""
    from fastpath._serve import segment_path
    from fastpath.serving import segment as seg
    name = uname()
    mnt = tmp_path / "hugepages"
    mnt.mkdir()
    monkeypatch.setattr(seg, "hugetlbfs_points", lambda mounts="/proc/mounts": {str(mnt)})
    real = mnt / f"fastpath.{name}"
    real.write_bytes(b"\0" * 64)
    os.symlink(str(real), segment_path(name))
    seg.remove(segment_path(name))
    assert not os.path.lexists(segment_path(name)) and not real.exists()


def test_hugetlbfs_points_lists_every_mount(tmp_path):
    from fastpath.serving import segment as seg
    m = tmp_path / "mounts"
    m.write_text("none /dev/hugepages hugetlbfs rw,relatime,pagesize=2M 0 0\n"
                 "tmpfs /dev/shm tmpfs rw 0 0\n"
                 "none /mnt/huge\\0401g hugetlbfs ro,pagesize=1024M 0 0\n")
    assert seg.hugetlbfs_points(str(m)) == {"/dev/hugepages", "/mnt/huge 1g"}


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_a_segment_this_user_may_not_open_says_what_mode_would_do():
    """A client of another user got "cannot open ...: Permission denied" and no word on
    [serve] mode, the setting that decides it."""
    name = uname()
    with fastpath.serve(name, None, cfg()):
        def child():
            os.setgid(65534)
            os.setuid(65534)
            fastpath.connect(name, timeout=0.05)
            return "connected"
        out = _child(child)
    assert out.startswith("ServeError") and "Permission denied" in out, out
    assert "mode 0o600" in out and "[serve] mode" in out and "uid 65534" in out, out


# ------------------------------------------------------------------ the segment's header
# fp_seg_header offsets (fastpath/include/fp_ring.h)
_OFF_RAW_LEN, _OFF_SLOTS, _OFF_MAX_CLIENTS, _OFF_REQ_SLOT = 16, 24, 28, 32


@pytest.mark.parametrize("field,value", [
    (_OFF_MAX_CLIENTS, 1000),          # past the client table's 64 entries
    (_OFF_SLOTS, 3),                   # not a power of two: the slot masks are wrong
    (_OFF_RAW_LEN, 4096),              # ticks longer than a request slot holds
    (_OFF_REQ_SLOT, 64),
])
def test_a_segment_whose_header_disagrees_with_itself_is_refused(field, value):
    """A copy of a live server's segment with one layout field changed (a corrupt or
    hand-made file under a segment's name): the client trusted every field past the magic
    and computed its slot and ring addresses from them (client slot 64+ written past the
    client table, a 4096-value tick copied into a 1 KB slot)."""
    import struct
    from fastpath._serve import segment_path
    name, fake = uname(), uname()
    with fastpath.serve(name, None, cfg(ring_slots=4, max_clients=2)) as srv:
        with open(srv.path, "rb") as f:
            data = bytearray(f.read())
        struct.pack_into("<I", data, field, value)
        path = segment_path(fake)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, bytes(data))
            os.close(fd)
            with deadline(10), pytest.raises(ServeError, match="not a fastpath serving segment"):
                fastpath.connect(fake, timeout=0.05)
        finally:
            os.unlink(path)


# ------------------------------------------------------------------ what the server got
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_segment_mlock_refusal_says_why_and_the_fix():
    """The segment's mlock refusal read "Operation not permitted (the segment may be paged
    out ...)": no word on the limit the kernel went by or on the fix, which the engine's own
    arena report gives for the same refusal."""
    import resource
    config = cfg()
    config["memory"] = {"mlock": True, "huge_pages": "none"}
    # everything the serve path imports, imported here: the other user may not read the
    # interpreter's library
    fastpath.serve(uname(), None, config).stop()
    from fastpath.control import memory, placement  # noqa: F401
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
    out = _child(child)
    assert out.startswith('"'), out
    mlock = json.loads(out)
    assert mlock != "ok"
    assert "RLIMIT_MEMLOCK" in mlock and "fix:" in mlock and "IPC_LOCK" in mlock, mlock


def _fake_host(tmp_path, files):
    from fastpath.control.host import Host
    base = {"sys/devices/system/cpu/online": "0-1", "sys/devices/system/cpu/possible": "0-1"}
    for rel, text in {**base, **files}.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return Host(str(tmp_path))


@pytest.mark.parametrize("huge,pools,want", [
    # no pool at all, but the config never asks for one: nothing to warn about
    ("none", {}, "pass"),
    ("thp", {}, "pass"),
    # "1g" draws on the 1 GB pool first: 16 free 2 MB pages were a pass, 0 of 0 1 GB a miss
    ("1g", {"2048kB": (16, 16)}, "warn"),
    ("1g", {"1048576kB": (2, 2)}, "pass"),
    ("auto", {"2048kB": (16, 16)}, "pass"),
])
def test_doctor_hugetlb_pool_checks_the_pool_the_config_uses(tmp_path, huge, pools, want):
    from fastpath.control import doctor
    files = {}
    for size, (free, total) in pools.items():
        files[f"sys/kernel/mm/hugepages/hugepages-{size}/free_hugepages"] = str(free)
        files[f"sys/kernel/mm/hugepages/hugepages-{size}/nr_hugepages"] = str(total)
    files["proc/meminfo"] = "MemTotal: 1000 kB\n"
    host = _fake_host(tmp_path, files)
    res = doctor.run_checks(host, core=1, policy="other", priority=0,
                            config={"memory": {"huge_pages": huge}}, arena_bytes=8 << 20)
    check = {c["name"]: c for c in res["checks"]}["hugetlb_pool"]
    assert check["status"] == want, check
    if huge == "1g":
        assert "1 GB" in check["detail"], check


# ------------------------------------------------------------------ interleavings
@pytest.mark.parametrize("on_full", ["spin", "reject"])
def test_random_interleaving_of_submit_poll_step_matches_a_local_engine(on_full):
    """Submits, polls and steps in a random order over a 4-slot ring (many turns, full
    rings, refused ticks among them): every answer is the one a local Engine gives for the
    same ticks in the same order, seq for seq, errors included."""
    from fastpath import InputError, RingFull
    rng = np.random.default_rng(11)
    raw_len = fastpath.get_default_engine().raw_len
    raws = ticks(600, raw_len, seed=4)
    local = fastpath.Engine(DEMO_MODEL, config=cfg())
    name = uname()
    want, got, sent = {}, {}, 0
    last_ts = {}
    with fastpath.serve(name, None, cfg(ring_slots=4, on_full=on_full)), \
            fastpath.connect(name) as c, deadline(60):
        for i in range(600):
            sym = int(rng.integers(0, 4))
            # now and then a tick earlier than the symbol's last: an error reply
            ts = last_ts.get(sym, 0) + int(rng.integers(1, 1000))
            if rng.random() < 0.05 and sym in last_ts:
                ts = last_ts[sym] - 1
            action = rng.random()
            if action < 0.15:
                try:
                    r = c.step(raws[i], sym, ts)
                    got[r.seq] = (r.signal, r.confidence, r.cached, r.miss_reason)
                except InputError:
                    got[sent + 1] = "error"
                except RingFull:
                    continue
                seq = sent + 1
            else:
                try:
                    seq = c.submit(raws[i], sym, ts)
                except RingFull:
                    continue                       # not sent: the local engine skips it too
            assert seq == sent + 1
            sent = seq
            try:
                r = local.step(raws[i], sym, ts)
                want[seq] = (r.signal, r.confidence, r.cached, r.miss_reason)
                last_ts[sym] = ts
            except InputError:
                want[seq] = "error"
            if rng.random() < 0.3:
                for s, r in c.poll():
                    got[s] = "error" if isinstance(r, Exception) else \
                        (r.signal, r.confidence, r.cached, r.miss_reason)
        while len(got) < sent:
            for s, r in c.poll():
                got[s] = "error" if isinstance(r, Exception) else \
                    (r.signal, r.confidence, r.cached, r.miss_reason)
        # one refused tick for certain (under load "reject" may have refused every random
        # one at the ring): the same InputError both ways, and the state after it alike
        sym = max(last_ts, key=last_ts.get)
        with pytest.raises(InputError, match="earlier than"):
            c.step(raws[0], sym, last_ts[sym] - 1)
        with pytest.raises(InputError, match="earlier than"):
            local.step(raws[0], sym, last_ts[sym] - 1)
        r = c.step(raws[1], sym, last_ts[sym] + 1)
        want_r = local.step(raws[1], sym, last_ts[sym] + 1)
        assert (r.signal, r.confidence, r.cached) == (want_r.signal, want_r.confidence,
                                                      want_r.cached)
    assert sorted(got) == list(range(1, sent + 1))
    assert got == want
