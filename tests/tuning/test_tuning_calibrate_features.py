"""fastpath.tuning.calibrate's features= choice: 'zscore' (the default for an MLP) or 'raw';
a tree ensemble or a model with its own input scaler must be told which."""
import numpy as np
import pytest

from fastpath import ModelError
from fastpath.model import FeatureSpec, Head, Layer, Model
from helpers.models import three_target_stumps


F32 = np.float32


PROBS = (0.2, 0.3, 0.5)


def test_tuning_calibrate_takes_the_choice():
    from fastpath.tuning import calibrate
    rng = np.random.default_rng(8)
    m = Model((Layer(rng.standard_normal((1, 3)).astype(F32), np.zeros(1, F32)),),
              head_spec=Head("regression"))
    raws = (rng.standard_normal((50, 3)) + 5).astype(F32)
    raw = calibrate(m, raws, range(3), features="raw")
    assert np.all(raw.feature_spec.mean == 0) and np.all(raw.feature_spec.inv_std == 1)
    assert calibrate(m, raws, range(3)).feature_spec == FeatureSpec.fit(raws, range(3))
    with pytest.raises(ModelError, match=r"features must be one of \('zscore', 'raw'\)"):
        calibrate(m, raws, range(3), features="z")


def test_tuning_calibrate_asks_a_tree_or_a_scaler_model_too():
    from fastpath.model.types import InputScaler
    from fastpath.tuning import calibrate
    raws = (np.random.default_rng(9).standard_normal((50, 2)) + 5).astype(F32)
    tree = Model((), None, trees=three_target_stumps(PROBS, PROBS), head_spec=Head("regression"))
    with pytest.raises(ModelError, match=r"calibrate: a tree ensemble compares each feature "
                                         r"with thresholds.*features='raw'.*features='zscore'"):
        calibrate(tree, raws, range(2))
    assert calibrate(tree, raws, range(2), features="raw").feature_spec.inv_std[0] == 1
    lay = (Layer(np.ones((1, 2), F32), np.zeros(1, F32)),)
    scaled = Model(lay, head_spec=Head("regression"),
                   input_scaler=InputScaler(np.zeros(2, F32), np.ones(2, F32)))
    with pytest.raises(ModelError, match="standardises its input itself"):
        calibrate(scaled, raws, range(2))
    assert calibrate(scaled, raws, range(2), features="zscore").feature_spec.inv_std[0] != 1
