"""The step path's shortcuts give the answers the plain path gives.

- Window features come straight from the running sums to z-scores in one kernel
  (window_zscore): bit for bit what window_stats followed by zscore compute, which the
  kernel shims still call one at a time, on every kernel set, before and after the window
  fills, for widths that exercise the vector body and its tail.
- Engine.step's argument checks: the common call (float32 C-contiguous array, int symbol,
  int or None ts_ns) and everything else still refused with the same messages.
"""
import numpy as np
import pytest

from fastpath import Engine, InputError
from fastpath import _kernels as K
from fastpath.model import CachePolicy, FeatureSpec
from helpers.builders import engine_cfg, random_model


def _window_engine(isa, n_w, window=5, raw_len=48, n_z=13, seed=0):
    rng = np.random.default_rng(seed)
    z_idx = np.sort(rng.choice(raw_len, n_z, replace=False)).astype(np.int32)
    w_idx = rng.choice(raw_len, n_w, replace=False).astype(np.int32)
    nf = n_z + 2 * n_w
    fs = FeatureSpec(raw_len, z_idx, w_idx, window,
                     (rng.standard_normal(nf) * 0.1).astype(np.float32),
                     (0.5 + rng.random(nf)).astype(np.float32))
    model = random_model(rng, [nf, 8, 2], fs=fs, policy=CachePolicy(enabled=False))
    return Engine(model, config=engine_cfg(isa)), fs


@pytest.mark.parametrize("n_w", [1, 3, 4, 5, 8, 11])
def test_window_features_bit_identical_to_the_two_kernel_path(isa, n_w):
    W = 5
    eng, fs = _window_engine(isa, n_w, window=W, seed=n_w)
    n_z = len(fs.z_idx)
    rng = np.random.default_rng(100 + n_w)
    # the engine's window state, kept the way fp_window_commit keeps it (double sums, float ring)
    s = np.zeros(n_w)
    q = np.zeros(n_w)
    ring = np.zeros((W, n_w), np.float32)
    count = pos = 0
    for tick in range(3 * W + 2):
        raw = (rng.standard_normal(fs.raw_len) * 3 + 50).astype(np.float32)
        full = count >= W
        old = ring[pos].copy() if full else None
        pm, ps = K.kernel_window_stats(isa, raw, fs.w_idx, s, q, old,
                                       1.0 / (W if full else count + 1))
        want_w = K.kernel_zscore(isa, np.concatenate([pm, ps]), fs.mean[n_z:], fs.inv_std[n_z:])
        want_z = K.kernel_zscore_gather(isa, raw, fs.z_idx, fs.mean[:n_z], fs.inv_std[:n_z])
        got = eng.features(raw, 0)
        np.testing.assert_array_equal(got[n_z:].view(np.uint32), want_w.view(np.uint32),
                                      err_msg=f"tick {tick}")
        np.testing.assert_array_equal(got[:n_z], want_z)
        eng.step(raw, 0, ts_ns=tick + 1)
        for j in range(n_w):
            x = float(raw[fs.w_idx[j]])
            if full:
                s[j] -= float(ring[pos, j])
                q[j] -= float(ring[pos, j]) * float(ring[pos, j])
            s[j] += x
            q[j] += x * x
            ring[pos, j] = raw[fs.w_idx[j]]
        count = min(count + 1, W)
        pos = (pos + 1) % W


@pytest.fixture(scope="module")
def plain_engine():
    rng = np.random.default_rng(3)
    return Engine(random_model(rng, [16, 8, 2]), config={"engine": {"n_symbols": 4}})


@pytest.mark.parametrize("ts, pattern", [
    (-1, r"ts_ns must be >= 0 \(ns\), got -1"),
    (-(2**70), r"does not fit a signed 64-bit int"),
    (2**63, r"ts_ns 9223372036854775808 does not fit a signed 64-bit int of ns"),
    (2**64 + 5, r"does not fit a signed 64-bit int"),
    (np.uint64(2**63), r"does not fit a signed 64-bit int"),
    (np.int64(-3), r"ts_ns must be >= 0 \(ns\), got -3"),
    (True, r"ts_ns must be an int >= 0 \(ns\) or None, got bool True"),
    (1.0, r"got float 1.0; pass an int \(ns\)"),
])
def test_ts_fast_path_refuses_what_the_full_check_refuses(plain_engine, ts, pattern):
    """A Python int takes a shortcut (no try block); ints that do not fit or are negative
    fall through to the full check and get its message; state unchanged."""
    raw = np.zeros(16, np.float32)
    before = plain_engine.ticks
    with pytest.raises(InputError, match=pattern):
        plain_engine.step(raw, 0, ts_ns=ts)
    assert plain_engine.ticks == before


@pytest.mark.parametrize("ts", [0, 1, 2**62, 2**63 - 1, np.int64(7), np.uint32(9)])
def test_ts_accepted_at_the_edges(ts):
    rng = np.random.default_rng(4)
    eng = Engine(random_model(rng, [16, 8, 2]), config={"engine": {"n_symbols": 2}})
    r = eng.step(np.zeros(16, np.float32), 1, ts_ns=ts)
    assert -1.0 <= r.signal <= 1.0 and eng.ticks == 1


def test_zscore_features_bit_identical_on_every_feature_path(isa):
    """The z-scored fields come out bit for bit as numpy's float32 (x - mean) * inv_std, on
    every kernel set, whichever path the engine picked for them (runs of consecutive fields,
    one gather per 8 or 16 fields, or the permute plan, which AVX-512 always takes): the demo
    model's own spec (22 runs) and a scattered one."""
    import fastpath
    from fastpath.model import Model
    demo = Model.load(fastpath._build.DEMO_MODEL)
    rng = np.random.default_rng(21)
    scattered = FeatureSpec(64, rng.permutation(64)[:30].astype(np.int32), np.array([3], np.int32), 4,
                            rng.standard_normal(32).astype(np.float32),
                            (rng.random(32) + 0.5).astype(np.float32))
    for fs, model in ((demo.feature_spec, demo),
                      (scattered, random_model(rng, [32, 8, 2], fs=scattered))):
        eng = Engine(model, config=engine_cfg(isa, enabled=False))
        if isa == "avx512":
            assert eng.feature_path == "permute"
        else:
            assert eng.feature_path in ("runs", "gather")
        n_z = len(fs.z_idx)
        for i in range(20):
            raw = (rng.standard_normal(fs.raw_len) * 10.0 ** rng.integers(-3, 4)).astype(np.float32)
            want = (raw[fs.z_idx] - fs.mean[:n_z]) * fs.inv_std[:n_z]
            got = eng.features(raw, 0)[:n_z]
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=f"tick {i}")
            eng.step(raw, 0, ts_ns=i + 1)
