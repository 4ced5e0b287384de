"""What the fits (fit_cache_policy, fit_head_scale) accept and report: arguments and ticks
are checked, sparse symbol ids fit as dense ones, and the report says when nothing was
measured or the budget never bit; calibrate refuses a bad window before replaying."""
import numpy as np
import pytest

from fastpath import InputError, ModelError
from fastpath.model import CachePolicy
from fastpath.tuning import fit_cache_policy
from helpers.builders import random_model


def _ticks(rng, n=400):
    base = rng.standard_normal(8).astype(np.float32)
    return base + 1e-4 * rng.standard_normal((n, 8)).astype(np.float32)


def test_fit_on_one_tick_says_nothing_was_measured():
    rng = np.random.default_rng(0)
    m = random_model(rng, [8, 16, 2], policy=CachePolicy())
    pol, rep = fit_cache_policy(m, rng.standard_normal((1, 8)).astype(np.float32))
    assert not pol.enabled and "no candidate policy hit" in rep.note
    assert "kept every hit within" not in rep.note


def test_fit_with_sparse_symbol_ids_equals_dense(isa):
    # ids like 10**9 asked the replay engines for 10**9 + 1 symbol slots (ConfigError)
    rng = np.random.default_rng(1)
    m = random_model(rng, [8, 16, 2], policy=CachePolicy())
    raws = _ticks(rng)
    dense = rng.integers(0, 3, len(raws)).astype(np.int32)
    sparse = np.array([7, 10**9, 123_456])[dense].astype(np.int64)
    p1, r1 = fit_cache_policy(m, raws, dense, max_error=0.05, simd=isa)
    p2, r2 = fit_cache_policy(m, raws, sparse, max_error=0.05, simd=isa)
    assert p1 == p2 and r1.rows == r2.rows and r1.chosen is not None
    with pytest.raises(InputError, match="symbols must be >= 0"):
        fit_cache_policy(m, raws, -np.ones(len(raws), np.int64), simd=isa)


def test_fit_arguments_validated():
    rng = np.random.default_rng(2)
    m = random_model(rng, [8, 16, 2], policy=CachePolicy())
    raws = _ticks(rng, 100)
    for flips in (-1, "x", 1.5, True):
        with pytest.raises(ModelError, match="max_sign_flips"):
            fit_cache_policy(m, raws, max_sign_flips=flips)
    with pytest.raises(ModelError, match="at least one candidate"):
        fit_cache_policy(m, raws, cos_grid=())
    pol, rep = fit_cache_policy(m, raws, max_error=np.float32(0.05))
    assert rep.max_error == pytest.approx(0.05) and type(rep.max_error) is float


def test_head_scale_blames_the_tick_not_the_model():
    from fastpath.tuning import fit_head_scale
    rng = np.random.default_rng(5)
    m = random_model(rng, [8, 16, 1])
    x = rng.standard_normal((50, 8)).astype(np.float32)
    x[3, 2] = np.nan
    with pytest.raises(InputError, match="raws row 3 field 2 is nan"):
        fit_head_scale(m, x)
    with pytest.raises(ModelError, match="target a finite number"):
        fit_head_scale(m, x[4:], target=np.inf)


def test_fits_refuse_boolean_ticks():
    # a bool mask passed for ticks was cast to 0.0/1.0 and fitted without a word
    from fastpath.tuning import fit_head_scale
    rng = np.random.default_rng(7)
    mask = rng.standard_normal((50, 8)) > 0
    with pytest.raises(InputError, match="dtype bool"):
        fit_cache_policy(random_model(rng, [8, 16, 2]), mask)
    with pytest.raises(InputError, match="dtype bool"):
        fit_head_scale(random_model(rng, [8, 16, 1]), mask)


def test_fit_on_identical_ticks_says_the_budget_never_bit():
    # all-identical ticks: every candidate has error 0 and the grid's loosest policy is chosen
    # and stored as "fitted to the budget"; the report now says the budget never bit
    rng = np.random.default_rng(9)
    m = random_model(rng, [8, 16, 2], policy=CachePolicy())
    same = np.tile(rng.standard_normal(8).astype(np.float32), (200, 1))
    pol, rep = fit_cache_policy(m, same, max_error=0.01)
    assert pol.enabled and rep.chosen["max_error"] == 0.0
    assert "budget never bit" in rep.note and "budget never bit" in rep.table()
    # a fit where the budget did bite says nothing of the kind
    walk = np.cumsum(rng.standard_normal((600, 8)).astype(np.float32) * 0.02, axis=0) + 1
    pol, rep = fit_cache_policy(m, walk, max_error=1e-3)
    assert any(not r["within_budget"] for r in rep.rows) and "never bit" not in rep.note


@pytest.mark.parametrize("window", [-3, 0, 1.5, True, 1 << 17])
def test_calibrate_refuses_a_bad_window_before_replaying(window):
    """FeatureSpec.fit (calibrate's first step) names a bad window: -3 was an IndexError from
    the numpy replay, 0 warned before the spec's own check."""
    from fastpath.model import FeatureSpec
    raws = np.random.default_rng(0).standard_normal((20, 8)).astype(np.float32)
    with pytest.raises(ModelError, match="window must be an int in 1..65536"):
        FeatureSpec.fit(raws, [0, 1], [2], window=window)
