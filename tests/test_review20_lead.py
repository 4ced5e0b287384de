"""Defects found in session 20's review by the lead (the helpers' finds are in the other
test_review20_* files)."""
import os

import pytest

import fastpath
from fastpath.errors import InputError

DEMO = os.path.join(os.path.dirname(fastpath.__file__), "data", "demo.fpm")


@pytest.mark.parametrize("name", [5, None, b"bytes", 1.5, ["x"]])
def test_serve_and_connect_refuse_a_name_that_is_not_a_str(name):
    # a non-str name met the typed attribute first: a bare "TypeError: Expected str, got int"
    # instead of the InputError that says what a name must be
    with pytest.raises(InputError, match="server name must be a non-empty str"):
        fastpath.serve(name)
    with pytest.raises(InputError, match="server name must be a non-empty str"):
        fastpath.connect(name, timeout=0)


def test_a_binary_config_file_is_a_config_error_naming_it(tmp_path):
    # tomllib decodes the bytes itself: a bundle passed as the config raised a bare
    # UnicodeDecodeError naming no file
    from fastpath.errors import ConfigError
    p = tmp_path / "model.fpm"
    p.write_bytes(b"FPM1\x00\xff\xfe" + bytes(range(256)))
    with pytest.raises(ConfigError, match=r"model\.fpm is not a TOML config: not UTF-8"):
        fastpath.Engine(DEMO, config=str(p))


def test_feature_fit_names_the_first_non_finite_tick():
    import numpy as np
    from fastpath.errors import ModelError
    from fastpath.model import FeatureSpec
    raws = np.ones((10, 4), np.float32) + np.arange(40, dtype=np.float32).reshape(10, 4)
    raws[6, 2] = np.nan
    raws[8, 1] = np.inf
    with pytest.raises(ModelError, match=r"row 6 field 2 \(spread\) is nan \(2 row\(s\)"):
        FeatureSpec.fit(raws, range(4), field_names=["a", "b", "spread", "d"])
