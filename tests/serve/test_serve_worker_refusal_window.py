"""The serving worker runs fp_step too: a tick it refuses answers an error and leaves the symbol's
rolling window as a worker that never saw the tick."""

import os
import uuid

import numpy as np
import pytest

import fastpath
from fastpath import Engine, InputError
from helpers.refusing_models import N_SYM, engine_cfg as cfg, good_tick, mlp_model, spoil


def test_serving_worker_refusal_leaves_the_window(isa):
    """The serving worker calls fp_step too: a tick it refuses answers an error and leaves
    the symbol's window as it was (later answers equal a local twin's that never saw it)."""
    model = mlp_model(9, 3, True)
    rng = np.random.default_rng(4)
    config = {**cfg(isa),
              "serve": {"place": False, "idle": "yield", "idle_spin_ns": 50_000}}
    twin = Engine(model, config=cfg(isa))
    name = f"test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    t = 0
    with fastpath.serve(name, model, config), fastpath.connect(name, timeout=5) as c:
        for i in range(40):
            t += 1000
            x = good_tick(rng, 9)
            if i in (5, 6, 17, 30):
                with pytest.raises(InputError, match="not applied"):
                    c.step(spoil(x, ("out", "wfeat", "zfeat", "wfeat")[i % 4], 9), i % N_SYM, t)
                continue
            a, b = c.step(x, i % N_SYM, t), twin.step(x, i % N_SYM, ts_ns=t)
            assert (a.signal, a.confidence, a.cached) == (b.signal, b.confidence, b.cached), i
