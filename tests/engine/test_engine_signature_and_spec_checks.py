"""Engine and FeatureSpec at the Python surface: Engine's signature, and FeatureSpec.identity's
check of its length."""
import inspect

import numpy as np
import pytest

import fastpath
from fastpath import FeatureSpec, ModelError


def test_engine_has_a_signature():
    """Regression: inspect.signature(fastpath.Engine) raised ValueError and help() showed none."""
    sig = inspect.signature(fastpath.Engine)
    assert list(sig.parameters) == ["model", "backend", "config"]
    # None: the config's [engine] backend ("cpu" unless it says otherwise)
    assert sig.parameters["backend"].default is None
    assert sig.parameters["config"].default is None
    # the docstring a user reads is the prose, not the clinic line
    assert fastpath.Engine.__doc__.startswith("A model, its feature spec and cache")
    e = fastpath.Engine(fastpath.get_default_engine().model, **{"backend": "cpu", "config": None})
    assert e.backend == "cpu"


def test_feature_spec_identity_of_a_bad_length_is_a_model_error():
    """Regression: FeatureSpec.identity of a bad length raised numpy's TypeError or ValueError."""
    for n in (None, "3", -1, 0, 2.5, True, 70_000):
        with pytest.raises(ModelError, match=r"identity\(n\): n is the raw tick's length"):
            FeatureSpec.identity(n)
    fs = FeatureSpec.identity(np.int64(5))
    assert fs.raw_len == 5 and type(fs.raw_len) is int
    raws = np.arange(10, dtype=np.float32).reshape(2, 5)
    np.testing.assert_array_equal(fs.apply(raws), raws)
