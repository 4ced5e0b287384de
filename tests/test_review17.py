"""Review of the bench's clock-step measurement (machine.clock_step): results written before it
existed still validate, the estimator claims no step it has no evidence for (readings that never
move, a step above its candidate range, TSC values past int64), and the note names the clock the
host really has (clock_gettime without an invariant TSC; perf_counter_ns only shares the counter
when the kernel's clocksource is TSC-based)."""
import json
import os

import numpy as np
import pytest

BENCH = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "bench"))


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
def test_readings_that_barely_move_claim_no_step(bench, readings):
    """Every q puts identical readings in one class: the old estimator answered max_step
    (4096 ticks) for a clock it never saw advance."""
    run, _ = bench
    with pytest.raises(ValueError, match="distinct"):
        run.clock_step_of(readings)


def test_clock_step_of_a_frozen_clock_is_left_out(bench, monkeypatch):
    """The bench does not crash and records nothing where the clock could not be read
    advancing; the notes then say nothing about a step."""
    run, rep = bench
    monkeypatch.setattr(run, "clock_ticks", lambda: 1000)
    assert run.clock_step(200) is None
    assert "clock_step" not in run.machine_facts()
    assert not any("resolution" in s for s in rep.timing_notes({"machine": {}}))


@pytest.mark.parametrize("step", [5000, 6000, 10000])
def test_a_step_above_max_step_is_not_halved(bench, step):
    """Readings on a lattice of a step above max_step: the old estimator returned the largest
    divisor of it under max_step (2500 for 5000, 3000 for 6000), a step the clock does not
    have."""
    run, _ = bench
    rng = np.random.default_rng(3)
    t = np.cumsum(rng.integers(60, 200, 3000)) + 10 ** 9
    q, frac = run.clock_step_of((t // step) * step + 11)
    assert q == step
    assert frac == 1.0


def test_tsc_values_past_int64(bench):
    """fp_ticks() is a uint64: readings at or past 2**63 (a TSC the hypervisor offset that
    far) are differences of a few ticks apart, not an OverflowError."""
    run, _ = bench
    rng = np.random.default_rng(4)
    t = np.cumsum(rng.integers(60, 200, 3000))
    ticks = [2 ** 63 + int(x) for x in (t // 26) * 26]
    assert run.clock_step_of(ticks) == (26, 1.0)


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


def test_this_hosts_clock_step_matches_the_schema(bench):
    jsonschema = pytest.importorskip("jsonschema")
    run, _ = bench
    res = _committed()
    cs = run.clock_step(1000)
    if cs is not None:
        res["machine"]["clock_step"] = cs
    jsonschema.validate(res, _schema())
