"""Checks of the serving configuration and arguments: [serve] keys, the engine tables a
server takes, server names, timeouts of serve(), stop() and connect(), each refused with a
clear error before anything starts."""
import os
import tomllib

import numpy as np
import pytest

import fastpath
from fastpath import ConfigError, InputError
from fastpath._build import EXAMPLE_CONFIG
from fastpath._serve import segment_path
from fastpath.control.config import EngineConfig, ServeConfig, load_config
from fastpath.serving.client import Client
from helpers.serving import cfg, uname


# ------------------------------------------------------------------ EngineConfig sections
@pytest.mark.parametrize("kw,match", [
    ({"serve": {"ring_slots": 3}}, r"serve\.ring_slots must be a power of two, got 3"),
    ({"serve": {"ringslots": 8}}, r"unknown key serve\.ringslots"),
    ({"cache": {"enabled": 1}}, r"cache\.enabled must be bool, got int 1"),
    ({"placement": None}, r"section placement must be a PlacementConfig .*got NoneType"),
    ({"memory": "none"}, r"section memory must be a MemoryConfig .*got str"),
])
def test_engine_config_sections_given_as_tables_are_checked(kw, match):
    """Regression: EngineConfig(serve={...}) tables were accepted unchecked; a bad key is a
    ConfigError naming it."""
    with pytest.raises(fastpath.ConfigError, match=match):
        EngineConfig(**kw)


def test_engine_config_sections_given_as_tables_are_used():
    c = EngineConfig(serve={"ring_slots": 8, "place": False})
    assert isinstance(c.serve, ServeConfig) and c.serve.ring_slots == 8 and not c.serve.place


# ------------------------------------------------------------------ server names
@pytest.mark.parametrize("call", ["serve", "connect"])
def test_a_server_name_that_is_not_utf8_is_an_input_error(call):
    """Regression: a server name that is not UTF-8 raised UnicodeEncodeError from the bindings."""
    name = "md\udcff"
    with pytest.raises(InputError, match="server name"):
        if call == "serve":
            fastpath.serve(name, config=cfg())
        else:
            fastpath.connect(name, timeout=0)


# ------------------------------------------------------------------ config honoured
def test_serve_refuses_a_config_asking_for_the_gpu_backend():
    """Regression: [engine] backend = "gpu" was silently served on the CPU; serve() refuses it."""
    name = uname()
    with pytest.raises(ConfigError, match=r"engine\.backend = 'gpu'"):
        fastpath.serve(name, config=cfg(engine={"backend": "gpu"}))
    assert not os.path.lexists(segment_path(name))


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


def test_a_client_made_directly_checks_its_timeouts():
    """Regression: Client() took nan, inf, huge, negative or str timeouts unchecked (overflowed
    deadlines, false stalls)."""

    name = uname()
    for bad in (float("nan"), float("inf"), 1e12, -1, "5", True):
        with pytest.raises(InputError, match=r"^timeout must be a number of seconds in \[0, "):
            Client(name, bad)
    for bad in (float("nan"), -1, 0, "5"):
        with pytest.raises(InputError, match=r"^stall_timeout must be a number of seconds in "
                                             r"\(0, "):
            Client(name, 1.0, bad)
    with fastpath.serve(name, config=cfg()):
        with Client(name, 5, 30) as c:
            assert c.stall_timeout == 30
            c.step(np.zeros(c.raw_len, np.float32), 0)


@pytest.mark.parametrize("value", [0, -1, 4000, float("nan"), True, "1"])
def test_connect_stall_timeout_is_checked(value):
    with pytest.raises(InputError, match="stall_timeout must be a number of seconds"):
        fastpath.connect(uname(), timeout=0, stall_timeout=value)


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
    with pytest.raises(ConfigError, match=match):
        load_config({"serve": {key: value}})


def test_example_config_serve_section_parses():
    with open(EXAMPLE_CONFIG, "rb") as f:
        assert "serve" in tomllib.load(f)
    assert load_config(EXAMPLE_CONFIG).serve.mode == 0o600
