"""Review of the engine clock's handling of a TSC that goes back: what the change left open.

Each test failed before its fix. Like tests/test_review21_lead.py, they move fields of a
module's own copy of the clock through ctypes (a TSC reset cannot be made on demand; an anchor
taken "in the future" is what a TSC that went back looks like to every later reading) and put
them back, re-anchoring at the real TSC.
"""
import time

import pytest

from fastpath import _kernels as K
from helpers.clock import JUMP, _clock, _needs_tsc, _Restore


def _go_back(clk):
    """The anchor JUMP ticks ahead of the TSC: what every reading after a TSC that went back
    by JUMP sees."""
    clk.base_tick += JUMP
    clk.fit_tick += JUMP


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
        _go_back(clk)
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
            _go_back(clk)
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


def test_readings_after_the_tsc_went_back_cover_what_the_mapping_gained():
    """The back re-anchor started the mapping at CLOCK_MONOTONIC plus the lead the old mapping
    had at its anchor, on the claim that the mapping gains nothing on CLOCK_MONOTONIC between
    anchors. While NTP slews CLOCK_MONOTONIC (up to 500 ppm) the mapping, at the rate fitted
    over the whole baseline, gains up to 0.5 ms a period: readings after the jump went back
    past readings taken before it by that much, and the engine refused steps without ts_ns
    until CLOCK_MONOTONIC caught up. Made here by a mapping 400 ppm fast for 0.2 s (80 us)."""
    _needs_tsc(K.clock_info())
    clk = _clock(K)
    with _Restore(clk, lambda: K.clock_reanchor()):
        assert any(K.clock_reanchor() for _ in range(50))
        backs0 = K.clock_info()["tsc_backs"]
        clk.map_ns_per_tick *= 1 + 4e-4
        time.sleep(0.2)
        jump = clk.base_tick + JUMP, clk.fit_tick + JUMP
        before = K.clock_ticks_to_mono_ns(K.clock_ticks())
        clk.base_tick, clk.fit_tick = jump
        after = K.clock_ticks_to_mono_ns(K.clock_ticks())
        assert K.clock_info()["tsc_backs"] == backs0 + 1
        assert after >= before - 1000, (before - after)
        assert after - K.clock_mono_ns() < 2_000_000


def test_a_start_timed_out_with_placement_stuck_still_removes_its_segment(monkeypatch):
    """A server whose start timed out while its placement was still stuck past the wait for
    the thread (2 s) was handed to the exit hook through a WeakSet: nothing else held it, so
    once the thread ended (the placement returned, the loop saw the stop) the server was
    collected, and the worker's finalizer unmaps but does not remove the segment: it stayed
    in /dev/shm until the next serve under that name. The thread removes it now, as soon as
    the placement returns."""
    import gc
    import os
    import threading
    from fastpath import ServeError
    from fastpath.serving import server as S
    from helpers.serving import cfg, uname

    go = threading.Event()

    def stuck_place(self):
        go.wait(30)
        return {"placed": False, "why": "test: placement stuck"}

    monkeypatch.setattr(S.Server, "_place", stuck_place)
    monkeypatch.setattr(S, "_START_JOIN_S", 0.05, raising=False)
    name = uname()
    path = f"/dev/shm/fastpath.{name}"
    try:
        with pytest.raises(ServeError, match="did not start within"):
            S.Server(name, config=cfg(), start_timeout=0.05)
        assert os.path.exists(path)       # the placement has not returned yet
    finally:
        go.set()
    for t in threading.enumerate():
        if t.name == f"fastpath-serve:{name}":
            t.join(30)
    gc.collect()
    assert not os.path.exists(path), sorted(os.listdir("/dev/shm"))
