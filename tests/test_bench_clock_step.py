"""The bench measures the step its clock advances in and says so where it is coarse: on a
hypervisor that advances the TSC in 10 ns steps every per-call figure is a multiple of 10 ns,
which a reader comparing a p50 with a target needs to know. The estimator is checked on
synthetic readings with a known step (and the reads-inside-a-step of such a hypervisor, which
come back as the last value + 1), then on this host's own clock: every reading it calls on the
step must be on one lattice of that step."""

import numpy as np
import pytest


def _stepped(step, n=3000, off_lattice=0.05, seed=0):
    """Readings of a clock that advances `step` ticks at a time, taken every 60-200 ticks,
    where a fraction of reads lands inside a step already read and gets the last value + 1."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.integers(60, 200, n)) + 123456789
    v = (t // step) * step + 17
    bump = rng.random(n) < off_lattice
    v[bump] += rng.integers(1, 4, bump.sum())
    return v


@pytest.mark.parametrize("step", [2, 13, 26, 100, 1000])
def test_step_of_a_stepped_clock(bench, step):
    run, _ = bench
    q, frac = run.clock_step_of(_stepped(step))
    assert q == step
    assert 0.9 <= frac <= 1.0


def test_step_of_a_clock_that_counts_every_tick(bench):
    run, _ = bench
    rng = np.random.default_rng(1)
    q, frac = run.clock_step_of(np.cumsum(rng.integers(60, 200, 3000)))
    assert (q, frac) == (1, 1.0)


def test_step_of_this_hosts_clock(bench):
    run, _ = bench
    cs = run.clock_step(2000)
    assert cs["ticks"] >= 1 and cs["readings"] == 2000
    assert cs["ns"] == pytest.approx(cs["ticks"] * run.fastpath.clock_info()["ns_per_tick"])
    # a fresh sample: the share the estimator saw on one lattice of that step holds again
    # (loosely: a preemption can knock a few readings off)
    t = np.array([run.clock_ticks() for _ in range(2000)], dtype=np.int64)
    if cs["ticks"] > 1:
        share = np.bincount((t - t.min()) % cs["ticks"]).max() / len(t)
        assert share >= 0.8


def test_the_notes_say_so_only_where_the_step_is_coarse(bench):
    _, rep = bench
    base = {"machine": {"clock_step": {"ticks": 26, "ns": 10.0, "readings_on_step": 0.99,
                                       "readings": 3000}}}
    notes = rep.timing_notes(base)
    assert any("steps of 10.0 ns" in s and "26 ticks" in s for s in notes)
    fine = {"machine": {"clock_step": {"ticks": 1, "ns": 0.385, "readings_on_step": 1.0,
                                       "readings": 3000}}}
    assert not any("resolution" in s for s in rep.timing_notes(fine))
