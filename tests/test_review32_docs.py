"""Session 32: the README read against the code, bad input fed to every command and config
key. A TOML file holding an integer literal past Python's 4300-digit str -> int limit (a
corrupt or fuzzed config) was a ValueError traceback from inside tomllib, not a ConfigError
naming the file; serve.mode given such an int raised the same ValueError while its own
ConfigError message was being written."""
import pytest


def test_a_toml_int_past_the_digit_limit_is_a_config_error_naming_the_file(tmp_path, capsys):
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
    import numpy as np
    from fastpath import lob
    return lob.raw_from_book(lob.generate_stream(n_ticks=n, n_symbols=1, seed=3))


@pytest.mark.parametrize("fn", ["calibrate", "weights_error", "fit_cache_policy",
                                "fit_head_scale"])
def test_tuning_refuses_a_model_path_naming_how_to_load_it(fn):
    """README: `fastpath.tuning.calibrate(..., features="raw")`, `weights_error(model, ticks,
    "int8", symbols)`. Given the model's path (as Engine and the command line take it), each
    failed with AttributeError: 'str' object has no attribute 'kind' (or 'trees',
    'raw_len', 'head_spec') from inside the function."""
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
