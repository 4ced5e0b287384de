"""A tree ensemble's tick refused after its post-transform names that transform in the message."""

import numpy as np
import pytest

import fastpath
from fastpath import Engine


def test_a_tree_models_refused_tick_names_the_post_transform(isa):
    """Defect guarded: a tree ensemble whose PROBIT left (0, 1) was refused by step() and
    step_batch() as an overflowed hidden layer (it has none); the message names the post
    transform, as predict() does."""
    from helpers.refusing_models import good_tick, tree_model
    m = tree_model(1, 4, cache=False, probit=True)
    eng = Engine(m, config={"engine": {"simd": isa, "n_symbols": 3}})
    rng = np.random.default_rng(9)
    x = good_tick(rng, 1)
    bad = x.copy()
    bad[0] = 2.0                      # the stump on raw[0] >= 1 pushes the score past 1
    for call in (lambda: eng.step(bad, 0, 5),
                 lambda: eng.step_batch(np.stack([bad]), [0], [5])):
        with pytest.raises(fastpath.InputError, match="post transform left its range") as e:
            call()
        assert "hidden layer" not in str(e.value)
    assert eng.ticks == 0
    eng.step(x, 0, 5)
