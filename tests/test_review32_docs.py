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
