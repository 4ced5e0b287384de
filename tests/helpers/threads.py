"""Threads in tests: a call run in its own thread with its result or exception kept, and the
one deadline every wait on a thread uses."""
import threading

import numpy as np

WAIT = 10.0     # seconds any wait of these tests may take before the test fails instead of hanging


def raw_tick(seed=0, n=256):
    """A 256-value raw tick of standard normals, the demo model's input."""
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


def run_in_thread(fn, *args):
    """fn(*args) in a thread; -> (thread, box) where box gets "r" (the result) or "e"."""
    box = {}

    def body():
        try:
            box["r"] = fn(*args)
        except BaseException as exc:        # reported by the test, in its own thread
            box["e"] = exc
    t = threading.Thread(target=body, daemon=True)
    t.start()
    return t, box
