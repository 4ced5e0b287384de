"""A GPU engine's stage times do not leak into a Result that a later CPU tick reuses."""

import numpy as np

import fastpath
from helpers.fake_cuda import _head_model, _stream


def test_gpu_stage_times_do_not_leak_into_a_reused_result(fake_gpu, isa):
    # a GPU tick sets h2d_ns / d2h_ns on its Result; once dropped, that object can be filled
    # again by a CPU engine's tick, which must read 0 there as a new Result does
    rng = np.random.default_rng(13)
    m = _head_model(rng, "tanh_sigmoid")
    raws, syms = _stream(rng, 40)
    cfg = {"engine": {"simd": isa, "n_symbols": 3}, "cache": {"enabled": False}}
    cpu = fastpath.Engine(m, backend="cpu", config=cfg)
    with fastpath.Engine(m, backend="gpu", config=dict(cfg, gpu={"mode": "launch"})) as ge:
        for i in range(6):
            g = ge.step(raws[i], int(syms[i]), ts_ns=i * 1000)
            assert g.latency.h2d_ns == 1000 and g.latency.d2h_ns == 1000
            del g
            # the Result handed out two calls ago is the one filled again: two CPU ticks
            for _ in range(2):
                c = cpu.step(raws[i], int(syms[i]), ts_ns=i * 1000)
                assert c.latency.h2d_ns == 0 and c.latency.d2h_ns == 0, i
                assert c.seq == 0 and c.wait_ns == 0
                del c
