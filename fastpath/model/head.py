"""Head: how step() turns a model's outputs into (signal, confidence)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fastpath._checks import one_of
from fastpath.errors import InputError, ModelError
from fastpath.model._arrays import _F32_MAX, _numbers

# head kind -> the output indices it reads, in order, by default
HEAD_KINDS = {"tanh_sigmoid": (0, 1), "regression": (0,), "classifier3": (0, 1, 2),
              "classifier2": (0, 1)}
# how far outside [0, 1] a classifier head's input may be and still be read as a probability
# (float32 rounding); the C core's FP_PROB_TOL (csrc/fp_math.h)
PROB_TOL = 1e-4
_F32_TINY = float(np.finfo(np.float32).tiny)
# how to give a head on the command line (calibrate, serve, doctor take a model file)
_CLI_HEAD = ("; on the command line (calibrate, serve, doctor) give it with --head "
             "KIND[:OUTPUTS][@SCALE], e.g. --head regression:0")


@dataclass(frozen=True)
class Head:
    """How step() turns the model's outputs into (signal in [-1, 1], confidence in [0, 1]).

    kind:
      "tanh_sigmoid"  two raw outputs: signal = tanh(out[a]), confidence = sigmoid(out[b]);
                      outputs = (a, b), default (0, 1)
      "regression"    one predicted value: signal = tanh(out[a] / scale), confidence =
                      |signal|; outputs = (a,), default (0,); scale is fitted by calibrate
                      (fastpath.tuning.fit_head_scale) so typical predictions use the range
      "classifier3"   down / flat / up probabilities: signal = p(up) - p(down), confidence =
                      the largest probability; outputs = (down, flat, up), default (0, 1, 2)
      "classifier2"   down / up probabilities, the same formulas; outputs = (down, up)
    """
    kind: str = "tanh_sigmoid"
    scale: float = 1.0
    outputs: tuple = ()

    def __post_init__(self) -> None:
        if not one_of(self.kind, HEAD_KINDS):
            raise ModelError(f"head kind {self.kind!r} not supported; expected one of "
                             f"{tuple(HEAD_KINDS)}")
        s = self.scale
        # the engine divides by the scale in float32: a scale finite in float64 only (1e39)
        # or one that rounds to 0 there (1e-46) would be refused by the C core as a bug
        if isinstance(s, bool) or not isinstance(s, (int, float, np.integer, np.floating)) or \
                not (np.isfinite(s) and _F32_TINY <= s <= _F32_MAX):
            raise ModelError(f"head scale must be a finite number > 0 that float32 holds (in "
                             f"[{_F32_TINY:.3g}, {_F32_MAX:.4g}]), got {s!r}")
        if isinstance(self.outputs, (int, np.integer)) and not isinstance(self.outputs, bool):
            # Head("regression", s, 0) was a TypeError ("'int' object is not iterable")
            raise ModelError(f"head outputs must be a tuple of output indices, e.g. "
                             f"({int(self.outputs)},), got the int {self.outputs!r}")
        try:
            outs = tuple(self.outputs) or HEAD_KINDS[self.kind]
        except TypeError:
            raise ModelError(f"head outputs must be a tuple of output indices, got "
                             f"{self.outputs!r}") from None
        if len(outs) != len(HEAD_KINDS[self.kind]) or not all(
                isinstance(i, (int, np.integer)) and not isinstance(i, bool) and i >= 0
                for i in outs):
            raise ModelError(f"head {self.kind!r} reads {len(HEAD_KINDS[self.kind])} output "
                             f"indices (>= 0), got {self.outputs!r}")
        object.__setattr__(self, "scale", float(s))
        object.__setattr__(self, "outputs", tuple(int(i) for i in outs))

    @classmethod
    def default_for(cls, n_outputs: int, post: str) -> "Head":
        """The head a model gets when none is given: probabilities (softmax / logistic2) of
        2 or 3 classes are a classifier, one output is a regression, two raw outputs are
        tanh / sigmoid; anything else must name its head."""
        if post in ("softmax", "logistic2"):
            if n_outputs in (2, 3):
                return cls("classifier2" if n_outputs == 2 else "classifier3")
        elif n_outputs == 1:
            return cls("regression")
        elif n_outputs == 2:
            return cls("tanh_sigmoid")
        raise ModelError(f"the last layer has {n_outputs} outputs and no head was given: without "
                         f"one the last layer must have 2 outputs (tanh / sigmoid head), 1 "
                         f"(regression head) or, after a softmax / logistic2 post transform, 2 or "
                         f"3 class probabilities (classifier head); give a head, e.g. "
                         f"Head('classifier3', outputs=(down, flat, up)) or "
                         f"Head('regression', outputs=(i,)){_CLI_HEAD}")

    def check(self, n_outputs: int) -> None:
        bad = [i for i in self.outputs if i >= n_outputs]
        if bad:
            raise ModelError(f"head {self.kind!r} reads output(s) {bad} but the model has "
                             f"{n_outputs} output(s)")
        if len(set(self.outputs)) != len(self.outputs):
            raise ModelError(f"head {self.kind!r} reads the same output twice: {self.outputs}")

    def apply(self, out: np.ndarray) -> tuple:
        """(signal, confidence) for outputs (..., n_outputs), in float64 numpy (the reference
        of the C heads). A classifier head reads probabilities: a finite output outside
        [0, 1] (beyond PROB_TOL, float32 rounding) is an InputError, as the engine refuses
        such a tick; within the tolerance the answer is clamped to its range, as there."""
        i = self.outputs
        o = _head_outputs(out, max(i) + 1, f"head {self.kind!r} (outputs {i})")
        if self.kind == "tanh_sigmoid":
            return np.tanh(o[..., i[0]]), _sigmoid(o[..., i[1]])
        if self.kind == "regression":
            s = np.tanh(o[..., i[0]] / self.scale)
            return s, np.abs(s)
        off = (o < -PROB_TOL) | (o > 1.0 + PROB_TOL)        # NaN stays NaN, as before
        if off.any():
            at = tuple(int(v) for v in np.argwhere(off)[0])
            row = "" if len(at) == 1 else f" of row {at[0] if len(at) == 2 else at[:-1]}"
            raise InputError(f"head {self.kind!r} (outputs {i}) reads class probabilities, "
                             f"each in [0, 1]; output {at[-1]}{row} is {float(o[at]):.6g}: "
                             f"margins or scores, not probabilities (give a head for raw "
                             f"outputs, e.g. Head('regression', outputs=(i,)))")
        return (np.clip(o[..., i[-1]] - o[..., i[0]], -1.0, 1.0),
                np.clip(o.max(axis=-1), 0.0, 1.0))

    def to_json(self) -> dict:
        return {"kind": self.kind, "scale": self.scale, "outputs": list(self.outputs)}


def _head_outputs(out: Any, need: int, what: str) -> np.ndarray:
    """out as float64 (..., n) with n >= need, what a head reads by index; an InputError
    naming the head otherwise (too few outputs was numpy's IndexError, text its ValueError)."""
    try:
        o = _numbers(out, np.float64)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{what}: outputs must be numbers, got {type(out).__name__} "
                         f"({exc})") from None
    if o.ndim < 1 or o.shape[-1] < need:
        raise InputError(f"{what}: outputs must have shape (..., n) with n >= {need}, got "
                         f"{o.shape}")
    return o


def _sigmoid(o: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-o)) in o's float type: where exp(-o) overflows (o below -709 in float64,
    -88 in float32) it gives 0, as the engine answers, without numpy's overflow warning (an
    exception under -W error)."""
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-o))
