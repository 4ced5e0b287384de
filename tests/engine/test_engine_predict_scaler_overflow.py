"""Engine.predict refuses a finite input that the input scaler takes past float32's range, as
step() refuses the tick, on every kernel set."""
import warnings

import numpy as np
import pytest

from fastpath import Engine, InputError
from fastpath.model import CachePolicy, Head, Model, TreeEnsemble
from fastpath.model.types import InputScaler
from helpers.builders import engine_cfg
from helpers.scalers import F, scaler_mlp




def _scaler_stump(offset, scale):
    t = TreeEnsemble(1, 1, [0, 3], [0, 6, 6], [0, 0, 0], np.asarray([0.5, 0, 0]), [1, 0, 0],
                     [2, 0, 0], [0, 0, 0], [1, 2], [0, 0], [1.0, 2.0])
    return Model((), None, CachePolicy(enabled=False), head_spec=Head("regression", 1.0, (0,)),
                 trees=t, input_scaler=InputScaler(np.asarray([offset], F),
                                                   np.asarray([scale], F)))


@pytest.mark.parametrize("kind", ["mlp", "trees"])
def test_predict_refuses_a_finite_input_its_scaler_overflows(kind, isa):
    """step() refuses the tick (its features overflow); predict blamed a layer (MLP) or
    answered 2.0 from the Inf (tree), and numpy's overflow warning escaped it."""
    if kind == "mlp":
        m = scaler_mlp(offset=0.0, scale=1e30, n=6)
        x = np.full(6, 1e10, F)
    else:
        m = _scaler_stump(0.0, 1e30)
        x = np.asarray([1e10], F)
    eng = Engine(m, config=engine_cfg(isa))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(InputError, match=r"x\[0\] = 1e\+?10.*input scaler.*is inf"):
            eng.predict(x)
        with pytest.raises(InputError, match="overflowed"):
            eng.step(x, 0)
        # in range, the two agree with the numpy reference
        ok = np.full_like(x, 1e-31)
        np.testing.assert_allclose(eng.predict(ok), m.forward(ok), rtol=1e-6)
    assert eng.ticks == 0
