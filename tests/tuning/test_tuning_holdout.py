"""The cache-policy fit's holdout: the last part of the stream is kept out of the choice and
must keep the budget too (fastpath.tuning.fit_cache_policy(holdout=...), `fastpath calibrate
--holdout`). A budget met on the fitting ticks alone is not a bound on the ticks that follow:
a fit on the calm start of a stream chose policies that broke it in a shock after."""
import os

import numpy as np
import pytest

import fastpath
import fastpath.lob as lob
from fastpath.errors import InputError, ModelError
from fastpath.model import Model
from fastpath.tuning import fit_cache_policy
from helpers.cli_child import run_cli

DEMO = os.path.join(os.path.dirname(fastpath.__file__), "data", "demo.fpm")


@pytest.fixture(scope="module")
def shock_at_the_end():
    """8,000 ticks of 2 symbols, calm until a shock in the last fifth: the held-out quarter
    holds most of the shock."""
    s = lob.generate_stream(8000, n_symbols=2, seed=1, shock_at=0.8, shock_len=0.15)
    return Model.load(DEMO), lob.raw_from_book(s), s.symbols, s.ts_ns


def _key(p):
    return (p.enabled, p.cos_threshold, p.norm_tol)


def test_holdout_refuses_what_only_the_fitting_ticks_allow(shock_at_the_end):
    model, raws, syms, ts = shock_at_the_end
    budget = 0.005
    pol, rep = fit_cache_policy(model, raws, syms, max_error=budget, ts_ns=ts, holdout=0.25)
    k = len(raws) - rep.n_holdout
    assert rep.n_holdout == 2000
    # the replay is causal: a fit on the first k ticks alone measures what the holdout fit
    # measures on its fitting part, and chooses the loosest candidate the holdout refused
    alone, rep_alone = fit_cache_policy(model, raws[:k], syms[:k], max_error=budget, ts_ns=ts[:k])
    assert rep.refused_by_holdout, "this stream was chosen for a shock the fitting part lacks"
    r0 = rep.refused_by_holdout[0]
    assert (r0["cos_threshold"], r0["norm_tol"]) == (alone.cos_threshold, alone.norm_tol)
    assert r0["holdout"]["max_error"] > budget >= r0["max_error"]
    # what was chosen keeps the budget on both parts, and is not what the fitting part chose
    assert pol.enabled and _key(pol) != _key(alone)
    c = rep.chosen
    assert c["max_error"] <= budget and c["holdout"]["max_error"] <= budget
    assert (c["cos_threshold"], c["norm_tol"]) == (pol.cos_threshold, pol.norm_tol)
    # the fitting part's figures are the fit alone's, row for row
    for a, b in zip(rep.rows, rep_alone.rows):
        assert {x: a[x] for x in ("hits", "max_error", "sign_flips")} == \
               {x: b[x] for x in ("hits", "max_error", "sign_flips")}
    # every refused row is looser (more hits on the fitting part) than the chosen one
    assert all(r["hit_rate"] >= c["hit_rate"] for r in rep.refused_by_holdout)
    assert "held-out" in rep.note and "not on the 2000 held-out ones" in rep.note
    assert "over budget held out" in rep.table()
    assert rep.summary()["n_holdout"] == 2000


def test_without_holdout_the_report_says_it_checked_nothing(shock_at_the_end):
    model, raws, syms, ts = shock_at_the_end
    pol, rep = fit_cache_policy(model, raws[:3000], syms[:3000], max_error=0.01, ts_ns=ts[:3000])
    assert rep.n_holdout == 0 and "holdout" not in rep.rows[0]
    assert "measured on the fitting ticks only" in rep.note


def test_holdout_with_no_candidate_left_turns_the_cache_off(shock_at_the_end):
    model, raws, syms, ts = shock_at_the_end
    _, full = fit_cache_policy(model, raws, syms, max_error=0.005, ts_ns=ts, holdout=0.25)
    r0 = full.refused_by_holdout[0]
    # a grid of that one candidate: within the budget on the fitting ticks, not held out
    pol, rep = fit_cache_policy(model, raws, syms, max_error=0.005, ts_ns=ts, holdout=0.25,
                                cos_grid=(r0["cos_threshold"],), norm_grid=(r0["norm_tol"],))
    assert rep.rows[0]["within_budget"] and rep.rows[0]["hits"]
    assert not rep.rows[0]["holdout"]["within_budget"]
    assert not pol.enabled and rep.chosen is None and rep.refused_by_holdout == rep.rows
    assert "on the fitting and the held-out ticks: the cache stays off" in rep.note
    assert "1 looser candidate(s) kept the budget on the fitting ticks" in rep.note
    # without the holdout the same grid turns the cache on: the fitting ticks alone allow it
    pol0, _ = fit_cache_policy(model, raws[:len(raws) - rep.n_holdout],
                               syms[:len(raws) - rep.n_holdout], max_error=0.005,
                               ts_ns=ts[:len(raws) - rep.n_holdout],
                               cos_grid=(r0["cos_threshold"],), norm_grid=(r0["norm_tol"],))
    assert pol0.enabled


@pytest.mark.parametrize("bad", [-0.1, 0.95, 1.0, float("nan"), True, "0.2", None])
def test_holdout_argument_checked(shock_at_the_end, bad):
    model, raws, syms, ts = shock_at_the_end
    with pytest.raises(ModelError, match="holdout must be the fraction of ticks held out"):
        fit_cache_policy(model, raws[:100], syms[:100], ts_ns=ts[:100], holdout=bad)


def test_holdout_needs_ticks_on_both_sides(shock_at_the_end):
    model, raws, syms, ts = shock_at_the_end
    with pytest.raises(InputError, match="leaves no tick to check"):
        fit_cache_policy(model, raws[:1], syms[:1], ts_ns=ts[:1], holdout=0.25)
    with pytest.raises(InputError, match="leaves no tick to fit"):
        fit_cache_policy(model, raws[:2], syms[:2], ts_ns=ts[:2], holdout=0.9)
    # numpy scalars are fractions too
    pol, rep = fit_cache_policy(model, raws[:400], syms[:400], ts_ns=ts[:400],
                                holdout=np.float32(0.25))
    assert rep.n_holdout == 100


def test_calibrate_cli_holds_out_a_quarter_by_default(tmp_path, shock_at_the_end):
    model, raws, syms, ts = shock_at_the_end
    np.save(tmp_path / "t.npy", raws[:2000])
    np.save(tmp_path / "ts.npy", ts[:2000])
    common = ("calibrate", "--ticks", str(tmp_path / "t.npy"), "--model", DEMO,
              "--ts", str(tmp_path / "ts.npy"))
    out = run_cli(*common, "--out", str(tmp_path / "a.fpm"), "--max-error", "0.01", timeout=300)
    assert out.returncode == 0, out.stderr
    assert "the last 500 held out" in out.stdout
    assert Model.load(tmp_path / "a.fpm").meta["cache_policy_fit"]["n_holdout"] == 500
    out = run_cli(*common, "--out", str(tmp_path / "b.fpm"), "--max-error", "0.01", "--holdout", "0", timeout=300)
    assert out.returncode == 0, out.stderr
    assert "held out" not in out.stdout and "fitting ticks only" in out.stdout
    bad = run_cli(*common, "--out", str(tmp_path / "c.fpm"), "--holdout", "0.2", timeout=300)
    assert bad.returncode != 0 and "--holdout is used by the cache-policy fit" in bad.stderr
    for v in ("1.5", "x", "nan", "-0.1"):
        bad = run_cli(*common, "--out", str(tmp_path / "c.fpm"), "--max-error", "0.01", "--holdout", v, timeout=300)
        assert bad.returncode != 0 and "holdout must be the fraction" in bad.stderr
