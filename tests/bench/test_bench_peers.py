"""The bench's peers (onnxruntime, numpy, torch) run the same work as fastpath: the model's post
transform, every output compared, the MLP only, one BLAS thread whatever the environment says
(and the JSON says which pools they ran on), and the onnxruntime peer leaves no files behind.
"""

import dataclasses
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

import fastpath

from helpers.builders import random_model
from helpers.bench_scripts import BENCH, bench_on_path, import_bench

bench_on_path()


CHILD_POOLS = r"""
import importlib.util, json, sys
sys.path.insert(0, sys.argv[1])
spec = importlib.util.spec_from_file_location("bench_mod", sys.argv[2])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
import numpy as np
a = np.ones((64, 64), np.float32)
a @ a                                   # the BLAS pool is up
from threadpoolctl import threadpool_info
print(json.dumps([p["num_threads"] for p in threadpool_info()]))
"""

@pytest.mark.parametrize("script", ["run.py", "zoo.py"])
def test_peers_blas_pool_holds_one_thread_whatever_the_environment(script, tmp_path):
    """The bench only defaulted OPENBLAS_NUM_THREADS and its kin to 1: a caller who had set
    them (OPENBLAS_NUM_THREADS=2 here) got numpy timed on that many threads under a table that
    says the pools hold one."""
    pytest.importorskip("threadpoolctl")
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one core: a BLAS pool holds one thread whatever it is told")
    env = dict(os.environ, OPENBLAS_NUM_THREADS="2", OMP_NUM_THREADS="2", MKL_NUM_THREADS="2")
    # started outside the checkout: `python -c` puts its cwd first on sys.path, and from a
    # non-editable install the checkout's fastpath is unbuilt sources
    out = subprocess.run([sys.executable, "-c", CHILD_POOLS, BENCH, os.path.join(BENCH, script)],
                         capture_output=True, text=True, timeout=120, env=env, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    pools = json.loads(out.stdout.strip().splitlines()[-1])
    assert pools and all(n == 1 for n in pools), pools


def test_the_json_says_which_thread_pools_the_peers_ran_on(bench):
    run, _ = bench
    pools = run.thread_pools()
    assert pools
    try:
        import threadpoolctl  # noqa: F401
    except ImportError:
        assert pools[0]["env"]["OPENBLAS_NUM_THREADS"] == "1"
    else:
        assert all("num_threads" in p for p in pools)


def test_numpy_peer_runs_the_mlp_only(monkeypatch):
    """The numpy peer, labelled "MLP only" beside onnxruntime's graph and the torch module
    (both end at the output layer), also computed the head, tanh and sigmoid of the two
    outputs, and threw it away: ~10% of its figure was work the others did not do. Counted
    here by the calls it makes to np.tanh on the demo model (ReLU, ReLU, identity: none)."""
    import fastpath
    sys.path.insert(0, BENCH)
    try:
        import peers
    finally:
        sys.path.remove(BENCH)
    model = fastpath.Model.load(os.path.join(os.path.dirname(fastpath.__file__), "data",
                                             "demo.fpm"))
    assert all(L.activation in ("relu", "identity") for L in model.layers)
    fn = peers.numpy_peer(model)
    x = np.random.default_rng(0).standard_normal(model.dims[0]).astype(np.float32)
    calls = []
    real = np.tanh
    monkeypatch.setattr(peers.np, "tanh", lambda *a, **k: calls.append(1) or real(*a, **k))
    out = np.asarray(fn(x))
    assert calls == []
    np.testing.assert_allclose(out, model.forward(x[None, :])[0], rtol=1e-5, atol=1e-6)


def _with_post(post, n_out):
    from fastpath.model import Model
    m = random_model(np.random.default_rng(27), [6, 5, 2])
    rng = np.random.default_rng(3)
    last = dataclasses.replace(m.layers[-1], weight=rng.standard_normal((n_out, 5)).astype(
        np.float32), bias=rng.standard_normal(n_out).astype(np.float32))
    return Model((m.layers[0], last), post=post)


@pytest.mark.parametrize("post,n_out", [("softmax", 3), ("logistic2", 1)])
def test_peers_run_the_models_post_transform(post, n_out):
    """The numpy and torch peers stopped at the last layer while onnxruntime ran the post
    transform."""
    peers = import_bench("peers")
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


def test_peer_check_compares_every_output(bench_replays):
    """The check before a peer is timed compared the first two outputs alone."""
    m = _with_post("softmax", 3)
    raws = np.random.default_rng(2).standard_normal((4, 6)).astype(np.float32)
    syms = np.zeros(4, np.int64)
    feats = m.features(raws, syms)
    right = import_bench("peers").numpy_peer(m)
    assert bench_replays.peer_error("numpy", right, m, raws, syms, feats) < 1e-5

    def third_off(x):
        y = np.array(right(x))
        y[2] += 0.5
        return y
    got = bench_replays.peer_error("numpy", third_off, m, raws, syms, feats)
    assert got == pytest.approx(0.5, abs=1e-5)
    with pytest.raises(RuntimeError, match="returns 2 outputs, the model has 3"):
        bench_replays.peer_error("numpy", lambda x: right(x)[:2], m, raws, syms, feats)


def test_onnxruntime_peer_leaves_nothing_behind(tmp_path, monkeypatch):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    import peers
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    model = fastpath.get_default_engine().model
    fn, version = peers.onnxruntime_peer(model)
    assert fn is not None, version
    assert os.listdir(tmp_path) == []
    # the peer still runs once its files are gone, and computes the model
    x = np.linspace(-1, 1, model.layers[0].weight.shape[1]).astype(np.float32)
    np.testing.assert_allclose(fn(x), fastpath.Engine(model).predict(x), rtol=1e-4, atol=1e-5)
