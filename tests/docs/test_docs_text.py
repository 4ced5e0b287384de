"""README.md and docs/*.md read against the code: their TOML blocks load with the config
loader, every command-line option they name exists in the command they name, every API name,
method and `[section] key` they name exists, every key of the example config is documented,
and the README stays a short page whose first two commands CI runs verbatim."""
from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
import tomllib

import pytest

from helpers.docs_pages import (DOCS, README, ROOT, all_text, anchors, blocks, pages, prose,
                                read, rel)

BENCH_CMD = "python3 -m venv .venv && .venv/bin/pip install '.[bench]' && .venv/bin/python bench/run.py"
TEST_CMD = ("python3 -m venv .venv && .venv/bin/pip install '.[test]' && "
            ".venv/bin/pytest -q -n 2 --dist loadfile")


# ---------------------------------------------------------------- the README as a page

def test_readme_is_short_and_opens_with_the_two_commands():
    """At most 200 lines; its first two ```bash blocks are the bench and test commands, byte
    for byte (.ci/run greps the test line and runs it as written)."""
    text = read(README)
    assert len(text.splitlines()) <= 200, len(text.splitlines())
    first = blocks(text, "bash")[:2]
    assert first == [BENCH_CMD + "\n", TEST_CMD + "\n"], first
    # the line .ci/run looks for is there, once, at the start of a line
    ci = [ln for ln in text.splitlines()
          if re.match(r"^python3 -m venv .venv && .*pip install '\.\[test\]'", ln)]
    assert ci == [TEST_CMD], ci


def test_readme_latency_table_matches_the_committed_bench():
    """The README's latency table quotes bench/results/latest-generated.json: p50 and p99 of
    the real miss, the real hit and each peer, and the CPU it ran on."""
    import json
    with open(os.path.join(ROOT, "bench", "results", "latest-generated.json")) as f:
        d = json.load(f)
    text = read(README)
    assert "python bench/run.py" in text and d["machine"]["cpu_model"] in text

    def fmt(ns):
        return f"{ns:.0f} ns" if ns < 1000 else f"{ns / 1000:.3g} us"
    rows = {"real miss": d["step"]["miss"]["python"], "real hit": d["step"]["hit"]["python"],
            "onnxruntime": d["peers"]["onnxruntime"]["python"],
            "numpy": d["peers"]["numpy"]["python"], "PyTorch": d["peers"]["torch"]["python"]}
    table = [ln for ln in text.splitlines() if ln.startswith("| ") and "per call" not in ln]
    for name, p in rows.items():
        row = [ln for ln in table if name in ln]
        assert len(row) == 1, (name, row)
        assert f"| {fmt(p['p50'])} | {fmt(p['p99'])} |" in row[0], (name, row[0], p)


def test_readme_and_docs_links_resolve():
    """Every relative link of README.md (which mkdocs does not check) names a file of the
    repository and, with a #fragment, a heading of that page."""
    text = prose(read(README))
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert any(lk.startswith("docs/") for lk in links)
    bad = []
    for lk in links:
        if re.match(r"[a-z]+://", lk):
            continue
        path, _, frag = lk.partition("#")
        full = os.path.join(ROOT, path)
        if not os.path.exists(full):
            bad.append(f"{lk}: no such file")
        elif frag and frag not in anchors(read(full)):
            bad.append(f"{lk}: no heading #{frag}")
    assert not bad, bad


# ---------------------------------------------------------------- TOML examples

def _toml_blocks():
    return [(rel(p), i, body) for p in pages() for i, body in enumerate(blocks(read(p), "toml"))]


def test_toml_blocks_load_with_load_config(tmp_path):
    """Each ```toml block is a config file a user may copy as it stands: it must load (a block
    that is only a fragment would have to say so in its first line), and every key it sets
    (commented ones aside) reaches the loaded config."""
    from fastpath.control.config import load_config
    found = _toml_blocks()
    assert any(page == "README.md" for page, _, _ in found), "the README has no ```toml block"
    assert len(found) >= 4, found
    for page, i, body in found:
        if body.lstrip().startswith("# fragment"):
            continue
        p = tmp_path / f"{page.replace('/', '_')}{i}.toml"
        p.write_text(body)
        cfg = load_config(str(p))
        for sec, table in tomllib.loads(body).items():
            for k, v in table.items():
                got = getattr(cfg, k) if sec == "engine" else getattr(getattr(cfg, sec), k)
                assert got == v, (page, sec, k, got, v)


def test_commented_keys_load_when_uncommented(tmp_path):
    """The keys a TOML block shows commented out are the ones a user uncomments: with their
    leading '# ' removed they must load too."""
    from fastpath.control.config import load_config
    for page, i, body in _toml_blocks():
        lines = [re.sub(r"^# (?=[a-z_]+ = )", "", ln) for ln in body.splitlines()]
        p = tmp_path / f"uncommented{i}.toml"
        p.write_text("\n".join(lines) + "\n")
        load_config(str(p))


def _example_keys() -> dict:
    """{section: [keys]} of fastpath/data/fastpath.example.toml, commented keys included."""
    from fastpath._build import EXAMPLE_CONFIG
    with open(EXAMPLE_CONFIG) as f:
        text = "\n".join(re.sub(r"^# (?=[a-z_]+ += )", "", ln) for ln in f.read().splitlines())
    return {sec: list(t) for sec, t in tomllib.loads(text).items()}


def test_every_example_config_key_is_in_the_configuration_reference():
    """docs/configuration.md has a `[section]` heading and a table row for each key of the
    example config the package ships (`fastpath example-config`)."""
    text = read(os.path.join(DOCS, "configuration.md"))
    sections = re.split(r"^## ", text, flags=re.M)
    keys = _example_keys()
    assert set(keys) == {"engine", "cache", "placement", "memory", "serve", "gpu"}, keys
    bad = []
    for sec, names in keys.items():
        part = [s for s in sections if s.startswith(f"`[{sec}]`")]
        if len(part) != 1:
            bad.append(f"no section `[{sec}]`")
            continue
        for k in names:
            if not re.search(rf"^\| `{k}` \|", part[0], flags=re.M):
                bad.append(f"[{sec}] {k}")
    assert not bad, bad


def test_configuration_reference_example_is_the_shipped_example():
    """The reference's full example sets the same keys to the same values as the shipped file
    (commented keys compared as commented)."""
    from fastpath._build import EXAMPLE_CONFIG
    body = blocks(read(os.path.join(DOCS, "configuration.md")), "toml")[-1]
    with open(EXAMPLE_CONFIG) as f:
        shipped = f.read()

    def settings(text):
        """Each `[section]` and `key = value` line, commented keys as "# key = value", without
        their trailing comments."""
        out = []
        for ln in text.splitlines():
            if re.match(r"^(# )?[a-z_0-9]+ += |^\[[a-z]+\]", ln):
                mark, ln = ("# ", ln[2:]) if ln.startswith("# ") else ("", ln)
                out.append(mark + re.sub(r"\s+#.*$", "", ln).strip())
        return out
    assert settings(body) == settings(shipped)


# ---------------------------------------------------------------- command-line options

_SPAN = re.compile(r"`([^`]+)`")
_CMD = re.compile(r"(?:\.venv/bin/)?(fastpath [a-z][a-z-]*|python3? (?:bench|tests/fuzz)/"
                  r"[a-z_]+\.py)\b")
_OPT = re.compile(r"(?<![\w-])--[a-z][a-z-]*")


def _commands(text: str):
    """(command, options) for each inline code span of prose that runs `fastpath <sub>` or
    `python bench/<x>.py`, and (None, option) for a span that is only an option, with the
    commands of its paragraph; then (command, options) for each line of a ```bash block that
    runs one (lines continued with a backslash joined)."""
    out = []
    for para in re.split(r"\n\s*\n", prose(text)):
        cmds, lone = [], []
        for span in _SPAN.findall(para):
            span = " ".join(span.split())
            m = _CMD.match(span)
            if m:
                cmds.append(m.group(1))
                out.append((m.group(1), _OPT.findall(span)))
            elif re.fullmatch(r"--[a-z][a-z-]*(?: \S+)?", span):
                lone.append(span.split()[0])
        # a lone option in a paragraph that runs no command is not ours (a linker flag)
        for opt in lone if cmds else ():
            out.append((tuple(cmds), [opt]))
    for body in blocks(text, "bash"):
        for line in body.replace("\\\n", " ").splitlines():
            for part in re.split(r"&&|\|\||;", line.split(" #", 1)[0]):
                m = _CMD.match(part.strip())
                if m:
                    out.append((m.group(1), _OPT.findall(part[m.end():])))
    return out


_HELP = {}


def _help(cmd: str) -> str:
    """The --help text of a documented command (fastpath's in process; a bench script by path)."""
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
            assert os.path.exists(script), f"the docs run {cmd}, which does not exist"
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


def test_cli_options_exist():
    mentions = [(rel(p), c, opts) for p in pages() for c, opts in _commands(read(p))]
    cmds = {c for _, c, _ in mentions if isinstance(c, str)}
    # the commands the docs are built around are all found by the extraction
    for need in ("fastpath calibrate", "fastpath doctor", "fastpath serve",
                 "fastpath example-config", "python bench/run.py", "python bench/scaling.py",
                 "python bench/zoo.py", "python bench/serve.py", "python bench/weights.py"):
        assert need in cmds, (need, sorted(cmds))
    readme_cmds = {c for page, c, _ in mentions if page == "README.md" and isinstance(c, str)}
    assert {"fastpath calibrate", "fastpath doctor", "python bench/run.py"} <= readme_cmds
    bad = []
    for page, cmd, opts in mentions:
        for opt in opts:
            if isinstance(cmd, str):
                if not _has(cmd, opt):
                    bad.append(f"{page}: `{cmd}` has no {opt}")
            elif not any(_has(c, opt) for c in cmd):
                bad.append(f"{page}: {opt} is in none of {list(cmd)}")
    assert not bad, bad


def test_cli_option_check_catches_a_missing_option():
    """The extraction reads options across a line break and in ```bash blocks, and the check
    refuses one argparse lacks (the test above cannot pass by finding nothing)."""
    text = "Run `fastpath calibrate --ticks t.npy\n  --no-such-option 3` and `fastpath serve --name md`."
    mentions = _commands(text)
    assert ("fastpath calibrate", ["--ticks", "--no-such-option"]) in mentions
    assert _has("fastpath calibrate", "--ticks")
    assert not _has("fastpath calibrate", "--no-such-option")
    assert not _has("fastpath serve", "--serve")     # --serve is doctor's, not serve's
    assert _has("fastpath doctor", "--serve")
    block = "```bash\nfastpath doctor --json \\\n  --bogus 1   # --comment-only\npip x && python bench/run.py --quick\n```\n"
    assert _commands(block) == [("fastpath doctor", ["--json", "--bogus"]),
                                ("python bench/run.py", ["--quick"])]


# ---------------------------------------------------------------- API names and config keys

_FILE_SUFFIXES = {"fpm", "onnx", "toml", "npy", "csv", "json", "png", "py", "h", "c", "so", "md",
                  "data", "pyi", "pyx", "pxd"}


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


def test_api_names_exist():
    """Every `fastpath.x.y` the docs name resolves, and every method or attribute they call on a
    model, engine, result, client or server (`model.with_head`, `eng.step_batch`, `c.poll`)
    exists."""
    import fastpath
    from fastpath import lob
    from fastpath._serve import Client
    from fastpath.control.config import EngineConfig
    from fastpath.gpu import GpuEngine
    text = all_text()
    # a name in quotes is a string the docs quote (a metadata_props key such as
    # "fastpath.model.sha256"), not an attribute path
    bad = [n for n in sorted(set(re.findall(r"(?<![\"'\w./-])fastpath(?:\.[A-Za-z_]\w*)+", text)))
           if n.rsplit(".", 1)[1] not in _FILE_SUFFIXES and not _resolve(n)]
    owners = {"Model": [fastpath.Model], "model": [fastpath.Model], "m": [fastpath.Model],
              "Engine": [fastpath.Engine], "eng": [fastpath.Engine], "e": [fastpath.Engine],
              # `engine.simd` is also how the docs name an [engine] config key
              "engine": [fastpath.Engine, EngineConfig],
              "FeatureSpec": [fastpath.FeatureSpec], "GpuEngine": [GpuEngine],
              "Result": [fastpath.Result], "r": [fastpath.Result], "c": [Client],
              "client": [Client], "Server": [fastpath.Server], "server": [fastpath.Server],
              "res": [fastpath.BatchResult], "lob": [lob]}
    pat = r"(?<![\w.])(" + "|".join(owners) + r")\.([a-z_]\w*)"
    seen = set(re.findall(pat, text))
    assert ("model", "with_weights") in seen and ("c", "poll") in seen
    for owner, name in sorted(seen):
        if name in _FILE_SUFFIXES:
            continue
        if not any(_attr(c, name) for c in owners[owner]):
            bad.append(f"{owner}.{name}")
    assert not bad, bad


def test_config_keys_exist():
    """`[section] key` in the prose names a key the config loader accepts."""
    from fastpath.control.config import load_config
    keys = set(re.findall(r"`\[([a-z]+)\] ([a-z_0-9]+)", all_text()))
    assert ("engine", "stage_times") in keys and ("serve", "on_full") in keys
    bad = []
    for sec, key in sorted(keys):
        try:
            load_config({sec: {key: getattr(load_config(None) if sec == "engine"
                                            else getattr(load_config(None), sec), key)}})
        except Exception as exc:  # noqa: BLE001 - the message is the finding
            bad.append(f"[{sec}] {key}: {exc}")
    assert not bad, bad


def test_every_docs_page_is_in_the_site_nav():
    """mkdocs.yml's nav lists each docs/*.md page once (mkdocs only notes a page left out)."""
    with open(os.path.join(ROOT, "mkdocs.yml")) as f:
        nav = re.findall(r"^  - [^:]+: (\S+\.md)$", f.read(), flags=re.M)
    on_disk = sorted(os.path.basename(p) for p in pages()[1:])
    assert sorted(nav) == on_disk and len(nav) == len(set(nav)), (nav, on_disk)
