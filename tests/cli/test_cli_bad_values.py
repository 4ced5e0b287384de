"""Bad values given to the commands, the config loader and the tuning functions are refused
with an error naming what was wrong (exit 2 from a command, a ConfigError, InputError or
ModelError in Python), never a traceback from inside a library or an error about a value the
caller never passed."""
import pytest


def test_a_toml_int_past_the_digit_limit_is_a_config_error_naming_the_file(tmp_path, capsys):
    """A TOML integer past Python's 4300-digit str -> int limit (a corrupt or fuzzed config)
    was a ValueError traceback from inside tomllib, not a ConfigError naming the file."""
    from fastpath.cli import main
    from fastpath.control.config import load_config, read_toml
    from fastpath.errors import ConfigError
    p = tmp_path / "big.toml"
    p.write_text("[engine]\nn_symbols = 1" + "0" * 5000 + "\n")
    for read in (read_toml, load_config):
        with pytest.raises(ConfigError, match=r"big\.toml is not valid TOML: .*integer") as ex:
            read(str(p))
        assert "at line 2 of more than 4300 digits" in str(ex.value)
    # every command that takes --config says it as bad input (exit 2), no traceback
    assert main(["doctor", "--config", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fastpath doctor: {p} is not valid TOML") and "Traceback" not in err


def test_serve_mode_of_a_huge_int_is_refused_by_its_size():
    """serve.mode given a huge int raised the same ValueError while its own ConfigError
    message was being written."""
    from fastpath.control.config import load_config
    from fastpath.errors import ConfigError
    with pytest.raises(ConfigError, match=r"serve\.mode must be file permissions in "
                                          r"\[0o400, 0o777\], got an int of about "
                                          r"10\*\*5000 \(= too large\)"):
        load_config({"serve": {"mode": 10 ** 5000}})
    with pytest.raises(ConfigError, match=r"got 600 \(= 0o1130\); permissions are octal"):
        load_config({"serve": {"mode": 600}})


# ------------------------------------------------------------------ fastpath.tuning arguments

def _ticks(n=64):
    from fastpath import lob
    return lob.raw_from_book(lob.generate_stream(n_ticks=n, n_symbols=1, seed=3))


@pytest.mark.parametrize("fn", ["calibrate", "weights_error", "fit_cache_policy",
                                "fit_head_scale"])
def test_tuning_refuses_a_model_path_naming_how_to_load_it(fn):
    """fastpath.tuning's functions take a Model. Given the model's path (as Engine and the
    command line take it), each failed with AttributeError: 'str' object has no attribute
    'kind' (or 'trees', 'raw_len', 'head_spec') from inside the function."""
    import fastpath.tuning as T
    from fastpath._build import DEMO_MODEL
    from fastpath.errors import ModelError
    raws = _ticks()
    call = {"calibrate": lambda m: T.calibrate(m, raws, range(112), range(112, 120)),
            "weights_error": lambda m: T.weights_error(m, raws, "int8"),
            "fit_cache_policy": lambda m: T.fit_cache_policy(m, raws),
            "fit_head_scale": lambda m: T.fit_head_scale(m, raws)}[fn]
    for bad in (DEMO_MODEL, None):
        with pytest.raises(ModelError, match=rf"{fn}: model must be a fastpath\.Model \(read a "
                                             rf"file with Model\.load or Model\.from_onnx\), "
                                             rf"got {type(bad).__name__}"):
            call(bad)


@pytest.mark.parametrize("kw", [{"quantile": "0.9"}, {"target": "2"}, {"quantile": None},
                                {"target": True}])
def test_fit_head_scale_refuses_a_quantile_or_target_that_is_not_a_number(kw):
    """fit_head_scale(target="2") was TypeError: '<' not supported between 'float' and 'str'."""
    import fastpath.tuning as T
    from fastpath._build import DEMO_MODEL
    from fastpath.errors import ModelError
    from fastpath.model import Model
    from fastpath.model.types import Head
    m = Model.load(DEMO_MODEL).with_head(Head("regression", outputs=(0,)))
    with pytest.raises(ModelError, match=r"quantile must be in \(0, 1\] and target a finite "
                                         r"number > 0"):
        T.fit_head_scale(m, _ticks(), **kw)


def test_fit_cache_policy_names_the_callers_symbol_when_time_goes_back(tmp_path, capsys):
    """The replay maps symbol ids to dense ones (5, 15 -> 0, 1), and the engine's refusal of a
    timestamp going backwards named the dense id: `fastpath calibrate --symbols` holding 5 and
    15 was told "earlier than the last tick of symbol 1, row 100 of this batch", a symbol its
    data does not have. Checked before the replay, in the caller's ids and rows."""
    import numpy as np
    from fastpath._build import DEMO_MODEL
    from fastpath.cli import main
    from fastpath.errors import InputError
    from fastpath.model import Model
    raws = _ticks(200)
    syms = np.where(np.arange(200) % 2 == 0, 5, 15).astype(np.int64)
    ts = np.arange(200, dtype=np.int64) * 1_000_000
    ts[101], ts[103] = ts[103], ts[101]          # symbol 15's ticks at rows 101, 103 swapped
    msg = r"ts_ns row 103 \(101000000\) is earlier than row 101 \(103000000\), the previous " \
          r"tick of symbol 15"
    with pytest.raises(InputError, match=msg):
        Model.load(DEMO_MODEL).fit_cache_policy(raws, syms, ts_ns=ts)
    for name, a in (("t", raws), ("s", syms), ("ts", ts)):
        np.save(tmp_path / f"{name}.npy", a)
    assert main(["calibrate", "--ticks", str(tmp_path / "t.npy"), "--symbols",
                 str(tmp_path / "s.npy"), "--ts", str(tmp_path / "ts.npy"), "--model", DEMO_MODEL,
                 "--out", str(tmp_path / "o.fpm"), "--max-error", "0.01"]) == 2
    assert "symbol 15" in capsys.readouterr().err
    # uint64 stamps past int64 are still the engine's to refuse (no wrapped comparison here)
    big = np.arange(200, dtype=np.uint64) + np.uint64(2 ** 63)
    with pytest.raises(InputError, match="does not fit a signed 64-bit"):
        Model.load(DEMO_MODEL).fit_cache_policy(raws, syms, ts_ns=big)


def test_model_load_of_a_file_named_onnx_says_from_onnx(tmp_path):
    # Model.load reads bundles only; an ONNX file already named .onnx was told "name it .onnx
    # or read it with Model.from_onnx": the first half is the name it has
    import os
    import fastpath
    from fastpath._build import DEMO_MODEL
    from fastpath.errors import ModelError
    pytest.importorskip("onnx")
    fastpath.Model.load(DEMO_MODEL).to_onnx(tmp_path / "m.onnx")
    with pytest.raises(ModelError) as ei:
        fastpath.Model.load(tmp_path / "m.onnx")
    msg = str(ei.value)
    assert "it is named .onnx: read it with Model.from_onnx" in msg, msg
    assert "name it .onnx" not in msg, msg
    # bytes paths too (os.fsdecode), and the other name keeps its hint
    with pytest.raises(ModelError, match="it is named .onnx"):
        fastpath.Model.load(os.fsencode(tmp_path / "m.onnx"))
    (tmp_path / "m.onnx").rename(tmp_path / "m.bin")
    with pytest.raises(ModelError, match=r"it looks like an ONNX file: name it \.onnx"):
        fastpath.Model.load(tmp_path / "m.bin")


def test_feature_spec_fit_refuses_negative_symbols():
    # FeatureSpec.fit (and tuning.calibrate through it) took symbol ids < 0, which
    # fit_cache_policy and the command line refuse and no engine can step
    import numpy as np
    from fastpath.errors import InputError
    from fastpath.model.types import FeatureSpec
    r = np.random.default_rng(0).normal(size=(100, 8)).astype(np.float32)
    sy = np.r_[np.zeros(50), np.full(50, -1)].astype(np.int64)
    with pytest.raises(InputError, match=r"symbols must be >= 0 .* got -1 at row 50"):
        FeatureSpec.fit(r, [0, 1], [2], 4, symbols=sy)
    fs = FeatureSpec.fit(r, [0, 1], [2], 4, symbols=np.abs(sy))
    assert fs.w_idx.tolist() == [2]


def test_fit_cache_policy_names_a_negative_stamp_not_a_backward_one():
    # the caller-terms order check read a -1 after stamps as "ts_ns row 150 (-1) is earlier
    # than row 148 (148)": the stamp's sign is what is wrong, as the engine says it
    import numpy as np
    from fastpath import lob
    from fastpath._build import DEMO_MODEL
    from fastpath.errors import InputError
    from fastpath.model import Model
    raws = lob.raw_from_book(lob.generate_stream(n_ticks=200, n_symbols=1, seed=3))
    m = Model.load(DEMO_MODEL)
    syms = np.where(np.arange(200) % 2 == 0, 5, 15).astype(np.int64)
    ts = np.r_[np.arange(150, dtype=np.int64), -np.ones(50, np.int64)]
    with pytest.raises(InputError, match=r"^ts_ns must be >= 0, row 150 is -1$"):
        m.fit_cache_policy(raws, syms, ts_ns=ts)
    ts = np.r_[np.arange(199, dtype=np.int64) * 10, -5]
    with pytest.raises(InputError, match=r"^ts_ns must be >= 0, row 199 is -5$"):
        m.fit_cache_policy(raws, syms, ts_ns=ts)
    # a stamp going backwards is still named in the caller's rows and symbols
    ts = np.arange(200, dtype=np.int64) * 10
    ts[101] = 5
    with pytest.raises(InputError, match=r"ts_ns row 101 \(5\) is earlier than row 99 .*symbol 15"):
        m.fit_cache_policy(raws, syms, ts_ns=ts)
