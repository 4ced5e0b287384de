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
    # every function on a cache line of its own: where a hot kernel starts otherwise depends
    # on the size of unrelated code before it, and a change elsewhere (a prefetch loop in
    # step_batch) moved the z-score and cache kernels by 16-byte steps and cost step() 10-15
    # ns from Python, measured across builds; aligned, no edit moves another function's loops
    cflags += ["-O3", "-falign-functions=64"]
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
                     depends=sorted(glob.glob("csrc/*.h") + glob.glob("csrc/kernels/*.h")
                                    + glob.glob("fastpath/include/*.h")))


# _engine: Engine, Result, step (the hot path); _kernels: kernel shims for tests and bench
exts = [extension("fastpath._engine", "fastpath/_engine.pyx"),
        extension("fastpath._kernels", "fastpath/_kernels.pyx"),
        extension("fastpath._serve", "fastpath/_serve.pyx")]

# --- GPU stage: fastpath.gpu._protocol (the persistent path's slot protocol, plain C) and the
# CUDA kernels compiled to a fatbin (sm_80, sm_90 + compute_90 PTX) when nvcc exists. Without
# nvcc the build goes on and fastpath.gpu compiles csrc/cuda/*.cu with pycuda at first use.
# cythonized here into build/ (pruned from the sdist), so no generated .c sits in the package
exts.append(cythonize([extension("fastpath.gpu._protocol", "fastpath/gpu/_protocol.pyx")],
                      compiler_directives=directives, build_dir="build/cython")[0])


def gpu_build_ext():
    import shutil
    import subprocess
    from setuptools.command.build_ext import build_ext

    arches = ["-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90",
              "-gencode", "arch=compute_90,code=compute_90"]

    class BuildExtWithFatbin(build_ext):
        def run(self):
            super().run()
            dest = (os.path.join("fastpath", "gpu") if self.inplace
                    else os.path.join(self.build_lib, "fastpath", "gpu"))
            os.makedirs(dest, exist_ok=True)
            # the sources travel too: SourceModule compiles them where no fatbin was built
            for src in ["csrc/fp_math.h", "csrc/fp_gpu.h"] + sorted(glob.glob("csrc/cuda/*.cu")):
                if not self.inplace:
                    shutil.copyfile(src, os.path.join(dest, os.path.basename(src)))
            nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists(
                "/usr/local/cuda/bin/nvcc") else None)
            if nvcc is None:
                print("fastpath: nvcc not found, no fatbin built (the GPU backend compiles the "
                      "kernels with pycuda at first use)")
                return
            for cu in sorted(glob.glob("csrc/cuda/*.cu")):
                out = os.path.join(dest, os.path.splitext(os.path.basename(cu))[0] + ".fatbin")
                cmd = [nvcc, "-fatbin", *arches, "-Icsrc", "-o", out, cu]
                print(" ".join(cmd))
                # a toolkit too old for these targets must not fail a CPU install
                r = subprocess.run(cmd, capture_output=True, text=True)
                if r.returncode != 0:
                    if os.path.exists(out):
                        os.remove(out)
                    print(f"fastpath: nvcc failed, no fatbin built (the GPU backend compiles "
                          f"the kernels with pycuda at first use):\n{r.stderr[-2000:]}")

    return BuildExtWithFatbin


setup(ext_modules=cythonize(exts, compiler_directives=directives),
      cmdclass={"build_ext": gpu_build_ext()})
