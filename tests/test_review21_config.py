"""Configuration and the command line as a user meets them: a config written the way people
write one (a policy without its priority, permissions in octal digits, a key above every table,
a file saved with a byte-order mark) and `fastpath doctor` options out of range.

Each test failed before its fix (the message or the outcome asserted here was different).
"""
import dataclasses
import os

import pytest

from fastpath.cli import main
from fastpath.control.config import EngineConfig, PlacementConfig, ServeConfig, load_config
from fastpath.errors import ConfigError


# ------------------------------------------------------------------ [placement]

@pytest.mark.parametrize("cfg", [
    {"placement": {"policy": "other"}},
    "[placement]\npolicy = \"other\"\n",
])
def test_policy_other_alone_takes_priority_zero(cfg, tmp_path):
    # Was: ConfigError "placement.priority must be 0 with policy 'other', got 50", a priority
    # the user never wrote (the default was 50 whatever the policy)
    if isinstance(cfg, str):
        p = tmp_path / "c.toml"
        p.write_text(cfg)
        cfg = p
    c = load_config(cfg).placement
    assert (c.policy, c.priority) == ("other", 0)
    assert PlacementConfig(policy="other").priority == 0


def test_placement_priority_defaults_unchanged_for_realtime():
    assert PlacementConfig().priority == 50
    assert PlacementConfig(policy="rr").priority == 50
    assert load_config({"placement": {"policy": "fifo"}}).placement.priority == 50
    # a priority the user did write is still checked against the policy
    with pytest.raises(ConfigError, match="must be 0 with policy 'other', got 5"):
        load_config({"placement": {"policy": "other", "priority": 5}})
    with pytest.raises(ConfigError, match="placement.priority"):
        PlacementConfig(policy="fifo", priority=0)


# ------------------------------------------------------------------ [serve] mode

def test_serve_mode_written_as_decimal_digits_is_explained():
    # Was: "serve.mode must be in [256, 511], got 600": decimal bounds for file permissions
    with pytest.raises(ConfigError) as ei:
        load_config({"serve": {"mode": 600}})
    msg = str(ei.value)
    assert "serve.mode" in msg and "[0o400, 0o777]" in msg and "0o600" in msg, msg
    with pytest.raises(ConfigError, match=r"serve\.mode .*0o1600"):
        ServeConfig(mode=0o1600)
    with pytest.raises(ConfigError, match=r"serve\.mode .*too large"):
        ServeConfig(mode=2 ** 70)
    # in range and with the owner's rw bits: accepted as before; a bool is still not a mode
    assert ServeConfig(mode=0o640).mode == 0o640 and ServeConfig(mode=384).mode == 0o600
    with pytest.raises(ConfigError, match="serve.mode must give the serving user"):
        ServeConfig(mode=0o400)
    with pytest.raises(ConfigError, match="serve.mode must be int"):
        ServeConfig(mode=True)


# ------------------------------------------------------------------ keys above every table

@pytest.mark.parametrize("cfg,home", [
    ({"n_symbols": 8}, "[engine]"),
    ({"core": 3}, "[placement]"),
    ({"cos_threshold": 0.99}, "[cache]"),
])
def test_key_outside_any_table_names_its_section(cfg, home):
    # Was: "unknown config section [n_symbols]": the key read as a misspelt section
    with pytest.raises(ConfigError) as ei:
        load_config(cfg)
    msg = str(ei.value)
    assert "outside any [table]" in msg and f"write it under {home}" in msg, msg


def test_key_outside_any_table_in_a_toml_file(tmp_path):
    p = tmp_path / "flat.toml"
    p.write_text("n_symbols = 8\n[memory]\nmlock = false\n")
    with pytest.raises(ConfigError, match=r"flat\.toml: 'n_symbols' is a key outside any "
                                          r"\[table\].*write it under \[engine\]"):
        load_config(p)
    # a shared key name lists every section that has it; an unknown one says none does
    with pytest.raises(ConfigError, match=r"\[serve\], \[gpu\]"):
        load_config({"mode": 3})
    with pytest.raises(ConfigError, match="no section has such a key"):
        load_config({"colour": "red"})
    # an unknown table is still an unknown section
    with pytest.raises(ConfigError, match=r"unknown config section \[engines\]"):
        load_config({"engines": {}})


# ------------------------------------------------------------------ the file itself

def test_toml_with_byte_order_mark_loads(tmp_path):
    # Was: "is not valid TOML: Invalid statement (at line 1, column 1)" for a file a Windows
    # editor saved as UTF-8 with a BOM
    body = "[engine]\r\nn_symbols = 8\r\n[serve]\r\nmax_clients = 3\r\n"
    plain, bom = tmp_path / "plain.toml", tmp_path / "bom.toml"
    plain.write_bytes(body.encode())
    bom.write_bytes(b"\xef\xbb\xbf" + body.encode())
    a, b = load_config(plain), load_config(bom)
    assert dataclasses.replace(a, source="") == dataclasses.replace(b, source="")
    assert b.n_symbols == 8 and b.serve.max_clients == 3
    # a BOM is accepted only at the start: a binary file is still refused with its byte
    bad = tmp_path / "bad.toml"
    bad.write_bytes(b"[engine]\nn\xff = 1\n")
    with pytest.raises(ConfigError, match=r"not UTF-8 text \(byte 10: b'\\xff'\)"):
        load_config(bad)


def test_same_config_every_way_it_can_be_given(tmp_path):
    d = {"engine": {"n_symbols": 16, "latency_records": 1024, "stage_times": False},
         "placement": {"policy": "other"}, "memory": {"huge_pages": "none", "mlock": False},
         "serve": {"mode": 0o640}}
    p = tmp_path / "c.toml"
    p.write_text("[engine]\nn_symbols = 16\nlatency_records = 1024\nstage_times = false\n"
                 "[placement]\npolicy = \"other\"\n[memory]\nhuge_pages = \"none\"\n"
                 "mlock = false\n[serve]\nmode = 0o640\n")
    got = [load_config(x) for x in (d, p, str(p), EngineConfig.from_dict(d))]
    got.append(EngineConfig(n_symbols=16, latency_records=1024, stage_times=False,
                            placement={"policy": "other"},
                            memory={"huge_pages": "none", "mlock": False},
                            serve={"mode": 0o640}))
    norm = [dataclasses.replace(c, source="") for c in got]
    assert all(n == norm[0] for n in norm[1:]), norm


# ------------------------------------------------------------------ fastpath doctor options

@pytest.mark.parametrize("argv,option", [
    (["doctor", "--core", "-1"], "--core"),
    (["doctor", "--core", "70000"], "--core"),
    (["doctor", "--jitter", "nan"], "--jitter"),
    (["doctor", "--jitter", "0"], "--jitter"),
    (["doctor", "--jitter-threshold-ns", "0"], "--jitter-threshold-ns"),
])
def test_doctor_bad_option_is_a_usage_error_naming_it(argv, option, capsys):
    # Was: --core -1 reported as "placement.core = -1 is not an online CPU" (a key the user
    # did not write), and --jitter nan as "jitter seconds must be ..." after the host checks
    with pytest.raises(SystemExit) as ei:
        main(argv)
    assert ei.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}:" in err, err


def test_doctor_core_not_online_names_the_option(capsys):
    online = sorted(os.sched_getaffinity(0))
    missing = next(c for c in range(1 << 16) if not os.path.exists(
        f"/sys/devices/system/cpu/cpu{c}"))
    assert main(["doctor", "--core", str(missing)]) == 2
    err = capsys.readouterr().err
    assert f"--core {missing} is not an online CPU" in err and "placement.core" not in err, err
    assert online      # the host has CPUs: the refusal is about the number, not the host


def test_example_config_is_the_code_defaults(capsys):
    # `fastpath example-config` prints the defaults the code uses, and every key it leaves
    # commented out loads when uncommented
    assert main(["example-config"]) == 0
    text = capsys.readouterr().out
    import tomllib
    ex = EngineConfig.from_dict(tomllib.loads(text))
    assert dataclasses.replace(ex, source="") == dataclasses.replace(EngineConfig(), source="")
    import re
    uncommented = re.sub(r"(?m)^# ([a-z_]+ = )", r"\1", text)
    full = EngineConfig.from_dict(tomllib.loads(uncommented))
    assert full.weights is not None and full.cache.enabled is True


# ------------------------------------------------------------------ calibrate's input files

def _npy_cuts():
    import io

    import numpy as np
    a = np.zeros((3, 256), np.float32)
    npy, npz = io.BytesIO(), io.BytesIO()
    np.save(npy, a)
    np.savez(npz, a=a)
    return {"empty": b"", "text": b"abc\n", "npy-cut-3": npy.getvalue()[:3],
            "npz-cut-100": npz.getvalue()[:100], "npz-cut-30": npz.getvalue()[:30]}


@pytest.mark.parametrize("name", sorted(_npy_cuts()))
@pytest.mark.parametrize("option", ["--ticks", "--symbols"])
def test_calibrate_empty_or_cut_npy_is_exit_2_naming_the_file(name, option, tmp_path, capsys):
    # Was: an empty file raised a bare EOFError and a truncated .npz a zipfile.BadZipFile
    # (tracebacks), and a text file was "pickled (object) data ... allow_pickle"
    import numpy as np
    from fastpath._build import DEMO_MODEL
    bad = tmp_path / f"{name}.npy"
    bad.write_bytes(_npy_cuts()[name])
    good = tmp_path / "ticks.npy"
    np.save(good, np.zeros((3, 256), np.float32))
    files = {"--ticks": str(good), "--symbols": None, option: str(bad)}
    argv = ["calibrate", "--model", DEMO_MODEL, "--out", str(tmp_path / "o.fpm")]
    for k, v in files.items():
        if v is not None:
            argv += [k, v]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{bad} is not a numpy .npy file" in err and "pickle" not in err, err
    assert not (tmp_path / "o.fpm").exists()


# ------------------------------------------------------------------ [memory] on a small host

def test_engine_larger_than_available_memory_is_refused_not_oom_killed(monkeypatch):
    # Was: ordinary and THP pages were mapped and then faulted in whole (memset) whatever the
    # host had left: engine.n_symbols = 4194304 (in range) asks for about 8 GB, and on a
    # smaller host or container the OOM killer ended the process without a word
    import numpy as np

    from fastpath import Engine
    from fastpath.control import memory
    from helpers.builders import random_model
    m = random_model(np.random.default_rng(0), [8, 4, 2])
    big = {"engine": {"n_symbols": 1 << 14}, "memory": {"huge_pages": "none", "mlock": False}}
    monkeypatch.setattr(memory, "available_bytes", lambda root="/": 1 << 20)
    for cfg in (big, dict(big, memory={"huge_pages": "thp", "mlock": False})):
        with pytest.raises(MemoryError, match=r"needs \d+ bytes .* only 1048576 are available"
                                              r".*lower engine\.n_symbols"):
            Engine(m, config=cfg)
    # within what is available: built as before
    monkeypatch.setattr(memory, "available_bytes", lambda root="/": 1 << 40)
    assert Engine(m, config=big).n_symbols == 1 << 14


def test_available_bytes_reads_meminfo_and_the_cgroup_limit(tmp_path):
    from fastpath.control.memory import available_bytes
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("MemTotal: 100 kB\nMemAvailable:    4096 kB\n")
    assert available_bytes(str(tmp_path)) == 4096 * 1024
    cg = tmp_path / "sys/fs/cgroup"
    cg.mkdir(parents=True)
    (cg / "memory.max").write_text("3000000\n")
    (cg / "memory.current").write_text("1000000\n")
    assert available_bytes(str(tmp_path)) == 2000000          # the container's room is less
    (cg / "memory.max").write_text("max\n")
    assert available_bytes(str(tmp_path)) == 4096 * 1024
    assert available_bytes(str(tmp_path / "nowhere")) is None


@pytest.mark.parametrize("n", [4, 1000, 4097, 20000])
@pytest.mark.parametrize("kind", ["demo", "mlp", "windowed", "bf16"])
def test_engine_region_bytes_without_building_the_engine_matches_a_built_one(n, kind):
    # doctor's measure of what the engine locks is now taken from small engines (a real one of
    # 4M symbols is GBs faulted in just to be sized, and refused where they are not): it must
    # equal what an engine of that size asks for
    import dataclasses

    import numpy as np

    from fastpath import Engine
    from fastpath._build import DEMO_MODEL, engine_region_bytes
    from fastpath.control.config import MemoryConfig
    from helpers.builders import random_model, windowed_model
    rng = np.random.default_rng(1)
    m = {"demo": DEMO_MODEL, "mlp": random_model(rng, [8, 16, 2]),
         "windowed": windowed_model(rng, window=7),
         "bf16": random_model(rng, [8, 32, 16, 2])}[kind]
    cfg = {"engine": {"n_symbols": n}}
    if kind == "bf16":
        cfg["engine"]["weights"] = "bf16"
    built = Engine(m, "cpu", dataclasses.replace(load_config(cfg),
                                                  memory=MemoryConfig("none", False)))
    assert engine_region_bytes(m, cfg) == built.memory.bytes


def test_doctor_sizes_a_huge_engine_on_a_host_without_room_for_it(monkeypatch, tmp_path, capsys):
    # Was: doctor built the real engine to size it: engine.n_symbols = 4194304 faulted in
    # about 8 GB (killed or refused on a smaller host) before any check was printed
    import json

    from fastpath.control import memory
    monkeypatch.setattr(memory, "available_bytes", lambda root="/": 64 << 20)
    p = tmp_path / "big.toml"
    p.write_text("[engine]\nn_symbols = 4194304\n")
    assert main(["doctor", "--json", "--config", str(p)]) in (0, 1)
    res = json.loads(capsys.readouterr().out)
    mlock = [c for c in res["checks"] if "4194304 symbols" in c["detail"]]
    assert mlock, [c["detail"] for c in res["checks"]]
    # serving it is refused with the reason, exit 2, not a traceback
    assert main(["serve", "--name", "h21cfg-big", "--config", str(p)]) == 2
    assert "lower engine.n_symbols" in capsys.readouterr().err


@pytest.mark.parametrize("cmd", ["example-config", "info"])
def test_reader_gone_is_not_reported_as_bad_input(cmd, tmp_path):
    # Was: `fastpath doctor --json | head` and the like printed "fastpath doctor: [Errno 32]
    # Broken pipe" and exited 2, the code for bad input
    import subprocess
    import sys
    p = subprocess.Popen([sys.executable, "-m", "fastpath.cli", cmd], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, cwd=tmp_path)
    p.stdout.close()            # before the command writes a byte
    err = p.stderr.read().decode()
    p.stderr.close()
    assert p.wait(timeout=120) == 1 and err == "", err
