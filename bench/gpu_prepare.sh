#!/usr/bin/env bash
# gpu_prepare.sh: build here, ahead of time, every file a GPU host needs for
# bench/gpu_device_run.sh, under one git-ignored folder (.gpu-run/ by default):
#
#   wheels/  pycuda (cp312, built against the CUDA headers here and linked to a stub
#            libcuda.so.1: the device's driver supplies the real one at import), fastpath
#            (cp312, with the fatbin), and pytools, platformdirs, mako, markupsafe, siphash24,
#            typing_extensions and pytest with its dependencies (py3 / cp312 wheels)
#   sdist/   pycuda's sdist: gpu_device_run.sh builds it there only if the wheel does not import
#   MANIFEST.txt  what was built, by which interpreter and CUDA, sizes and sha256, timings
#
# Needs a Python 3.12 interpreter (PY312=..., else python3.12 on PATH or a pyenv 3.12.x),
# nvcc, gcc and a package index. Nothing of it is committed; the device tool carries the
# folder (carry [".gpu-run"]). Usage: bash bench/gpu_prepare.sh [--dry-run]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${DEST:-$ROOT/.gpu-run}"
PYCUDA_VERSION="${PYCUDA_VERSION:-2026.1}"
JOBS="${JOBS:-$(nproc)}"
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1

find_py312() {
    local c
    for c in "${PY312:-}" "$(command -v python3.12 || true)" \
             "$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12 2>/dev/null | tail -1)"; do
        if [ -n "$c" ] && [ -x "$c" ] && "$c" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
            echo "$c"; return 0
        fi
    done
    return 1
}

PY312="$(find_py312)" || { echo "gpu_prepare: no Python 3.12 interpreter (set PY312)" >&2; exit 1; }
export PATH="/usr/local/cuda/bin:$PATH"
NVCC="$(command -v nvcc)" || { echo "gpu_prepare: nvcc not on PATH" >&2; exit 1; }
CUDA_ROOT="$(dirname "$(dirname "$(readlink -f "$NVCC")")")"
[ -f "$CUDA_ROOT/include/cuda.h" ] || { echo "gpu_prepare: no cuda.h under $CUDA_ROOT" >&2; exit 1; }
echo "gpu_prepare: python $PY312, nvcc $NVCC, CUDA headers $CUDA_ROOT/include, into $DEST"
if [ "$DRY" = 1 ]; then
    echo "gpu_prepare: dry run, nothing built"
    exit 0
fi

T0=$(date +%s)
LOG="$DEST/prepare.log"
rm -rf "$DEST/wheels" "$DEST/sdist" "$DEST/build"
mkdir -p "$DEST/wheels" "$DEST/sdist" "$DEST/build"
: >"$LOG"
step() { echo "== $(date -u +%H:%M:%S) (+$(( $(date +%s) - T0 )) s) $*" | tee -a "$LOG"; }

step "build interpreter: a 3.12 venv with numpy, setuptools, wheel, Cython"
VENV="$DEST/venv312"
[ -x "$VENV/bin/python" ] || "$PY312" -m venv "$VENV" >>"$LOG" 2>&1
"$VENV/bin/python" -m pip install -q 'numpy>=2.0' 'setuptools>=77' wheel 'Cython>=3.0' >>"$LOG" 2>&1
VPY="$VENV/bin/python"

step "pycuda $PYCUDA_VERSION sdist"
"$VPY" -m pip download -q --no-deps --no-binary=pycuda "pycuda==$PYCUDA_VERSION" \
    -d "$DEST/sdist" >>"$LOG" 2>&1

step "libcuda.so.1 stub: every cu* entry point of cuda.h and cudaProfiler.h (after their _v2 macros), returning an error"
STUB="$DEST/build/stub"
mkdir -p "$STUB"
printf '#include <cuda.h>\n#include <cudaProfiler.h>\n' | gcc -E -I"$CUDA_ROOT/include" -x c - \
    | grep -oE '\bcu[A-Z][A-Za-z0-9_]*[[:space:]]*\(' | tr -d '( \t' | sort -u \
    | awk '{printf "int %s(void) { return 999; }\n", $1}' >"$STUB/stub.c"
gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$STUB/libcuda.so.1" "$STUB/stub.c"
ln -sf libcuda.so.1 "$STUB/libcuda.so"
echo "stub: $(grep -c . "$STUB/stub.c") symbols" | tee -a "$LOG"

step "pycuda: configure and build the cp312 wheel ($JOBS compiles at a time)"
SRC="$DEST/build/pycuda"
mkdir -p "$SRC"
tar xzf "$DEST"/sdist/pycuda-*.tar.gz -C "$SRC" --strip-components=1
(cd "$SRC" && "$VPY" configure.py --cuda-root="$CUDA_ROOT" --cudadrv-lib-dir="$STUB" \
    --no-cuda-enable-curand >>"$LOG" 2>&1)
# --no-as-needed keeps libcuda.so.1 as a dependency of _driver (the stub resolves the link;
# the device's driver is the libcuda.so.1 loaded at import)
# pycuda's ~40 C++ files compiled concurrently (bench/gpu_psetup.py), linked as usual
(cd "$SRC" && LDFLAGS="-Wl,--no-as-needed" "$VPY" "$ROOT/bench/gpu_psetup.py" "$JOBS" \
    bdist_wheel -d "$DEST/wheels" >>"$LOG" 2>&1)
ls "$DEST"/wheels/pycuda-*-cp312-*.whl >/dev/null

step "fastpath: the cp312 wheel with the fatbin, from the checkout's tracked and new files"
FP="$DEST/build/fastpath"
rm -rf "$FP" && mkdir -p "$FP"
(cd "$ROOT" && git ls-files -co --exclude-standard -z | grep -zv '^\.gpu-run/' \
    | xargs -0 tar cf - | tar xf - -C "$FP")
(cd "$FP" && FASTPATH_BUILD_JOBS="$JOBS" "$VPY" -m pip wheel -q --no-deps --no-build-isolation \
    -w "$DEST/wheels" . >>"$LOG" 2>&1)
FPW="$(ls "$DEST"/wheels/fastpath-*-cp312-*.whl)"
"$VPY" -m zipfile -l "$FPW" | grep -q 'fastpath/gpu/fp_mlp.fatbin' \
    || { echo "gpu_prepare: $FPW has no fatbin" | tee -a "$LOG" >&2; exit 1; }

step "check: the pycuda wheel imports against the stub (every cu* symbol it needs is a driver entry point), the fastpath wheel imports and carries the fatbin"
CHECK="$DEST/build/check"
rm -rf "$CHECK"
"$VPY" -m pip install -q --no-index --no-deps --target "$CHECK" "$DEST"/wheels/pycuda-*.whl "$FPW" \
    >>"$LOG" 2>&1
(cd "$DEST/build" && LD_LIBRARY_PATH="$STUB" PYTHONPATH="$CHECK" "$VPY" -c \
    "import pycuda._driver as d; print('pycuda._driver', d.get_version())") 2>&1 | tee -a "$LOG"
(cd "$DEST/build" && PYTHONPATH="$CHECK" "$VPY" -c "import os, fastpath.gpu._backend as B; \
    assert os.path.exists(B.FATBIN), B.FATBIN; print('fastpath', B.FATBIN)") 2>&1 | tee -a "$LOG"

step "pure and cp312 wheels: pytools, platformdirs, mako, siphash24, pytest and their needs"
"$VPY" -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$DEST/wheels" \
    pytools platformdirs mako markupsafe siphash24 typing_extensions pytest >>"$LOG" 2>&1
# numpy is the device's own (a wheel built against numpy 2.x headers runs on any later 2.x)
rm -f "$DEST"/wheels/numpy-*.whl

step "manifest"
{
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) in $(( $(date +%s) - T0 )) s"
    echo "python $("$VPY" -V 2>&1), numpy $("$VPY" -c 'import numpy; print(numpy.__version__)')"
    echo "nvcc $("$NVCC" --version | tail -1)"
    echo "fastpath commit $(cd "$ROOT" && git rev-parse --short HEAD)$(cd "$ROOT" && git diff --quiet HEAD || echo ' (with uncommitted changes)')"
    (cd "$DEST" && du -b wheels/* sdist/* | sort -k2 && sha256sum wheels/* sdist/*)
    echo "total $(du -sh "$DEST/wheels" "$DEST/sdist" | awk '{print $1}' | tr '\n' ' ')"
} >"$DEST/MANIFEST.txt"
# what the device tool carries is the wheels and the sdist: the venv and build trees stay here
rm -rf "$DEST/build"
cat "$DEST/MANIFEST.txt"
step "done"
