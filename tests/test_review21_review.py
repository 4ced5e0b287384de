"""Review of the engine clock's handling of a TSC that goes back: what the change left open.

Each test failed before its fix. Like tests/test_review21_lead.py, they move fields of a
module's own copy of the clock through ctypes (a TSC reset cannot be made on demand; an anchor
taken "in the future" is what a TSC that went back looks like to every later reading) and put
them back, re-anchoring at the real TSC.
"""
import time

import pytest

from fastpath import _kernels as K
from test_review21_lead import JUMP, _clock, _needs_tsc, _Restore


def test_a_reading_from_before_the_tsc_went_back_is_not_mapped_into_the_future():
    """A TSC reading taken just before the TSC went back and converted after another thread
    re-anchored on the new TSC (a VM paused, or a thread frozen for suspend, between its read
    and its conversion) is JUMP ticks past the new anchor: it was mapped that far into the
    future (minutes here, hours after a reset on resume). As a symbol's last tick, every later
    step() without ts_ns was then refused as time going backwards for that long. It maps as
    the TSC now: not before any reading taken before the jump, not after the clock now."""
    _needs_tsc(K.clock_info())
    clk = _clock(K)
    with _Restore(clk, lambda: K.clock_reanchor()):
        before = K.clock_ticks_to_mono_ns(K.clock_ticks())
        backs0 = K.clock_info()["tsc_backs"]
        clk.base_tick += JUMP
        clk.fit_tick += JUMP
        # read on the old TSC (JUMP ticks ahead of the TSC now), not converted yet
        t_old = K.clock_ticks() + JUMP
        # another thread's reading on the new TSC re-anchors
        K.clock_ticks_to_mono_ns(K.clock_ticks())
        assert K.clock_info()["tsc_backs"] == backs0 + 1
        v = K.clock_ticks_to_mono_ns(t_old)
        mono = K.clock_mono_ns()
        assert v >= before - 1000, (v - before)
        assert v <= mono + 2_000_000, f"{(v - mono) / 1e9:.1f} s in the future"


def test_a_forced_reanchor_soon_after_the_tsc_went_back_keeps_the_rate():
    """The back re-anchor restarts the rate's fit at its own sample. A forced re-anchor soon
    after refitted over that baseline of microseconds, against a tolerance sized for the
    calibration's 10 ms: two brackets' error passed as the new rate (every duration read with
    it) or, larger, was counted as a step between the clocks that never happened. Under 10 ms
    of baseline the rate in force is kept, and no step is counted."""
    _needs_tsc(K.clock_info())
    clk = _clock(K)
    for _attempt in range(5):
        with _Restore(clk, lambda: K.clock_reanchor()):
            clk.base_tick += JUMP
            clk.fit_tick += JUMP
            K.clock_ticks_to_mono_ns(K.clock_ticks())       # the back re-anchor
            fit_tick, k0 = clk.fit_tick, clk.ns_per_tick
            steps0 = K.clock_info()["steps"]
            assert any(K.clock_reanchor() for _ in range(50))
            if (clk.base_tick - fit_tick) * k0 >= 5_000_000:
                continue    # this process was descheduled for ms: not the case under test
            assert K.clock_info()["steps"] == steps0
            assert clk.ns_per_tick == k0
            return
        time.sleep(0.01)
    pytest.skip("could not re-anchor within 5 ms of the back re-anchor")
