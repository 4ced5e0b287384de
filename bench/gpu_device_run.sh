#!/usr/bin/env bash
# gpu_device_run.sh: the GPU check on a bare GPU host in one command: build pycuda from its
# sdist, build and install fastpath (fatbin included), run the GPU tests and bench/gpu_check.py,
# leave the JSON and the logs in $OUT.
#
# The host it is written for: Python 3.12, CUDA 13 with nvcc, numpy, Cython, setuptools and
# markupsafe present; no pycuda, pytools, platformdirs, siphash24 or mako; no network.
# Carry, in the repo root's .whl/ (ignored by git: `echo /.whl/ >> .git/info/exclude`):
#
#   pycuda-2026.1.tar.gz (it has no wheel):  python3 -m pip download --no-deps pycuda==2026.1 -d .whl
#   pytools, platformdirs, mako (py3-none-any), siphash24 (cp312 manylinux), setuptools and
#   Cython (so the build does not depend on the host's versions):
#       python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#         --implementation cp --platform manylinux_2_28_x86_64 \
#         --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
#         pytools platformdirs mako siphash24 'setuptools>=77' 'Cython>=3.0'
#
# and call the device tool with carry [".whl"], e.g.
#   command: bash bench/gpu_device_run.sh        timeout_s: 560
# Tried where no GPU is (Python 3.12.1, CUDA 13.0 headers, pycuda 2026.1): every step up to
# the first import of pycuda.driver, which needs the driver. The versions above are the ones
# tried; pins newer than these have not been.
# Everything lands in $OUT (default ./gpu-out): gpu-<device>.json, gpu_check.log,
# pytest.log, build.log. Each step prints a line first, so a cut-off log says where it was.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CARRY="${CARRY:-$ROOT/.whl}"
OUT="${OUT:-$ROOT/gpu-out}"
PY="${PY:-python3}"
WORK="${WORK:-/tmp/fastpath-gpu}"
JOBS="${JOBS:-$(nproc)}"
mkdir -p "$OUT" "$WORK"
BUILD_LOG="$OUT/build.log"
step() { echo "== $(date +%H:%M:%S) $*" | tee -a "$BUILD_LOG"; }
die() { echo "gpu_device_run: $*" | tee -a "$BUILD_LOG" >&2; exit 1; }

export PATH="/usr/local/cuda/bin:$PATH"
NVCC="$(command -v nvcc)" || die "nvcc not on PATH"
CUDA_ROOT="$(dirname "$(dirname "$(readlink -f "$NVCC")")")"
step "python $($PY -V 2>&1), nvcc at $NVCC, CUDA_ROOT $CUDA_ROOT, $JOBS jobs"
nvidia-smi --query-gpu=name,driver_version,pci.bus_id --format=csv,noheader 2>&1 | tee -a "$BUILD_LOG"

step "carried wheels -> $WORK/site"
ls "$CARRY"/pycuda-*.tar.gz >/dev/null 2>&1 || die "no pycuda sdist in $CARRY (see the header)"
$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$WORK/site" "$CARRY"/*.whl >>"$BUILD_LOG" 2>&1 || die "wheel install failed"
export PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}"

step "pycuda: configure against $CUDA_ROOT"
rm -rf "$WORK/pycuda" && mkdir -p "$WORK/pycuda"
tar xzf "$CARRY"/pycuda-*.tar.gz -C "$WORK/pycuda" --strip-components=1 || die "bad sdist"
# curand is not needed (and not in every toolkit). -lcuda: the toolkit's stub when it has one, else the driver's own libcuda.so.1 (linked
# through a libcuda.so link in a folder of ours: the driver ships no unversioned name)
LIBDIR="${CUDA_LIBDIR:-$CUDA_ROOT/lib64/stubs}"
if [ ! -e "$LIBDIR/libcuda.so" ]; then
    real="$(ldconfig -p | awk '/libcuda\.so\.1 /{print $NF; exit}')"
    [ -n "$real" ] || real="$(ls /usr/local/nvidia/lib64/libcuda.so.1 /usr/lib/x86_64-linux-gnu/libcuda.so.1 2>/dev/null | head -1)"
    [ -n "$real" ] || die "no libcuda.so to link pycuda against"
    LIBDIR="$WORK/cudalib"; mkdir -p "$LIBDIR"; ln -sf "$real" "$LIBDIR/libcuda.so"
fi
(cd "$WORK/pycuda" && $PY configure.py --cuda-root="$CUDA_ROOT" --cudadrv-lib-dir="$LIBDIR" --no-cuda-enable-curand \
    >>"$BUILD_LOG" 2>&1) || die "pycuda configure failed"

step "pycuda: build_ext in place, $JOBS compiles at a time"
# setuptools compiles one file at a time; pycuda's _driver is ~40 C++ files (boost.python
# included): compile them concurrently, link as usual
# --no-as-needed: keep libcuda.so.1 as a dependency even where -lcuda resolved against a stub
# without symbols (this gcc drops a library nothing was resolved from)
(cd "$WORK/pycuda" && LDFLAGS="-Wl,--no-as-needed" $PY - "$JOBS" >>"$BUILD_LOG" 2>&1 <<'PYEOF'
import sys
from multiprocessing.pool import ThreadPool
from setuptools._distutils import ccompiler

jobs = int(sys.argv[1])

def parallel_compile(self, sources, output_dir=None, macros=None, include_dirs=None, debug=0,
            extra_preargs=None, extra_postargs=None, depends=None):
    macros, objects, extra_postargs, pp_opts, build = self._setup_compile(
        output_dir, macros, include_dirs, sources, depends, extra_postargs)
    cc_args = self._get_cc_args(pp_opts, debug, extra_preargs)

    def one(obj):
        src, ext = build[obj]
        self._compile(obj, src, ext, cc_args, extra_postargs, pp_opts)
    with ThreadPool(jobs) as pool:
        list(pool.imap_unordered(one, objects))
    return objects

ccompiler.CCompiler.compile = parallel_compile
sys.argv = ["setup.py", "build_ext", "--inplace"]
sys.path.insert(0, "")
with open("setup.py") as f:
    exec(compile(f.read(), "setup.py", "exec"), {"__name__": "__main__", "__file__": "setup.py"})
PYEOF
) || die "pycuda build failed (tail of $BUILD_LOG)"
export PYTHONPATH="$WORK/pycuda:$PYTHONPATH"
(cd "$WORK" && $PY -c "import pycuda.driver as c; c.init(); print('pycuda', c.get_version(), \
    'driver', c.get_driver_version(), c.Device(0).name())" 2>&1 | tee -a "$BUILD_LOG") \
    || die "pycuda does not import"

step "fastpath: build (C, Cython, fatbin) and install into $WORK/fp"
# C that Cython generated for another Cython/numpy pair does not compile against this one
rm -rf "$WORK/fp" "$ROOT/build" "$ROOT"/fastpath/_engine.c "$ROOT"/fastpath/_kernels.c
(cd "$ROOT" && $PY -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir \
    --target "$WORK/fp" . >>"$BUILD_LOG" 2>&1) || die "fastpath build failed"
export PYTHONPATH="$WORK/fp:$PYTHONPATH"
ls "$WORK/fp/fastpath/gpu" | tee -a "$BUILD_LOG"

step "the SourceModule fallback (what a build without nvcc loads)"
(cd "$WORK" && FASTPATH_CUDA_CACHE="$WORK/cuda-cache" timeout 120 $PY - 2>&1 <<'PYEOF' | tee -a "$BUILD_LOG"
import numpy as np
import pycuda.driver as cuda
from fastpath.gpu import _backend as B
from fastpath.gpu._pack import pack, packed_forward
from fastpath.model import Layer

rng = np.random.default_rng(0)
layers = [Layer(rng.standard_normal((64, 40)).astype(np.float32) / 7, np.zeros(64, np.float32),
                "tanh"), Layer(rng.standard_normal((2, 64)).astype(np.float32) / 8,
                               np.zeros(2, np.float32), "identity")]
p = pack(layers)
dc = B.DeviceContext(cuda, 0)
with dc.current():
    mod, how = B.load_module(cuda, fatbin="/nonexistent.fatbin")
print("loaded:", how)
path = B.LaunchPath(dc, mod, p, 4)
x = rng.standard_normal(40).astype(np.float32)
y, bad, t = path.infer(x)
err = float(np.abs(y - packed_forward(p, x)[0][0]).max())
print("max abs err vs numpy:", err, "refused:", bad, t)
path.close()
dc.release()
PYEOF
)

step "GPU tests"
(cd "$WORK" && timeout 180 $PY -m pytest -q -p no:cacheprovider "$ROOT/tests/gpu" 2>&1 \
    | tee "$OUT/pytest.log" | tail -15)

step "gpu_check"
(cd "$WORK" && PYTHONUNBUFFERED=1 timeout 300 $PY "$ROOT/bench/gpu_check.py" --out "$OUT" \
    2>&1 | tee "$OUT/gpu_check.log")
rc=$?
step "done (gpu_check rc=$rc)"
ls -la "$OUT"
exit $rc
