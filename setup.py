"""Build of the compiled hot path: fastpath._engine (Cython) over csrc/*.c.

No -march=native and no global -mavx2: AVX2/FMA kernels carry target
attributes and are chosen at run time (csrc/fp_simd.c).
FASTPATH_SANITIZE=1 builds with -fsanitize=address,undefined;
FASTPATH_DEBUG=1 turns Cython bounds checks back on and keeps C asserts.
"""
import glob
import os

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

sanitize = os.environ.get("FASTPATH_SANITIZE", "") == "1"
debug = os.environ.get("FASTPATH_DEBUG", "") == "1" or sanitize

cflags = ["-std=gnu11", "-fno-math-errno", "-Wall", "-Wno-unused-function"]
ldflags = []
if sanitize:
    cflags += ["-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined",
               "-fno-sanitize-recover=undefined"]
    ldflags += ["-fsanitize=address,undefined"]
else:
    cflags += ["-O3"]
if not debug:
    cflags += ["-DNDEBUG"]

directives = {
    "language_level": 3,
    "boundscheck": debug,
    "wraparound": debug,
    "initializedcheck": debug,
    "cdivision": True,
    "embedsignature": True,
}

csrc = sorted(glob.glob("csrc/*.c") + glob.glob("csrc/kernels/*.c"))


def extension(name: str, pyx: str) -> Extension:
    # each module links its own copy of the C core (no shared library to locate at run time)
    return Extension(name, sources=[pyx] + csrc, include_dirs=["csrc", np.get_include()],
                     define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
                     extra_compile_args=cflags, extra_link_args=ldflags,
                     depends=sorted(glob.glob("csrc/*.h") + glob.glob("csrc/kernels/*.h")))


# _engine: Engine, Result, step (the hot path); _kernels: kernel shims for tests and bench
exts = [extension("fastpath._engine", "fastpath/_engine.pyx"),
        extension("fastpath._kernels", "fastpath/_kernels.pyx"),
        extension("fastpath._serve", "fastpath/_serve.pyx")]

setup(ext_modules=cythonize(exts, compiler_directives=directives))
