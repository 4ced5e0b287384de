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
    ref = sc.apply(fs.apply(raws))
    models = [m.with_feature_spec(fs), replace(m, feature_spec=fs),
              Model(m.layers, fs, input_scaler=sc)]
    for other in models:
        assert other.feature_spec == fs and other.input_scaler == sc
        e = Engine(other, config={"engine": {"n_symbols": 1, "simd": isa}})
        got = np.stack([e.features(r, 0) for r in raws])
        np.testing.assert_array_equal(got, ref)
        np.testing.assert_array_equal(other.features(raws), ref)
        # and outputs() of raw ticks is forward() of the spec's output (the model's input)
        np.testing.assert_allclose(other.outputs(raws), other.forward(fs.apply(raws)),
                                   rtol=1e-6, atol=1e-6)
    # without a scaler, the features are the spec's
    plain = replace(m, feature_spec=fs, input_scaler=None)
    np.testing.assert_array_equal(plain.features(raws), fs.apply(raws))


def test_the_scaler_runs_after_the_spec_in_the_window_features_too(isa):
    """Window features (rolling mean / std over W ticks) go through the scaler as the
    z-scores do; a scaler whose offset sits at the level of a centred price feature and a
    window field whose scale is large: the engine's features are the spec's then the
    scaler's float32 ops, tick by tick, for every kernel set."""
    rng = np.random.default_rng(2)
    n_feat = 2 + 2 * 2
    sc = InputScaler(np.array([0.5, -1.0, 65000.0, 0.01, 3.0, 0.0], np.float32),
                     np.array([2.0, 0.25, 1e3, 50.0, 1.0, 1e-3], np.float32))
    layers = (Layer(rng.standard_normal((4, n_feat)).astype(np.float32), np.zeros(4, np.float32),
                    "tanh"),
              Layer(rng.standard_normal((2, 4)).astype(np.float32), np.zeros(2, np.float32),
                    "identity"))
    fs = FeatureSpec(4, [0, 1], [2, 3], 8, np.array([65000.0, 0, 0, 0, 0, 0], np.float32),
                     np.array([1.0, 1.0, 1.0, 1.0, 1.0, 1.0], np.float32))
    m = Model(layers, fs, input_scaler=sc)
    raws = np.column_stack([65000 + rng.standard_normal(60), rng.standard_normal(60),
                            65000 + 0.01 * rng.standard_normal(60),
                            rng.standard_normal(60)]).astype(np.float32)
    syms = np.zeros(60, np.int64)
    cfg = {"engine": {"n_symbols": 1, "simd": isa}}
    e, e0 = Engine(m, config=cfg), Engine(replace(m, input_scaler=None), config=cfg)
    got, spec_only = [], []
    for r in raws:
        got.append(e.features(r, 0))
        spec_only.append(e0.features(r, 0))
        e.step(r, 0)
        e0.step(r, 0)
    # bit for bit: the scaler's float32 ops on the engine's own spec features
    np.testing.assert_array_equal(np.stack(got), sc.apply(np.stack(spec_only)))
    # and the numpy reference (its window std is the C one's to an ulp)
    np.testing.assert_allclose(np.stack(got), m.features(raws, syms), rtol=1e-6, atol=1e-9)


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
