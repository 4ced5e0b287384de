"""What a user installs: the sdist carries every source a build needs and nothing a build makes,
the wheel's pure-Python part carries every module and data file, and both carry the command's
entry point module.

These run setuptools on this checkout (no compiler, about a second each); building and
installing the sdist and the manylinux wheel for real, in fresh environments, is .ci/run's job.
They need the build requirements (Cython, setuptools), which a checkout installed for
development has.
"""

import os
import tarfile
from pathlib import Path

import pytest

from helpers.packaging import ROOT, _entry_point, _setup


pytestmark = [
    pytest.mark.skipif(not (ROOT / "setup.py").exists(), reason="not run from a source tree"),
]


def _tree(top: str, suffixes: tuple) -> set:
    """Files under ROOT/top with one of the suffixes, as paths relative to ROOT."""
    out = set()
    for dirpath, dirnames, files in os.walk(ROOT / top):
        dirnames[:] = [d for d in dirnames if d != "__pycache__" and not d.startswith(".")]
        for f in files:
            if f.endswith(suffixes):
                out.add(str((Path(dirpath) / f).relative_to(ROOT)))
    return out


def _generated_c() -> set:
    """fastpath/X.c made by cythonize from fastpath/X.pyx."""
    return {str(p.with_suffix(".c").relative_to(ROOT)) for p in (ROOT / "fastpath").rglob("*.pyx")}


@pytest.fixture(scope="module")
def sdist_names(tmp_path_factory):
    """(the sdist's path, the names it holds): one build for the tests that read it."""
    tmp = tmp_path_factory.mktemp("sdist")
    _setup(tmp, "sdist", "-d", str(tmp / "dist"))
    (sdist,) = (tmp / "dist").glob("fastpath-*.tar.gz")
    with tarfile.open(sdist) as tf:
        return sdist, tf.getnames()


def test_sdist_has_every_source_and_no_generated_file(sdist_names):
    sdist, names = sdist_names
    top = names[0].split("/")[0]
    have = {n.split("/", 1)[1] for n in names if "/" in n}
    need = {"setup.py", "pyproject.toml", "README.md", "MANIFEST.in",
            "fastpath/_csrc.pxd", "fastpath/py.typed", "fastpath/data/demo.fpm",
            "fastpath/data/fastpath.example.toml", "bench/schema.json"}
    need |= _tree("fastpath", (".py", ".pyx", ".pxd", ".pxi", ".pyi", ".h"))
    need |= _tree("csrc", (".c", ".h", ".cu"))               # csrc/*.c and csrc/kernels/*.c: setup.py's glob
    need |= _tree("control", (".py",)) | _tree("bench", (".py",)) | _tree("tests", (".py",))
    need -= _generated_c()
    assert {"fastpath/_engine.pyx", "fastpath/_kernels.pyx"} <= need
    missing = sorted(need - have)
    assert not missing, f"{sdist.name} lacks {missing}"
    generated = sorted(n for n in have if n in _generated_c() or n.endswith((".so", ".pyc")))
    assert not generated, f"{sdist.name} ships generated files {generated}: a build makes them"
    assert top == sdist.name[:-len(".tar.gz")]


@pytest.fixture(scope="module")
def build_py_lib(tmp_path_factory):
    """build_py's output: what the wheel gets besides the compiled modules (one build for
    the tests that read it)."""
    tmp = tmp_path_factory.mktemp("build_py")
    _setup(tmp, "build_py", "-d", str(tmp / "lib"))
    return tmp / "lib"


def test_wheel_python_part_has_every_module_and_data_file(build_py_lib):
    lib = build_py_lib
    have = {str(p.relative_to(lib)) for p in lib.rglob("*") if p.is_file()}
    need = {"fastpath/py.typed", "fastpath/_engine.pyi", "fastpath/_kernels.pyi",
            "fastpath/_serve.pyi", "fastpath/include/fp_ring.h",
            "fastpath/data/demo.fpm", "fastpath/data/fastpath.example.toml",
            "fastpath/bench/schema.json", "fastpath/control/__init__.py", "fastpath/control/doctor.py"}
    # every module of the source tree lands under its package name
    need |= _tree("fastpath", (".py", ".pyi"))
    need |= {"fastpath/control/" + p.split("/", 1)[1] for p in _tree("control", (".py",))}
    need |= {"fastpath/bench/" + p.split("/", 1)[1] for p in _tree("bench", (".py",))}
    missing = sorted(need - have)
    assert not missing, f"the wheel would lack {missing}"
    # fastpath/include/ is the public header for C producers (fastpath.get_include())
    stray = sorted(n for n in have if n.endswith((".c", ".pyx", ".pxd", ".pxi", ".h"))
                   and not n.startswith("fastpath/include/"))
    assert not stray, f"build sources would be installed as package data: {stray}"


def test_wheel_and_sdist_carry_the_entry_point_module(build_py_lib, sdist_names):
    mod, _ = _entry_point()
    if "." in mod:
        pytest.skip("the entry point is inside a package, which the packaging tests cover")
    assert (build_py_lib / f"{mod}.py").is_file(), sorted(p.name for p in build_py_lib.iterdir())
    sdist, names = sdist_names
    assert f"{names[0].split('/')[0]}/{mod}.py" in names, f"{sdist.name} lacks {mod}.py"
