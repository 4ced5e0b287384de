"""Bad input gets a clear error and leaves the engine exactly as it was."""
import numpy as np
import pytest

import fastpath
from fastpath import ConfigError, Engine, InputError, Model, ModelError
from fastpath.model import CachePolicy, FeatureSpec, Layer
from helpers.builders import engine_cfg, windowed_model
from helpers.engine_state import assert_same_state, good, pair  # noqa: F401


BAD_RAWS = {
    "float64": lambda n: np.zeros(n, np.float64),
    "float16": lambda n: np.zeros(n, np.float16),
    "int32": lambda n: np.zeros(n, np.int32),
    "short": lambda n: np.zeros(n - 1, np.float32),
    "long": lambda n: np.zeros(n + 1, np.float32),
    "empty": lambda n: np.zeros(0, np.float32),
    "2d": lambda n: np.zeros((1, n), np.float32),
    "0d": lambda n: np.float32(0),
    "strided": lambda n: np.zeros(2 * n, np.float32)[::2],
    "byteswapped": lambda n: np.zeros(n, ">f4"),
    "unaligned": lambda n: np.frombuffer(b"\0" * (4 * n + 1), np.float32, n, offset=1),
    "list": lambda n: [0.0] * n,
    "none": lambda n: None,
    "bytes": lambda n: b"\0" * (4 * n),
    "string": lambda n: "tick",
}


@pytest.mark.parametrize("kind", sorted(BAD_RAWS))
def test_bad_raw_rejected(pair, kind):
    a, b, rng = pair
    raw = BAD_RAWS[kind](a.raw_len)
    with pytest.raises(InputError, match=f"raw must be a float32 C-contiguous numpy array with "
                                         f"{a.raw_len} values, got"):
        a.step(raw, 0, ts_ns=100)
    assert_same_state(a, b, rng)


def test_readonly_raw_is_accepted(pair):
    a, b, rng = pair
    x = good(a)
    x.flags.writeable = False
    a.step(x, 0, ts_ns=100)
    b.step(good(b), 0, ts_ns=100)
    assert_same_state(a, b, rng)


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("pos", [0, 17, -1])
def test_nonfinite_rejected(pair, value, pos):
    a, b, rng = pair
    x = good(a)
    x[pos] = value
    idx = pos % a.raw_len
    with pytest.raises(InputError, match=rf"non-finite value\(s\), first at index {idx}"):
        a.step(x, 1, ts_ns=100)
    assert_same_state(a, b, rng)


@pytest.mark.parametrize("symbol", [-1, 16, 10**6, 2**40])
def test_symbol_out_of_range(pair, symbol):
    a, b, rng = pair
    with pytest.raises(InputError, match="out of range: this engine has 16 symbols"):
        a.step(good(a), symbol, ts_ns=100)
    assert_same_state(a, b, rng)


@pytest.mark.parametrize("symbol", [1.5, "3", None, True, np.float64(2.0), np.float32(1),
                                    np.bool_(True), 1 + 0j, [1], np.array([1])])
def test_symbol_wrong_type(pair, symbol):
    a, b, rng = pair
    with pytest.raises(InputError, match=r"symbol must be an integer in 0\.\.15, got"):
        a.step(good(a), symbol)
    with pytest.raises(InputError, match=r"symbol must be an integer"):
        a.features(good(a), symbol)
    assert_same_state(a, b, rng)


@pytest.mark.parametrize("symbol", [2**80, -2**80, np.uint64(2**64 - 1), np.int64(-1), 16])
def test_huge_symbol_is_out_of_range(pair, symbol):
    a, b, rng = pair
    with pytest.raises(InputError, match=f"symbol {int(symbol)} out of range"):
        a.step(good(a), symbol)
    assert_same_state(a, b, rng)


@pytest.mark.parametrize("symbol", [np.int8(2), np.int32(2), np.int64(2), np.uint16(2)])
def test_numpy_integer_symbol_is_the_same_symbol(pair, symbol):
    a, b, rng = pair
    x = rng.standard_normal(a.raw_len).astype(np.float32)
    ra, rb = a.step(x, symbol, ts_ns=500), b.step(x, 2, ts_ns=500)
    assert (ra.signal, ra.cached) == (rb.signal, rb.cached)
    assert_same_state(a, b, rng)


def test_time_backwards(pair):
    a, b, rng = pair
    with pytest.raises(InputError, match="earlier than the last tick of symbol 0"):
        a.step(good(a), 0, ts_ns=5)        # symbol 0 last saw ts 27
    with pytest.raises(InputError, match="ts_ns must be >= 0"):
        a.step(good(a), 0, ts_ns=-1)
    with pytest.raises(InputError, match="ts_ns must be an int >= 0"):
        a.step(good(a), 0, ts_ns="now")
    assert_same_state(a, b, rng)


def test_huge_values_make_no_nan():
    """Finite but enormous raw values: either a finite saturated answer or a clean error."""
    rng = np.random.default_rng(0)
    m = windowed_model(rng)
    eng = Engine(m, config=engine_cfg("scalar"))
    x = np.full(m.raw_len, np.finfo(np.float32).max, np.float32)
    x[::2] *= -1
    try:
        r = eng.step(x, 0, ts_ns=0)
        assert np.isfinite(r.signal) and np.isfinite(r.confidence)
    except InputError as exc:
        assert "not applied" in str(exc)


# -------------------------------------------------------------------- step_batch
def test_batch_bad_row_applies_nothing(pair):
    a, b, rng = pair
    raws = rng.standard_normal((10, a.raw_len)).astype(np.float32)
    raws[7, 3] = np.nan
    with pytest.raises(InputError, match="row 7: raw contains 1 non-finite.*no row was applied"):
        a.step_batch(raws, np.zeros(10, np.int64), np.arange(10) + 100)
    assert_same_state(a, b, rng)


def test_batch_bad_symbol_and_ts(pair):
    a, b, rng = pair
    raws = rng.standard_normal((4, a.raw_len)).astype(np.float32)
    with pytest.raises(InputError, match="row 2: symbol 99 out of range"):
        a.step_batch(raws, [0, 1, 99, 2], None)
    with pytest.raises(InputError, match="row 3: ts_ns 150 is earlier"):
        a.step_batch(raws, [0, 1, 0, 0], [100, 100, 200, 150])
    with pytest.raises(InputError, match="must be >= 0"):
        a.step_batch(raws, [0, 1, 0, 0], [100, -100, 200, 150])
    assert_same_state(a, b, rng)


@pytest.mark.parametrize("bad", ["f64", "1d", "cols", "fortran", "list"])
def test_batch_bad_raws(pair, bad):
    a, b, rng = pair
    R = a.raw_len
    raws = {"f64": np.zeros((3, R)), "1d": np.zeros(R, np.float32),
            "cols": np.zeros((3, R + 1), np.float32),
            "fortran": np.asfortranarray(np.zeros((3, R), np.float32)),
            "list": [[0.0] * R] * 3}[bad]
    with pytest.raises(InputError, match=rf"raws must be a float32 C-contiguous numpy array of "
                                         rf"shape \(n, {R}\)"):
        a.step_batch(raws, [0, 0, 0])
    assert_same_state(a, b, rng)


@pytest.mark.parametrize("symbols", [[0, 1], [[0, 1, 2]], [0.5, 1, 2], ["a", "b", "c"]])
def test_batch_bad_symbols(pair, symbols):
    a, b, rng = pair
    with pytest.raises(InputError, match="symbols must be an integer array of shape"):
        a.step_batch(np.zeros((3, a.raw_len), np.float32), symbols)
    assert_same_state(a, b, rng)


def test_batch_empty(pair):
    a, b, rng = pair
    res = a.step_batch(np.zeros((0, a.raw_len), np.float32), np.zeros(0, np.int32))
    assert len(res.signal) == 0
    assert_same_state(a, b, rng)


# ------------------------------------------------------------------ model files
@pytest.fixture
def bundle(tmp_path):
    rng = np.random.default_rng(5)
    m = windowed_model(rng)
    p = tmp_path / "m.fpm"
    m.save(p)
    return m, p


def test_bundle_roundtrip(bundle, isa):
    m, p = bundle
    m2 = Model.load(p)
    assert m2.dims == m.dims and m2.cache_policy == m.cache_policy
    for l1, l2 in zip(m.layers, m2.layers):
        np.testing.assert_array_equal(l1.weight, l2.weight)
        assert l1.activation == l2.activation
    np.testing.assert_array_equal(m.feature_spec.z_idx, m2.feature_spec.z_idx)
    x = np.random.default_rng(0).standard_normal(m.raw_len).astype(np.float32)
    assert Engine(m, config=engine_cfg(isa)).step(x).signal == \
        Engine(str(p), config=engine_cfg(isa)).step(x).signal


@pytest.mark.parametrize("cut", [0, 4, 8, 20, 100, -13, -1])
def test_truncated_bundle(bundle, cut):
    m, p = bundle
    data = p.read_bytes()
    p.write_bytes(data[:cut] if cut else b"")
    with pytest.raises(ModelError):
        Model.load(p)


@pytest.mark.parametrize("where", [9, 40, 300, 2000, -20])
def test_corrupt_bundle(bundle, where):
    m, p = bundle
    data = bytearray(p.read_bytes())
    data[where] ^= 0x5A
    p.write_bytes(bytes(data))
    with pytest.raises(ModelError):
        Model.load(p)


def test_bundle_errors_are_specific(bundle, tmp_path):
    m, p = bundle
    with pytest.raises(ModelError, match="cannot read model file"):
        Model.load(tmp_path / "nope.fpm")
    (tmp_path / "x.fpm").write_bytes(b"PK\x03\x04" + b"\0" * 64)
    with pytest.raises(ModelError, match="not a fastpath model bundle"):
        Model.load(tmp_path / "x.fpm")
    data = p.read_bytes()
    (tmp_path / "t.fpm").write_bytes(data[:-30])
    with pytest.raises(ModelError, match="truncated"):
        Model.load(tmp_path / "t.fpm")
    b = bytearray(data)
    b[len(b) // 2] ^= 1
    (tmp_path / "c.fpm").write_bytes(bytes(b))
    with pytest.raises(ModelError, match="CRC32 mismatch"):
        Model.load(tmp_path / "c.fpm")


def test_model_validation_errors():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    with pytest.raises(ModelError, match="bias has 3 values but weight has 4 rows"):
        Layer(w, np.zeros(3), "relu")
    with pytest.raises(ModelError, match="activation 'gelu' not supported"):
        Layer(w, np.zeros(4), "gelu")
    bad = w.copy()
    bad[1, 2] = np.nan
    with pytest.raises(ModelError, match=r"NaN/Inf \(first at index \(1, 2\)\)"):
        Layer(bad, np.zeros(4))
    with pytest.raises(ModelError, match="layer 1 takes 5 inputs but layer 0 gives 4"):
        Model((Layer(w, np.zeros(4)), Layer(np.zeros((2, 5)), np.zeros(2))))
    with pytest.raises(ModelError, match="last layer must have 2 outputs"):
        Model((Layer(w, np.zeros(4)),))
    with pytest.raises(ModelError, match="feature spec makes 3 features but the first layer takes 5"):
        Model((Layer(np.zeros((2, 5)), np.zeros(2)),), FeatureSpec.identity(3))
    with pytest.raises(ModelError, match="needs 1..16 layers"):
        Model(())
    with pytest.raises(ModelError, match="indexes outside raw"):
        FeatureSpec(4, [0, 4], [], 1, np.zeros(2), np.ones(2))
    with pytest.raises(ModelError, match="mean/inv_std need 4 values"):
        FeatureSpec(4, [0, 1], [2], 3, np.zeros(3), np.ones(3))
    with pytest.raises(ModelError, match="window must be an int"):
        FeatureSpec(4, [0, 1], [2], 0, np.zeros(4), np.ones(4))
    with pytest.raises(ModelError, match="must be a fastpath.Model or a path"):
        Engine(42)


# ----------------------------------------------------------------------- config
CONFIG_CASES = [
    ({"engine": {"n_symbols": 0}}, "engine.n_symbols"),
    ({"engine": {"n_symbols": -5}}, "engine.n_symbols"),
    ({"engine": {"n_symbols": 1 << 30}}, "engine.n_symbols"),
    ({"engine": {"n_symbols": "4096"}}, "engine.n_symbols"),
    ({"engine": {"n_symbols": 4.0}}, "engine.n_symbols"),
    ({"engine": {"n_symbols": True}}, "engine.n_symbols"),
    ({"engine": {"simd": "avx1024"}}, "engine.simd"),
    ({"engine": {"simd": 1}}, "engine.simd"),
    ({"engine": {"backend": "tpu"}}, "engine.backend"),
    ({"engine": {"latency_records": 1000}}, "engine.latency_records"),
    ({"engine": {"latency_records": 0}}, "engine.latency_records"),
    ({"engine": {"nsymbols": 5}}, "engine.nsymbols"),
    ({"cache": {"cos_threshold": 1.5}}, "cache.cos_threshold"),
    ({"cache": {"cos_threshold": float("nan")}}, "cache.cos_threshold"),
    ({"cache": {"cos_threshold": "high"}}, "cache.cos_threshold"),
    ({"cache": {"norm_tol": -0.1}}, "cache.norm_tol"),
    ({"cache": {"max_age_ns": -1}}, "cache.max_age_ns"),
    ({"cache": {"max_age_ns": 1.5}}, "cache.max_age_ns"),
    ({"cache": {"max_run": -2}}, "cache.max_run"),
    ({"cache": {"max_run": 2**33}}, "cache.max_run"),
    ({"cache": {"enabled": 1}}, "cache.enabled"),
    ({"cache": {"enabled": "yes"}}, "cache.enabled"),
    ({"cache": {"threshold": 0.9}}, "cache.threshold"),
    ({"caches": {}}, "caches"),
    ({"engine": 5}, "engine"),
]


@pytest.mark.parametrize("cfg,key", CONFIG_CASES)
def test_config_errors_name_the_key(cfg, key):
    m = windowed_model(np.random.default_rng(0))
    with pytest.raises(ConfigError) as exc:
        Engine(m, config=cfg)
    assert key in str(exc.value)


def test_config_toml_errors(tmp_path):
    m = windowed_model(np.random.default_rng(0))
    p = tmp_path / "c.toml"
    p.write_text("[cache]\nmax_run = \"lots\"\n")
    with pytest.raises(ConfigError, match=r"c.toml: cache.max_run must be int, got str"):
        Engine(m, config=str(p))
    p.write_text("[cache\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        Engine(m, config=str(p))
    with pytest.raises(ConfigError, match="cannot read config file"):
        Engine(m, config=str(tmp_path / "none.toml"))
    with pytest.raises(ConfigError, match="config must be None, a dict"):
        Engine(m, config=42)


def test_bad_env_simd(monkeypatch):
    monkeypatch.setenv("FASTPATH_SIMD", "sse2")
    with pytest.raises(ConfigError, match="FASTPATH_SIMD must be one of"):
        fastpath.simd()


def test_gpu_backend_without_gpu_is_clear():
    m = windowed_model(np.random.default_rng(0))
    with pytest.raises(fastpath.BackendError, match="backend='gpu' is not available"):
        Engine(m, backend="gpu")
    eng = Engine(m, backend="auto")
    assert eng.backend == "cpu" and eng.backend_reason.startswith("auto: cpu chosen")
    with pytest.raises(ConfigError, match="backend must be"):
        Engine(m, backend="fpga")


def test_example_config_loads():
    import os
    from fastpath.control.config import load_config
    from fastpath._build import EXAMPLE_CONFIG as p
    assert os.path.exists(p)          # shipped inside the installed package
    cfg = load_config(p)
    assert cfg.n_symbols == 4096 and cfg.cache.overrides() == {}
    eng = Engine(windowed_model(np.random.default_rng(0)), config=p)
    assert eng.n_symbols == 4096


def test_batch_after_replay_timestamps_refuses_engine_clock(pair):
    """Ticks stamped in the far future (a replay), then a batch on the engine clock: refused
    before any row is applied, naming the first row of that symbol."""
    a, b, rng = pair
    raws = rng.standard_normal((4, a.raw_len)).astype(np.float32)
    a.step(raws[0], 5, ts_ns=2**62)
    b.step(raws[0], 5, ts_ns=2**62)
    with pytest.raises(InputError, match="row 3: the engine clock .* earlier than the last tick of symbol 5"
                                         ".*no row was applied"):
        a.step_batch(raws, [0, 1, 0, 5])
    assert_same_state(a, b, rng)


def test_nonfinite_anywhere_in_a_demo_tick(isa):
    """The demo model reads 120 of a tick's 256 values; a NaN or +-Inf in any of the 256 is
    refused all the same, with its index, and changes nothing. On AVX-512 the check rides on
    the z-score permute plan's loads, and raw[96:128], which no feature reads, gets loads of
    its own for it: a plan without them would let a NaN there through."""
    from fastpath._build import DEMO_MODEL
    m = Model.load(DEMO_MODEL)
    a, b = Engine(m, config=engine_cfg(isa)), Engine(m, config=engine_cfg(isa))
    rng = np.random.default_rng(5)
    ticks = rng.standard_normal((40, m.raw_len)).astype(np.float32)
    for i, x in enumerate(ticks[:20]):
        a.step(x, i % 4, ts_ns=i)
        b.step(x, i % 4, ts_ns=i)
    for pos in range(m.raw_len):
        x = ticks[20 + pos % 20].copy()
        x[pos] = (np.nan, np.inf, -np.inf)[pos % 3]
        with pytest.raises(InputError, match=rf"non-finite value\(s\), first at index {pos}\b"):
            a.step(x, pos % 4, ts_ns=100)
    assert a.stats()["ticks"] == b.stats()["ticks"] == 20
    for i, x in enumerate(ticks[20:]):
        ra, rb = a.step(x, i % 4, ts_ns=200 + i), b.step(x, i % 4, ts_ns=200 + i)
        assert (ra.signal, ra.confidence, ra.cached) == (rb.signal, rb.confidence, rb.cached)
