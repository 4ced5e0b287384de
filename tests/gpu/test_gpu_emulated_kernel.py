"""csrc/cuda/fp_mlp.cu's own kernels, compiled for the host through csrc/cuda/emu/cuda_emu.h
(blocks as threads, CUDA threads as fibers, the .cu's barriers, shuffles and slot protocol as
written), agree with numpy's packed_forward; the persistent kernel serves requests through
the host protocol (fp_gpu.c) and stops. A wrong index or argument order in the .cu fails."""
import os

import numpy as np
import pytest

from fastpath import Layer
from fastpath.gpu import _pack
from fastpath.gpu import _protocol as P
from helpers import cuda_emu as E

pytestmark = pytest.mark.skipif(E.compilers() is None, reason="no gcc/g++ to build the emulation")

ACTS = ["identity", "relu", "tanh", "sigmoid"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cuda_emu"))


@pytest.fixture(scope="module")
def exe(workdir):
    return E.build(workdir)


def _net(rng, dims, acts):
    layers = [Layer((rng.standard_normal((dims[i + 1], dims[i])) / np.sqrt(dims[i]))
                    .astype(np.float32), rng.standard_normal(dims[i + 1]).astype(np.float32), a)
              for i, a in enumerate(acts)]
    return _pack.pack(layers)


def _close(out, ref):
    scale = max(1.0, float(np.abs(ref).max()))
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5 * scale)


def _agrees(res, ref) -> bool:
    if not isinstance(res, tuple):
        return False
    scale = max(1.0, float(np.abs(ref).max()))
    return bool(np.allclose(res[0], ref, rtol=1e-5, atol=1e-5 * scale))


@pytest.mark.parametrize("act", ACTS)
def test_launch_kernel_matches_numpy_for_each_activation(exe, workdir, act):
    rng = np.random.default_rng(ACTS.index(act))
    p = _net(rng, [37, 45, 33, 3], [act] * 3)
    x = rng.standard_normal((3, 37)).astype(np.float32)
    res = E.run_batch(exe, os.path.join(workdir, act), p, x, grid=2, block=64)
    assert isinstance(res, tuple), res.stderr
    ref, bad = _pack.packed_forward(p, x)
    _close(res[0], ref)
    assert not bad.any() and not res[1].any()


@pytest.mark.parametrize("n_layers,grid,block", [(1, 1, 32), (2, 3, 64), (5, 2, 96),
                                                 (16, 2, 64), (3, 1, 256)])
def test_launch_kernel_matches_numpy_for_1_to_16_layers(exe, workdir, n_layers, grid, block):
    rng = np.random.default_rng(100 + n_layers)
    dims = [int(d) for d in rng.integers(1, 70, n_layers + 1)]
    dims[0], dims[-1] = 33, 2          # widths around and below a warp
    acts = [ACTS[int(i)] for i in rng.integers(0, 4, n_layers)]
    p = _net(rng, dims, acts)
    x = rng.standard_normal((4, 33)).astype(np.float32)
    res = E.run_batch(exe, os.path.join(workdir, f"l{n_layers}"), p, x, grid, block)
    assert isinstance(res, tuple), res.stderr
    _close(res[0], _pack.packed_forward(p, x)[0])


def test_launch_kernel_marks_nonfinite_rows_with_the_tag(exe, workdir):
    rng = np.random.default_rng(7)
    p = _net(rng, [5, 40, 2], ["relu", "identity"])
    x = rng.standard_normal((3, 5)).astype(np.float32)
    x[1] = np.float32(3e38)             # overflows the first layer's sums in row 1 only
    res = E.run_batch(exe, os.path.join(workdir, "nonfinite"), p, x, grid=2, block=64, tag=9)
    assert isinstance(res, tuple), res.stderr
    _, bad = _pack.packed_forward(p, x)
    assert bad.tolist() == [False, True, False]
    assert res[1].tolist() == [0, 9, 0]


@pytest.mark.parametrize("dims,grid", [([37, 45, 3], 2), ([33] + [40] * 15 + [2], 3), ([5, 1], 1)])
def test_persistent_kernel_answers_requests_then_stops(exe, workdir, dims, grid):
    rng = np.random.default_rng(len(dims))
    p = _net(rng, dims, [ACTS[i % 4] for i in range(len(dims) - 1)])
    xs = rng.standard_normal((4, dims[0])).astype(np.float32)
    xs[2] = np.float32(3e38)            # one request meets a non-finite pre-activation
    run = E.run_persistent(exe, os.path.join(workdir, f"p{len(dims)}"), p, xs, grid, 64)
    assert run.returncode == 0, run.stderr
    ref, bad = _pack.packed_forward(p, xs)
    assert run.stats["ready_rc"] == P.OK and run.stats["exit_rc"] == P.OK
    want = [P.NONFINITE if b else P.OK for b in bad]
    assert run.rcs.tolist() == want and want[2] == P.NONFINITE
    ok = ~bad
    _close(run.outputs[ok], ref[ok])
    # stopped: the host sends nothing more
    assert run.stats["after_stop_rc"] == P.STOPPED


def test_stop_is_read_from_the_request_word(exe, workdir):
    """The poll loop read a separate stop word over PCIe besides req_seq each spin."""
    rng = np.random.default_rng(11)
    p = _net(rng, [8, 40, 2], ["tanh", "identity"])
    xs = rng.standard_normal((2, 8)).astype(np.float32)
    # only req_seq's stop bit is set (the slot's stop field stays 0): the kernel must return
    run = E.run_persistent(exe, os.path.join(workdir, "stopword"), p, xs, 2, 64, stop="word")
    assert run.stats.get("exit_rc") == P.OK and run.returncode == 0, run.stderr
    _close(run.outputs, _pack.packed_forward(p, xs)[0])


def test_one_system_fence_per_answer(exe, workdir):
    """Every thread of block 0 issued __threadfence_system for each answer."""
    rng = np.random.default_rng(12)
    p = _net(rng, [8, 40, 2], ["relu", "identity"])
    xs = rng.standard_normal((5, 8)).astype(np.float32)
    run = E.run_persistent(exe, os.path.join(workdir, "fences"), p, xs, 2, 128)
    assert run.returncode == 0, run.stderr
    assert run.rcs.tolist() == [P.OK] * 5
    # one per answer; the fence after `ready` may land after the host saw it and be counted
    assert run.stats["request_fences"] in (5, 6)


def test_ready_only_after_every_block_reached_the_grid_barrier(exe, workdir):
    """`ready` was published before the other blocks were resident."""
    rng = np.random.default_rng(13)
    p = _net(rng, [8, 40, 2], ["sigmoid", "identity"])
    xs = rng.standard_normal((2, 8)).astype(np.float32)
    run = E.run_persistent(exe, os.path.join(workdir, "hold"), p, xs, 3, 64, hold=True)
    assert run.returncode == 0, run.stderr
    # while the last block is not resident the kernel does not report running
    assert run.stats["ready_while_held"] == 0 and run.stats["wait_while_held"] == P.TIMEOUT
    assert run.stats["ready_rc"] == P.OK and run.rcs.tolist() == [P.OK, P.OK]
    _close(run.outputs, _pack.packed_forward(p, xs)[0])


MUTANTS = {
    # a row's inputs strided by the layer's output width
    "stride": ("const float *xs = in + (size_t)s * L.in;",
               "const float *xs = in + (size_t)s * L.out;"),
    # the launch kernel passes tag and batch in swapped order
    "argument order": ("fp_mlp_forward_dev(net, w, x, a, b, y, status, tag, batch, bar);",
                       "fp_mlp_forward_dev(net, w, x, a, b, y, status, batch, tag, bar);"),
    # each output takes the next row's bias
    "bias index": ("const float v = acc + bl[o];", "const float v = acc + bl[o + 1];"),
}


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_a_wrong_index_or_argument_order_in_the_cu_disagrees(workdir, name):
    old, new = MUTANTS[name]
    text = open(E.CU).read()
    assert text.count(old) == 1, f"the .cu no longer has {old!r}: update the mutant"
    mutant = E.build(workdir, text.replace(old, new))
    rng = np.random.default_rng(21)
    p = _net(rng, [37, 45, 3], ["tanh", "identity"])
    x = rng.standard_normal((3, 37)).astype(np.float32)
    ref = _pack.packed_forward(p, x)[0]
    res = E.run_batch(mutant, os.path.join(workdir, "mut"), p, x, grid=2, block=64, tag=1)
    assert not _agrees(res, ref)


PERSISTENT_MUTANTS = {
    # the answer written at the output offset of the other width
    "output offset": ("float *outp = (float *)((char *)slot + FP_GPU_OUT_OFF(n_in));",
                      "float *outp = (float *)((char *)slot + FP_GPU_OUT_OFF(n_out));"),
    # thread 0 publishes before the block's other threads have written their outputs
    "missing barrier": ("            __syncthreads();\n            if (threadIdx.x == 0) {\n"
                        "                const int st",
                        "            if (threadIdx.x == 0) {\n                const int st"),
}


@pytest.mark.parametrize("name", sorted(PERSISTENT_MUTANTS))
def test_a_wrong_offset_or_missing_barrier_in_the_persistent_kernel_disagrees(workdir, name):
    old, new = PERSISTENT_MUTANTS[name]
    text = open(E.CU).read()
    assert text.count(old) == 1, f"the .cu no longer has {old!r}: update the mutant"
    mutant = E.build(workdir, text.replace(old, new))
    rng = np.random.default_rng(22)
    p = _net(rng, [37, 45, 3], ["tanh", "identity"])
    xs = rng.standard_normal((2, 37)).astype(np.float32)
    run = E.run_persistent(mutant, os.path.join(workdir, "mutp"), p, xs, 2, 64)
    ref = _pack.packed_forward(p, xs)[0]
    assert run.outputs is None or not np.allclose(run.outputs, ref, rtol=1e-5, atol=1e-5)
