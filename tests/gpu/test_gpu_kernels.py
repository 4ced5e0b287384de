"""The CUDA kernels where no GPU is: the sources compile to sm_80/sm_90 (where nvcc is), the
packed weight layout the kernels read reproduces the model, the module is loaded from the
fatbin or compiled, the grid and the item count stay within what the kernels handle. On a GPU,
the kernels' answers equal the CPU's.
"""

import glob
import os
import re
import shutil
import struct
import subprocess

import numpy as np
import pytest

import fastpath
from fastpath.errors import BackendError, ConfigError
from fastpath.gpu import GpuBackend, _backend as B, gpu_status
from fastpath.gpu._pack import NET_DTYPE, pack, packed_forward

from helpers.builders import ACTS, random_model
from helpers.fake_cuda import FakeCuda, FakeError, FakeModule, ROOT, users


CU = sorted(glob.glob(os.path.join(ROOT, "csrc", "cuda", "*.cu")))
NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc"
                                if os.path.exists("/usr/local/cuda/bin/nvcc") else None)


ARCHES = ["-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90",
          "-gencode", "arch=compute_90,code=compute_90"]


def fatbin_entries(blob: bytes) -> set:
    """{(kind, sm)} of a fatbin: kind 'elf' (machine code) or 'ptx'. The container: a 16-byte
    header (magic 0xBA55ED50, version, header size, payload size), then entries, each a header
    (kind u16 at 0: 1 PTX, 2 ELF; header size u32 at 4; payload size u64 at 8; sm u32 at 28)
    and its payload."""
    magic, _, hsize, fsize = struct.unpack_from("<IHHQ", blob, 0)
    assert magic == 0xBA55ED50, f"not a fatbin (magic {magic:#x})"
    out, off = set(), hsize
    while off < hsize + fsize:
        kind, _, ehs, size = struct.unpack_from("<HHIQ", blob, off)
        (sm,) = struct.unpack_from("<I", blob, off + 28)
        out.add(({1: "ptx", 2: "elf"}.get(kind, str(kind)), sm))
        off += ehs + size
    return out


@pytest.mark.skipif(NVCC is None, reason="nvcc not found: the CUDA sources are not compiled here")
@pytest.mark.parametrize("cu", CU, ids=os.path.basename)
def test_cuda_source_compiles_to_sm80_sm90_fatbin(cu, tmp_path):
    out = tmp_path / "k.fatbin"
    r = subprocess.run([NVCC, "-fatbin", *ARCHES, "-I", os.path.join(ROOT, "csrc"), "-o",
                        str(out), cu], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    assert {("elf", 80), ("elf", 90), ("ptx", 90)} <= fatbin_entries(out.read_bytes())
    dump = shutil.which("cuobjdump") or os.path.join(os.path.dirname(NVCC), "cuobjdump")
    if os.path.exists(dump):
        elf = subprocess.run([dump, "--list-elf", str(out)], capture_output=True, text=True)
        assert "sm_80" in elf.stdout and "sm_90" in elf.stdout, elf.stdout


@pytest.mark.skipif(NVCC is None, reason="nvcc not found: the CUDA sources are not compiled here")
@pytest.mark.parametrize("sm", ["sm_80", "sm_90"])
def test_kernels_fit_one_block_per_sm(sm, tmp_path):
    # the grid barrier needs every block resident: one BLOCK-thread block must fit an SM's
    # 64k registers, and nothing may spill to local memory on the tick's path
    r = subprocess.run([NVCC, "-cubin", f"-arch={sm}", "-Xptxas", "-v", "-I",
                        os.path.join(ROOT, "csrc"), "-o", str(tmp_path / "k.cubin"), CU[0]],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    regs = [int(n) for n in re.findall(r"Used (\d+) registers", r.stderr)]
    assert len(regs) == 2 and max(regs) * B.BLOCK <= 65536, r.stderr
    assert "0 bytes spill stores" in r.stderr and " spill stores" not in r.stderr.replace(
        "0 bytes spill stores", "")


def test_there_are_cuda_sources():
    assert [os.path.basename(c) for c in CU] == ["fp_mlp.cu"]


def test_packaged_fatbin_when_built():
    if not os.path.exists(B.FATBIN):
        pytest.skip("no fatbin in this build (nvcc was absent when it was built)")
    with open(B.FATBIN, "rb") as f:
        assert {("elf", 80), ("elf", 90), ("ptx", 90)} <= fatbin_entries(f.read())


def test_kernel_sources_found():
    cu, incs = B.kernel_sources()
    assert os.path.basename(cu) == "fp_mlp.cu"
    assert any(os.path.exists(os.path.join(d, "fp_math.h")) for d in incs)


@pytest.mark.parametrize("act", ACTS)
def test_packed_layout_reproduces_model(act):
    rng = np.random.default_rng(0)
    m = random_model(rng, [37, 50, 3, 2], [act, act, "identity"])
    p = pack(m.layers)
    assert p.dims == (37, 50, 3, 2) and p.macs == 37 * 50 + 50 * 3 + 3 * 2
    assert NET_DTYPE.itemsize == 16 + 32 * 16    # static_assert'ed by fp_mlp.cu
    for i in range(3):
        rec = p.net["layers"][0, i]
        assert rec["w_off"] % 32 == 0 and rec["b_off"] % 32 == 0
    x = rng.standard_normal((5, 37)).astype(np.float32)
    y, bad = packed_forward(p, x)
    h = x.astype(np.float64)
    f = {"identity": lambda v: v, "relu": lambda v: np.maximum(v, 0), "tanh": np.tanh,
         "sigmoid": lambda v: 1 / (1 + np.exp(-v))}
    for L in m.layers:
        h = f[L.activation](h @ L.weight.T.astype(np.float64) + L.bias)
    np.testing.assert_allclose(y, h, rtol=1e-5, atol=1e-5)
    assert not bad.any()


def test_packed_forward_flags_nonfinite_rows():
    rng = np.random.default_rng(1)
    m = random_model(rng, [4, 3, 2], ["relu", "identity"])
    p = pack(m.layers)
    p.weights[int(p.net["layers"][0, 0]["w_off"])] = 3e38
    x = np.array([[1, 0, 0, 0], [-1, 0, 0, 0], [0, 1, 0, 0]], np.float32) * 1e3
    _, bad = packed_forward(p, x)
    # relu would hide row 1's -inf; the refusal looks at the pre-activation, as on the CPU
    assert bad.tolist() == [True, True, False]


def test_load_module_prefers_fatbin_then_sourcemodule(tmp_path, monkeypatch, fake_fatbin):
    cu = FakeCuda()
    cu.depth = 1
    mod, how = B.load_module(cu)
    assert isinstance(mod, FakeModule) and how == f"fatbin {fake_fatbin}"

    def broken(blob):
        raise FakeError("device kernel image is invalid")
    cu.module_from_buffer = broken
    seen = {}

    def source_module(src, **kw):
        seen.update(kw, src=src)
        return "compiled"
    monkeypatch.setenv("FASTPATH_CUDA_CACHE", str(tmp_path / "cache"))
    mod, how = B.load_module(cu, source_module=source_module)
    assert mod == "compiled" and "SourceModule" in how and "did not load" in how
    assert seen["no_extern_c"] is True and "fp_mlp_persistent" in seen["src"]
    assert seen["cache_dir"] == str(tmp_path / "cache")
    mod, how = B.load_module(cu, fatbin=str(tmp_path / "absent"), source_module=source_module)
    assert "no fatbin was built" in how


def test_grid_never_exceeds_sms():
    big = B.SMALL_MACS + 1
    assert B.grid_for(132, 1, big) == 1
    assert B.grid_for(132, 9, big) == 2
    assert B.grid_for(132, 10**6, big) == 132
    assert B.grid_for(132, 10**6, B.SMALL_MACS) == 1     # small models: one block, no atomics


@pytest.mark.skipif(not gpu_status()[0], reason=gpu_status()[1])
@pytest.mark.parametrize("mode", ["launch", "persistent"])
def test_real_gpu_matches_cpu(mode):
    rng = np.random.default_rng(13)
    m = random_model(rng, [40, 256, 64, 2], ["relu", "tanh", "identity"])
    with GpuBackend(m, mode) as be:
        X = rng.standard_normal((64, 40)).astype(np.float32)
        Y, bad, _ = be.infer_batch(X)
        np.testing.assert_allclose(Y, packed_forward(be.packed, X)[0], rtol=1e-4, atol=1e-5)
        assert not bad.any()


class SmallCuda(FakeCuda):
    """A device with 1 GB: the old code tried the multi-GB scratch of the batch below."""

    def mem_alloc(self, n):
        if n > 1 << 30:
            raise self.Error(f"out of memory ({n} bytes)")
        return super().mem_alloc(n)


def test_max_batch_past_the_kernels_item_count_is_refused(fake_fatbin, fake_gpu):
    """batch * width past 2**31 wrapped the kernel's int item count and skipped the layer
    silently."""
    m = random_model(np.random.default_rng(9), [1, 32768, 2])
    cu = SmallCuda()
    with pytest.raises(ConfigError, match=r"gpu.max_batch = 65536.*1\.\.65504"):
        GpuBackend(m, "launch", max_batch=65536, cuda=cu)
    # the context is kept for the process (released at exit), not current anywhere
    assert cu.depth == 0 and cu.left_current == 0
    assert B.max_batch_for(pack(m.layers)) == 65504
    # the persistent path sends one row: nothing to refuse there
    with pytest.raises(ConfigError, match="gpu.max_batch"):
        fastpath.Engine(m, backend="gpu", config={"gpu": {"max_batch": 65536}})


def test_no_fatbin_and_no_compiler_is_a_backend_error_and_auto_falls_back(fake_gpu, tmp_path,
                                                                          monkeypatch):
    """Without a fatbin or a compiler the compiler's own exception escaped backend='auto' and
    'gpu'."""
    absent = str(tmp_path / "absent.fatbin")
    monkeypatch.setattr(B, "FATBIN", absent)
    monkeypatch.setattr(B.load_module, "__defaults__", (absent, None))
    m = random_model(np.random.default_rng(15), [8, 4, 2])
    with pytest.raises(BackendError, match=r"no fatbin was built.*compiling .*fp_mlp.cu at run "
                                           r"time failed.*nvcc"):
        fastpath.Engine(m, backend="gpu")
    assert fake_gpu.depth == 0 and users(fake_gpu) == 0
    e = fastpath.Engine(m, backend="auto")
    assert e.backend == "cpu" and "cannot be loaded" in e.backend_reason
    e.step(np.ones(8, np.float32), 0)

    def no_nvcc(src, **kw):
        raise FileNotFoundError(2, "No such file or directory", "nvcc")
    cu = FakeCuda()
    cu.depth = 1
    with pytest.raises(BackendError, match="FileNotFoundError.*nvcc"):
        B.load_module(cu, fatbin=absent, source_module=no_nvcc)
