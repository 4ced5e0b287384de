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


# ---------------------------------------------------------------- the bench's latency bound
def _scaling():
    import importlib.util
    import os
    path = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "scaling.py")
    spec = importlib.util.spec_from_file_location("scaling_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


LAT = {"fma": 4.0, "mul": 3.0, "add": 2.0, "max": 1.5}


def test_latency_bound_sums_each_layers_critical_path():
    """Per layer: the cheaper product op, ceil(log2 n_in) adds, the activation's op."""
    S = _scaling()
    # 32 inputs: 3 + 5 * 2 + 1.5 (relu); 16 inputs: 3 + 4 * 2 (identity)
    assert S.latency_bound_ns([(32, "relu"), (16, "identity")], LAT) == 3 + 10 + 1.5 + 3 + 8
    assert S.latency_bound_ns([(1, "identity")], LAT) == 3                # one FMA with the bias
    assert S.latency_bound_ns([(17, "identity")], LAT) == 3 + 5 * 2       # 17 needs 5 levels
    # tanh/sigmoid: at least the cheapest op
    assert S.latency_bound_ns([(2, "tanh")], LAT) == 3 + 2 + 1.5
    # an FMA faster than an add joins the sums instead: each level costs the cheaper one
    fast_fma = {"fma": 1.0, "mul": 3.0, "add": 2.0, "max": 1.5}
    assert S.latency_bound_ns([(16, "identity")], fast_fma) == 1 + 4 * 1
    m = S.build_model((32, 16, 2))
    assert S.model_latency_bound(m, LAT) == 3 + 10 + 1.5 + 3 + 8
    assert S.latency_bound_ns([(32, "relu")], {"skipped": "no probe"}) != \
        S.latency_bound_ns([(32, "relu")], {"skipped": "no probe"})       # NaN


def test_bounds_x_max_takes_the_larger_bound():
    S = _scaling()
    b = S.bounds(20.0, fma_ns=4.0, read_ns=5.0, wbytes=1000, l2=1 << 20, lat_ns=8.0)
    assert b["bound"] == "read" and b["x_bound"] == 4.0
    assert b["max_bound"] == "latency" and b["x_max"] == 2.5 and b["x_latency"] == 2.5
    b = S.bounds(20.0, fma_ns=4.0, read_ns=10.0, wbytes=1000, l2=1 << 20, lat_ns=8.0)
    assert b["max_bound"] == "read" and b["x_max"] == 2.0
    b = S.bounds(20.0, fma_ns=4.0, read_ns=10.0, wbytes=1000, l2=1 << 20)
    assert b["max_bound"] is None and b["x_max"] != b["x_max"]


@pytest.mark.parametrize("argv", [["--models", "32x"], ["--models", "16"], ["--models", "0x2"],
                                  ["--sets", "sse9"], ["--weights", "fp64"]])
def test_scaling_cli_refuses_bad_arguments(argv, capsys):
    with pytest.raises(SystemExit) as e:
        _scaling().main(argv)
    assert e.value.code == 2
    assert "error" in capsys.readouterr().err


def test_scaling_partial_run(tmp_path):
    """A run of one model and one set, without peers: every figure is there, the latency bound
    measured or skipped with its reason, and the full table's JSON is left alone."""
    import json
    S = _scaling()
    assert S.main(["--models", "8x4x2", "--sets", ISAS[-1], "--no-peers", "--calls", "100",
                   "--out", str(tmp_path)]) == 0
    assert not (tmp_path / "scaling-latest.json").exists()
    res = json.loads((tmp_path / "scaling-partial.json").read_text())
    assert res["kernel_sets"] == [ISAS[-1]]
    (row,) = res["rows"]
    assert row["dims"] == [8, 4, 2]
    lat = res["machine"]["op_latency_ns"]
    if "skipped" in lat:
        assert "probe" in lat["skipped"]
    else:
        assert set(lat) == {"fma", "mul", "add", "max"} and min(lat.values()) > 0
        assert row["latency_bound_ns"] == pytest.approx(S.latency_bound_ns(
            [(8, "relu"), (4, "identity")], lat))
    if ISAS[-1] != "scalar":
        m = row["fastpath"][ISAS[-1]]["mlp"]
        assert m["ns"] > 0 and m["x_bound"] > 0
