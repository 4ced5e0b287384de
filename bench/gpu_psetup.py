"""Run a setup.py in the current folder with its C/C++ files compiled concurrently.

Usage: python gpu_psetup.py JOBS SETUP-ARGS...  (e.g. ``8 build_ext --inplace``).
setuptools compiles one source at a time; pycuda's _driver is ~40 C++ files, so the GPU run's
scripts (gpu_prepare.sh, gpu_pycuda_sdist.sh) build it through this; linking is unchanged.
"""

import sys
from multiprocessing.pool import ThreadPool

from setuptools._distutils import ccompiler


def _parallel(jobs):
    serial = ccompiler.CCompiler.compile

    def compile_all(self, sources, *args, **kw):
        with ThreadPool(jobs) as pool:
            objs = pool.map(lambda src: serial(self, [src], *args, **kw), sources)
        return [o for group in objs for o in group]

    return compile_all


def main(argv):
    if len(argv) < 3 or not argv[1].isdigit() or int(argv[1]) < 1:
        sys.exit("usage: gpu_psetup.py JOBS SETUP-ARGS... (JOBS a whole number >= 1)")
    ccompiler.CCompiler.compile = _parallel(int(argv[1]))
    sys.argv = ["setup.py", *argv[2:]]
    sys.path.insert(0, "")
    with open("setup.py") as f:
        exec(compile(f.read(), "setup.py", "exec"), {"__name__": "__main__", "__file__": "setup.py"})


if __name__ == "__main__":
    main(sys.argv)
