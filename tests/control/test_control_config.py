"""Configuration as users write it: errors name the key, a policy without its priority,
permissions in decimal digits, a key above every table, a byte-order mark, a binary file given
as the config, the same config given every way it can be, and the example config equal to the
code's defaults.
"""

import dataclasses
import os

import pytest

import fastpath
from fastpath.cli import main
from fastpath.control.config import EngineConfig, PlacementConfig, ServeConfig, load_config
from fastpath.errors import ConfigError


@pytest.mark.parametrize("cfg,key", [
    ({"placement": {"core": -1}}, "placement.core"),
    ({"placement": {"core": "fast"}}, "placement.core"),
    ({"placement": {"core": 1.0}}, "placement.core"),
    ({"placement": {"core": True}}, "placement.core"),
    ({"placement": {"policy": "deadline"}}, "placement.policy"),
    ({"placement": {"priority": 100}}, "placement.priority"),
    ({"placement": {"priority": 85}}, "placement.priority"),
    ({"placement": {"priority": 0}}, "placement.priority"),
    ({"placement": {"policy": "other", "priority": 5}}, "placement.priority"),
    ({"placement": {"allow_priority_above_80": "yes"}}, "placement.allow_priority_above_80"),
    ({"placement": {"cpu": 3}}, "placement.cpu"),
    ({"memory": {"huge_pages": "4k"}}, "memory.huge_pages"),
    ({"memory": {"huge_pages": True}}, "memory.huge_pages"),
    ({"memory": {"mlock": "on"}}, "memory.mlock"),
    ({"memory": {"lock": True}}, "memory.lock"),
])
def test_control_config_errors_name_the_key(cfg, key):
    from fastpath.control.config import load_config
    with pytest.raises(ConfigError) as exc:
        load_config(cfg)
    assert key in str(exc.value)


@pytest.mark.parametrize("cfg", [
    {"placement": {"policy": "other"}},
    "[placement]\npolicy = \"other\"\n",
])
def test_policy_other_alone_takes_priority_zero(cfg, tmp_path):
    """policy = "other" without a priority was refused for the default priority 50 the user never
    wrote."""
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


def test_serve_mode_written_as_decimal_digits_is_explained():
    """serve.mode = 600 (octal digits written as decimal) was refused with decimal bounds that
    explain nothing."""
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


@pytest.mark.parametrize("cfg,home", [
    ({"n_symbols": 8}, "[engine]"),
    ({"core": 3}, "[placement]"),
    ({"cos_threshold": 0.99}, "[cache]"),
])
def test_key_outside_any_table_names_its_section(cfg, home):
    """A key above every table was reported as an unknown section of its own name."""
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


def test_toml_with_byte_order_mark_loads(tmp_path):
    """A config saved as UTF-8 with a byte-order mark was not valid TOML."""
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


DEMO = os.path.join(os.path.dirname(fastpath.__file__), "data", "demo.fpm")


def test_a_binary_config_file_is_a_config_error_naming_it(tmp_path):
    """A binary file given as the config raised a bare UnicodeDecodeError naming no file."""
    from fastpath.errors import ConfigError
    p = tmp_path / "model.fpm"
    p.write_bytes(b"FPM1\x00\xff\xfe" + bytes(range(256)))
    with pytest.raises(ConfigError, match=r"model\.fpm is not a TOML config: not UTF-8"):
        fastpath.Engine(DEMO, config=str(p))
