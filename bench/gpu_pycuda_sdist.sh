#!/usr/bin/env bash
# gpu_pycuda_sdist.sh SDIST WORK: build pycuda in place from its sdist on a GPU host, linked
# to the host's own libcuda.so.1, into WORK/pycuda (the fallback of gpu_device_run.sh when
# the prebuilt wheel does not import). Needs nvcc's CUDA headers, numpy and setuptools.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SDIST="$1"
WORK="$2"
PY="${PY:-python3}"
JOBS="${JOBS:-$(nproc)}"
NVCC="$(command -v nvcc)" || { echo "nvcc not on PATH" >&2; exit 1; }
CUDA_ROOT="$(dirname "$(dirname "$(readlink -f "$NVCC")")")"
rm -rf "$WORK/pycuda" && mkdir -p "$WORK/pycuda"
tar xzf "$SDIST" -C "$WORK/pycuda" --strip-components=1
# the driver ships libcuda.so.1 only: a libcuda.so link to it in a folder of ours for -lcuda
LIBDIR="$WORK/cudalib"
mkdir -p "$LIBDIR"
real="$(ldconfig -p | awk '/libcuda\.so\.1 /{print $NF; exit}')"
[ -n "$real" ] || real="$(ls /usr/local/nvidia/lib64/libcuda.so.1 /usr/lib/x86_64-linux-gnu/libcuda.so.1 2>/dev/null | head -1)"
[ -n "$real" ] || { echo "no libcuda.so.1 to link pycuda against" >&2; exit 1; }
ln -sf "$real" "$LIBDIR/libcuda.so"
cd "$WORK/pycuda"
"$PY" configure.py --cuda-root="$CUDA_ROOT" --cudadrv-lib-dir="$LIBDIR" --no-cuda-enable-curand
# pycuda's ~40 C++ files compiled concurrently, linked as usual
LDFLAGS="-Wl,--no-as-needed" "$PY" "$HERE/gpu_psetup.py" "$JOBS" build_ext --inplace
cd "$WORK" && PYTHONPATH="$WORK/pycuda${PYTHONPATH:+:$PYTHONPATH}" "$PY" -c \
    "import pycuda.driver as c; c.init(); print('pycuda (sdist)', c.get_version(), c.Device(0).name())"
