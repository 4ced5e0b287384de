"""FeatureSpec.fit names the first non-finite tick it is given.
"""

import pytest


def test_feature_fit_names_the_first_non_finite_tick():
    import numpy as np
    from fastpath.errors import ModelError
    from fastpath.model import FeatureSpec
    raws = np.ones((10, 4), np.float32) + np.arange(40, dtype=np.float32).reshape(10, 4)
    raws[6, 2] = np.nan
    raws[8, 1] = np.inf
    with pytest.raises(ModelError, match=r"row 6 field 2 \(spread\) is nan \(2 row\(s\)"):
        FeatureSpec.fit(raws, range(4), field_names=["a", "b", "spread", "d"])
