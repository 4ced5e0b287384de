"""The bench measures the step its clock advances in (machine.clock_step) and says so where it is
coarse: on a hypervisor that advances the TSC in 10 ns steps every per-call figure is a multiple
of 10 ns, which a reader comparing a p50 with a target needs to know. The estimator is checked on
synthetic readings with a known step (and the reads-inside-a-step of such a hypervisor, which
come back as the last value + 1), then on this host's own clock; it claims no step it has no
evidence for (readings that never move, a step above its candidate range, TSC values past
int64), and the note names the clock the host really has. Results written without clock_step
still validate.
"""

import json
import os

import numpy as np
import pytest

from helpers.bench_scripts import BENCH


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
def test_step_of_a_stepped_clock(step, bench_machine):
    q, frac = bench_machine.clock_step_of(_stepped(step))
    assert q == step
    assert 0.9 <= frac <= 1.0


def test_step_of_a_clock_that_counts_every_tick(bench_machine):
    rng = np.random.default_rng(1)
    q, frac = bench_machine.clock_step_of(np.cumsum(rng.integers(60, 200, 3000)))
    assert (q, frac) == (1, 1.0)


def test_step_of_this_hosts_clock(bench, bench_machine):
    run, _ = bench
    cs = bench_machine.clock_step(2000)
    assert cs["ticks"] >= 1 and cs["readings"] == 2000
    assert cs["ns"] == pytest.approx(cs["ticks"] * run.fastpath.clock_info()["ns_per_tick"])
    # a fresh sample: the share the estimator saw on one lattice of that step holds again
    # (loosely: a preemption can knock a few readings off)
    t = np.array([bench_machine.clock_ticks() for _ in range(2000)], dtype=np.int64)
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


def _schema():
    with open(os.path.join(BENCH, "schema.json")) as f:
        return json.load(f)


def _committed():
    with open(os.path.join(BENCH, "results", "latest-generated.json")) as f:
        return json.load(f)


def test_results_without_clock_step_still_validate():
    """The committed results (and any JSON written before the clock step was measured) have no
    machine.clock_step; requiring it turned the committed figures invalid."""
    jsonschema = pytest.importorskip("jsonschema")
    res = _committed()
    res["machine"].pop("clock_step", None)
    jsonschema.validate(res, _schema())


@pytest.mark.parametrize("bad", [{"ticks": 0}, {"readings_on_step": 1.5},
                                 {"readings_on_step": "all"}, {"readings": 0}])
def test_a_malformed_clock_step_is_rejected(bad):
    jsonschema = pytest.importorskip("jsonschema")
    res = _committed()
    cs = {"ticks": 26, "ns": 10.0, "readings_on_step": 0.99, "readings": 3000}
    cs.update(bad)
    res["machine"]["clock_step"] = cs
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(res, _schema())


@pytest.mark.parametrize("readings", [[5] * 100, [123456789], [7, 7, 7, 8, 7, 7]])
def test_readings_that_barely_move_claim_no_step(readings, bench_machine):
    """Every q puts identical readings in one class: the old estimator answered max_step
    (4096 ticks) for a clock it never saw advance."""
    with pytest.raises(ValueError, match="distinct"):
        bench_machine.clock_step_of(readings)


def test_clock_step_of_a_frozen_clock_is_left_out(bench, monkeypatch, bench_machine):
    """The bench does not crash and records nothing where the clock could not be read
    advancing; the notes then say nothing about a step."""
    _, rep = bench
    monkeypatch.setattr(bench_machine, "clock_ticks", lambda: 1000)
    assert bench_machine.clock_step(200) is None
    assert "clock_step" not in bench_machine.machine_facts()
    assert not any("resolution" in s for s in rep.timing_notes({"machine": {}}))


@pytest.mark.parametrize("step", [5000, 6000, 10000])
def test_a_step_above_max_step_is_not_halved(step, bench_machine):
    """Readings on a lattice of a step above max_step: the old estimator returned the largest
    divisor of it under max_step (2500 for 5000, 3000 for 6000), a step the clock does not
    have."""
    rng = np.random.default_rng(3)
    t = np.cumsum(rng.integers(60, 200, 3000)) + 10 ** 9
    q, frac = bench_machine.clock_step_of((t // step) * step + 11)
    assert q == step
    assert frac == 1.0


def test_tsc_values_past_int64(bench_machine):
    """fp_ticks() is a uint64: readings at or past 2**63 (a TSC the hypervisor offset that
    far) are differences of a few ticks apart, not an OverflowError."""
    rng = np.random.default_rng(4)
    t = np.cumsum(rng.integers(60, 200, 3000))
    ticks = [2 ** 63 + int(x) for x in (t // 26) * 26]
    assert bench_machine.clock_step_of(ticks) == (26, 1.0)


def _notes(rep, source, clocksource, ticks, ns):
    return rep.timing_notes({"machine": {
        "clock": {"source": source, "ns_per_tick": 1.0 if source != "tsc" else 0.385},
        "kernel_clocksource": clocksource,
        "clock_step": {"ticks": ticks, "ns": ns, "readings_on_step": 1.0, "readings": 3000}}})


def test_note_on_a_host_without_tsc_names_its_clock(bench):
    """Without an invariant TSC (an ARM server's 25 MHz counter: CLOCK_MONOTONIC in 40 ns
    steps, on bare metal) the note must not call it a TSC stepped by a hypervisor."""
    _, rep = bench
    notes = [s for s in _notes(rep, "clock_gettime(CLOCK_MONOTONIC)", "arch_sys_counter", 40,
                               40.0) if s.startswith("resolution")]
    assert len(notes) == 1
    s = notes[0]
    assert "the TSC" not in s and "hypervisor" not in s and "ticks" not in s
    assert "CLOCK_MONOTONIC" in s and "40.0 ns" in s


def test_note_claims_a_shared_counter_only_where_the_kernel_reads_the_tsc(bench):
    _, rep = bench
    shared = [s for s in _notes(rep, "tsc", "tsc", 26, 10.0) if s.startswith("resolution")][0]
    assert "perf_counter_ns reads the same counter" in shared
    assert "26 ticks" in shared
    for other in ("hpet", "acpi_pm", None):
        s = [s for s in _notes(rep, "tsc", other, 26, 10.0) if s.startswith("resolution")][0]
        assert "reads the same counter" not in s
        assert "in C" in s and "10.0 ns" in s


def test_this_hosts_clock_step_matches_the_schema(bench_machine):
    jsonschema = pytest.importorskip("jsonschema")
    res = _committed()
    cs = bench_machine.clock_step(1000)
    if cs is not None:
        res["machine"]["clock_step"] = cs
    jsonschema.validate(res, _schema())


def test_stage_table_names_the_clock_the_host_had(bench):
    """The stage table's title said "(TSC)" on a host whose fastpath clock fell back to
    CLOCK_MONOTONIC (no invariant TSC), where the in-C figures are clock_gettime readings."""
    _, report = bench
    with open(os.path.join(BENCH, "results", "latest-generated.json")) as f:
        res = json.load(f)
    res["machine"]["clock"]["source"] = "clock_gettime(CLOCK_MONOTONIC)"
    (title,) = [t[0] for t in report.tables(res) if t[0].startswith("Stages inside fp_step()")]
    assert "CLOCK_MONOTONIC" in title and "TSC" not in title
    res["machine"]["clock"]["source"] = "tsc"
    (title,) = [t[0] for t in report.tables(res) if t[0].startswith("Stages inside fp_step()")]
    assert "(TSC)" in title
