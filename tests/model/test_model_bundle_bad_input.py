"""A model bundle (.fpm) round-trips; a truncated or corrupted one, and a Model built from bad
arrays, is a ModelError that says what is wrong."""

import numpy as np
import pytest

from fastpath import Engine, Model, ModelError
from fastpath.model import FeatureSpec, Layer
from helpers.builders import engine_cfg, windowed_model


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
