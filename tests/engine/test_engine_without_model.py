"""How an Engine takes its model: a path or a Model, by position or keyword; without one, a
TypeError that says what it needs."""
import math

import numpy as np
import pytest

import fastpath
from fastpath import Engine


@pytest.mark.parametrize("args,kw", [((), {}), ((), {"config": {}}), ((), {"backend": "cpu"}),
                                     ((), {"config": None, "backend": "cpu"})])
def test_engine_without_a_model_says_what_it_needs(args, kw):
    """Defect: TypeError "__cinit__() takes at least 1 positional argument (0 given)"."""
    with pytest.raises(TypeError) as ei:
        Engine(*args, **kw)
    msg = str(ei.value)
    assert "__cinit__" not in msg
    for part in ("Engine needs a model", ".onnx", ".fpm", "fastpath.Model", "demo model",
                 "fastpath.configure"):
        assert part in msg, msg


F32 = np.float32


def test_engine_takes_its_model_every_way():
    from fastpath._build import DEMO_MODEL
    a = Engine(DEMO_MODEL)
    b = Engine(model=DEMO_MODEL, config={})
    c = Engine(a.model, "cpu", None)
    d = Engine(model=a.model, backend="cpu", config={"engine": {"n_symbols": 2}})
    assert a.model == b.model == c.model == d.model
    assert d.n_symbols == 2
    raw = np.linspace(-1, 1, a.raw_len).astype(F32)
    assert a.step(raw, 0).signal == c.step(raw, 0).signal
    with pytest.raises(fastpath.ModelError, match="fastpath.Model or a path"):
        Engine(None)
    with pytest.raises(TypeError):
        Engine(DEMO_MODEL, "cpu", None, 4)
    import inspect
    assert list(inspect.signature(Engine).parameters) == ["model", "backend", "config"]
    assert math.isfinite(a.step(raw, 1).signal)
