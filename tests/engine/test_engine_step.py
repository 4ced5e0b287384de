"""The fused step against numpy references (features from z-scores and windows, the model, the
head), step_batch against sequential steps, stats and reset, the default engine behind
fastpath.step, and the kernel-set and stage-time settings."""
import numpy as np
import pytest

import fastpath
from fastpath import ConfigError, Engine, Model
from fastpath.model import FeatureSpec
from helpers.builders import ISAS, engine_cfg, random_model, windowed_model


def expected(model, raws, symbols):
    feats = model.feature_spec.apply(raws, symbols)
    return feats, Model.head(model.forward(feats))


@pytest.mark.parametrize("window", [1, 3, 8])
def test_features_match_numpy_with_windows(isa, window):
    rng = np.random.default_rng(window)
    m = windowed_model(rng, window=window)
    eng = Engine(m, config=engine_cfg(isa, enabled=False))
    n = 60
    raws = (rng.standard_normal((n, m.raw_len)) * 3 + 10).astype(np.float32)
    syms = rng.integers(0, 3, n)
    feats, (sig, conf) = expected(m, raws, syms)
    for i in range(n):
        np.testing.assert_allclose(eng.features(raws[i], int(syms[i])), feats[i], rtol=1e-5,
                                   atol=1e-5)
        r = eng.step(raws[i], int(syms[i]))
        assert not r.cached
        assert r.signal == pytest.approx(sig[i], abs=2e-5)
        assert r.confidence == pytest.approx(conf[i], abs=2e-5)


@pytest.mark.parametrize("dims", [[7, 2], [37, 129, 2], [129, 64, 32, 2], [300, 9, 17, 2]])
def test_identity_spec_model(isa, dims):
    rng = np.random.default_rng(sum(dims))
    for acts in (None, ["tanh"] * (len(dims) - 2) + ["sigmoid"]):
        m = random_model(rng, dims, acts)
        eng = Engine(m, config=engine_cfg(isa, enabled=False))
        x = rng.standard_normal((20, dims[0])).astype(np.float32)
        sig, conf = Model.head(m.forward(x))
        for i in range(20):
            r = eng.step(x[i])
            assert r.signal == pytest.approx(sig[i], abs=2e-5)
            assert r.confidence == pytest.approx(conf[i], abs=2e-5)


@pytest.mark.parametrize("seed, raw_len, n_z, hidden, n, repeats", [
    (3, 40, 20, (64, 32), 200, False),
    (12, 70, 37, (64, 33), 300, True),       # ticks 100..139 repeat tick 99: the cache hits too
])
def test_every_kernel_set_steps_as_scalar(seed, raw_len, n_z, hidden, n, repeats):
    """The whole fused step (features, cache, MLP, head) gives the same signals and
    confidences (atol 1e-5) and the same cache decisions on every set this CPU runs as on
    scalar."""
    rng = np.random.default_rng(seed)
    m = windowed_model(rng, raw_len=raw_len, n_z=n_z, hidden=hidden)
    raws = rng.standard_normal((n, m.raw_len)).astype(np.float32)
    if repeats:
        raws[100:140] = raws[99]
    syms = rng.integers(0, 4, n)
    ts = np.arange(n) * 1000
    ref = Engine(m, config=engine_cfg("scalar")).step_batch(raws, syms, ts)
    if repeats:
        assert ref.cached.any() and not ref.cached.all()
    for isa in ISAS:
        got = Engine(m, config=engine_cfg(isa)).step_batch(raws, syms, ts)
        np.testing.assert_allclose(got.signal, ref.signal, atol=1e-5)
        np.testing.assert_allclose(got.confidence, ref.confidence, atol=1e-5)
        np.testing.assert_array_equal(got.cached, ref.cached)


# ------------------------------------------------------------------ cache semantics
def _eng(isa, **cache):
    rng = np.random.default_rng(11)
    return Engine(random_model(rng, [32, 16, 2]), config=engine_cfg(isa, **cache))


def test_step_batch_equals_sequential(isa):
    rng = np.random.default_rng(9)
    m = windowed_model(rng)
    raws = rng.standard_normal((300, m.raw_len)).astype(np.float32)
    raws[100:200] = raws[100]       # a run of repeats so the cache hits
    syms = rng.integers(0, 5, 300)
    ts = np.arange(300, dtype=np.int64) * 10
    a = Engine(m, config=engine_cfg(isa))
    b = Engine(m, config=engine_cfg(isa))
    res = a.step_batch(raws, syms, ts)
    seq = [b.step(raws[i], int(syms[i]), ts_ns=int(ts[i])) for i in range(300)]
    np.testing.assert_array_equal(res.signal, np.float32([r.signal for r in seq]))
    np.testing.assert_array_equal(res.cached, [r.cached for r in seq])
    assert res.cached.sum() > 0
    assert (res.total_ns > 0).all()
    assert a.stats()["hits"] == b.stats()["hits"]


def test_stats_and_reset(isa):
    eng = _eng(isa)
    x = np.ones(32, np.float32)
    for t in range(10):
        eng.step(x, t % 2, ts_ns=t)
    st = eng.stats()
    assert st["ticks"] == 10 and st["hits"] + st["misses"] == 10
    assert st["hit_rate"] == pytest.approx(st["hits"] / 10)
    for stage in ("feature", "cache", "infer", "total"):
        assert st["latency_ns"][stage]["p50"] > 0
    eng.reset()
    assert eng.stats()["ticks"] == 0
    assert not eng.step(x, 0, ts_ns=0).cached


def test_module_step_default_engine():
    eng = fastpath.get_default_engine()
    assert (eng.raw_len, eng.n_features, eng.model.dims) == (256, 128, [128, 64, 32, 2])
    x = np.zeros(256, np.float32)
    r = fastpath.step(x, symbol=7)
    assert -1 <= r.signal <= 1 and 0 <= r.confidence <= 1
    L = r.latency
    assert L.total_ns >= L.feature_ns and L.h2d_ns == 0 and L.d2h_ns == 0
    assert fastpath.simd() in ("avx512", "avx2", "scalar")


def test_configure_replaces_default(tmp_path):
    p = tmp_path / "fp.toml"
    p.write_text("[engine]\nn_symbols = 8\n[cache]\nenabled = false\n")
    try:
        eng = fastpath.configure(str(p))
        assert fastpath.get_default_engine() is eng and eng.n_symbols == 8
        with pytest.raises(fastpath.InputError, match="out of range"):
            fastpath.step(np.zeros(256, np.float32), symbol=8)
    finally:
        fastpath.set_default_engine(None)


def test_forced_scalar_env(monkeypatch):
    monkeypatch.setenv("FASTPATH_SIMD", "scalar")
    assert fastpath.simd() == "scalar"
    assert Engine(random_model(np.random.default_rng(0), [4, 2])).simd == "scalar"


def test_demo_model_signal_means_something():
    """The embedded model was trained on the generated stream: its signal correlates with
    the future return on a stream it did not see (another seed)."""
    from fastpath import lob
    bs = lob.generate_stream(20_000, 8, seed=1234)
    raws = lob.raw_from_book(bs)
    eng = Engine(fastpath._build.DEMO_MODEL, config={"cache": {"enabled": False}})
    res = eng.step_batch(raws, bs.symbols, bs.ts_ns)
    fr = lob.future_return_bps(bs, 20)
    assert np.corrcoef(res.signal, fr)[0, 1] > 0.02


def test_runs_and_gather_feature_paths(isa):
    """Contiguous z fields take the runs path, scattered ones the gather path (AVX-512 takes
    its permute plan for both); every path matches numpy."""
    rng = np.random.default_rng(17)
    runs = "permute" if isa == "avx512" else "runs"
    gather = "permute" if isa == "avx512" else "gather"
    for z, path in ((np.r_[0:9, 12:30, 31:40], runs), (rng.permutation(40)[:20], gather)):
        nf = len(z) + 2
        fs = FeatureSpec(40, z, [3], 4, rng.standard_normal(nf).astype(np.float32),
                         (rng.random(nf) + 0.5).astype(np.float32))
        m = random_model(rng, [nf, 8, 2], fs=fs)
        eng = Engine(m, config=engine_cfg(isa, enabled=False))
        assert eng.feature_path == path
        raws = rng.standard_normal((10, 40)).astype(np.float32)
        ref = fs.apply(raws)
        for i in range(10):
            np.testing.assert_allclose(eng.features(raws[i]), ref[i], rtol=1e-5, atol=1e-6)
            eng.step(raws[i])


def test_stage_times_off_measures_only_the_total(isa):
    """[engine] stage_times = false: the same answers, the same counters; each tick's total_ns
    still measured, its stage fields -1 (not measured, unlike 0: a stage that did not run),
    the records' stage columns 0 and stats() reports only the total."""
    rng = np.random.default_rng(31)
    model = windowed_model(rng)
    raws = rng.standard_normal((300, model.raw_len)).astype(np.float32)
    raws[1::2] = raws[::2] + 1e-4       # every other tick a near repeat: hits and misses
    out = {}
    for on in (True, False):
        cfg = engine_cfg(isa, enabled=True, cos_threshold=0.999, norm_tol=0.05)
        cfg["engine"]["stage_times"] = on
        eng = Engine(model, config=cfg)
        assert eng.stage_times is on
        res = [eng.step(r, (i // 2) % 3, ts_ns=i + 1) for i, r in enumerate(raws)]
        out[on] = [(r.signal, r.confidence, r.cached, r.miss_reason) for r in res]
        lat = [r.latency for r in res]
        assert all(L.total_ns > 0 for L in lat)
        rec = eng.latency_records()
        assert (rec[:, 3] > 0).all()
        st = eng.stats()
        assert st["stage_times"] is on
        if on:
            assert all(L.feature_ns > 0 and L.cache_ns >= 0 and L.infer_ns >= 0 for L in lat)
            assert any(L.infer_ns == 0 for L in lat) and any(L.infer_ns > 0 for L in lat)
            assert {"feature", "cache", "infer", "total_hit", "total_miss"} <= set(st["latency_ns"])
        else:
            assert all(L.feature_ns == L.cache_ns == L.infer_ns == -1 for L in lat)
            assert (rec[:, :3] == 0).all()
            assert set(st["latency_ns"]) == {"total"}
    assert out[True] == out[False]
    assert any(c for _, _, c, _ in out[True]) and not all(c for _, _, c, _ in out[True])


@pytest.mark.parametrize("bad", ["no", 1, None])
def test_stage_times_must_be_a_bool(bad):
    with pytest.raises(ConfigError, match="engine.stage_times"):
        Engine(random_model(np.random.default_rng(0), [4, 2]),
               config={"engine": {"stage_times": bad}})
