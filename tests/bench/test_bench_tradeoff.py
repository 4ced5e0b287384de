"""The bench's step_batch figures (cache trade-off rows, throughput) are taken from several timed
calls, not one: each row keeps every call's wall and thread CPU time, reports the median (the
throughput the best), counts the calls that lost time off the CPU, and the printed notes say why.
Nothing here looks at how fast anything ran: the figures are checked against the row's own
samples only.
"""

from collections import namedtuple

import numpy as np
import pytest

from fastpath import Engine, Model, lob


@pytest.fixture(scope="module")
def stream(bench):
    run, _ = bench
    bs = lob.generate_stream(3000, n_symbols=8, seed=run.DEFAULT_SEED)
    raws = lob.raw_from_book(bs)
    model = Model.load(run.DEMO_MODEL)
    ref = Engine(model, config={"cache": {"enabled": False}}).step_batch(raws, bs.symbols, bs.ts_ns)
    return model, bs, raws, ref.signal.astype(np.float64)


def test_tradeoff_rows_keep_every_timed_call(bench, stream, bench_replays):
    _, report = bench
    model, bs, raws, ref = stream
    edges = np.linspace(0, len(raws), 11).astype(int)
    rows = bench_replays.cache_tradeoff(model, raws, bs.symbols, bs.ts_ns, bs, ref, edges, runs=3,
                                        warm=500)
    assert [r["policy"] for r in rows] == ["bundle policy"] + [t[0] for t in bench_replays.TRADEOFF]
    for r in rows:
        bt = r["batch_timing"]
        assert bt["reported"] == "median" and bt["runs"] == 3
        assert bt["ticks"] == len(raws) and bt["warmup_ticks"] == 500
        assert not bt["fresh_engine_per_run"] and bt["round_robin_with"] == len(rows)
        for key in ("ns_per_tick", "cpu_ns_per_tick", "off_cpu_ms", "involuntary_switches",
                    "minor_faults"):
            assert len(bt[key]) == 3, key
        assert r["batch_ns_per_tick"] == bt["median_ns_per_tick"] == pytest.approx(
            float(np.median(bt["ns_per_tick"])))
        assert bt["min_ns_per_tick"] == min(bt["ns_per_tick"])
        assert bt["max_ns_per_tick"] == max(bt["ns_per_tick"])
        assert min(bt["off_cpu_ms"]) >= 0 and 0 <= bt["descheduled_runs"] <= 3
        # the answers of the timed calls are the policy's own, as a fresh engine gives them
        eng = Engine(model, config={"cache": {"enabled": True, "cos_threshold": r["cos_threshold"],
                                              "norm_tol": r["norm_tol"]}})
        assert r["hits"] == int(eng.step_batch(raws, bs.symbols, bs.ts_ns).cached.sum())
        assert sum(r["miss_reasons"].values()) == len(raws) - r["hits"]
    # the printed table carries the spread, and the notes say how the figure was taken
    title, header, cells = report.tradeoff_table({"stream": {"regimes": list(bs.regime_names)},
                                                  "replay": {"tradeoff": rows}})
    assert "median of 3 timed calls" in title
    col = header.index("ns/tick (min-max)")
    for r, c in zip(rows, cells):
        bt = r["batch_timing"]
        assert c[col].startswith(f"{r['batch_ns_per_tick']:.0f} ns ({bt['min_ns_per_tick']:.0f}-"
                                 f"{bt['max_ns_per_tick']:.0f}")


def test_batch_throughput_best_and_spread(stream, bench_replays):
    model, bs, raws, _ = stream
    out = bench_replays.batch_throughput(model, raws, bs.symbols, bs.ts_ns, runs=3)
    for name in ("cache_off", "cache_on"):
        b = out[name]
        bt = b["batch_timing"]
        assert bt["reported"] == "best" and bt["fresh_engine_per_run"] and bt["runs"] == 3
        assert b["ns_per_tick"] == bt["min_ns_per_tick"] == min(bt["ns_per_tick"])
        assert b["ticks_per_s"] == pytest.approx(1e9 / b["ns_per_tick"])
        assert b["median_ns_per_tick"] == bt["median_ns_per_tick"]
        assert b["ticks"] == len(raws)


def test_summary_counts_a_call_taken_off_the_cpu(bench, bench_harness):
    """The calls of a full-stream trade-off row seen in a full bench run: one of them lost 50 ms
    to RT throttling (wall 115.5 ms, thread CPU 65.5 ms); the median leaves it out and the
    summary counts it."""
    _, report = bench
    ticks = 200_000
    wall = [61.2e6, 115.5e6, 62.1e6, 61.8e6, 61.5e6]
    cpu = [61.2e6, 65.5e6, 62.1e6, 61.8e6, 61.5e6]
    s = bench_harness.batch_runs_summary(wall, cpu, [0, 2, 0, 0, 0], [0] * 5, ticks, 2000, False,
                               [0, 49.9e6, 0, 0, 0])
    assert s["descheduled_runs"] == 1
    assert s["runqueue_wait_ms"] == pytest.approx([0, 49.9, 0, 0, 0])
    assert s["off_cpu_ms"][1] == pytest.approx(50.0)
    assert s["median_ns_per_tick"] == pytest.approx(61.8e6 / ticks)
    assert s["max_ns_per_tick"] == pytest.approx(115.5e6 / ticks)
    # a call that ran slower on the CPU (no time off it) is spread, not a descheduled call
    s2 = bench_harness.batch_runs_summary([90e6, 61e6, 62e6], [89.9e6, 61e6, 62e6], [0, 0, 0], [0, 0, 0],
                                ticks, 2000, False)
    assert s2["descheduled_runs"] == 0 and s2["max_ns_per_tick"] == pytest.approx(90e6 / ticks)
    # per-thread counters missing (not Linux): kept as None, the rest still summarised
    s3 = bench_harness.batch_runs_summary([61e6], [61e6], [None], [None], ticks, 2000, True)
    assert s3["involuntary_switches"] == [None] and s3["runqueue_wait_ms"] == [None]
    assert s3["runs"] == 1

    row = {"policy": "cos 0.9999, norm 0.005", "batch_timing": {"reported": "median", **s}}
    for policy, cause in (("SCHED_FIFO", "RT throttling"), ("SCHED_OTHER", "another task")):
        notes = report.timing_notes({"placement": {"policy_granted": policy},
                                     "replay": {"tradeoff": [row]}, "batch": {}})
        assert len(notes) == 2 and "median of 5 timed calls" in notes[0]
        assert cause in notes[1] and "cos 0.9999, norm 0.005" in notes[1] and "50.0 ms" in notes[1]
        assert notes[1].startswith("1 of 5 ") and "hypervisor" not in notes[1]
    # off the CPU with no run-queue wait: the guest kernel did not hold the thread
    s4 = bench_harness.batch_runs_summary(wall, cpu, [0] * 5, [0] * 5, ticks, 2000, False, [0] * 5)
    notes = report.timing_notes({"placement": {"policy_granted": "SCHED_FIFO"}, "batch": {},
                                 "replay": {"tradeoff": [{"policy": "p", "batch_timing": s4}]}})
    assert "hypervisor" in notes[1] and "RT throttling" not in notes[1]
    # results written before the calls were kept: no notes, and the table cell says so
    assert report.timing_notes({"replay": {"tradeoff": [{"policy": "x"}]}, "batch": {}}) == []
    assert report._batch_spread(None) == "-"


def test_replays_that_answer_differently_are_refused(bench_harness):
    """Every timed call replays the stream from the same state, so all answer the same; an
    engine whose reset() forgot something would make the calls differ, and the median of
    different replays would not be one figure."""
    Batch = namedtuple("Batch", "signal cached")

    class Drifting:
        calls = 0

        def reset(self):
            pass

        def step_batch(self, raws, syms, ts):
            Drifting.calls += 1
            return Batch(np.full(len(raws), float(Drifting.calls), np.float32),
                         np.zeros(len(raws), np.bool_))

    raws = np.zeros((10, 4), np.float32)
    syms = np.zeros(10, np.int32)
    ts = np.arange(10, dtype=np.int64)
    with pytest.raises(RuntimeError, match="answered differently"):
        bench_harness.time_batches([Drifting], raws, syms, ts, runs=3, warm=2)


def test_calls_go_round_robin_over_the_rows(bench_harness):
    """The rows of a table are timed in turn (A B C A B C ..), each call after its warm-up and a
    reset(): a machine that slows down during the phase slows every row alike, instead of making
    the last rows look dearer."""
    Batch = namedtuple("Batch", "signal cached")
    log = []

    def maker(name):
        class Fake:
            def reset(self):
                log.append((name, "reset"))

            def step_batch(self, raws, syms, ts):
                log.append((name, len(raws)))
                return Batch(np.zeros(len(raws), np.float32), np.zeros(len(raws), np.bool_))
        return Fake

    raws = np.zeros((10, 4), np.float32)
    syms = np.zeros(10, np.int32)
    ts = np.arange(10, dtype=np.int64)
    out = bench_harness.time_batches([maker("A"), maker("B")], raws, syms, ts, runs=2, warm=3)
    timed = [name for name, what in log if what == 10]
    assert timed == ["A", "B", "A", "B"]
    # before each timed call: reset, warm-up, reset
    for i, entry in enumerate(log):
        if entry[1] == 10:
            assert log[i - 3:i] == [(entry[0], "reset"), (entry[0], 3), (entry[0], "reset")]
    assert [o[2]["runs"] for o in out] == [2, 2] and out[0][2]["round_robin_with"] == 2


def test_step_rows_say_which_calls_sat_through_a_stall(bench, stream, bench_replays):
    """A step() replay keeps its time off the CPU, each per-call row counts its calls over 1 ms,
    and the notes name such a row with the replay's off-CPU time (the committed results had a
    51.9 ms real-miss max, an RT-throttling stall, with nothing saying so)."""
    _, report = bench
    model, bs, raws, _ = stream
    rp = bench_replays.replay_step(model, {"enabled": True}, raws, bs.symbols, bs.ts_ns, 0, 500)
    sc = rp["sched"]
    assert sc["wall_ms"] > 0 and 0 <= sc["off_cpu_ms"] <= sc["wall_ms"]
    sel = np.ones(len(raws), np.bool_)
    rp["py"][7] = 51_937_279                       # as if call 7 had sat through the stall
    row, _, _ = bench_replays.step_row("all", "all calls", "every call", {"enabled": True}, rp, sel)
    assert row["stalls"]["calls_over_1ms"] == int((rp["py"] > 1_000_000).sum()) >= 1
    assert row["stalls"]["replay"] is sc
    notes = report.timing_notes({"step": {"miss": row}})
    assert len(notes) == 1 and notes[0].startswith("all calls: ")
    assert "51.94 ms" in notes[0] and f"{sc['off_cpu_ms']:.1f} ms" in notes[0]
    # a row without slow calls, or from results written before, adds nothing
    row["stalls"]["calls_over_1ms"] = 0
    assert report.timing_notes({"step": {"miss": row}}) == []
    del row["stalls"]
    assert report.timing_notes({"step": {"miss": row}}) == []
