"""The engine's memory: the arena's backing (huge pages, THP, none) read back, an engine built
by the control plane, an engine larger than the memory available refused before it is faulted
in, and the engine's size computed without building it.
"""

import os

import numpy as np
import pytest

from fastpath import Engine
from fastpath.control.config import load_config
from fastpath.control.memory import allocate, smaps_entry

from helpers.builders import windowed_model


@pytest.mark.parametrize("mode", ["auto", "thp", "none"])
def test_arena_backing_read_back(mode):
    r = allocate(3 << 20, mode, lock=True)
    rep = r.report
    assert r.addr % 64 == 0 and r.size >= 3 << 20
    assert rep.tried[-1][1] == "ok" and rep.method in ("hugetlb-2m", "thp", "normal")
    sm = smaps_entry(r.addr)
    assert sm.get("KernelPageSize") == rep.kernel_page_kb      # read back, not assumed
    if mode == "none":
        assert rep.method == "normal" and rep.page_size.endswith("K")
    if os.geteuid() == 0:
        assert rep.mlock == "ok"


def test_engine_arena_from_control_plane():
    m = windowed_model(np.random.default_rng(0))
    a = Engine(m, config={"engine": {"n_symbols": 64}, "memory": {"huge_pages": "none"}})
    b = Engine(m, config={"engine": {"n_symbols": 64}, "memory": {"huge_pages": "thp", "mlock": False}})
    assert a.memory.method == "normal" and b.memory.method in ("thp", "normal")
    x = np.random.default_rng(1).standard_normal((50, m.raw_len)).astype(np.float32)
    s = np.arange(50) % 64
    np.testing.assert_array_equal(a.step_batch(x, s).signal, b.step_batch(x, s).signal)


def test_engine_larger_than_available_memory_is_refused_not_oom_killed(monkeypatch):
    """An engine larger than the memory left was faulted in whole and the OOM killer ended the
    process."""
    import numpy as np

    from fastpath import Engine
    from fastpath import _memory as memory
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
    """doctor's size of the engine, taken from small engines, equals what an engine of that size
    asks for."""
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
