"""Layer: one dense layer of an MLP, y = activation(weight @ x + bias)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fastpath._checks import one_of
from fastpath.errors import ModelError
from fastpath.model._arrays import MAX_WIDTH, _cached_hash, _f32, _frozen, _key

ACTIVATIONS = ("identity", "relu", "tanh", "sigmoid")


@dataclass(frozen=True, eq=False)
class Layer:
    """Dense layer: y = activation(weight @ x + bias); weight is (out, in)."""
    weight: np.ndarray
    bias: np.ndarray
    activation: str = "identity"

    def __post_init__(self) -> None:
        w = _f32(self.weight, "layer weight", 2)
        b = _f32(self.bias, "layer bias", 1)
        if b.shape[0] != w.shape[0]:
            raise ModelError(f"bias has {b.shape[0]} values but weight has {w.shape[0]} rows")
        if not (1 <= w.shape[0] <= MAX_WIDTH and 1 <= w.shape[1] <= MAX_WIDTH):
            raise ModelError(f"layer shape {w.shape} outside 1..{MAX_WIDTH}")
        if not one_of(self.activation, ACTIVATIONS):
            raise ModelError(f"activation {self.activation!r} not supported; expected one of "
                             f"{ACTIVATIONS}")
        object.__setattr__(self, "activation", str(self.activation))
        object.__setattr__(self, "weight", _frozen(w))
        object.__setattr__(self, "bias", _frozen(b))

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return _key(self, ("weight", "bias", "activation")) == \
            _key(other, ("weight", "bias", "activation"))

    def __hash__(self) -> int:
        return _cached_hash(self, ("weight", "bias", "activation"))

    def __reduce__(self):
        # copy.deepcopy and pickle rebuild through the constructor: restored as plain state,
        # the arrays came back writable (and unchecked)
        return (self.__class__, (self.weight, self.bias, self.activation))
