"""The README read as a new user reads it: its TOML examples load with the config loader, and
every command-line option it names exists in the command it names, so the README cannot drift
from fastpath.control.config or from the argparse of `fastpath <subcommand>` / `bench/*.py`."""
from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")


def _readme() -> str:
    with open(README, encoding="utf-8") as f:
        return f.read()


def _blocks(text: str, lang: str) -> list:
    return re.findall(r"^```" + lang + r"\n(.*?)^```", text, flags=re.S | re.M)


def _prose(text: str) -> str:
    """The README without its fenced blocks (an option inside a TOML comment is not a use)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


# ---------------------------------------------------------------- TOML examples

def test_readme_toml_blocks_load_with_load_config(tmp_path):
    """Each ```toml block is a config file a user may copy as it stands: it must load (a block
    that is only a fragment would have to say so in its first line)."""
    from fastpath.control.config import load_config
    blocks = _blocks(_readme(), "toml")
    assert blocks, "the README has no ```toml block"
    for i, body in enumerate(blocks):
        if body.lstrip().startswith("# fragment"):
            continue
        p = tmp_path / f"readme{i}.toml"
        p.write_text(body)
        cfg = load_config(str(p))
        # every key the block sets (commented ones aside) reached the loaded config
        import tomllib
        for sec, table in tomllib.loads(body).items():
            for k, v in table.items():
                got = getattr(cfg, k) if sec == "engine" else getattr(getattr(cfg, sec), k)
                assert got == v, (sec, k, got, v)


def test_readme_commented_cache_keys_load_when_uncommented(tmp_path):
    """The [cache] keys the README shows commented out are the ones a user uncomments: with
    their leading '# ' removed they must load too."""
    from fastpath.control.config import load_config
    for i, body in enumerate(_blocks(_readme(), "toml")):
        lines = [re.sub(r"^# (?=[a-z_]+ = )", "", ln) for ln in body.splitlines()]
        p = tmp_path / f"uncommented{i}.toml"
        p.write_text("\n".join(lines) + "\n")
        load_config(str(p))


# ---------------------------------------------------------------- command-line options

_SPAN = re.compile(r"`([^`]+)`")


def _commands(text: str):
    """(command, options) for each inline code span of prose that runs `fastpath <sub>` or
    `python bench/<x>.py`, and (None, option) for a span that is only an option, with the
    commands of its paragraph."""
    out = []
    for para in re.split(r"\n\s*\n", _prose(text)):
        cmds, lone = [], []
        for span in _SPAN.findall(para):
            span = " ".join(span.split())
            m = re.match(r"(?:\.venv/bin/)?(fastpath [a-z][a-z-]*|python3? (?:bench|tests/fuzz)/"
                         r"[a-z_]+\.py)\b", span)
            if m:
                cmds.append(m.group(1))
                out.append((m.group(1), re.findall(r"(?<![\w-])--[a-z][a-z-]*", span)))
            elif re.fullmatch(r"--[a-z][a-z-]*(?: \S+)?", span):
                lone.append(span.split()[0])
        # a lone option in a paragraph that runs no command is not ours (a linker flag)
        for opt in lone if cmds else ():
            out.append((tuple(cmds), [opt]))
    return out


_HELP = {}


def _help(cmd: str) -> str:
    """The --help text of a README command (fastpath's in process; a bench script by path)."""
    if cmd not in _HELP:
        if cmd.startswith("fastpath "):
            from fastpath.cli import main
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf), pytest.raises(SystemExit) as ex:
                main([cmd.split()[1], "--help"])
            assert ex.value.code == 0, f"`{cmd} --help` exited {ex.value.code}: no such subcommand?"
            _HELP[cmd] = buf.getvalue()
        else:
            script = os.path.join(ROOT, cmd.split()[1])
            assert os.path.exists(script), f"the README runs {cmd}, which does not exist"
            if "fuzz" in script:
                _HELP[cmd] = ""  # atheris harness: targets, not options
            else:
                p = subprocess.run([sys.executable, script, "--help"], capture_output=True,
                                   text=True, timeout=60, cwd=ROOT)
                assert p.returncode == 0, (cmd, p.stderr[-2000:])
                _HELP[cmd] = p.stdout
    return _HELP[cmd]


def _has(cmd: str, opt: str) -> bool:
    return re.search(r"(?<![\w-])" + re.escape(opt) + r"(?![\w-])", _help(cmd)) is not None


def test_readme_cli_options_exist():
    mentions = _commands(_readme())
    cmds = {c for c, _ in mentions if isinstance(c, str)}
    # the commands the README is built around are all found by the extraction
    for need in ("fastpath calibrate", "fastpath doctor", "fastpath serve",
                 "fastpath example-config", "python bench/run.py", "python bench/scaling.py"):
        assert need in cmds, (need, sorted(cmds))
    bad = []
    for cmd, opts in mentions:
        for opt in opts:
            if isinstance(cmd, str):
                if not _has(cmd, opt):
                    bad.append(f"`{cmd}` has no {opt}")
            elif not any(_has(c, opt) for c in cmd):
                bad.append(f"{opt} is in none of {list(cmd)}")
    assert not bad, bad


def test_cli_option_check_catches_a_missing_option():
    """The extraction reads options across a line break and the check refuses one argparse
    lacks (the test above cannot pass by finding nothing)."""
    text = "Run `fastpath calibrate --ticks t.npy\n  --no-such-option 3` and `fastpath serve --name md`."
    mentions = _commands(text)
    assert ("fastpath calibrate", ["--ticks", "--no-such-option"]) in mentions
    assert _has("fastpath calibrate", "--ticks")
    assert not _has("fastpath calibrate", "--no-such-option")
    assert not _has("fastpath serve", "--serve")     # --serve is doctor's, not serve's
    assert _has("fastpath doctor", "--serve")


# ---------------------------------------------------------------- API names and config keys

_FILE_SUFFIXES = {"fpm", "onnx", "toml", "npy", "csv", "json", "png", "py", "h", "c", "so"}


def _resolve(dotted: str) -> bool:
    import importlib
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
            break
        except ImportError:
            continue
    else:
        return False
    for a in parts[i:]:
        if not hasattr(obj, a):
            return False
        obj = getattr(obj, a)
    return True


def _attr(cls, name: str) -> bool:
    import dataclasses
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else ()
    return hasattr(cls, name) or name in fields


def test_readme_api_names_exist():
    """Every `fastpath.x.y` the README names resolves, and every method or attribute it calls on
    a model, engine, result or client (`model.with_head`, `eng.step_batch`, `c.poll`) exists."""
    import fastpath
    from fastpath._serve import Client
    from fastpath.control.config import EngineConfig
    from fastpath.gpu import GpuEngine
    text = _readme()
    # a name in quotes is a string the README quotes (a metadata_props key such as
    # "fastpath.model.sha256"), not an attribute path
    bad = [n for n in sorted(set(re.findall(r"(?<![\"'\w.])fastpath(?:\.[A-Za-z_]\w*)+", text)))
           if n.rsplit(".", 1)[1] not in _FILE_SUFFIXES and not _resolve(n)]
    owners = {"Model": [fastpath.Model], "model": [fastpath.Model],
              "Engine": [fastpath.Engine], "eng": [fastpath.Engine], "e": [fastpath.Engine],
              # `engine.simd` is also how the README names an [engine] config key
              "engine": [fastpath.Engine, EngineConfig],
              "FeatureSpec": [fastpath.FeatureSpec], "GpuEngine": [GpuEngine],
              "Result": [fastpath.Result], "r": [fastpath.Result], "c": [Client]}
    pat = r"(?<![\w.])(" + "|".join(owners) + r")\.([a-z_]\w*)"
    seen = set(re.findall(pat, text))
    assert ("model", "with_weights") in seen and ("c", "poll") in seen
    for owner, name in sorted(seen):
        if name in _FILE_SUFFIXES:
            continue
        if not any(_attr(c, name) for c in owners[owner]):
            bad.append(f"{owner}.{name}")
    assert not bad, bad


def test_readme_config_keys_exist():
    """`[section] key` in the prose names a key the config loader accepts."""
    from fastpath.control.config import load_config
    keys = set(re.findall(r"`\[([a-z]+)\] ([a-z_0-9]+)", _readme()))
    assert ("engine", "stage_times") in keys and ("serve", "on_full") in keys
    bad = []
    for sec, key in sorted(keys):
        try:
            load_config({sec: {key: getattr(load_config(None) if sec == "engine"
                                            else getattr(load_config(None), sec), key)}})
        except Exception as exc:  # noqa: BLE001 - the message is the finding
            bad.append(f"[{sec}] {key}: {exc}")
    assert not bad, bad


# ---------------------------------------------------------------- the quick start runs

def test_readme_quick_start_block_runs(tmp_path, monkeypatch):
    """The README's first ```python block runs as written, given the files and arrays its
    comments say are the user's (a model.onnx, the example config, a tick x of the model's
    width, a batch), on a default engine of its own."""
    import numpy as np

    import fastpath
    from fastpath._build import DEMO_MODEL, EXAMPLE_CONFIG
    pytest.importorskip("onnx")
    block = _blocks(_readme(), "python")[0]
    assert 'fastpath.Engine("model.onnx"' in block and "fastpath.step(raw" in block
    monkeypatch.chdir(tmp_path)
    fastpath.Model.load(DEMO_MODEL).to_onnx("model.onnx")
    with open(EXAMPLE_CONFIG) as src, open("fastpath.toml", "w") as dst:
        dst.write(src.read())
    # the tick's width: the demo's raw_len (to_onnx records its feature spec; the file read
    # back takes raw ticks, as the bundle does)
    n_in = fastpath.Model.from_onnx("model.onnx").raw_len
    rng = np.random.default_rng(0)
    ns = {"x": rng.normal(size=n_in).astype(np.float32), "exchange_ts": 1_000_000_000,
          "raws": rng.normal(size=(4, n_in)).astype(np.float32),
          "symbols": np.array([0, 1, 2, 3]), "ts_ns": np.arange(4, dtype=np.int64) + 2_000_000_000}
    old = fastpath.get_default_engine()
    fastpath.set_default_engine(fastpath.Engine(DEMO_MODEL))
    try:
        exec(compile(block, "README.md", "exec"), ns)
        r = ns["r"]
        assert -1.0 <= r.signal <= 1.0 and 0.0 <= r.confidence <= 1.0
        assert isinstance(r.cached, bool)
        assert ns["eng"].stats()["ticks"] == 5          # one step, a batch of four
    finally:
        fastpath.set_default_engine(old)
