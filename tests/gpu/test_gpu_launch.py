"""The launch path's host logic on the stand-in pycuda driver: context push/pop, buffers, launch
arguments, the per-call refusal tag (and its wrap), faults and a launch that never completes,
input widths, and a closed backend.
"""

import numpy as np
import pytest

import fastpath
from fastpath.errors import BackendError, InputError
from fastpath.gpu import GpuBackend, GpuEngine
from fastpath.gpu._pack import packed_forward

from helpers.builders import ACTS, random_model
from helpers.fake_cuda import FakeCuda, OccCuda, _fake_pycuda, users

NOCACHE = {"enabled": False}


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
    assert cu.depth == 0 and users(cu) == 0


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


@pytest.mark.parametrize("kernel_mode,seed,timeout_ns,says", [
    ("fault", 7, None, "illegal memory access"),
    ("launch_never_ends", 16, 2 * 10**6, "did not complete")])
def test_launch_that_faults_or_never_completes_is_an_error(fake_fatbin, kernel_mode, seed,
                                                           timeout_ns, says):
    """A launch that faults or never completes is a BackendError, with the context popped."""
    m = random_model(np.random.default_rng(seed), [4, 2])
    cu = FakeCuda(kernel_mode=kernel_mode)
    kw = {} if timeout_ns is None else {"timeout_ns": timeout_ns}
    be = GpuBackend(m, "launch", cuda=cu, **kw)
    with pytest.raises(BackendError, match=says):
        be.infer(np.zeros(4, np.float32))
    assert cu.depth == 0
    if kernel_mode == "launch_never_ends":
        assert be.path._inflight == 0


@pytest.mark.parametrize("mode", ["launch", "persistent"])
def test_backend_infer_refuses_wrong_widths(fake_gpu, mode):
    """The launch path broadcast an input of the wrong width into the pinned rows and answered
    it."""
    m = random_model(np.random.default_rng(7), [6, 4, 2])
    with GpuBackend(m, mode, max_batch=8, cuda=fake_gpu, timeout_ns=5 * 10**9) as be:
        for x in (np.float32([0.5]), np.ones(7, np.float32), np.ones((1, 6), np.float32)):
            with pytest.raises(InputError, match=r"x must hold the model's 6 features"):
                be.infer(x)
        for X in (np.arange(6, dtype=np.float32), np.ones((3, 1), np.float32),
                  np.ones((2, 7), np.float32)):
            with pytest.raises(InputError, match=r"\(n, 6\)"):
                be.infer_batch(X)
        if mode == "launch":
            with pytest.raises(InputError, match=r"\(n, 6\)"):
                be.path.infer(np.float32([0.5]))
        # still right afterwards
        x = np.linspace(-1, 1, 6).astype(np.float32)
        np.testing.assert_allclose(be.infer(x)[0], packed_forward(be.packed, x)[0][0],
                                   rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["launch", "persistent"])
def test_backend_infer_batch_of_no_rows(fake_gpu, mode):
    """A batch of no rows raised ValueError from np.concatenate."""
    from fastpath.model import Layer
    rng = np.random.default_rng(8)
    m = [Layer(rng.standard_normal((4, 6)).astype(np.float32), np.zeros(4, np.float32), "relu"),
         Layer(rng.standard_normal((3, 4)).astype(np.float32), np.zeros(3, np.float32))]
    with GpuBackend(m, mode, cuda=fake_gpu, timeout_ns=5 * 10**9) as be:
        Y, bad, ts = be.infer_batch(np.zeros((0, 6), np.float32))
        assert Y.shape == (0, 3) and Y.dtype == np.float32 and bad.shape == (0,) and ts == []


@pytest.mark.parametrize("mode", ["launch", "persistent"])
def test_closed_gpu_engine_and_backend_are_backend_errors(fake_gpu, mode):
    """A closed GpuEngine or GpuBackend raised AttributeError instead of a BackendError."""
    m = random_model(np.random.default_rng(6), [6, 4, 2])
    ge = GpuEngine(m, {"cache": NOCACHE}, mode=mode, timeout_ns=5 * 10**9)
    ge.close()
    raws = np.ones((2, 6), np.float32)
    with pytest.raises(BackendError, match="closed"):
        ge.step_batch(raws, [0, 0])
    be = GpuBackend(m, mode, cuda=fake_gpu, timeout_ns=5 * 10**9)
    be.close()
    with pytest.raises(BackendError, match="closed"):
        be.infer(np.ones(6, np.float32))
    with pytest.raises(BackendError, match="closed"):
        be.infer_batch(raws)


def test_launch_refusal_tag_wrap_does_not_flag_a_clean_row(fake_fatbin):
    """After the refusal tag wrapped, a row refused 2**31-1 launches earlier read as refused
    again."""
    # the counter is set near the wrap instead of launching 2**31 times
    m = random_model(np.random.default_rng(6), [4, 3, 2], ["relu", "identity"])
    cu = OccCuda()
    with GpuBackend(m, "launch", max_batch=4, cuda=cu) as be:
        w = cu.mem.view(int(be.path.d_w), np.float32, 1)
        w[0] = 3e38
        big = np.full(4, 1e38, np.float32)
        clean = np.zeros(4, np.float32)
        assert be.infer(big)[1] is True                # tag 1: status[0] = 1
        be.path._tag = 2**31 - 2
        assert be.infer(clean)[1] is False             # tag 2**31 - 1
        assert be.infer(clean)[1] is False             # the wrap: tag 1 again
        Y, bad, _ = be.infer_batch(np.stack([clean, big, clean]))
        assert bad.tolist() == [False, True, False]    # a refusal after the wrap still shows
        assert be.path._tag == 2 and cu.depth == 0


def test_step_batch_across_the_tag_wrap_flags_only_refused_rows(fake_fatbin, monkeypatch):
    """Rows wrongly flagged at the tag wrap each cost a CPU recompute in GpuEngine.step_batch."""
    cu = OccCuda()
    _fake_pycuda(monkeypatch, cu)
    from fastpath.gpu import gpu_status
    import fastpath.gpu as G
    calls = []
    real = G._cpu_outputs
    monkeypatch.setattr(G, "_cpu_outputs", lambda *a: calls.append(1) or real(*a))
    try:
        rng = np.random.default_rng(3)
        m = random_model(rng, [6, 8, 2])
        cfg = {"engine": {"n_symbols": 2}, "cache": {"enabled": False}}
        raws = rng.standard_normal((8, 6)).astype(np.float32)
        syms = np.zeros(8, np.int64)
        with GpuEngine(m, cfg, mode="launch", max_batch=8) as ge:
            path = ge.backend.path
            # a refusal left at rows 0..7 from tag 1, as an overflow 2**31 - 1 launches ago
            cu.mem.view(int(path.d_st), np.int32, 8)[:] = 1
            path._tag = 2**31 - 1
            got = ge.step_batch(raws, syms)
        assert calls == []                  # no clean row recomputed on the CPU
        cpu = fastpath.Engine(m, backend="cpu", config=cfg)
        for g, r in zip(got, raws):
            assert abs(g.signal - cpu.step(r, 0).signal) < 1e-5
    finally:
        gpu_status.cache_clear()
