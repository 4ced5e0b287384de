"""The documentation as the tests read it: README.md and docs/*.md, their fenced blocks, and
the `<!-- no-run -->` mark that exempts a python block from being run."""
from __future__ import annotations

import glob
import os
import re

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
README = os.path.join(ROOT, "README.md")
DOCS = os.path.join(ROOT, "docs")
NO_RUN = "<!-- no-run -->"


def pages() -> list:
    """README.md, then every docs/*.md page, as paths."""
    return [README] + sorted(glob.glob(os.path.join(DOCS, "*.md")))


def rel(path: str) -> str:
    return os.path.relpath(path, ROOT)


def read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def all_text() -> str:
    return "\n\n".join(read(p) for p in pages())


def blocks(text: str, lang: str) -> list:
    """The bodies of the ```lang blocks of a text, in order."""
    return re.findall(r"^```" + lang + r"\n(.*?)^```", text, flags=re.S | re.M)


def fenced(text: str, lang: str) -> list:
    """(line number, body, runs) of each ```lang block; runs is False where the line before
    the fence is the no-run mark."""
    out = []
    for m in re.finditer(r"^```" + lang + r"\n(.*?)^```", text, flags=re.S | re.M):
        line = text.count("\n", 0, m.start()) + 1
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        out.append((line, m.group(1), before.strip() != NO_RUN))
    return out


def prose(text: str) -> str:
    """The text without its fenced blocks (an option inside a TOML comment is not a use)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def slug(heading: str) -> str:
    """The anchor MkDocs (python-markdown's toc) gives a heading."""
    s = re.sub(r"[`*]", "", heading).strip().lower()
    s = re.sub(r"[^\w\s-]", "", s)
    return re.sub(r"[\s]+", "-", s)


def anchors(text: str) -> set:
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", prose(text), flags=re.M)}
