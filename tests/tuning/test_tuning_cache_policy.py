"""The cache is off unless a policy was fitted (or the config turns it on explicitly): imported
and calibrated models do not cache, the shadow-replay fit keeps every hit within its budget
and says what it found, and the bundle and the example config keep a fitted policy intact."""
import json
import struct
import zlib

import numpy as np
import pytest

import fastpath
from fastpath import Engine, Model
from fastpath._build import DEMO_MODEL, EXAMPLE_CONFIG
from fastpath.model import CachePolicy
from fastpath.tuning import calibrate, fit_cache_policy
from helpers.builders import engine_cfg, random_model, strip_fastpath_record
from helpers.cli_child import run_cli


def _walk(rng, n=3000, n_sym=4, width=8, step=0.01, jump=0.02):
    """Per-symbol random walks: mostly small steps (near-repeats the cache can hit), some
    jumps (which it must not)."""
    sy = rng.integers(0, n_sym, n).astype(np.int32)
    x = np.zeros((n, width), np.float32)
    cur = rng.standard_normal((n_sym, width))
    for t in range(n):
        s = sy[t]
        big = rng.random() < jump
        cur[s] += rng.standard_normal(width) * (1.0 if big else step)
        x[t] = cur[s]
    return x, sy, np.arange(n, dtype=np.int64) * 100_000


def test_cache_policy_default_is_off():
    assert CachePolicy().enabled is False and CachePolicy().fitted_max_error is None
    m = random_model(np.random.default_rng(0), [4, 2], policy=CachePolicy())
    assert Engine(m).config.cache_origin == "off (not fitted)"


def test_onnx_import_runs_with_the_cache_off(tmp_path, isa):
    pytest.importorskip("onnx")
    rng = np.random.default_rng(1)
    random_model(rng, [6, 8, 2]).to_onnx(tmp_path / "m.onnx")
    # a file from another exporter: to_onnx's fastpath record (which carries the model's
    # enabled policy) taken out
    strip_fastpath_record(tmp_path / "m.onnx")
    m = Model.from_onnx(tmp_path / "m.onnx")
    assert not m.cache_policy.enabled and m.cache_policy.fitted_max_error is None
    # the same tick again and again, microseconds apart: any enabled policy would hit
    raws = np.repeat(rng.standard_normal((1, 6)).astype(np.float32), 50, axis=0)
    for eng in (Engine(m, config=engine_cfg(isa)), Engine(str(tmp_path / "m.onnx"),
                                                         config=engine_cfg(isa))):
        assert eng.config.cache_origin == "off (not fitted)"
        res = eng.step_batch(raws, np.zeros(50, np.int32), np.arange(50, dtype=np.int64) * 1000)
        assert not res.cached.any()
        assert not any(eng.step(raws[0], 1, ts_ns=10**6 + i).cached for i in range(5))


def test_fit_keeps_every_hit_within_the_budget(isa):
    rng = np.random.default_rng(2)
    m = random_model(rng, [8, 32, 2], policy=CachePolicy())
    raws, sy, ts = _walk(rng)
    budget = 0.01
    fitted, rep = m.fit_cache_policy(raws, sy, max_error=budget, ts_ns=ts, simd=isa)
    pol = fitted.cache_policy
    assert rep.chosen is not None and pol.enabled and pol.fitted_max_error == budget
    assert any(not r["within_budget"] for r in rep.rows)       # the budget did bite
    assert rep.chosen["hit_rate"] == max(r["hit_rate"] for r in rep.rows if r["within_budget"])
    # replay the fitted model beside a cache-less one: every hit is within the budget
    cfg = engine_cfg(isa)
    on = Engine(fitted, config=cfg).step_batch(raws, sy, ts)
    off = Engine(fitted, config={**cfg, "cache": {"enabled": False}}).step_batch(raws, sy, ts)
    assert on.cached.sum() == rep.chosen["hits"] > 0
    err = np.abs(on.signal[on.cached].astype(np.float64) - off.signal[on.cached])
    assert err.max() <= budget
    assert float(err.max()) == pytest.approx(rep.chosen["max_error"], abs=1e-7)
    assert fitted.meta["cache_policy_fit"]["chosen"]["hits"] == rep.chosen["hits"]
    assert "<- chosen" in rep.table() and "over budget" in rep.table()


def test_fit_reports_sign_flips(isa):
    """Signals near zero: loose policies return hits of the opposite sign. They are counted
    per candidate, and max_sign_flips=0 picks only a policy without any."""
    rng = np.random.default_rng(2)
    m = random_model(rng, [8, 32, 2], scale=0.3, policy=CachePolicy())
    raws, sy, ts = _walk(rng)
    grid = {"cos_grid": (0.999, 0.9999, 0.999999), "norm_grid": (0.02, 0.001)}
    pol, rep = fit_cache_policy(m, raws, sy, max_error=2.0, ts_ns=ts, simd=isa, **grid)
    loose = rep.rows[0]
    assert loose["cos_threshold"] == 0.999 and loose["sign_flips"] > 0
    # the count is what a replay with that policy shows
    cand = m.with_cache_policy(CachePolicy(True, loose["cos_threshold"], loose["norm_tol"]))
    on = Engine(cand, config=engine_cfg(isa)).step_batch(raws, sy, ts)
    off = Engine(m, config=engine_cfg(isa)).step_batch(raws, sy, ts)
    h = on.cached
    assert loose["sign_flips"] == int((np.sign(on.signal[h]) != np.sign(off.signal[h])).sum())
    pol0, rep0 = fit_cache_policy(m, raws, sy, max_error=2.0, ts_ns=ts, max_sign_flips=0,
                                  simd=isa, **grid)
    assert all(r["within_budget"] == (r["sign_flips"] == 0) for r in rep0.rows)
    assert rep0.chosen is None or rep0.chosen["sign_flips"] == 0


def test_fit_with_nothing_within_budget_leaves_the_cache_off(isa):
    rng = np.random.default_rng(4)
    m = random_model(rng, [8, 32, 2])                         # enabled, not fitted
    raws, sy, ts = _walk(rng)
    out, rep = m.fit_cache_policy(raws, sy, max_error=1e-6, ts_ns=ts, simd=isa,
                                  norm_grid=(0.02, 0.001))
    assert rep.chosen is None and "stays off" in rep.note and "stays off" in rep.table()
    assert not out.cache_policy.enabled and out.cache_policy.fitted_max_error is None
    assert Engine(out).config.cache_origin == "off (not fitted)"


def test_fit_without_timestamps_says_how_ticks_were_spaced():
    rng = np.random.default_rng(5)
    m = random_model(rng, [8, 2])
    raws, sy, _ = _walk(rng, n=500)
    _, rep = fit_cache_policy(m, raws, sy, max_error=0.01, cos_grid=(0.999,), norm_grid=(0.02,))
    assert "no timestamps" in rep.timestamps and "1000000 ns apart" in rep.table()
    with pytest.raises(fastpath.InputError, match="shape"):
        fit_cache_policy(m, raws[:, :4], sy)
    with pytest.raises(fastpath.ModelError, match="max_error"):
        fit_cache_policy(m, raws, sy, max_error=0)


def test_fitted_policy_round_trips_the_bundle(tmp_path):
    rng = np.random.default_rng(6)
    m = random_model(rng, [8, 16, 2], policy=CachePolicy())
    raws, sy, ts = _walk(rng, n=1500)
    fitted, rep = m.fit_cache_policy(raws, sy, max_error=0.02, ts_ns=ts)
    fitted.save(tmp_path / "f.fpm")
    back = Model.load(tmp_path / "f.fpm")
    assert back.cache_policy == fitted.cache_policy and back.cache_policy.fitted_max_error == 0.02
    assert back.meta["cache_policy_fit"] == json.loads(json.dumps(rep.summary()))
    assert Engine(back).config.cache_origin == "fitted (max error 0.02)"


def test_calibrate_turns_a_fitted_policy_off():
    """A policy fitted to the old features says nothing about the recalibrated ones."""
    rng = np.random.default_rng(7)
    base = random_model(rng, [8, 2], policy=CachePolicy(True, 0.9999, 0.01, fitted_max_error=0.01))
    out = calibrate(base, rng.standard_normal((100, 8)), range(8))
    assert not out.cache_policy.enabled and out.cache_policy.fitted_max_error is None
    assert Engine(out).config.cache_origin == "off (not fitted)"


def test_calibrate_cli_cache_off_unless_fitted(tmp_path):
    rng = np.random.default_rng(8)
    # each tick three times in a row: repeats the cache can serve at no error
    raws = np.repeat((rng.standard_normal((200, 20)) * 4 + 3).astype(np.float32), 3, axis=0)
    np.save(tmp_path / "t.npy", raws)
    np.save(tmp_path / "ts.npy", np.arange(len(raws), dtype=np.int64) * 1000)
    random_model(rng, [14, 8, 2]).save(tmp_path / "m.fpm")      # cache enabled, not fitted
    common = ("calibrate", "--ticks", str(tmp_path / "t.npy"), "--model", str(tmp_path / "m.fpm"),
              "--z-fields", "0-13", "--window-fields", "none")
    out = run_cli(*common, "--out", str(tmp_path / "off.fpm"))
    assert out.returncode == 0, out.stderr
    assert "cache: off" in out.stdout and "--max-error" in out.stdout
    assert not Model.load(tmp_path / "off.fpm").cache_policy.enabled

    out = run_cli(*common, "--out", str(tmp_path / "on.fpm"), "--max-error", "0.01",
               "--ts", str(tmp_path / "ts.npy"))
    assert out.returncode == 0, out.stderr
    assert "<- chosen" in out.stdout and "fitted to max error 0.01" in out.stdout
    m = Model.load(tmp_path / "on.fpm")
    assert m.cache_policy.enabled and m.cache_policy.fitted_max_error == 0.01
    assert m.meta["cache_policy_fit"]["chosen"]["hits"] > 0

    out = run_cli(*common, "--out", str(tmp_path / "nots.fpm"), "--max-error", "0.01")
    assert out.returncode == 0, out.stderr
    assert "1 ms apart" in out.stdout and Model.load(tmp_path / "nots.fpm").cache_policy.enabled
    bad = run_cli(*common, "--out", str(tmp_path / "x.fpm"), "--max-error", "5")
    assert bad.returncode == 2 and "max_error must be" in bad.stderr


def test_demo_bundle_records_its_fit():
    p = Model.load(DEMO_MODEL).cache_policy
    assert p.enabled and p.cos_threshold == 0.999999 and p.norm_tol == 0.02
    assert p.fitted_max_error == 0.005
    assert Engine(DEMO_MODEL).config.cache_origin == "fitted (max error 0.005)"


def test_example_config_keeps_the_bundles_policy():
    demo = Model.load(DEMO_MODEL)
    eng = Engine(DEMO_MODEL, config=EXAMPLE_CONFIG)
    assert eng.config.cache == demo.cache_policy
    assert eng.config.cache_origin == "fitted (max error 0.005)"
    # and over a model that was never fitted, the example leaves the cache off
    m = random_model(np.random.default_rng(9), [4, 2], policy=CachePolicy())
    assert not Engine(m, config=EXAMPLE_CONFIG).config.cache.enabled


def test_config_turns_the_cache_on_explicitly():
    m = random_model(np.random.default_rng(10), [4, 2], policy=CachePolicy())
    eng = Engine(m, config={"cache": {"enabled": True}})
    assert eng.config.cache.enabled and eng.config.cache_origin == "config"
    # changing a guard of a fitted policy: the fit no longer vouches for it
    fitted = m.with_cache_policy(CachePolicy(True, 0.9999, 0.01, fitted_max_error=0.01))
    eng = Engine(fitted, config={"cache": {"cos_threshold": 0.999}})
    assert eng.config.cache.fitted_max_error is None and eng.config.cache_origin == "config"
    eng = Engine(fitted, config={"cache": {"enabled": False}})
    assert eng.config.cache_origin == "off (config)"
    assert Engine(fitted, config={"cache": {"enabled": True, "cos_threshold": 0.9999}}
                  ).config.cache_origin == "fitted (max error 0.01)"
    assert Engine(random_model(np.random.default_rng(11), [4, 2])).config.cache_origin == \
        "model (set explicitly, not fitted)"


def _as_v1_without_fit_keys(blob: bytes, meta=None) -> bytes:
    """The bundle as fastpath wrote it before fits were recorded: same version, the header's
    cache_policy without fitted_max_error."""
    hlen = struct.unpack("<I", blob[12:16])[0]
    header = json.loads(blob[16:16 + hlen])
    start = 16 + hlen + (-(16 + hlen)) % 64
    payload = blob[start:-12]
    del header["cache_policy"]["fitted_max_error"]
    if meta is not None:
        header["meta"] = meta
    hb = json.dumps(header, sort_keys=True).encode()
    body = blob[:8] + struct.pack("<II", 1, len(hb)) + hb
    body += b"\0" * ((-len(body)) % 64) + payload
    return body + struct.pack("<I", zlib.crc32(body)) + b"FPEND\x00\x00\x00"


def test_v1_bundles_without_fit_keys_still_load(tmp_path):
    demo_blob = open(DEMO_MODEL, "rb").read()
    old_fit = {"max_error": 0.01, "margin": 0.5, "on": "generate_stream(60000, 8, seed=8)",
               "chosen": {"cos_threshold": 0.999999, "norm_tol": 0.02, "hit_rate": 0.0028}}
    old_demo = Model.from_bytes(_as_v1_without_fit_keys(demo_blob, {"cache_policy_fit": old_fit}))
    new_demo = Model.load(DEMO_MODEL)
    assert old_demo.cache_policy == new_demo.cache_policy            # fitted 0.005, on
    for a, b in zip(old_demo.layers, new_demo.layers):
        np.testing.assert_array_equal(a.weight, b.weight)
    # an old bundle whose enabled policy was the unfitted default loads with the cache off
    m = random_model(np.random.default_rng(12), [6, 4, 2])
    old = Model.from_bytes(_as_v1_without_fit_keys(m.to_bytes()))
    assert not old.cache_policy.enabled and old.cache_policy.cos_threshold == 0.999
    np.testing.assert_array_equal(old.layers[0].weight, m.layers[0].weight)
