"""The engine clock seen from Python: fp_clock_t as a ctypes structure and a guard that restores it."""
import ctypes

import pytest




class _Clock(ctypes.Structure):
    """fp_clock_t (csrc/fp_clock.h), field for field."""
    _fields_ = [("use_tsc", ctypes.c_int), ("ns_per_tick", ctypes.c_double),
                ("read_cost_ns", ctypes.c_double), ("cal_samples", ctypes.c_int),
                ("cal_bracket_ns", ctypes.c_double), ("reanchors", ctypes.c_uint64),
                ("reanchor_ticks", ctypes.c_uint64), ("fit_tick", ctypes.c_uint64),
                ("fit_ns", ctypes.c_int64), ("seq", ctypes.c_uint32),
                ("base_tick", ctypes.c_uint64), ("base_ns", ctypes.c_int64),
                ("map_ns_per_tick", ctypes.c_double), ("steps", ctypes.c_uint64),
                ("lead_ns", ctypes.c_int64), ("tsc_backs", ctypes.c_uint64)]


def _clock(module):
    return _Clock.in_dll(ctypes.CDLL(module.__file__), "fp_clock")


_SAVED = ("fit_tick", "fit_ns", "ns_per_tick", "map_ns_per_tick", "base_tick", "base_ns",
          "lead_ns")


class _Restore:
    """Put a clock's anchor and fit back the way they were (the rest of the suite shares it),
    then re-anchor at the real TSC."""

    def __init__(self, clk, reanchor):
        self.clk, self.reanchor = clk, reanchor

    def __enter__(self):
        self.saved = {f: getattr(self.clk, f) for f in _SAVED}
        return self.clk

    def __exit__(self, *exc):
        for f, v in self.saved.items():
            setattr(self.clk, f, v)
        self.reanchor()


def _needs_tsc(info):
    if info["source"] != "tsc":
        pytest.skip("no invariant TSC: the clock is CLOCK_MONOTONIC itself")


JUMP = 10 ** 12   # ticks the TSC "went back" (minutes at any TSC rate)
