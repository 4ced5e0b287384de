"""The weights, the network table and the zeroed words reach the device before the first
kernel: async copies from page-locked memory and memsets on the path's own stream, then
that stream synchronized (the stand-in logs every copy, memset, launch and sync in order)."""

import numpy as np
import pytest

from fastpath.gpu import GpuBackend

from helpers.builders import random_model
from helpers.fake_cuda import FakeCuda


@pytest.mark.parametrize("mode", ["launch", "persistent"])
def test_setup_copies_are_on_the_path_stream_and_synced_before_the_first_kernel(fake_fatbin,
                                                                                mode):
    """Setup used pageable memcpy_htod and memset_d32 on the legacy stream, which the
    non-blocking kernel streams do not wait for."""
    cu = FakeCuda()
    m = random_model(np.random.default_rng(2), [12, 16, 2])
    with GpuBackend(m, mode, cuda=cu, timeout_ns=5 * 10**9) as be:
        stream = be.path.stream
        # what the constructor did before the first kernel (a persistent one starts there)
        setup = [op for op in cu.ops]
        if mode == "persistent":
            setup = setup[:next(i for i, (w, _) in enumerate(setup) if w == "launch")]
        else:
            be.infer(np.ones(12, np.float32))
        copies = [(w, s) for w, s in setup if w in ("htod", "htod pageable", "memset")]
        assert len([w for w, _ in copies if w.startswith("htod")]) >= 2     # table, weights
        assert all(w != "htod pageable" and s is stream for w, s in copies), copies
        last = max(i for i, (w, _) in enumerate(setup) if w in ("htod", "memset"))
        assert ("sync", stream) in setup[last + 1:]
        assert ("context sync", None) not in cu.ops
        first = next(i for i, (w, _) in enumerate(cu.ops) if w == "launch")
        assert first >= len(setup) and cu.ops[first][1] is stream
