"""The python blocks of README.md and docs/*.md run as written. The blocks of one page run in
order in one namespace, which starts with what the pages say is the user's: a model.onnx, a
model.fpm bundle and the example fastpath.toml in the working directory, ticks of the demo
model's width and an engine on it. A block marked `<!-- no-run -->` on the line before it
(it needs a GPU, or changes the process's signal handling) is left out."""
from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from helpers.docs_pages import README, fenced, pages, read, rel


def _python_pages():
    return [p for p in pages() if fenced(read(p), "python")]


@pytest.fixture
def user_files(tmp_path, monkeypatch):
    """The working directory and namespace the pages' examples assume; the default engine
    is put back afterwards (a page may call fastpath.configure)."""
    import fastpath
    from fastpath import lob
    from fastpath._build import DEMO_MODEL, EXAMPLE_CONFIG
    pytest.importorskip("onnx")
    monkeypatch.chdir(tmp_path)
    fastpath.Model.load(DEMO_MODEL).to_onnx("model.onnx")
    shutil.copy(DEMO_MODEL, "model.fpm")
    shutil.copy(EXAMPLE_CONFIG, "fastpath.toml")
    n_in = fastpath.Model.from_onnx("model.onnx").raw_len
    rng = np.random.default_rng(0)
    stream = lob.generate_stream(n_ticks=600, n_symbols=2, seed=5)
    ns = {"np": np, "fastpath": fastpath,
          "x": rng.normal(size=n_in).astype(np.float32), "exchange_ts": 1_000_000_000,
          "raws": rng.normal(size=(4, n_in)).astype(np.float32),
          "symbols": np.array([0, 1, 2, 3]), "ts_ns": np.arange(4, dtype=np.int64) + 2_000_000_000,
          "raws_long": lob.raw_from_book(stream), "symbols_long": stream.symbols,
          "ts_long": stream.ts_ns, "eng": fastpath.Engine("model.fpm")}
    ns["raw"] = ns["x"].copy()
    old = fastpath.get_default_engine()
    fastpath.set_default_engine(fastpath.Engine(DEMO_MODEL))
    try:
        yield ns
    finally:
        fastpath.set_default_engine(old)


@pytest.mark.parametrize("page", _python_pages(), ids=rel)
def test_page_python_blocks_run(page, user_files):
    ran = 0
    for line, body, runs in fenced(read(page), "python"):
        if runs:
            exec(compile(body, f"{rel(page)}:{line + 1}", "exec"), user_files)
            ran += 1
    assert ran, f"{rel(page)}: every python block is marked no-run"


def test_no_run_blocks_are_few_and_marked_on_pages_that_say_why():
    """The exemptions are the GPU stage (no GPU in the test run) and process-wide signal
    handling; any other block runs."""
    exempt = {rel(p): sum(not r for _, _, r in fenced(read(p), "python")) for p in pages()}
    assert {k: v for k, v in exempt.items() if v} == {"docs/gpu.md": 1, "docs/serving.md": 1}


def test_readme_quick_start_block_runs(user_files):
    """The README's first ```python block runs as written, given the files and arrays its
    comments say are the user's (a model.onnx, the example config, a tick x of the model's
    width, a batch), on a default engine of its own."""
    block = fenced(read(README), "python")[0][1]
    assert 'fastpath.Engine("model.onnx"' in block and "fastpath.step(raw" in block
    exec(compile(block, "README.md", "exec"), user_files)
    r = user_files["r"]
    assert -1.0 <= r.signal <= 1.0 and 0.0 <= r.confidence <= 1.0
    assert isinstance(r.cached, bool)
    assert user_files["eng"].stats()["ticks"] == 5          # one step, a batch of four
    assert os.path.exists("fastpath.toml")
