"""Bench figures that did not measure what their label says (bench/peers.py, bench/run.py,
bench/gpu_check.py), shown without timing anything: each test failed on the code before its fix.
"""
import dataclasses
import os
import sys
import types

import numpy as np
import pytest

from helpers.builders import BENCH, random_model


def _import(name):
    sys.path.insert(0, BENCH)
    try:
        return __import__(name)
    finally:
        sys.path.remove(BENCH)


def _with_post(post, n_out):
    from fastpath.model import Model
    m = random_model(np.random.default_rng(27), [6, 5, 2])
    rng = np.random.default_rng(3)
    last = dataclasses.replace(m.layers[-1], weight=rng.standard_normal((n_out, 5)).astype(
        np.float32), bias=rng.standard_normal(n_out).astype(np.float32))
    return Model((m.layers[0], last), post=post)


@pytest.mark.parametrize("post,n_out", [("softmax", 3), ("logistic2", 1)])
def test_peers_run_the_models_post_transform(post, n_out):
    # Model.to_onnx writes the post transform, so onnxruntime's graph ran it; the numpy and
    # torch peers stopped at the last layer: less work under the same "MLP only" label, and
    # other outputs (a softmax model's logits, a logistic2 model's one value for two)
    peers = _import("peers")
    m = _with_post(post, n_out)
    x = np.random.default_rng(1).standard_normal(6).astype(np.float32)
    want = m.forward(x[None, :])[0]
    assert want.shape == (m.n_outputs,)
    np.testing.assert_allclose(np.asarray(peers.numpy_peer(m)(x)), want, rtol=1e-5, atol=1e-6)
    for make in (peers.onnxruntime_peer, peers.torch_peer):
        fn, info = make(m)
        if fn is None:
            continue            # not installed here: the peer is skipped by the bench too
        np.testing.assert_allclose(np.asarray(fn(x)).reshape(-1), want, rtol=1e-5, atol=1e-6)


def test_peer_check_compares_every_output(bench):
    # the check before a peer is timed compared the first two outputs alone: a peer wrong in
    # a third was timed as the same work, and one returning the wrong number of outputs was
    # compared by broadcasting
    run, _ = bench
    m = _with_post("softmax", 3)
    raws = np.random.default_rng(2).standard_normal((4, 6)).astype(np.float32)
    syms = np.zeros(4, np.int64)
    feats = m.features(raws, syms)
    right = _import("peers").numpy_peer(m)
    assert run.peer_error("numpy", right, m, raws, syms, feats) < 1e-5

    def third_off(x):
        y = np.array(right(x))
        y[2] += 0.5
        return y
    assert run.peer_error("numpy", third_off, m, raws, syms, feats) == pytest.approx(0.5, abs=1e-5)
    with pytest.raises(RuntimeError, match="returns 2 outputs, the model has 3"):
        run.peer_error("numpy", lambda x: right(x)[:2], m, raws, syms, feats)


def test_timeline_percentiles_are_calls_in_c(bench):
    # the timeline's p50_ns / p99_ns were np.percentile's interpolation (a time between two
    # calls that no call took) where the method says every figure is a call's own time by the
    # histogram's rank rule; and nothing said they are in-C totals, not the Python figures
    run, _ = bench
    n = 200
    rec = np.zeros((n, 4), np.uint32)
    rec[:, 3] = 10 * (np.arange(n) % 100) + 100          # each bin of 100: 100, 110, .., 1090
    on = {"cached": np.zeros(n, bool), "reason": np.full(n, 3, np.int8),
          "py": np.full(n, 500, np.int64), "rec": rec, "signal": np.zeros(n),
          "stats": {}}
    bs = types.SimpleNamespace(regime_names=["calm"], regime=np.zeros(n, np.int64))
    tl = run.replay_summary(on, np.zeros(n), bs, n)["timeline"]
    assert len(tl["p50_ns"]) == 2
    took = set(rec[:, 3].tolist())
    assert all(v in took for v in tl["p50_ns"] + tl["p99_ns"]), tl
    assert "in C" in tl["what"] and "not from Python" in tl["what"]


def test_gpu_check_gpu_figure_is_the_whole_call(monkeypatch):
    # bench/gpu_check.py's crossover compared the CPU forward (timed in C around the call)
    # with the GPU path's Timing.total_ns, labelled "the whole call" though it leaves part of
    # the call out (launch: the checks, the grid, the output copy; persistent: all but the C
    # wait). On a fake clock: a call of 5 us whose Timing says 1 us is 5 us
    gc = _import("gpu_check")
    from fastpath.gpu._backend import Timing
    clock = {"ns": 0}

    def read():
        clock["ns"] += 40          # what one timer read costs
        return clock["ns"]
    monkeypatch.setattr(gc, "time", types.SimpleNamespace(perf_counter_ns=read))

    class Be:
        def infer(self, x):
            clock["ns"] += 5000
            return x, False, Timing(300, 400, 200, 1000)
    r = gc._gpu_times(Be(), np.zeros(4, np.float32), 50)
    assert r["p50_ns"] == r["p99_ns"] == r["max_ns"] == 5000
    assert r["timer_overhead_ns"] == 40
    assert r["timing_total_p50_ns"] == 1000 and r["stages_sum_p50_ns"] == 900
    assert r["stages_vs_total"] == 0.9
    assert "whole call" in gc.__doc__ and "GpuBackend.infer timed around" in gc.__doc__


def test_schema_describes_the_timeline():
    import json
    with open(os.path.join(BENCH, "schema.json")) as f:
        s = json.load(f)
    tl = s["properties"]["replay"]["properties"]["timeline"]
    assert "in C" in tl["properties"]["what"]["description"]


@pytest.mark.parametrize("calls", [1, 65_536, 200_000, 1 << 30])
def test_serve_worker_rows_cover_every_round_trip(calls):
    # bench/serve.py reads the worker's fp_step and hand-off rows from the worker's latency
    # records; its default ring of 65,536 held the last 65,536 of a row's 200,000 round trips
    # (the committed serve-latest.json: worker_in_c_total_ns n 65536 beside round trips of
    # 200,000, printed as "of which"). The ring now holds every timed call, up to the engine's
    # largest ring
    import fastpath
    from fastpath.control.config import load_config
    serve = _import("serve")
    cfg = serve.server_config(0, calls)
    rec = cfg["engine"]["latency_records"]
    assert rec >= min(calls, serve.MAX_RECORDS) and rec & (rec - 1) == 0
    assert rec <= serve.MAX_RECORDS and rec >= 65_536
    assert load_config(cfg).latency_records == rec
    if calls == 200_000:
        eng = fastpath.Engine(os.path.join(os.path.dirname(fastpath.__file__), "data",
                                           "demo.fpm"), config=cfg)
        assert eng.stats()["ticks"] == 0
