"""fastpath.step has the signature of Engine.step."""
import inspect

import fastpath
from fastpath import Engine


def test_step_has_the_signature_of_engine_step():
    # a builtin (binding=False) without an Argument Clinic line: inspect.signature raised
    # ValueError, and help() showed no parameters
    sig = inspect.signature(fastpath.step)
    want = inspect.signature(Engine.step)
    assert list(sig.parameters) == [p for p in want.parameters if p != "self"]
    assert [p.default for p in sig.parameters.values()] == \
        [p.default for n, p in want.parameters.items() if n != "self"]
    assert fastpath.step.__doc__.lstrip().startswith("fastpath.step(")
