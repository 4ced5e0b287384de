"""The bench's figures measure what their labels say, with or without its optional packages:
percentiles without hdrhistogram pick the sample the histogram would, a replay's run-queue wait
is never more than its time off the CPU, the results are stamped with the commit they measured
(and "-dirty" only where the code differs from it, not where an earlier run wrote its results),
the peers' BLAS pools hold one thread whatever the caller's environment says, and the MLP
kernel's GFLOP/s is printed where the CPU has no FMA rate to compare with. Nothing here looks
at how fast anything ran: only at which samples, windows and fields a figure is made of."""
import json
import os
import subprocess
import sys
import types

import numpy as np
import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
BENCH = os.path.join(ROOT, "bench")


def _without_hdrh(monkeypatch):
    # a None entry in sys.modules makes `import hdrh.histogram` raise ImportError, as on a
    # host where the package is not installed
    monkeypatch.setitem(sys.modules, "hdrh", None)
    monkeypatch.setitem(sys.modules, "hdrh.histogram", None)


@pytest.mark.parametrize("n", [2, 3, 44, 1218, 3000])
def test_percentiles_without_hdrhistogram_are_the_histograms(bench, monkeypatch, n):
    """Below 2048 ns a 3-digit HdrHistogram is exact, so the figures computed from the sorted
    samples must be the histogram's to the ns: np.percentile interpolated (a p50 of two calls
    that no call took) and the plotted series rounded ranks up where the histogram rounds half
    up."""
    pytest.importorskip("hdrh.histogram")
    _, report = bench
    v = np.random.default_rng(n).integers(1, 2000, n)
    with_hdr = report.Dist.of(v)
    assert with_hdr._h is not None
    _without_hdrh(monkeypatch)
    without = report.Dist.of(v)
    assert without._h is None
    assert without.summary() == {**with_hdr.summary(), "mean": without.summary()["mean"]}
    assert without.series() == with_hdr.series()
    # every percentile is a time some call took
    assert set(without.q.values()) <= set(float(x) for x in v)
