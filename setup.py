"""Build of the compiled hot path: fastpath._core (the C core, csrc/, compiled once) and the
Cython modules linked against it (_engine, _kernels, _serve, gpu._protocol, gpu._tick).

No -march=native and no global -mavx2: AVX2/FMA kernels carry target
attributes and are chosen at run time (csrc/fp_simd.c).
FASTPATH_SANITIZE=1 builds with -fsanitize=address,undefined;
FASTPATH_DEBUG=1 turns Cython bounds checks back on and keeps C asserts;
FASTPATH_COVERAGE=1 builds with gcov instrumentation (docs/development.md, "Coverage").
"""
import glob
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

sanitize = os.environ.get("FASTPATH_SANITIZE", "") == "1"
coverage = os.environ.get("FASTPATH_COVERAGE", "") == "1"
debug = os.environ.get("FASTPATH_DEBUG", "") == "1" or sanitize

cflags = ["-std=gnu11", "-fno-math-errno", "-Wall", "-Wno-unused-function"]
ldflags = []
if sanitize:
    cflags += ["-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined",
               "-fno-sanitize-recover=undefined"]
    ldflags += ["-fsanitize=address,undefined"]
elif coverage:
    cflags += ["-O1", "-g", "--coverage"]
    ldflags += ["--coverage"]
else:
    # each function on its own cache line, so an edit elsewhere cannot shift a hot kernel's
    # loops across line boundaries (and its timing with them)
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
CORE = "fastpath._core"


def extension(name: str, pyx: str, sources=(), rpath: str = "$ORIGIN") -> Extension:
    # rpath: where the loader finds fastpath._core from this module's directory; -fno-plt:
    # a call into the core (fp_step on every tick) is one call through the GOT, no PLT stub
    return Extension(name, sources=[pyx, *sources], include_dirs=["csrc", np.get_include()],
                     define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
                     extra_compile_args=cflags + ([] if name == CORE else ["-fno-plt"]),
                     extra_link_args=ldflags + ([f"-Wl,-rpath,{rpath}"] if name != CORE else []),
                     depends=sorted(glob.glob("csrc/*.h") + glob.glob("csrc/kernels/*.h")
                                    + glob.glob("fastpath/include/*.h")))


# _core: the C core and the Cython code the others cimport; _engine: Engine and Result (the hot
# path); _default: the default engine behind fastpath.step(); _kernels: kernel shims for tests
# and bench; _ring: the serving segment's shared helpers; _serve: the serving worker; _client:
# the serving client
exts = [extension(CORE, "fastpath/_core.pyx", csrc),
        extension("fastpath._engine", "fastpath/_engine.pyx"),
        extension("fastpath._default", "fastpath/_default.pyx"),
        extension("fastpath._kernels", "fastpath/_kernels.pyx"),
        extension("fastpath._ring", "fastpath/_ring.pyx"),
        extension("fastpath._serve", "fastpath/_serve.pyx"),
        extension("fastpath._client", "fastpath/_client.pyx")]

# --- GPU stage: fastpath.gpu._protocol (the persistent path's slot protocol, plain C) and the
# CUDA kernels compiled to a fatbin (sm_80, sm_90 + compute_90 PTX) when nvcc exists. Without
# nvcc the build goes on and fastpath.gpu compiles csrc/cuda/*.cu with pycuda at first use.
# cythonized here into build/ (pruned from the sdist), so no generated .c sits in the package
# fastpath.gpu._tick: the GPU tick, which cimports the Engine and drives its split tick
gpu_exts = [extension("fastpath.gpu._protocol", "fastpath/gpu/_protocol.pyx", rpath="$ORIGIN/.."),
            extension("fastpath.gpu._tick", "fastpath/gpu/_tick.pyx", rpath="$ORIGIN/..")]


def cythonize_sources() -> None:
    """Turn each extension's .pyx source into its C translation, in place (build_ext has set
    up these objects); run by build_ext alone, so an sdist or build_py does not translate
    modules it never compiles."""
    for group, kw in ((exts, {}), (gpu_exts, {"build_dir": "build/cython"})):
        for ext, done in zip(group, cythonize(group, compiler_directives=directives, **kw)):
            ext.sources = done.sources


def gpu_build_ext():
    import shutil
    import subprocess
    from setuptools.command.build_ext import build_ext

    arches = ["-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90",
              "-gencode", "arch=compute_90,code=compute_90"]

    class BuildExtWithFatbin(build_ext):
        def build_extensions(self):
            # fastpath._core first: the other modules link against it, and its soname is what
            # they record, so the loader finds it beside them (one copy in a process)
            self.check_extensions_list(self.extensions)
            core = [e for e in self.extensions if e.name == CORE]
            rest = [e for e in self.extensions if e.name != CORE]
            for ext in core:
                soname = os.path.basename(self.get_ext_filename(ext.name))
                ext.extra_link_args = [*ext.extra_link_args, f"-Wl,-soname,{soname}"]
                self._compile_in_parallel(ext)
            core_so = self.get_ext_fullpath(CORE)
            for ext in rest:
                ext.extra_objects = [*ext.extra_objects, core_so]
            self.extensions = rest
            try:
                super().build_extensions()
            finally:
                self.extensions = core + rest

        def _compile_in_parallel(self, ext):
            # the core's C files are independent: compile them on every core, then link once
            serial = self.compiler.compile
            jobs = self.parallel if isinstance(self.parallel, int) and self.parallel > 1 \
                else (os.cpu_count() or 1)

            def compile_each(sources, *args, **kw):
                with ThreadPoolExecutor(jobs) as pool:
                    objs = pool.map(lambda src: serial([src], *args, **kw), sources)
                    return [o for group in objs for o in group]

            self.compiler.compile = compile_each
            try:
                self.build_extension(ext)
            finally:
                self.compiler.compile = serial

        def run(self):
            cythonize_sources()
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


setup(ext_modules=exts + gpu_exts, cmdclass={"build_ext": gpu_build_ext()})
