"""Session 23, lead: the fastpath.step signature, and a tree model's scaler kept apart
from its feature spec."""
import inspect
from dataclasses import replace

import numpy as np
import pytest

import fastpath
from fastpath import Engine
from fastpath.model import FeatureSpec, Layer, Model
from fastpath.model.types import InputScaler


def test_step_has_the_signature_of_engine_step():
    # a builtin (binding=False) without an Argument Clinic line: inspect.signature raised
    # ValueError, and help() showed no parameters
    sig = inspect.signature(fastpath.step)
    want = inspect.signature(Engine.step)
    assert list(sig.parameters) == [p for p in want.parameters if p != "self"]
    assert [p.default for p in sig.parameters.values()] == \
        [p.default for n, p in want.parameters.items() if n != "self"]
    assert fastpath.step.__doc__.lstrip().startswith("fastpath.step(")


def _mlp(rng, n=3):
    return (Layer(rng.standard_normal((4, n)).astype(np.float32), np.zeros(4, np.float32),
                  "relu"),
            Layer(rng.standard_normal((2, 4)).astype(np.float32), np.zeros(2, np.float32),
                  "identity"))


def test_every_way_of_setting_the_spec_keeps_the_scaler(isa):
    rng = np.random.default_rng(0)
    sc = InputScaler(np.array([65000.0, 1.0, -2.0], np.float32),
                     np.array([3.0, 0.5, 10.0], np.float32))
    m = Model(_mlp(rng), input_scaler=sc)
    fs = FeatureSpec(5, np.array([4, 0, 2]), [], 1, np.array([1.0, 0.0, 0.5], np.float32),
                     np.array([1.0, 2.0, 1.0], np.float32))
    raws = rng.standard_normal((20, 5)).astype(np.float32) + \
        np.array([0, 0, 0, 0, 65000], np.float32)
    ref = sc.compose(fs)
    models = [m.with_feature_spec(fs), replace(m, feature_spec=fs),
              Model(m.layers, fs, input_scaler=sc)]
    for other in models:
        assert other.feature_spec == fs and other.input_scaler == sc
        assert other.layer_spec == ref
        e = Engine(other, config={"engine": {"n_symbols": 1, "simd": isa}})
        got = np.stack([e.features(r, 0) for r in raws])
        np.testing.assert_array_equal(got, ref.apply(raws))
        # and outputs() of raw ticks is forward() of the spec's output (the model's input)
        np.testing.assert_allclose(other.outputs(raws), other.forward(fs.apply(raws)),
                                   rtol=1e-6, atol=1e-6)
    # without a scaler, layer_spec is the feature spec itself
    plain = replace(m, input_scaler=None)
    assert plain.layer_spec is plain.feature_spec


def test_a_spec_one_spec_cannot_compose_with_the_scaler_is_refused_on_replace():
    rng = np.random.default_rng(1)
    sc = InputScaler(np.array([1.0, 1.0, 1.0], np.float32), np.ones(3, np.float32))
    m = Model(_mlp(rng), input_scaler=sc)
    inv = np.ones(3, np.float32)
    inv[2] = 0.0          # a constant 0 the scaler maps to -1: no (pre - m) * s computes it
    bad = FeatureSpec(3, np.arange(3), [], 1, np.zeros(3, np.float32), inv)
    with pytest.raises(fastpath.ModelError, match="feature 2"):
        replace(m, feature_spec=bad)


def test_a_missing_recorded_file_is_an_input_error_naming_it(tmp_path):
    # the module promises every problem of a recorded file is an InputError naming it; a
    # missing one was open()'s FileNotFoundError
    from fastpath import InputError
    from fastpath.lob import readers
    with pytest.raises(InputError, match=r"depth10\.csv: cannot be read \(No such file"):
        readers.read_binance(str(tmp_path / "nowhere"))
    (tmp_path / "ob.csv").write_text("1,2,3,4\n")
    with pytest.raises(InputError, match=r"msg\.csv: cannot be read"):
        readers.read_lobster(str(tmp_path / "ob.csv"), str(tmp_path / "msg.csv"))
