"""The compiled core's shape: csrc/ is linked into one extension (fastpath._core) that the other
compiled modules load, so a process has one clock calibration and one kernel table; Cython code
is shared through .pxd cimport; the hot path does not import the control plane or the bench."""
import ast
import ctypes
import importlib
import os
import re
import shutil
import subprocess

import pytest

import fastpath
from helpers.clock import _Clock

PKG = os.path.dirname(os.path.abspath(fastpath.__file__))      # the installed package (.so)
# the sources (.pyx, .pxd, .py): the checkout, since a wheel ships no .pyx
SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                   "fastpath")
COMPILED = ["fastpath._core", "fastpath._engine", "fastpath._default", "fastpath._kernels",
            "fastpath._ring", "fastpath._serve", "fastpath._client", "fastpath.gpu._protocol",
            "fastpath.gpu._tick"]
# the hot path and what builds an engine: none of them may import fastpath.control / .bench
HOT = ["_core.pyx", "_core.pxd", "_engine.pyx", "_engine.pxd", "_csrc.pxd", "_default.pyx",
       "_batch.py", "_resolve.py", "_build.py", "config.py", "_memory.py", "_privileges.py",
       "gpu/_refusal.py", "gpu/_tick.pyx", "__init__.py"]
# modules whose imports all sit at the top: the import graph is what the file's head says
TOP_IMPORTS = ["config.py", "_memory.py", "_privileges.py", "gpu/_refusal.py",
               "_batch.py", "_resolve.py", "_build.py", "__init__.py"]


def _shared_objects():
    out = []
    for root, _, files in os.walk(PKG, followlinks=False):
        out += [os.path.join(root, f) for f in files if f.endswith(".so")]
    return sorted(out)


def _defines(so, symbol):
    r = subprocess.run(["nm", "-D", "--defined-only", so], capture_output=True, text=True,
                       check=True)
    return any(line.split()[-1] == symbol for line in r.stdout.splitlines() if line.strip())


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs nm (binutils)")
@pytest.mark.parametrize("symbol", ["fp_step", "fp_clock", "fp_kernels_for", "fp_clock_init"])
def test_one_compiled_copy_of_the_c_core(symbol):
    """Every compiled module of the package: exactly one defines the C core's symbols, and it
    is fastpath._core (the others resolve them there at load time)."""
    sos = _shared_objects()
    assert len(sos) >= len(COMPILED), sos
    core = importlib.import_module("fastpath._core").__file__
    defining = [so for so in sos if _defines(so, symbol)]
    assert defining == [os.path.abspath(core)], defining


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs nm (binutils)")
@pytest.mark.parametrize("name", COMPILED)
def test_every_module_sees_the_one_clock_and_kernel_table(name):
    """fp_clock and the kernel table looked up through the handle of each module that calls
    the C core (the symbol search covers the libraries it loaded) are the core's: one
    calibration, one table."""
    so = importlib.import_module(name).__file__
    r = subprocess.run(["nm", "-D", "--undefined-only", so], capture_output=True, text=True,
                       check=True)
    if name != "fastpath._core" and not any(
            line.split()[-1].startswith("fp_") for line in r.stdout.splitlines() if line.strip()):
        pytest.skip(f"{name} calls nothing in the C core (header-only code)")
    core = ctypes.CDLL(importlib.import_module("fastpath._core").__file__)
    lib = ctypes.CDLL(so)
    assert (ctypes.addressof(_Clock.in_dll(lib, "fp_clock"))
            == ctypes.addressof(_Clock.in_dll(core, "fp_clock")))
    for isa in range(3):       # fp_isa: scalar, avx2, avx512 (NULL where the CPU lacks it)
        ptrs = []
        for handle in (lib, core):
            f = handle.fp_kernels_for
            f.restype, f.argtypes = ctypes.c_void_p, [ctypes.c_int]
            ptrs.append(f(isa))
        assert ptrs[0] == ptrs[1], (name, isa)


def test_the_clock_is_calibrated_once():
    """The clock the engine reports is the one the kernel shims and the core read: a field
    written through one module is seen through every other."""
    from fastpath import _kernels as K
    clk = _Clock.in_dll(ctypes.CDLL(K.__file__), "fp_clock")
    assert fastpath.clock_info()["source"] == K.clock_info()["source"]
    saved = clk.reanchors
    try:
        clk.reanchors = saved + 12345
        assert fastpath.clock_info()["reanchors"] == saved + 12345
        assert K.clock_info()["reanchors"] == saved + 12345
    finally:
        clk.reanchors = saved


def test_cython_code_is_shared_by_cimport_not_include():
    """No .pxi in the package and no `include` statement in a .pyx or .pxd."""
    for root, _, files in os.walk(SRC):
        for f in files:
            assert not f.endswith(".pxi"), os.path.join(root, f)
            if f.endswith((".pyx", ".pxd")):
                with open(os.path.join(root, f)) as fh:
                    src = fh.read()
                assert not re.search(r'^\s*include\s+["\']', src, re.M), os.path.join(root, f)


@pytest.mark.parametrize("name", HOT)
def test_the_hot_path_does_not_import_the_control_plane_or_the_bench(name):
    with open(os.path.join(SRC, name)) as fh:
        src = fh.read()
    imports = re.findall(r'^\s*(?:from\s+(\S+)\s+c?import|import\s+(\S+))', src, re.M)
    mods = [a or b for a, b in imports]
    assert not [m for m in mods if m.startswith(("fastpath.control", "fastpath.bench"))], mods


def test_control_re_exports_the_engine_config_and_memory():
    """fastpath.control.config / .memory keep their names, from the modules beside the engine."""
    from fastpath import _memory, config
    from fastpath.control import config as ccfg
    from fastpath.control import memory as cmem
    for n in ccfg.__all__:
        assert getattr(ccfg, n) is getattr(config, n), n
    for n in ("allocate", "available_bytes", "smaps_entry", "Region", "MemoryReport"):
        assert getattr(cmem, n) is getattr(_memory, n), n


@pytest.mark.parametrize("name", TOP_IMPORTS)
def test_no_import_inside_a_function(name):
    with open(os.path.join(SRC, name)) as fh:
        tree = ast.parse(fh.read())
    inner = [(f.name, n.lineno) for f in ast.walk(tree)
             if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
             for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert not inner, inner
