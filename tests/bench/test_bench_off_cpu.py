"""Time off the CPU in the bench's replays: a replay's (and a batch call's) run-queue wait is part
of its time off the CPU, and reading the counters is not, on a stand-in host that preempts the
thread.
"""

import types

import pytest


class _PreemptingHost:
    """Fake clocks (reading them is free) of a thread that is preempted for wait_ns on its
    way back from every run-queue counter read (a syscall: where a kernel reschedules), as on
    a shared core; a counter read itself costs read_ns of CPU (the /proc file). The wall clock
    and the CPU clock advance together while it runs; a wait advances the wall clock and the
    run-queue counter only."""

    def __init__(self, wait_ns=5_000_000, read_ns=0):
        self.wall = self.cpu = self.wait = 0
        self.WAIT_NS, self.READ_NS = wait_ns, read_ns

    def _run(self, ns=0):
        self.wall += ns
        self.cpu += ns

    def perf_counter_ns(self):
        self._run()
        return self.wall

    def thread_time_ns(self):
        self._run()
        return self.cpu

    def counters(self):
        self._run(self.READ_NS)
        got = (0, 0, self.wait)
        self.wall += self.WAIT_NS
        self.wait += self.WAIT_NS
        return got


@pytest.fixture(params=[(5_000_000, 0)])
def host(bench_harness, bench_replays, monkeypatch, request):
    h = _PreemptingHost(*request.param)
    clock = types.SimpleNamespace(perf_counter_ns=h.perf_counter_ns,
                                  thread_time_ns=h.thread_time_ns)
    for mod in (bench_harness, bench_replays):      # time_batches, replay_step
        monkeypatch.setattr(mod, "time", clock)
        monkeypatch.setattr(mod, "thread_counters", h.counters)
    return h


@pytest.fixture(scope="module")
def small(bench):
    from fastpath import Model, lob
    run, _ = bench
    bs = lob.generate_stream(400, n_symbols=4, seed=run.DEFAULT_SEED)
    return Model.load(run.DEMO_MODEL), lob.raw_from_book(bs), bs.symbols, bs.ts_ns


def test_replay_runqueue_wait_is_part_of_its_time_off_cpu(host, small, bench_replays):
    """The replay's printed note reads "spent X ms off the CPU, Y ms of it waiting in the run
    queue": Y was read over a wider window than X (counters outside the wall-clock pair), so a
    preemption at a counter read made Y larger than X (42.5 ms "of" 35.2 ms on this host)."""
    model, raws, syms, ts = small
    sched = bench_replays.replay_step(model, {"enabled": False}, raws, syms, ts, 0, 50)["sched"]
    assert sched["runqueue_wait_ms"] > 0
    assert sched["runqueue_wait_ms"] <= sched["off_cpu_ms"]


@pytest.mark.parametrize("host", [(0, 50_000)], indirect=True)
def test_counter_reads_are_not_time_off_cpu(host, small, bench_replays, bench_harness):
    """The run-queue counters' own reads (a /proc file: tens of us of CPU) sit inside the CPU
    clock's window: outside it they were time off the CPU, and every 1 ms call of a small
    stream was counted as descheduled by a hypervisor."""
    from fastpath import Engine
    model, raws, syms, ts = small
    sched = bench_replays.replay_step(model, {"enabled": False}, raws, syms, ts, 0, 50)["sched"]
    assert sched["off_cpu_ms"] * 1e6 < host.READ_NS
    (_, _, bt), = bench_harness.time_batches([lambda: Engine(model)], raws, syms, ts, runs=2,
                                             warm=50)
    assert all(off * 1e6 < host.READ_NS for off in bt["off_cpu_ms"])
    assert bt["descheduled_runs"] == 0


def test_batch_call_runqueue_wait_is_part_of_its_time_off_cpu(host, small, bench_harness):
    """The same for each timed step_batch call (batch_timing: off_cpu_ms, runqueue_wait_ms),
    on which the notes decide what held a descheduled call."""
    from fastpath import Engine
    model, raws, syms, ts = small
    (_, _, bt), = bench_harness.time_batches([lambda: Engine(model)], raws, syms, ts, runs=2,
                                             warm=50)
    assert len(bt["runqueue_wait_ms"]) == 2
    for wait, off in zip(bt["runqueue_wait_ms"], bt["off_cpu_ms"]):
        assert 0 < wait <= off
