"""The CUDA kernels of csrc/cuda/fp_mlp.cu run on the host (csrc/cuda/emu/): build the driver
with g++ (cached per source text) and run the launch-path and persistent kernels on packed
models (fastpath.gpu._pack)."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass

import numpy as np

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
CSRC = os.path.join(ROOT, "csrc")
CU = os.path.join(CSRC, "cuda", "fp_mlp.cu")
EMU = os.path.join(CSRC, "cuda", "emu")
_EMU_SOURCES = [os.path.join(EMU, f) for f in ("cuda_emu.h", "cuda_emu.cpp",
                                                   "fp_mlp_emu_main.cpp")]
_HOST_SOURCES = [os.path.join(CSRC, f) for f in ("fp_gpu.c", "fp_gpu.h", "fp_math.h")]
BUILD_TIMEOUT_S = 300
RUN_TIMEOUT_S = 240


def compilers() -> tuple | None:
    """(gcc, g++), or None where either is missing."""
    gcc, gxx = shutil.which("gcc"), shutil.which("g++")
    return (gcc, gxx) if gcc and gxx else None


class EmuBuildError(RuntimeError):
    pass


def build(workdir: str, cu_text: str | None = None) -> str:
    """The driver executable for `cu_text` (the .cu's source; fp_mlp.cu itself by default),
    built under `workdir` once per distinct source text."""
    gcc, gxx = compilers()
    cu_text = open(CU).read() if cu_text is None else cu_text
    h = hashlib.sha256(cu_text.encode())
    for p in _EMU_SOURCES + _HOST_SOURCES:
        h.update(open(p, "rb").read())
    d = os.path.join(workdir, h.hexdigest()[:16])
    exe = os.path.join(d, "fp_mlp_emu")
    if os.path.exists(exe):
        return exe
    os.makedirs(d, exist_ok=True)
    cu = os.path.join(d, "fp_mlp.cu")
    with open(cu, "w") as f:
        f.write(cu_text)
    obj = os.path.join(d, "fp_gpu.o")
    cmds = [[gcc, "-O2", "-std=gnu11", "-I", CSRC, "-c", os.path.join(CSRC, "fp_gpu.c"),
             "-o", obj],
            [gxx, "-O2", "-std=c++17", "-pthread", "-fno-strict-aliasing",
             "-include", os.path.join(EMU, "cuda_emu.h"), "-I", CSRC, f'-DFP_EMU_CU="{cu}"',
             os.path.join(EMU, "fp_mlp_emu_main.cpp"), os.path.join(EMU, "cuda_emu.cpp"), obj,
             "-o", exe + ".tmp"]]
    for cmd in cmds:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        if r.returncode:
            raise EmuBuildError(f"{' '.join(cmd)}\n{r.stderr[-3000:]}")
    os.replace(exe + ".tmp", exe)
    return exe


def _inputs(d: str, p, x: np.ndarray) -> tuple:
    net, w, xs = (os.path.join(d, n) for n in ("net.bin", "w.bin", "x.bin"))
    p.net.tofile(net)
    np.ascontiguousarray(p.weights, np.float32).tofile(w)
    np.ascontiguousarray(x, np.float32).tofile(xs)
    return net, w, xs


def run_batch(exe: str, d: str, p, x: np.ndarray, grid: int, block: int, tag: int = 7):
    """fp_mlp_batch on rows x: (outputs (batch, n_out), status (batch,) int32 == tag where a
    pre-activation was non-finite), or a CompletedProcess when the driver failed."""
    x = np.atleast_2d(np.asarray(x, np.float32))
    os.makedirs(d, exist_ok=True)
    net, w, xs = _inputs(d, p, x)
    y, st = os.path.join(d, "y.bin"), os.path.join(d, "st.bin")
    r = subprocess.run([exe, "batch", net, w, xs, y, st, str(x.shape[0]), str(grid),
                        str(block), str(tag)], capture_output=True, text=True,
                       timeout=RUN_TIMEOUT_S)
    if r.returncode:
        return r
    return (np.fromfile(y, np.float32).reshape(x.shape[0], p.n_out),
            np.fromfile(st, np.int32))


@dataclass
class PersistentRun:
    returncode: int
    stats: dict            # the driver's key=value lines
    outputs: np.ndarray    # (n_req, n_out)
    rcs: np.ndarray        # fp_gpu_request's return code per request
    stderr: str


def run_persistent(exe: str, d: str, p, xs: np.ndarray, grid: int, block: int,
                   hold: bool = False, stop: str = "api") -> PersistentRun:
    """fp_mlp_persistent served through fp_gpu.c: len(xs) requests, then stop."""
    xs = np.asarray(xs, np.float32).reshape(-1, p.n_in)
    os.makedirs(d, exist_ok=True)
    net, w, xf = _inputs(d, p, xs)
    y, st = os.path.join(d, "y.bin"), os.path.join(d, "st.bin")
    for f in (y, st):
        if os.path.exists(f):
            os.remove(f)
    r = subprocess.run([exe, "persistent", net, w, xf, y, st, str(len(xs)), str(grid),
                        str(block), str(int(hold)), stop], capture_output=True, text=True,
                       timeout=RUN_TIMEOUT_S)
    stats = dict(line.split("=", 1) for line in r.stdout.split() if "=" in line)
    stats = {k: int(v) for k, v in stats.items()}
    have = os.path.exists(y) and os.path.exists(st)
    return PersistentRun(r.returncode, stats,
                         np.fromfile(y, np.float32).reshape(len(xs), p.n_out) if have else None,
                         np.fromfile(st, np.int32) if have else None, r.stderr)
