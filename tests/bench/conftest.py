"""The bench's modules by job, beside the `bench` fixture (run.py and _report.py): where the
machine is read (_machine), the timing tools (_harness) and the replays (_replays), as run.py
imported them."""
import sys

import pytest


def _module_of(bench, name):
    run, _ = bench
    mod = sys.modules[getattr(run, name).__module__]
    return mod


@pytest.fixture(scope="session")
def bench_machine(bench):
    return _module_of(bench, "machine_facts")


@pytest.fixture(scope="session")
def bench_harness(bench):
    return _module_of(bench, "mlp_kernel")


@pytest.fixture(scope="session")
def bench_replays(bench):
    return _module_of(bench, "replay_step")
