"""fastpath doctor's RLIMIT_MEMLOCK check counts what a config would lock: the engine arena
and state as the engine sizes them, plus the serve segment, and never calls a guessed size
allowed."""
import os

from fastpath import Engine
from fastpath.control import doctor
from fastpath.control import memory
from fastpath.control.host import Host
from fastpath.control.placement import Privileges


MB = 1 << 20


def _limit(monkeypatch, memlock):
    """An ordinary user without CAP_IPC_LOCK under this RLIMIT_MEMLOCK (what the default
    distribution and container settings give: 8 MB)."""
    monkeypatch.setattr(doctor, "read_privileges",
                        lambda host=None: Privileges(1000, 0, 0, memlock))


def _memlock(res):
    return next(c for c in res["checks"] if c["name"] == "rlimit_memlock")


def _engine_bytes(config=None, model=None):
    """What the engine asks the control plane to map for this model and config (its weights
    arena and per-symbol state, fp_engine_sizes), read from an engine built with that region
    unlocked on base pages: how the command line sizes it for doctor."""
    import dataclasses

    from fastpath._build import DEMO_MODEL
    from fastpath.control.config import MemoryConfig, load_config
    cfg = dataclasses.replace(load_config(config), memory=MemoryConfig("none", False))
    return int(Engine(DEMO_MODEL if model is None else model, "cpu", cfg).memory.bytes)


def test_doctor_counts_the_serve_segment_against_the_limit(monkeypatch):
    """Defaults under an 8 MB limit: the engine's arena and state (4096 symbols, 2 MB pages:
    8 MB) fit, but `fastpath serve` adds its 9 MB segment (1024 slots x 8 clients): the
    check must say it will fail, with the numbers and the fix (it said "allowed" for an
    assumed 8 MB arena)."""
    _limit(monkeypatch, 8 * MB)
    eb = _engine_bytes()
    res = doctor.run_checks(Host(), core=0, serve=True, arena_bytes=eb)
    c = _memlock(res)
    seg = memory.mapped_bytes(memory.serve_segment_bytes(256, 1024, 8), "auto")
    assert res["locked"]["segment"] == seg == 10 * MB
    assert res["locked"]["engine"] == memory.mapped_bytes(eb, "auto")
    assert res["locked"]["total"] == res["locked"]["engine"] + seg > 8 * MB
    assert c["status"] == "warn", c
    assert f"mlock of {res['locked']['total']} B" in c["detail"] and "will fail" in c["detail"]
    assert "serve.ring_slots 1024 x serve.max_clients 8" in c["detail"], c
    assert f"engine arena + state {res['locked']['engine']} B ({eb} B for 4096 symbols" \
        in c["detail"], c
    assert "RLIMIT_MEMLOCK is 8388608 B" in c["detail"], c
    kb = res["locked"]["total"] // 1024
    assert f"ulimit -l {kb}" in c["fix"] and "limits.conf" in c["fix"], c
    assert "IPC_LOCK" in c["fix"], c
    # the engine alone fits, and the note says serving would not
    res = doctor.run_checks(Host(), core=0, serve=False, arena_bytes=eb)
    c = _memlock(res)
    assert c["status"] == "pass" and res["locked"]["total"] == res["locked"]["engine"] <= 8 * MB
    assert "not allowed: raise the limit before serving" in c["detail"], c


def test_doctor_never_says_allowed_on_a_guessed_size(monkeypatch):
    """Without the engine's size the check used to assume 8 MB and pass under an 8 MB
    limit; now it says it cannot tell, unless any size is allowed."""
    _limit(monkeypatch, 8 * MB)
    c = _memlock(doctor.run_checks(Host(), core=0))
    assert c["status"] == "warn" and "cannot tell" in c["detail"], c
    assert "RLIMIT_MEMLOCK is 8388608 B" in c["detail"] and "4096 symbols" in c["detail"], c
    from fastpath.control.placement import UNLIMITED
    _limit(monkeypatch, UNLIMITED)
    c = _memlock(doctor.run_checks(Host(), core=0, serve=True))
    assert c["status"] == "pass" and "any size" in c["detail"], c


def test_doctor_reads_serving_and_sizes_from_the_config(monkeypatch, tmp_path):
    _limit(monkeypatch, 64 * MB)
    # a [serve] table: serving is configured; its sizes are the ones counted
    cfg = tmp_path / "fp.toml"
    cfg.write_text("[engine]\nn_symbols = 64\n[serve]\nring_slots = 16384\nmax_clients = 8\n")
    res = doctor.run_checks(Host(), core=0, config=str(cfg), arena_bytes=_engine_bytes(str(cfg)))
    seg = memory.serve_segment_bytes(256, 16384, 8)
    assert res["locked"]["serve"] and res["locked"]["segment_asked"] == seg
    assert res["locked"]["total"] > 64 * MB and _memlock(res)["status"] == "warn"
    assert "serve.ring_slots 16384 x serve.max_clients 8" in _memlock(res)["detail"]
    # more symbols: a bigger engine state, as the engine sizes it
    small_cfg, big_cfg = {"engine": {"n_symbols": 64}}, {"engine": {"n_symbols": 65536}}
    small = doctor.run_checks(Host(), core=0, config=small_cfg,
                              arena_bytes=_engine_bytes(small_cfg))
    big = doctor.run_checks(Host(), core=0, config=big_cfg, arena_bytes=_engine_bytes(big_cfg))
    assert not small["locked"]["serve"] and _memlock(small)["status"] == "pass"
    assert big["locked"]["engine"] > 64 * MB and _memlock(big)["status"] == "warn"
    assert "65536 symbols" in _memlock(big)["detail"]
    # with mlock off nothing is locked, whatever the limit
    _limit(monkeypatch, 0)
    res = doctor.run_checks(Host(), core=0, config={"memory": {"mlock": False}}, serve=True)
    assert res["locked"]["total"] == 0 and _memlock(res)["status"] == "pass"


def test_segment_size_is_the_servers():
    """serve_segment_bytes equals the size the C side writes in a live segment's header."""
    import struct

    import fastpath
    from fastpath._serve import segment_path
    name = f"fp-limits-{os.getpid()}"
    cfg = {"serve": {"ring_slots": 64, "max_clients": 3},
           "memory": {"huge_pages": "none", "mlock": False}, "engine": {"n_symbols": 8}}
    with fastpath.serve(name, None, cfg):
        with open(segment_path(name), "rb") as f:
            head = f.read(64)
    raw_len, _, slots, clients = struct.unpack_from("<4I", head, 16)
    total = struct.unpack_from("<Q", head, 48)[0]
    assert (raw_len, slots, clients) == (256, 64, 3)
    assert memory.serve_segment_bytes(raw_len, slots, clients) == total
