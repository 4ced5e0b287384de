"""The serving loop: answers equal to a local Engine, ordering under load from several
processes, and every fault (worker killed, client killed, full ring, stale segment, unknown
name) ending in a clear error within a bounded time, never a hang.

Each test bounds itself: clients in other processes run under subprocess timeouts, and a wait
in this process runs under an alarm (a client's spin loop checks for signals), so a hang
fails the test instead of stalling the suite. Nothing asserts on wall-clock time.
"""
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from contextlib import contextmanager

import numpy as np
import pytest

import fastpath
from fastpath import ConfigError, InputError, RingFull, ServeError, ServerGone
from fastpath._build import DEMO_MODEL
from fastpath._serve import segment_path
from fastpath.model import CachePolicy
from helpers.builders import windowed_model
from helpers.serving import PKG_ROOT, _wait_stopped, cfg, deadline, server_process, ticks, uname  # noqa: F401

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def model():
    return windowed_model(np.random.default_rng(7))


def local_results(model, raws, syms, ts, config):
    eng = fastpath.Engine(model, config=config)
    out = [eng.step(raws[i], int(syms[i]), int(ts[i])) for i in range(len(raws))]
    return (np.array([r.signal for r in out]), np.array([r.confidence for r in out]),
            np.array([r.cached for r in out]))


def test_round_trip_equals_local_engine(model, isa):
    config = cfg()
    config["engine"]["simd"] = isa
    n = 400
    raws = ticks(n, model.feature_spec.raw_len)
    syms = np.arange(n) % 5
    ts = 1_000_000 * (np.arange(n) + 1)
    sig, conf, cached = local_results(model, raws, syms, ts, config)
    name = uname()
    with fastpath.serve(name, model, config), fastpath.connect(name) as c:
        got = [c.step(raws[i], int(syms[i]), int(ts[i])) for i in range(n)]
    assert [r.seq for r in got] == list(range(1, n + 1))
    np.testing.assert_array_equal([r.signal for r in got], sig)
    np.testing.assert_array_equal([r.confidence for r in got], conf)
    np.testing.assert_array_equal([r.cached for r in got], cached)
    assert cached.any() and not cached.all()          # both paths were exercised
    r = got[-1]
    assert r.miss_reason in ("hit", "cold", "age", "run", "cosine", "norm", "disabled")
    lat = r.latency
    assert lat.total_ns > 0 and lat.wait_ns >= 0 and lat.h2d_ns == 0


def test_pipelined_submit_poll_in_order(model):
    name = uname()
    raws = ticks(300, model.feature_spec.raw_len, seed=1)
    with fastpath.serve(name, model, cfg()), fastpath.connect(name) as c:
        seqs = [c.submit(raws[i], i % 3, 1000 * (i + 1)) for i in range(300)]
        got = []
        with deadline(10):
            while len(got) < 300:
                got += c.poll()
    assert seqs == list(range(1, 301))
    assert [s for s, _ in got] == seqs


SOAK_CLIENT = textwrap.dedent("""
    import sys, numpy as np, fastpath
    name, raws_path, sym0, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    raws = np.load(raws_path)
    n = len(raws)
    c = fastpath.connect(name, timeout=5)
    seqs = np.zeros(n, np.int64); sig = np.zeros(n); conf = np.zeros(n)
    k = 0
    for i in range(n):
        c.submit(raws[i], sym0 + i % 4, 1000 * (i + 1))
        if i % 64 == 63 or i == n - 1:
            for s, r in c.poll():
                seqs[k] = s; sig[k] = r.signal; conf[k] = r.confidence; k += 1
    while k < n:
        for s, r in c.poll():
            seqs[k] = s; sig[k] = r.signal; conf[k] = r.confidence; k += 1
    c.close()
    np.savez(out, seqs=seqs, sig=sig, conf=conf)
""")


def test_soak_two_client_processes(model, tmp_path):
    """100,000 requests from 2 processes: every answer arrives once, in order, and equals a
    local Engine's for the same ticks (each client owns its symbols: per-symbol state is
    independent, so the interleaving cannot change an answer)."""
    n = 50_000
    raw_len = model.feature_spec.raw_len
    name = uname()
    config = cfg()
    script = tmp_path / "client.py"
    script.write_text(SOAK_CLIENT)
    paths = []
    for k in range(2):
        p = tmp_path / f"raws{k}.npy"
        np.save(p, ticks(n, raw_len, seed=10 + k))
        paths.append(p)
    env = dict(os.environ, PYTHONPATH=PKG_ROOT)
    with fastpath.serve(name, model, config):
        procs = [subprocess.Popen([sys.executable, str(script), name, str(paths[k]), str(4 * k),
                                   str(tmp_path / f"out{k}.npz")], env=env, cwd=PKG_ROOT) for k in range(2)]
        for p in procs:
            assert p.wait(timeout=120) == 0
    for k in range(2):
        out = np.load(tmp_path / f"out{k}.npz")
        assert np.array_equal(out["seqs"], np.arange(1, n + 1))   # none lost, doubled, reordered
        raws = np.load(paths[k])
        syms = 4 * k + np.arange(n) % 4
        eng = fastpath.Engine(model, config=config)
        ts = 1000 * (np.arange(n, dtype=np.int64) + 1)
        ref = eng.step_batch(raws, syms, ts)
        np.testing.assert_array_equal(out["sig"], ref.signal.astype(np.float64))
        np.testing.assert_array_equal(out["conf"], ref.confidence.astype(np.float64))


def test_bad_input_refused_at_the_client(model):
    name = uname()
    raw_len = model.feature_spec.raw_len
    good = ticks(1, raw_len)[0]
    with fastpath.serve(name, model, cfg()) as srv, fastpath.connect(name) as c:
        bad_raw = [good.astype(np.float64), good[:-1], np.ascontiguousarray(np.stack([good] * 2).T)[:, 0],
                   list(good)]
        for raw in bad_raw:
            with pytest.raises(InputError, match="float32 C-contiguous"):
                c.step(raw, 0)
        for sym in (-1, 16, 2.0, "BTC", True):
            with pytest.raises(InputError, match="symbol"):
                c.submit(good, sym)
        for ts in (-5, 1.5):
            with pytest.raises(InputError, match="ts_ns"):
                c.submit(good, 0, ts)
        nan = good.copy()
        nan[3] = np.nan
        with pytest.raises(InputError, match="non-finite value.*index 3"):
            c.step(nan, 0)
        assert srv.stats()["served"] == 0             # nothing reached the ring
        c.step(good, 1, 5000)
        # only the worker knows a symbol's last tick: it refuses, and the client says why
        with pytest.raises(InputError, match="earlier than the last tick of symbol 1"):
            c.step(good, 1, 4000)
        st = srv.stats()
        assert st["served"] == 2 and st["errors"] == 1
        assert c.step(good, 1, 6000).seq == 3      # ticks refused at the client took no seq


def test_unknown_name_is_a_clear_error():
    name = uname()
    with deadline(5), pytest.raises(ServeError, match=f"no server is serving '{name}'"):
        fastpath.connect(name, timeout=0.05)
    with pytest.raises(InputError, match="server name"):
        fastpath.connect("a/b")


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


def test_ring_full_reject_raises_and_counts(model):
    name = uname()
    raw = ticks(1, model.feature_spec.raw_len)[0]
    with fastpath.serve(name, model, cfg(ring_slots=4, on_full="reject")) as srv, \
            fastpath.connect(name) as c:
        accepted = []
        with pytest.raises(RingFull, match="full"), deadline(10):
            for i in range(100):
                accepted.append(c.submit(raw, 0, 1000 * (i + 1)))
        # 4 answers waiting to be taken, 4 requests behind them: nothing more fits
        assert len(accepted) <= 8
        assert srv.stats()["rejected_full"] == 1
        got = []
        with deadline(10):
            while len(got) < len(accepted):
                got += c.poll()
        assert [s for s, _ in got] == accepted        # the refused tick took no seq
        assert c.step(raw, 0, 10**9).seq == accepted[-1] + 1


def test_ring_full_spin_waits_without_deadlock(model):
    """on_full = "spin" with a client that never polls: submit keeps taking answers aside
    while it waits, so the worker is never held back by the client's own reply ring."""
    name = uname()
    raw = ticks(1, model.feature_spec.raw_len)[0]
    with fastpath.serve(name, model, cfg(ring_slots=4, on_full="spin")) as srv, \
            fastpath.connect(name) as c:
        with deadline(10):
            seqs = [c.submit(raw, 0, 1000 * (i + 1)) for i in range(200)]
            got = []
            while len(got) < 200:
                got += c.poll()
        assert [s for s, _ in got] == seqs
        assert srv.stats()["rejected_full"] == 0


def test_stop_drains_accepted_requests(model):
    name = uname()
    raws = ticks(200, model.feature_spec.raw_len)
    srv = fastpath.serve(name, model, cfg())
    c = fastpath.connect(name)
    seqs = [c.submit(raws[i], 0, 1000 * (i + 1)) for i in range(200)]
    with deadline(10):
        srv.stop()
    got = c.poll()
    assert [s for s, _ in got] == seqs
    with deadline(5), pytest.raises(ServerGone, match="stop"):
        c.step(raws[0], 0, 10**9)
    c.close()


@pytest.mark.parametrize("reap", [True, False], ids=["reaped", "zombie"])
def test_worker_killed_is_server_gone_then_replaced(reap):
    name = uname()
    raw = np.zeros(fastpath.get_default_engine().raw_len, np.float32)
    with server_process(name) as p:
        c = fastpath.connect(name, timeout=5)
        c.step(raw, 0)
        assert c.server_pid == p.pid
        p.kill()
        if reap:
            p.wait(timeout=10)
        # the heartbeat goes stale and the pid is gone (or a zombie): an error, not a hang
        with deadline(5), pytest.raises(ServerGone, match="dead"):
            c.step(raw, 0)
        c.close()
        p.wait(timeout=10)
        # kill -9 left the segment behind: connecting says so, a new server replaces it
        assert os.path.exists(segment_path(name))
        with pytest.raises(ServerGone, match="left from a server"):
            fastpath.connect(name, timeout=0.05)
        with fastpath.serve(name, None, cfg()) as srv:
            assert srv.replaced == p.pid
            with fastpath.connect(name) as c2:
                assert c2.step(raw, 0).signal == fastpath.Engine(DEMO_MODEL, config=cfg()).step(raw, 0).signal


def test_stalled_worker_is_server_gone_after_the_stall_timeout():
    """A server stopped by a signal (alive, not beating): ServerGone after the stall timeout,
    the server's [serve] stall_timeout_ms by default, connect(stall_timeout=) per client."""
    name = uname()
    raw = np.zeros(fastpath.get_default_engine().raw_len, np.float32)
    with server_process(name, stall_timeout_ms=300) as p:
        c = fastpath.connect(name, timeout=5)
        c2 = fastpath.connect(name, timeout=5, stall_timeout=0.1)
        assert (c.stall_timeout, c2.stall_timeout) == (0.3, 0.1)
        c.step(raw, 0)
        os.kill(p.pid, signal.SIGSTOP)
        try:
            # kill() returns before every thread of the target has stopped (a spinning worker
            # stops at its next kernel entry): wait until /proc says so, or a request sent in
            # between is still answered
            _wait_stopped(p.pid)
            with deadline(5), pytest.raises(ServerGone, match=r"not responding.*over 0.3 s"):
                c.step(raw, 0)
            with deadline(5), pytest.raises(ServerGone, match=r"not responding.*over 0.1 s"):
                c2.step(raw, 0)
        finally:
            os.kill(p.pid, signal.SIGCONT)
        c.close()
        c2.close()


@pytest.mark.parametrize("value", [0, -1, 4000, float("nan"), True, "1"])
def test_connect_stall_timeout_is_checked(value):
    with pytest.raises(InputError, match="stall_timeout must be a number of seconds"):
        fastpath.connect(uname(), timeout=0, stall_timeout=value)


KILLED_CLIENT = textwrap.dedent("""
    import sys, numpy as np, fastpath
    c = fastpath.connect(sys.argv[1], timeout=5)
    raw = np.zeros(c.raw_len, np.float32)
    for i in range(3):                      # mid-stream: answers left untaken in its ring
        c.submit(raw, 0)
    print("submitted", flush=True)
    sys.stdin.read()
""")


def test_killed_client_frees_its_slot():
    """max_clients = 1: the next client can only connect once the worker has noticed the dead
    one and freed its rings."""
    name = uname()
    raw = np.zeros(fastpath.get_default_engine().raw_len, np.float32)
    env = dict(os.environ, PYTHONPATH=PKG_ROOT)
    with fastpath.serve(name, None, cfg(max_clients=1)) as srv:
        p = subprocess.Popen([sys.executable, "-c", KILLED_CLIENT, name], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, env=env, text=True, cwd=PKG_ROOT)
        assert p.stdout.readline().strip() == "submitted"
        with pytest.raises(ServeError, match="client slots taken"):
            fastpath.connect(name, timeout=0)
        p.kill()
        p.wait(timeout=10)
        with deadline(10):
            while srv.stats()["clients_reaped"] == 0:
                time.sleep(0.001)
        # the next owner of the rings starts at position 0 again: what the dead client left
        # there (requests served, answers never taken) must read as neither a new request to
        # the worker nor an answer to the new client
        tick = ticks(1, raw.size, seed=5)[0]
        with fastpath.connect(name) as c:
            r = c.step(tick, 1, 7000)
            assert r.seq == 1
            st = srv.stats()       # before close(): a closed client is reaped (and counted) too
        ref = fastpath.Engine(DEMO_MODEL, config=cfg()).step(tick, 1, 7000)
        assert (r.signal, r.confidence) == (ref.signal, ref.confidence)
        assert st["clients_reaped"] == 1
        assert st["served"] == 3 + 1


def test_placement_report_reaches_clients(model):
    name = uname()
    with fastpath.serve(name, model, cfg(place=True)) as srv, fastpath.connect(name) as c:
        rep = c.placement
        assert rep == srv.placement
        assert "core" in rep and "policy_granted" in rep and "placed" in rep


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH")
def test_c_client_round_trip(tmp_path):
    exe = tmp_path / "client"
    subprocess.run(["cc", "-std=c99", "-O2", "-Wall", "-Wextra", "-Werror",
                    f"-I{fastpath.get_include()}",
                    os.path.join(REPO, "tests", "c", "client.c"), "-o", str(exe)], check=True,
                   timeout=60)
    eng_cfg = cfg()
    local = fastpath.Engine(DEMO_MODEL, config=eng_cfg)
    n = 2000
    raws = ticks(n, local.raw_len, seed=3)
    raws.tofile(tmp_path / "in.f32")
    name = uname()
    with fastpath.serve(name, None, eng_cfg) as srv:
        out = subprocess.run([str(exe), name, "check", str(tmp_path / "in.f32"), str(n), "2", "3",
                              str(tmp_path / "out.f32")], timeout=60)
        assert out.returncode == 0
        assert srv.stats()["served"] == n
    got = np.fromfile(tmp_path / "out.f32", np.float32).reshape(n, 2)
    syms = 2 + np.arange(n) % 3
    ref = local.step_batch(raws, syms, 1000 * (np.arange(n, dtype=np.int64) + 1))
    np.testing.assert_array_equal(got[:, 0], ref.signal)
    np.testing.assert_array_equal(got[:, 1], ref.confidence)


@pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler (c++) on PATH")
def test_ring_header_compiles_as_cpp(tmp_path):
    """fp_ring.h is for C and C++ feed handlers alike."""
    src = tmp_path / "h.cpp"
    src.write_text('#include "fp_ring.h"\nint main() { fp_seg s; fp_client c; fp_rep r; '
                   '(void)s; (void)c; (void)r; return 0; }\n')
    subprocess.run(["c++", "-std=c++17", "-Wall", "-Wextra", "-Werror",
                    f"-I{fastpath.get_include()}", str(src), "-o", str(tmp_path / "h")],
                   check=True, timeout=60)


@pytest.mark.parametrize("key,value,match", [
    ("on_full", "drop", "serve.on_full must be one of"),
    ("ring_slots", 1000, "serve.ring_slots must be a power of two"),
    ("ring_slots", 1, r"serve.ring_slots must be in"),
    ("mode", 0o400, "serve.mode must give the serving user read and write"),
    ("mode", "0600", "serve.mode must be int"),
    ("idle", "nap", "serve.idle must be one of"),
    ("heartbeat_ms", 0, r"serve.heartbeat_ms must be in"),
    ("dead_after_ms", 1, r"serve.dead_after_ms"),
    ("bogus", 1, "unknown key serve.bogus"),
    ("stall_timeout_ms", 1, r"serve.stall_timeout_ms must be in"),
    ("stall_timeout_ms", 2.5, r"serve.stall_timeout_ms must be int"),
    ("stall_timeout_ms", 40, r"serve.stall_timeout_ms \(40\) must exceed serve.dead_after_ms \(50\)"),
])
def test_serve_config_keys_are_checked(key, value, match):
    from fastpath.control.config import load_config
    with pytest.raises(ConfigError, match=match):
        load_config({"serve": {key: value}})


def test_example_config_serve_section_parses():
    import tomllib
    from fastpath._build import EXAMPLE_CONFIG
    from fastpath.control.config import load_config
    with open(EXAMPLE_CONFIG, "rb") as f:
        assert "serve" in tomllib.load(f)
    assert load_config(EXAMPLE_CONFIG).serve.mode == 0o600


def test_cli_serve_stops_cleanly_on_sigterm(tmp_path):
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


def test_latency_snapshot_leaves_out_a_record_being_written():
    """A monitor copying the records while the loop writes one must not return that one
    half old, half new: a record is copied whole or left out."""
    from fastpath._serve import _LatRing
    ring = _LatRing(8)
    ring.write(5)
    ring.begin_only(999)          # the writer is inside record 5: its first field changed
    snap = ring.snapshot()
    assert snap.shape == (5, 5)
    assert (snap == np.arange(5, dtype=np.uint32)[:, None]).all()
    ring.write(20)                # lapped: only the last 8 ticks, oldest first
    np.testing.assert_array_equal(ring.snapshot()[:, 0], np.arange(17, 25))


def test_latency_snapshot_is_consistent_under_a_running_writer():
    """Every field of tick k is k: a snapshot taken while another thread writes (GIL
    released) holds no row that mixes two ticks, in tick order."""
    import threading
    from fastpath._serve import _LatRing
    ring = _LatRing(64)
    writer = threading.Thread(target=ring.write, args=(20_000_000,))
    writer.start()
    snaps = 0
    with deadline(60):
        while writer.is_alive() or snaps == 0:
            s = ring.snapshot()
            assert (s == s[:, :1]).all(), "a row mixes two ticks"
            assert (np.diff(s[:, 0].astype(np.int64)) > 0).all()
            snaps += 1
        writer.join()
    assert ring.count == 20_000_000 and snaps > 1


def test_server_latency_records(model):
    name = uname()
    raws = ticks(50, model.feature_spec.raw_len)
    with fastpath.serve(name, model, cfg()) as srv, fastpath.connect(name) as c:
        got = [c.step(raws[i], i % 3, 1000 * (i + 1)) for i in range(50)]
        lat = srv.latency_records()
    assert lat.shape == (50, 5) and lat.dtype == np.uint32
    np.testing.assert_array_equal(lat[:, 3], [r.latency.total_ns for r in got])
    np.testing.assert_array_equal(lat[:, 4], [r.latency.wait_ns for r in got])


def test_segment_backing_is_reported_with_the_reasons(model):
    """What backs the segment is read back from smaps; each better backing not used says why
    (on a host without a hugetlb pool or shmem THP that is every one of them)."""
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
    """A hugetlbfs segment lives in the mount, with a symlink at /dev/shm/fastpath.<name>:
    clients (Python and C alike) open the usual path; stop removes both; a link left by a
    crash is replaced. The mount is stood in for by a directory: the report still says what
    smaps saw (ordinary pages), not what was asked."""
    from fastpath.serving import segment
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
