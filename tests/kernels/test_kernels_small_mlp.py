"""The fused pass of small fp32 MLPs (all layers in one call, activations kept in registers
between layers) against the per-layer pass and a float64 reference, on every kernel set.

A model of two or more layers, each 1, 2, 4 or 8 blocks of 8 rows wide (1-8, 9-16, 25-32 or
57-64 outputs) and at most 128 KB of weights, runs fused where the set has a fused pass
(AVX-512, AVX2); any other model, and every one-layer model, runs layer by layer. So a model's
output must equal, bit for bit, its layers run one at a time as one-layer models: the fused
pass runs the per-layer pass's sums in the same order. On a set without a fused pass (scalar)
the check holds trivially and still runs, so each set is held to the same answers.
The AVX2 pass has two forms: hidden layers of up to 4 blocks kept in four registers, and a
model with an 8-block hidden layer, every layer after the first 1 or 8 blocks, kept in eight
(other models with an 8-block hidden layer run per layer there); the shapes below cover each,
and the models between them: every block count after every other, in the middle and last,
with input tails of every length in 1..7.
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fastpath import _kernels as K
from helpers.builders import ACTS, ISAS
from helpers.reference import act_ref

# widths of each block count the fused pass takes (nb = 1, 2, 4, 8), edges and middles
FUSED_WIDTHS = (1, 2, 7, 8, 9, 15, 16, 25, 31, 32, 57, 63, 64)


def _model(rng, dims, acts):
    ws = [(rng.standard_normal((dims[i + 1], dims[i])) / np.sqrt(dims[i])).astype(np.float32)
          for i in range(len(dims) - 1)]
    bs = [(rng.standard_normal(dims[i + 1]) * 0.3).astype(np.float32)
          for i in range(len(dims) - 1)]
    return ws, bs, list(acts)


def _layer_by_layer(isa, ws, bs, acts, x):
    h = x
    for w, b, a in zip(ws, bs, acts):
        h = K.PackedMLP([w], [b], [a], isa).forward(h)
    return h


def _ref(ws, bs, acts, x):
    h = x.astype(np.float64)
    for w, b, a in zip(ws, bs, acts):
        h = act_ref(w.astype(np.float64) @ h + b, a)
    return h


def _check(isa, dims, acts, seed):
    rng = np.random.default_rng(seed)
    ws, bs, acts = _model(rng, dims, acts)
    x = rng.standard_normal(dims[0]).astype(np.float32)
    P = K.PackedMLP(ws, bs, acts, isa)
    got = P.forward(x)
    np.testing.assert_array_equal(got, _layer_by_layer(isa, ws, bs, acts, x))
    np.testing.assert_array_equal(P.forward(x), got)        # the other row-group parity
    np.testing.assert_allclose(got, _ref(ws, bs, acts, x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dims", [(32, 16, 2), (128, 64, 32, 2), (16, 2), (1, 1, 1),
                                  (3, 5, 7, 2), (17, 31, 2),
                                  (200, 8, 64, 1), (130, 1, 2), (129, 64, 64, 64, 8),
                                  (64, 57, 25, 9, 1), (7, 64, 16),
                                  (37, 29, 64), (37, 13, 60, 5), (20, 3, 64, 64, 27),
                                  (16, 8, 8, 8, 2), (64, 32, 16, 2), (256, 32, 32, 2)])
@pytest.mark.parametrize("act", ACTS)
def test_small_mlp_matches_layer_by_layer(isa, dims, act):
    """Hidden layers with every activation (sigmoid's padding rows are 0.5, not 0: the next
    layer must not read them), the last one identity."""
    _check(isa, dims, [act] * (len(dims) - 2) + ["identity"], seed=sum(dims))


def test_every_width_pair(isa):
    """Each fused width feeding each other one, through a tail-heavy first layer (37 inputs:
    two full chunks and a 5-input tail) and into a 3-output layer."""
    for i, a in enumerate(FUSED_WIDTHS):
        for b in FUSED_WIDTHS[i % 3::3]:
            _check(isa, (37, a, b, 3), ["relu", "tanh", "identity"], seed=a * 100 + b)


def test_every_register_input_width(isa):
    """Every width a layer can hand over in registers (1-8, 9-16, 25-32, 57-64 outputs: 1, 2, 4
    or 8 blocks, so every tail of 0-7 inputs after 0-3 or 7 full registers) into each block
    count, as a middle layer and as the last; sigmoid first, so the padding rows past the width
    are 0.5, which the next layer must not read."""
    for a in [*range(1, 17), *range(25, 33), *range(57, 65)]:
        for b in (3, 16, 32, 64):
            _check(isa, (11, a, b, 5), ["sigmoid", "tanh", "identity"], seed=a * 100 + b)
            _check(isa, (11, a, b), ["sigmoid", "identity"], seed=a * 100 + b + 1)


def test_not_fused_shapes_agree(isa):
    """Shapes just outside the fused pass (a 3-block and a 9-block layer, a model past 128 KB)
    give the per-layer answer as well, so the boundary is not where answers change."""
    for dims in ((20, 24, 2), (20, 72, 2), (600, 64, 2)):
        _check(isa, dims, ["relu", "identity"], seed=dims[1])


@pytest.mark.parametrize("where", ["first", "middle", "last"])
@pytest.mark.parametrize("width", [8, 16, 32, 64])
def test_overflow_in_any_layer_is_refused(isa, where, width):
    """A NaN/Inf pre-activation in any layer of any width fails the pass, also where the next
    activation would hide it (relu maps the -inf of an overflowed layer to 0, sigmoid maps
    +inf to 1)."""
    dims = (24, width, width, width)
    rng = np.random.default_rng(width)
    ws, bs, acts = _model(rng, dims, ["relu", "sigmoid", "identity"])
    big = {"first": 0, "middle": 1, "last": 2}[where]
    ws[big] = np.full_like(ws[big], -3e38 if where == "first" else 3e38)
    P = K.PackedMLP(ws, bs, acts, isa)
    x = np.abs(rng.standard_normal(dims[0])).astype(np.float32) + 1
    with pytest.raises(ValueError, match="NaN/Inf"):
        P.forward(x)


def test_nan_input_is_refused(isa):
    P = K.PackedMLP(*_model(np.random.default_rng(4), (32, 16, 2), ["relu", "identity"]), isa)
    x = np.ones(32, np.float32)
    x[31] = np.nan                      # the last input of the second chunk
    with pytest.raises(ValueError, match="NaN/Inf"):
        P.forward(x)


@settings(max_examples=40, deadline=None)
@given(dims=st.lists(st.sampled_from(FUSED_WIDTHS), min_size=2, max_size=5),
       n_in=st.integers(1, 300), acts=st.lists(st.sampled_from(ACTS), min_size=5, max_size=5),
       seed=st.integers(0, 2**32 - 1))
def test_small_mlp_property(dims, n_in, acts, seed):
    for isa in ISAS:
        _check(isa, [n_in, *dims], acts[:len(dims) - 1] + ["identity"], seed)


