"""Bad input gets a clear error and leaves the engine exactly as it was."""
import numpy as np
import pytest

import fastpath
from fastpath import ConfigError, Engine, InputError, Model
from helpers.builders import engine_cfg, windowed_model
from helpers.engine_state import assert_same_state, good, pair  # noqa: F401 - pair is a fixture


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
def test_raw_of_a_wrong_dtype_or_shape_is_refused(pair, kind):
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
def test_nonfinite_raw_is_refused(pair, value, pos):
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


def test_a_timestamp_backwards_negative_or_not_an_int_is_refused(pair):
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


def test_batch_of_no_rows_applies_nothing(pair):
    a, b, rng = pair
    res = a.step_batch(np.zeros((0, a.raw_len), np.float32), np.zeros(0, np.int32))
    assert len(res.signal) == 0
    assert_same_state(a, b, rng)


def test_bad_env_simd(monkeypatch):
    monkeypatch.setenv("FASTPATH_SIMD", "sse2")
    with pytest.raises(ConfigError, match="FASTPATH_SIMD must be one of"):
        fastpath.simd()


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
