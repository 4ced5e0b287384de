"""fastpath.model.native_trees: a region split (a rule that is piecewise constant between
float32 breakpoints, as LightGBM's zero band and categorical bitsets are) becomes a chain of
`x < p` nodes that sends every float32 input, NaN included, to the subtree the rule names."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastpath.errors import ModelError
from fastpath.model.native_trees import Leaf, Region, build_ensemble, check_shape

F = np.float32


def _ensemble(points, sides, nan_side):
    """One region split over feature 0 whose leaves 1..k carry their own index."""
    pts = sorted(points)

    def dest(x):
        return 1 + sides[int(np.searchsorted(pts, x, side="right"))]
    nodes = [Region(0, pts, dest, 1 + nan_side)] + [Leaf([(0, float(j))]) for j in range(3)]
    return build_ensemble([nodes], 1, 1), dest


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, width=32), min_size=0, max_size=6, unique=True),
       st.data())
def test_a_region_chain_decides_every_float32_as_its_rule(points, data):
    sides = data.draw(st.lists(st.integers(0, 2), min_size=len(points) + 1,
                               max_size=len(points) + 1))
    nan_side = data.draw(st.integers(0, 2))
    te, dest = _ensemble(points, sides, nan_side)
    xs = [F(p) for p in points] + [np.nextafter(F(p), F(-np.inf)) for p in points] + \
        [F(-np.inf), F(np.inf), F(0.0), F(-0.0), F(3.5)]
    X = np.array(xs, F).reshape(-1, 1)
    want = [float(dest(float(x)) - 1) for x in X[:, 0]]
    np.testing.assert_array_equal(te.forward(X)[:, 0], np.array(want, F))
    assert te.forward(np.array([[np.nan]], F))[0, 0] == nan_side


def test_a_shared_child_in_a_source_tree_is_refused():
    left, right = np.array([1, -1, -1]), np.array([1, -1, -1])
    with pytest.raises(ModelError, match="tree 5: node 1 is reached twice"):
        check_shape(5, left, right, left != -1)


def test_an_unreached_node_is_refused():
    left, right = np.array([1, -1, -1, -1]), np.array([2, -1, -1, -1])
    with pytest.raises(ModelError, match="tree 0: node 3 is not reached"):
        check_shape(0, left, right, left != -1)
