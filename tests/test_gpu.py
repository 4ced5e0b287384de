"""The GPU stage where no GPU is: the kernels compile (nvcc, when present), the weight layout
the kernels read reproduces the model, the status probe, and the pycuda backend's host logic
(context push/pop, buffers, launch arguments, refusal tags, the persistent path's start /
request / stop / deadlines) against a stand-in for pycuda.driver whose "kernels" compute on the
CPU. What only a GPU can show (the CUDA code's results, timings) is bench/gpu_check.py's job;
the tests that need one skip with gpu_status()'s reason.
"""
import dataclasses
import glob
import os
import re
import shutil
import struct
import subprocess
import sys
import threading
import time
import types

import numpy as np
import pytest

import fastpath
from fastpath.errors import BackendError, ConfigError
from fastpath.gpu import GpuBackend, GpuEngine, auto_choice, gpu_mode, gpu_status
from fastpath.gpu import _backend as B
from fastpath.gpu import _protocol as P
from fastpath.gpu._pack import NET_DTYPE, pack, packed_forward

from helpers.builders import ACTS, random_model, windowed_model
from helpers.fake_cuda import FakeCuda, FakeError, FakeModule, HIT_CACHE, ROOT, _fake_pycuda, _gpu_check, _head_model, _stream, _tree_model, fake_fatbin, fake_gpu  # noqa: F401

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


# --- kernels compile -------------------------------------------------------------------------

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


# --- the layout the kernels read ---------------------------------------------------------------

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


# --- status and modes --------------------------------------------------------------------------


def test_status_without_pycuda(monkeypatch):
    monkeypatch.setitem(sys.modules, "pycuda", None)
    monkeypatch.setitem(sys.modules, "pycuda.driver", None)
    gpu_status.cache_clear()
    try:
        ok, why = gpu_status()
        assert not ok and "pycuda not importable" in why
    finally:
        gpu_status.cache_clear()


@pytest.mark.parametrize("case", ["init_fails", "no_device", "ok"])
def test_status_cases(monkeypatch, case):
    class Error(Exception):
        pass

    drv = types.ModuleType("pycuda.driver")
    drv.Error = Error

    def init():
        if case == "init_fails":
            raise Error("cuInit failed: no CUDA-capable device is detected")
    drv.init = init
    drv.Device = type("Device", (), {"count": staticmethod(lambda: 0 if case == "no_device" else 1),
                                     "__init__": lambda self, i: None,
                                     "name": lambda self: "Fake H200"})
    _fake_pycuda(monkeypatch, drv)
    try:
        ok, why = gpu_status()
    finally:
        gpu_status.cache_clear()
    assert ok == (case == "ok")
    assert {"init_fails": "CUDA init failed", "no_device": "no CUDA device",
            "ok": "Fake H200"}[case] in why


def test_import_fastpath_never_imports_pycuda():
    code = ("import sys, fastpath, fastpath.gpu; fastpath.gpu.gpu_status(); "
            "import fastpath.gpu._backend; "
            "assert 'pycuda.compiler' not in sys.modules, 'compiler imported'; "
            "import fastpath as f; print(sorted(m for m in sys.modules if m.startswith('pycuda')))")
    # run where the imported (built) fastpath lives, not beside the source tree, which a
    # "-c" child would import first from its working directory
    here = os.path.dirname(os.path.dirname(os.path.abspath(fastpath.__file__)))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=here)
    assert out.returncode == 0, out.stderr
    code2 = "import sys, fastpath; assert not any(m.startswith('pycuda') for m in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code2], timeout=60, cwd=here).returncode == 0


def test_gpu_mode_from_config():
    assert gpu_mode(None) == "launch"
    assert gpu_mode({"gpu": {"mode": "persistent"}}) == "persistent"
    with pytest.raises(ConfigError, match="gpu.mode"):
        gpu_mode({"gpu": {"mode": "zero-copy"}})


def test_auto_choice_without_gpu_picks_cpu_and_says_why():
    ok, why = gpu_status()
    if ok:
        pytest.skip("a GPU is usable here")
    m = random_model(np.random.default_rng(0), [8, 4, 2])
    c = auto_choice(m, iters=5)
    assert c["backend"] == "cpu" and c["gpu_p50_ns"] is None and why in c["reason"]
    assert c["cpu_p50_ns"] > 0


def test_auto_choice_measures_both(fake_fatbin):
    m = random_model(np.random.default_rng(0), [8, 4, 2])
    c = auto_choice(m, "launch", iters=5, cuda=FakeCuda())
    # the stand-in's launch costs far more host time than an 8->4->2 forward on the CPU
    assert c["backend"] == "cpu" and c["gpu_p50_ns"] > c["cpu_p50_ns"] > 0
    assert "gpu launch" in c["reason"] and str(c["cpu_p50_ns"]) in c["reason"]
    bad = auto_choice(m, "launch", iters=5, cuda=FakeCuda(kernel_mode="fault"))
    assert bad["backend"] == "cpu" and "failed" in bad["reason"]


def test_backend_without_gpu_is_clear():
    ok, why = gpu_status()
    if ok:
        pytest.skip("a GPU is usable here")
    m = random_model(np.random.default_rng(0), [4, 2])
    with pytest.raises(BackendError, match="no usable GPU"):
        GpuBackend(m)


# --- a stand-in for pycuda.driver ------------------------------------------------------------


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


@pytest.mark.parametrize("act", ACTS)
def test_launch_path_host_logic(fake_fatbin, act):
    rng = np.random.default_rng(5)
    m = random_model(rng, [12, 40, 2], [act, "identity"])
    cu = FakeCuda(sm=3)
    with GpuBackend(m, "launch", max_batch=8, cuda=cu) as be:
        assert be.module_origin.startswith("fatbin") and be.info["device"] == "Fake GPU"
        x = rng.standard_normal(12).astype(np.float32)
        y, bad, t = be.infer(x)
        np.testing.assert_allclose(y, packed_forward(be.packed, x)[0][0], rtol=1e-5, atol=1e-6)
        assert not bad and t.h2d_ns == t.infer_ns == t.d2h_ns == 1000
        X = rng.standard_normal((20, 12)).astype(np.float32)
        Y, bad, ts = be.infer_batch(X)
        assert Y.shape == (20, 2) and len(ts) == 3 and not bad.any()
        np.testing.assert_allclose(Y, packed_forward(be.packed, X)[0], rtol=1e-5, atol=1e-6)
        assert [a[2][8] for a in cu.launches[1:]] == [8, 8, 4]    # the batch argument
        assert cu.depth == 0
    assert cu.depth == 0 and getattr(cu, "detached", False)


def test_launch_path_refusal_tag_is_per_call(fake_fatbin):
    rng = np.random.default_rng(6)
    m = random_model(rng, [4, 3, 2], ["relu", "identity"])
    cu = FakeCuda()
    with GpuBackend(m, "launch", max_batch=4, cuda=cu) as be:
        big = np.array([1e38, 1e38, 1e38, 1e38], np.float32)
        w = cu.mem.view(int(be.path.d_w), np.float32, 1)
        w[0] = 3e38
        assert be.infer(big)[1] is True
        # the next call's status is not the last call's: no clearing needed, tags differ
        assert be.infer(np.zeros(4, np.float32))[1] is False


def test_launch_path_fault_pops_context(fake_fatbin):
    m = random_model(np.random.default_rng(7), [4, 2])
    cu = FakeCuda(kernel_mode="fault")
    be = GpuBackend(m, "launch", cuda=cu)
    with pytest.raises(BackendError, match="illegal memory access"):
        be.infer(np.zeros(4, np.float32))
    assert cu.depth == 0


def test_launch_that_never_completes_is_an_error(fake_fatbin):
    m = random_model(np.random.default_rng(16), [4, 2])
    cu = FakeCuda(kernel_mode="launch_never_ends")
    be = GpuBackend(m, "launch", cuda=cu, timeout_ns=2 * 10**6)
    with pytest.raises(BackendError, match="did not complete"):
        be.infer(np.zeros(4, np.float32))
    assert cu.depth == 0 and be.path._inflight == 0


def test_persistent_path_host_logic(fake_fatbin):
    rng = np.random.default_rng(8)
    m = random_model(rng, [9, 16, 2], ["tanh", "identity"])
    cu = FakeCuda()
    with GpuBackend(m, "persistent", cuda=cu, timeout_ns=5 * 10**9) as be:
        name, grid, args = cu.launches[0]
        assert name == "fp_mlp_persistent" and len(args) == 10
        assert args[2] == be.path.h_slot.base.get_device_pointer()
        for _ in range(50):
            x = rng.standard_normal(9).astype(np.float32)
            y, bad, t = be.infer(x)
            np.testing.assert_allclose(y, packed_forward(be.packed, x)[0][0], rtol=1e-5,
                                       atol=1e-6)
            assert not bad and t.total_ns >= t.infer_ns and t.d2h_ns == 0
        assert cu.depth == 0
    assert not cu.threads[0].is_alive()      # stop() waited for the "kernel" to return
    assert be.path is None


def test_stopped_persistent_path_is_not_restarted(fake_fatbin):
    m = random_model(np.random.default_rng(14), [4, 2])
    cu = FakeCuda()
    be = GpuBackend(m, "persistent", cuda=cu, timeout_ns=5 * 10**9)
    path = be.path
    path.stop()
    with pytest.raises(BackendError, match="stopped"):
        path.start()
    with pytest.raises(BackendError, match="not running"):
        be.infer(np.zeros(4, np.float32))
    be.close()
    assert len(cu.launches) == 1


def test_persistent_kernel_that_never_starts_is_an_error(fake_fatbin):
    m = random_model(np.random.default_rng(9), [4, 2])
    cu = FakeCuda(kernel_mode="never_starts")
    with pytest.raises(BackendError, match="did not start"):
        GpuBackend(m, "persistent", cuda=cu, timeout_ns=2 * 10**6)
    assert cu.depth == 0 and cu.detached


def test_persistent_kernel_that_stops_answering_times_out(fake_fatbin):
    m = random_model(np.random.default_rng(10), [4, 2])
    cu = FakeCuda(kernel_mode="hangs_after_3")
    be = GpuBackend(m, "persistent", cuda=cu, timeout_ns=5 * 10**9)
    x = np.ones(4, np.float32)
    for _ in range(3):
        be.infer(x)
    be.path.timeout_ns = 2 * 10**6
    with pytest.raises(BackendError, match="no answer within"):
        be.infer(x)
    be.close()       # the stop flag still ends the silent loop: no hang
    assert not cu.threads[0].is_alive()


# --- Engine(backend="gpu" | "auto") on the stand-in driver ---------------------------------


@pytest.mark.parametrize("kind", ["regression", "tanh_sigmoid", "classifier3", "logistic2"])
@pytest.mark.parametrize("mode", ["launch", "persistent"])
def test_gpu_engine_equals_cpu_engine_tick_for_tick(fake_gpu, kind, mode, isa):
    rng = np.random.default_rng(21)
    m = _head_model(rng, kind)
    raws, syms = _stream(rng)
    cfg = {"engine": {"simd": isa, "n_symbols": 3}, "cache": HIT_CACHE}
    cpu = fastpath.Engine(m, backend="cpu", config=cfg)
    want = [cpu.step(raws[i], int(syms[i]), ts_ns=i * 1000) for i in range(len(raws))]
    gcfg = dict(cfg, gpu={"mode": mode, "timeout_ms": 5000})
    with fastpath.Engine(m, backend="gpu", config=gcfg) as ge:
        assert ge.backend == "gpu" and ge.n_outputs == cpu.n_outputs
        be = ge.gpu_backend
        calls = []
        real = be.infer

        def counted(x):
            calls.append(1)
            return real(x)
        be.infer = counted
        got = [ge.step(raws[i], int(syms[i]), ts_ns=i * 1000) for i in range(len(raws))]
        assert ge.ticks == len(raws)
    hits = sum(w.cached for w in want)
    assert 0 < hits < len(raws), "the stream must give both hits and misses"
    for i, (w, g) in enumerate(zip(want, got)):
        assert g.cached == w.cached and g.miss_reason == w.miss_reason, i
        assert abs(g.signal - w.signal) < 1e-5 and abs(g.confidence - w.confidence) < 1e-5, i
    # the GPU runs on misses only, once each
    assert len(calls) == len(raws) - hits
    if mode == "launch":
        assert sum(1 for L in fake_gpu.launches if L[0] == "fp_mlp_batch") == len(calls)
    # GPU stages in the Result: the stand-in's events say 1 us a stage; a hit has none
    for g in got:
        L = g.latency
        if g.cached:
            assert L.h2d_ns == L.d2h_ns == L.infer_ns == 0
        elif mode == "launch":
            assert L.h2d_ns == 1000 and L.d2h_ns == 1000 and L.infer_ns >= 1000


def test_gpu_gets_the_features_of_this_tick_from_the_engine_buffer(fake_gpu, isa):
    # features are computed once a tick (by fp_step_begin) and handed over without a copy:
    # every GPU call reads the same buffer, and it holds what a CPU engine's features() gives
    rng = np.random.default_rng(22)
    m = _head_model(rng, "tanh_sigmoid")
    raws, syms = _stream(rng, 40)
    cfg = {"engine": {"simd": isa, "n_symbols": 3}, "cache": {"enabled": False}}
    cpu = fastpath.Engine(m, backend="cpu", config=cfg)
    with fastpath.Engine(m, backend="gpu", config=cfg) as ge:
        be = ge.gpu_backend
        seen = []
        real = be.infer

        def spy(x):
            seen.append((x.ctypes.data, x.copy()))
            return real(x)
        be.infer = spy
        for i in range(len(raws)):
            f = cpu.features(raws[i], int(syms[i]))
            cpu.step(raws[i], int(syms[i]), ts_ns=i)
            ge.step(raws[i], int(syms[i]), ts_ns=i)
            assert len(seen) == i + 1
            np.testing.assert_array_equal(seen[-1][1], f)
    assert len({a for a, _ in seen}) == 1


def test_gpu_engine_step_batch_equals_cpu(fake_gpu, isa):
    rng = np.random.default_rng(23)
    m = _head_model(rng, "classifier3")
    raws, syms = _stream(rng)
    ts = np.arange(len(raws), dtype=np.int64) * 1000
    cfg = {"engine": {"simd": isa, "n_symbols": 3}, "cache": HIT_CACHE}
    want = fastpath.Engine(m, backend="cpu", config=cfg).step_batch(raws, syms, ts)
    with fastpath.Engine(m, backend="gpu", config=cfg) as ge:
        got = ge.step_batch(raws, syms, ts)
        assert ge.ticks == len(raws)
    np.testing.assert_array_equal(got.cached, want.cached)
    np.testing.assert_allclose(got.signal, want.signal, atol=1e-5)
    np.testing.assert_allclose(got.confidence, want.confidence, atol=1e-5)
    # every row is checked before any is applied, as on the CPU
    bad = raws.copy()
    bad[7, 3] = np.nan
    with fastpath.Engine(m, backend="gpu", config=cfg) as ge:
        n_launches = len(fake_gpu.launches)
        with pytest.raises(fastpath.InputError, match="row 7"):
            ge.step_batch(bad, syms, ts)
        assert ge.ticks == 0 and len(fake_gpu.launches) == n_launches


@pytest.mark.parametrize("mode", ["launch", "persistent"])
def test_gpu_engine_wrapper_matches_cpu_engine(fake_gpu, mode, isa):
    rng = np.random.default_rng(11)
    m = windowed_model(rng, hidden=(24,))
    cfg = {"engine": {"simd": isa, "n_symbols": 4}, "cache": {"enabled": False}}
    raws = rng.standard_normal((40, 40)).astype(np.float32)
    syms = rng.integers(0, 4, 40)
    cpu = fastpath.Engine(m, backend="cpu", config=cfg)
    want = [cpu.step(raws[i], int(syms[i]), ts_ns=i * 1000) for i in range(40)]
    with GpuEngine(m, cfg, mode=mode, timeout_ns=5 * 10**9) as ge:
        got = [ge.step(raws[i], int(syms[i]), ts_ns=i * 1000) for i in range(20)]
        got += [g for g in ge.step_batch(raws[20:], syms[20:], np.arange(20, 40) * 1000)]
    for w, g in zip(want, got):
        r = getattr(g, "result", g)
        assert abs(r.signal - w.signal) < 1e-5 and abs(r.confidence - w.confidence) < 1e-5
    assert ge.engine.ticks == 40


def test_gpu_engine_wrapper_batch_applies_post_transform(fake_gpu):
    # the batched launch hands the engine the model's outputs after softmax, not the raw
    # last layer (a 3-output classifier got only 2 raw outputs before)
    rng = np.random.default_rng(24)
    m = _head_model(rng, "classifier3")
    raws, syms = _stream(rng, 40)
    cfg = {"engine": {"n_symbols": 3}, "cache": {"enabled": False}}
    want = fastpath.Engine(m, backend="cpu", config=cfg).step_batch(raws, syms)
    with GpuEngine(m, cfg, mode="launch") as ge:
        got = ge.step_batch(raws, syms)
    np.testing.assert_allclose([g.signal for g in got], want.signal, atol=1e-5)
    np.testing.assert_allclose([g.confidence for g in got], want.confidence, atol=1e-5)


def test_gpu_engine_mode_from_config(fake_gpu):
    m = random_model(np.random.default_rng(15), [4, 2])
    with GpuEngine(m, {"gpu": {"mode": "persistent"}, "engine": {"n_symbols": 2}},
                   timeout_ns=5 * 10**9) as ge:
        assert ge.mode == "persistent" and ge.engine.n_symbols == 2
        ge.step(np.ones(4, np.float32), 1)
    assert fake_gpu.launches[0][0] == "fp_mlp_persistent"
    # a TOML path or an EngineConfig works too; the keyword arguments override its [gpu]
    from fastpath._build import EXAMPLE_CONFIG
    from fastpath.control.config import load_config
    for cfg in (EXAMPLE_CONFIG, load_config({"gpu": {"mode": "persistent", "max_batch": 8}})):
        with GpuEngine(m, cfg, mode="launch", max_batch=4) as ge:
            assert ge.mode == "launch" and ge.backend.path.max_batch == 4
    with pytest.raises(ConfigError, match="gpu.max_batch"):
        GpuEngine(m, None, max_batch=0)
    with fastpath.Engine(m, backend="gpu", config={"gpu": {"mode": "persistent",
                                                           "timeout_ms": 5000}}) as e:
        r = e.backend_report
        assert r["backend"] == "gpu" and r["gpu"]["mode"] == "persistent"
        assert r["gpu"]["device"] == "Fake GPU" and "fatbin" in r["gpu"]["module"]
        e.step(np.ones(4, np.float32), 0)
    with pytest.raises(BackendError, match="closed"):
        e.step(np.ones(4, np.float32), 0)


def test_gpu_engine_refuses_nonfinite_like_cpu(fake_gpu):
    rng = np.random.default_rng(12)
    m = random_model(rng, [6, 4, 2], ["relu", "identity"])
    # model arrays are read-only: a model with other weights is a new model
    l0 = m.layers[0]
    m = dataclasses.replace(m, layers=(dataclasses.replace(l0, weight=np.full_like(l0.weight, 3e38)),)
                            + tuple(m.layers[1:]))
    cfg = {"engine": {"n_symbols": 2}, "cache": {"enabled": False}}
    for mk in (lambda: GpuEngine(m, cfg, mode="launch").engine,
               lambda: fastpath.Engine(m, backend="gpu", config=cfg)):
        ge = mk()
        with pytest.raises(fastpath.InputError) as gpu_err:
            ge.step(np.ones(6, np.float32), 0)
        assert ge.ticks == 0
        ge.close()
    with pytest.raises(fastpath.InputError) as cpu_err:
        fastpath.Engine(m, backend="cpu", config=cfg).step(np.ones(6, np.float32), 0)
    assert str(gpu_err.value) == str(cpu_err.value)


def test_gpu_fault_mid_tick_leaves_the_engine_unchanged(fake_gpu, isa):
    # the GPU fails between fp_step_begin and fp_step_finish: BackendError, the tick is not
    # applied (no window, slot or counter moves), and the engine goes on as if it never came
    rng = np.random.default_rng(29)
    m = _head_model(rng, "tanh_sigmoid")
    raws, syms = _stream(rng, 40)
    cfg = {"engine": {"simd": isa, "n_symbols": 3}, "cache": HIT_CACHE}
    cpu = fastpath.Engine(m, backend="cpu", config=cfg)
    with fastpath.Engine(m, backend="gpu", config=cfg) as ge:
        for i in range(10):
            cpu.step(raws[i], int(syms[i]), ts_ns=i)
            ge.step(raws[i], int(syms[i]), ts_ns=i)
        fake_gpu.kernel_mode = "fault"
        with pytest.raises(BackendError, match="illegal memory access"):
            ge.step(raws[10] + np.float32(5), int(syms[10]), ts_ns=10)
        assert ge.ticks == 10 and ge.stats()["misses"] == cpu.stats()["misses"]
        fake_gpu.kernel_mode = "ok"
        for i in range(10, len(raws)):
            w = cpu.step(raws[i], int(syms[i]), ts_ns=i)
            g = ge.step(raws[i], int(syms[i]), ts_ns=i)
            assert g.cached == w.cached and abs(g.signal - w.signal) < 1e-5, i


@pytest.mark.parametrize("what", ["trees", "bf16 model", "int8 config"])
def test_gpu_refuses_what_it_does_not_serve_and_auto_falls_back(fake_gpu, what):
    rng = np.random.default_rng(25)
    cfg = {"engine": {"n_symbols": 2}, "gpu": {"auto": "gpu"}}
    if what == "trees":
        m = _tree_model()
    elif what == "bf16 model":
        m = random_model(rng, [16, 16, 2]).with_weights("bf16")
    else:
        m = random_model(rng, [16, 16, 2])
        cfg["engine"]["weights"] = "int8"
    with pytest.raises(BackendError, match="the GPU stage serves fp32 MLPs only"):
        fastpath.Engine(m, backend="gpu", config=cfg)
    # auto with gpu.auto = "gpu" would take a usable GPU: the model keeps it on the CPU
    e = fastpath.Engine(m, backend="auto", config=cfg)
    assert e.backend == "cpu" and e.gpu_backend is None
    assert e.backend_reason.startswith("auto: cpu chosen") and "fp32 MLPs" in e.backend_reason
    assert not fake_gpu.launches


def test_auto_rule(fake_gpu, monkeypatch):
    m = random_model(np.random.default_rng(26), [8, 4, 2])
    # gpu.auto = "gpu": a usable GPU and an fp32 MLP are enough
    with fastpath.Engine(m, backend="auto", config={"gpu": {"auto": "gpu"}}) as e:
        assert e.backend == "gpu" and e.gpu_backend is not None
        assert "auto: gpu chosen" in e.backend_reason
    # "measure" (default): the stand-in's launch costs far more than an 8->4->2 forward
    with fastpath.Engine(m, backend="auto") as e:
        assert e.backend == "cpu" and e.gpu_backend is None
        meas = e.backend_report["measured"]
        assert meas["gpu_p50_ns"] > meas["cpu_p50_ns"] > 0
        assert str(meas["cpu_p50_ns"]) in e.backend_reason
    # where the GPU measures faster, auto runs on it and reports both figures
    import fastpath.gpu as G
    real = G.auto_choice

    def gpu_wins(*a, **k):
        c = real(*a, **k)
        return dict(c, backend="gpu", gpu_p50_ns=1, reason="auto: gpu chosen (stand-in)")
    monkeypatch.setattr(G, "auto_choice", gpu_wins)
    with fastpath.Engine(m, backend="auto") as e:
        assert e.backend == "gpu" and e.gpu_backend is not None
        assert e.backend_report["measured"]["gpu_p50_ns"] == 1
        assert e.backend_report["gpu"]["device"] == "Fake GPU"
        e.step(np.ones(8, np.float32), 0)
    monkeypatch.setattr(G, "auto_choice", real)
    # the config's backend key is honoured too
    e = fastpath.Engine(m, backend=None, config={"engine": {"backend": "gpu"}})
    assert e.backend == "gpu"
    e.close()


def test_gpu_and_auto_without_a_gpu():
    ok, why = gpu_status()
    if ok:
        pytest.skip("a GPU is usable here")
    m = random_model(np.random.default_rng(27), [4, 2])
    with pytest.raises(BackendError, match="backend='gpu' is not available"):
        fastpath.Engine(m, backend="gpu")
    e = fastpath.Engine(m, backend="auto")
    assert e.backend == "cpu" and e.backend_reason == f"auto: cpu chosen ({why})"
    assert e.backend_report == {"backend": "cpu", "reason": e.backend_reason}
    e.close()      # nothing to release on the CPU
    e.step(np.ones(4, np.float32), 0)


def test_gpu_config_section():
    from fastpath._build import EXAMPLE_CONFIG
    from fastpath.control.config import load_config
    c = load_config({"gpu": {"mode": "persistent", "device": 1, "max_batch": 64,
                             "timeout_ms": 20, "auto": "gpu"}})
    assert (c.gpu.mode, c.gpu.device, c.gpu.max_batch, c.gpu.timeout_ms, c.gpu.auto) == (
        "persistent", 1, 64, 20, "gpu")
    assert load_config(None).gpu.mode == "launch" and load_config(None).gpu.auto == "measure"
    assert load_config(EXAMPLE_CONFIG).gpu == load_config(None).gpu
    for bad, msg in (({"mod": "launch"}, "unknown key gpu.mod"),
                     ({"mode": "zero-copy"}, "gpu.mode"),
                     ({"device": -1}, "gpu.device"),
                     ({"max_batch": 0}, "gpu.max_batch"),
                     ({"timeout_ms": "1s"}, "gpu.timeout_ms"),
                     ({"auto": "always"}, "gpu.auto")):
        with pytest.raises(ConfigError, match=msg):
            load_config({"gpu": bad})
    with pytest.raises(ConfigError, match=r"\[gpu\] must be a table"):
        load_config({"gpu": "launch"})


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


@pytest.mark.skipif(not gpu_status()[0], reason=gpu_status()[1])
@pytest.mark.parametrize("kind", ["regression", "tanh_sigmoid", "classifier3"])
@pytest.mark.parametrize("mode", ["launch", "persistent"])
def test_real_gpu_engine_equals_cpu_engine(kind, mode):
    rng = np.random.default_rng(28)
    m = _head_model(rng, kind)
    raws, syms = _stream(rng)
    cfg = {"engine": {"n_symbols": 3}, "cache": HIT_CACHE}
    cpu = fastpath.Engine(m, backend="cpu", config=cfg)
    want = [cpu.step(raws[i], int(syms[i]), ts_ns=i * 1000) for i in range(len(raws))]
    with fastpath.Engine(m, backend="gpu", config=dict(cfg, gpu={"mode": mode})) as ge:
        got = [ge.step(raws[i], int(syms[i]), ts_ns=i * 1000) for i in range(len(raws))]
    for w, g in zip(want, got):
        assert g.cached == w.cached
        assert abs(g.signal - w.signal) < 1e-5 and abs(g.confidence - w.confidence) < 1e-5
        assert (g.latency.infer_ns > 0) == (not g.cached)


# --- bench/gpu_check.py ----------------------------------------------------------------------


def test_gpu_check_without_gpu_says_why(tmp_path):
    if gpu_status()[0]:
        pytest.skip("a GPU is usable here")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "gpu_check.py"), "--out",
                          str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "no usable GPU here" in out.stderr
    assert "Traceback" not in out.stderr and not list(tmp_path.iterdir())


def test_gpu_check_report_on_stand_in(tmp_path, monkeypatch, fake_fatbin):
    # the whole check against the stand-in driver: every field the issue asks for is written
    cu = FakeCuda()
    _fake_pycuda(monkeypatch, cu)
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cpus: None)
    gc = _gpu_check()
    # gpu_check imports bench/_report inside its functions (as a script it runs from bench/):
    # alone, this test failed with "No module named '_report'"; in the whole suite an earlier
    # test had left the module imported
    monkeypatch.syspath_prepend(os.path.join(ROOT, "bench"))
    monkeypatch.setattr(gc, "MODELS", [(128, 64, 32, 2), (256, 256, 2)])
    try:
        assert gc.main(["--out", str(tmp_path), "--iters", "20", "--quick"]) == 0
    finally:
        gpu_status.cache_clear()
    (path,) = tmp_path.glob("gpu-*.json")
    assert path.name == "gpu-fake-gpu.json"
    import json
    r = json.loads(path.read_text())
    for k in ("device", "driver", "numa_node", "core", "max_abs_err", "launch", "persistent",
              "crossover"):
        assert k in r, k
    for m in ("launch", "persistent"):
        assert {"p50_ns", "p99_ns", "h2d_p50_ns", "infer_p50_ns", "d2h_p50_ns"} <= set(r[m])
    assert [c["dims"] for c in r["crossover"]][1:] == [[128, 64, 32, 2], [256, 256, 2]]
    assert {"dims", "macs", "cpu_p50_ns", "launch_p50_ns", "persistent_p50_ns"} <= set(
        r["crossover"][0])
    assert r["max_abs_err"] < 1e-4 and r["targets"]["largest_model_rel_within_1e-4"]
    assert r["demo_end_to_end"]["persistent"]["signal_max_abs_err"] < 1e-5
    # Engine(backend="gpu") on a stream with cache hits decides as the CPU engine does
    hits = r["demo_end_to_end"]["cache_hits"]
    assert 0 < hits["hits"] < hits["ticks"] and hits["same_decisions"], hits
    assert hits["signal_max_abs_err"] < 1e-5
    assert r["auto"]["backend"] in ("cpu", "gpu") and "measured" in r["auto"]
    assert r["batch"]["engine_step_batch_persistent_ticks_per_s"] > 0
    assert cu.depth == 0


def test_gpu_check_records_a_broken_path_and_goes_on(tmp_path, monkeypatch, fake_fatbin):
    cu = FakeCuda(kernel_mode="never_starts")      # the persistent kernel never comes up
    _fake_pycuda(monkeypatch, cu)
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cpus: None)
    gc = _gpu_check()
    monkeypatch.setattr(gc, "MODELS", [(256, 256, 2)])
    try:
        assert gc.main(["--out", str(tmp_path), "--iters", "10", "--quick"]) == 1
    finally:
        gpu_status.cache_clear()
    import json
    r = json.loads(next(tmp_path.glob("gpu-*.json")).read_text())
    assert r["persistent"] is None and r["launch"]["p50_ns"] > 0
    assert any("persistent" in f and "did not start" in f for f in r["failures"])
    assert r["targets"]["persistent_p50_le_5us"] is None and r["targets"]["no_failures"] is False
    assert r["crossover"][1]["launch_p50_ns"] is not None
