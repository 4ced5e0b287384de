"""bench/run.py's notes on slow calls: a stall is put down to the OS only with a run-queue
reading as evidence."""



def _stalled_row(off_cpu_ms: float, wait_ms):
    """A step() row as bench/run.py writes it: 100,000 calls, one of them 51.94 ms, and the
    replay's own time off the CPU."""
    return {"short": "real miss", "samples": 100_000,
            "python": {"p50": 331.0, "max": 51_937_279.0},
            "stalls": {"calls_over_1ms": 1,
                       "replay": {"wall_ms": 120.0, "off_cpu_ms": off_cpu_ms,
                                  "runqueue_wait_ms": wait_ms, "involuntary_switches": 1}}}


def test_step_row_stall_note_follows_the_evidence(bench):
    """A step() call over 1 ms is put down to "a stall, not the engine" only when the replay
    was off the CPU for about that long. A replay that was on the CPU the whole time (off-CPU
    ~0: a page-fault storm, a hugepage compaction, the engine itself) must not be excused as
    a stall: the note then says the time was spent on the CPU."""
    _, report = bench
    stalled = report.timing_notes({"step": {"miss": _stalled_row(50.9, 50.8)}})
    assert len(stalled) == 1 and "not the engine" in stalled[0]
    on_cpu = report.timing_notes({"step": {"miss": _stalled_row(0.0, 0.0)}})
    assert len(on_cpu) == 1 and on_cpu[0].startswith("real miss: ")
    assert "51.94 ms" in on_cpu[0] and "0.0 ms" in on_cpu[0]
    assert "not the engine" not in on_cpu[0], on_cpu[0]
    assert "on the CPU" in on_cpu[0], on_cpu[0]


def test_batch_note_names_no_cause_without_a_run_queue_reading(bench):
    """A step_batch call that lost 50 ms off the CPU where the OS gave no per-thread run-queue
    wait (None): the note cannot know whether another task, RT throttling or the hypervisor
    held the thread, and must not say it "waited in the run queue"."""
    run, report = bench
    wall = [61.2e6, 115.5e6, 62.1e6, 61.8e6, 61.5e6]
    cpu = [61.2e6, 65.5e6, 62.1e6, 61.8e6, 61.5e6]
    s = run.batch_runs_summary(wall, cpu, [None] * 5, [None] * 5, 200_000, 2000, False)
    assert s["descheduled_runs"] == 1 and s["runqueue_wait_ms"] == [None] * 5
    for policy in ("SCHED_FIFO", "SCHED_OTHER"):
        notes = report.timing_notes({"placement": {"policy_granted": policy}, "batch": {},
                                     "replay": {"tradeoff": [{"policy": "p",
                                                              "batch_timing": s}]}})
        assert len(notes) == 2 and notes[1].startswith("1 of 5 ") and "50.0 ms" in notes[1]
        assert "run queue" not in notes[1], notes[1]
        assert "not known" in notes[1], notes[1]
