"""Reduced-precision weights (bf16, int8): every kernel variant against a numpy reference of the
same quantization, int8 variants bit for bit against the scalar twin, odd widths, NaN/Inf,
the engine, the config key and the bundle; streamed bf16 layers past the L2 share."""
import numpy as np
import pytest

from fastpath import ConfigError, Engine, InputError, Model, ModelError
from fastpath._kernels import LowpMLP, kernel_lowp_dense, lowp_kernels, lowp_variants
from fastpath.model import Layer

from helpers.builders import ACTS, engine_cfg, random_model
from helpers.reference import F32, act_np, ref_bf16

WIDTHS = (1, 7, 9, 33, 257)
SHAPES = [(i, o) for i in WIDTHS for o in WIDTHS]
ALL_BF16, HAVE_BF16 = lowp_variants("bf16")
ALL_INT8, HAVE_INT8 = lowp_variants("int8")


def int8_weights(w):
    """per-row symmetric: (q int, s_w) with q = rint(w / s_w), s_w = max|w_row| / 127."""
    w = np.asarray(w, F32)
    s = (np.abs(w).max(axis=1) / F32(127)).astype(F32)
    safe = np.where(s > 0, s, F32(1))
    q = np.where(s[:, None] > 0, np.clip(np.rint(w / safe[:, None]), -127, 127), 0)
    return q.astype(np.int64), s


def int8_input(x):
    """the two int8 steps of x: (x1, x2, s1, s2), x ~ s1 x1 + s2 x2."""
    x = np.asarray(x, F32)
    m = F32(np.abs(x).max())
    if m < F32(1e-30):
        z = np.zeros(len(x), np.int64)
        return z, z, F32(0), F32(0)
    inv1, s1 = F32(127) / m, m / F32(127)
    inv2, s2 = inv1 * F32(254), s1 / F32(254)
    x1 = np.clip(np.rint(x * inv1), -127, 127)
    # the residual as one fused multiply-add (exact product, one rounding)
    r = (x.astype(np.float64) - x1 * np.float64(s1)).astype(F32)
    x2 = np.clip(np.rint(r * inv2), -127, 127)
    return x1.astype(np.int64), x2.astype(np.int64), s1, s2


def ref_int8(w, b, x, act):
    q, sw = int8_weights(w)
    x1, x2, s1, s2 = int8_input(x)
    d1, d2 = q @ x1, q @ x2
    # fmaf(d1, s1*sw, fmaf(d2, s2*sw, b)): products exact in float64, roundings as in C
    t = (d2.astype(F32).astype(np.float64) * (s2 * sw).astype(np.float64) + b).astype(F32)
    v = (d1.astype(F32).astype(np.float64) * (s1 * sw).astype(np.float64) + t).astype(F32)
    return act_np(v, act)


def layer(rng, n_in, n_out):
    w = (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(F32)
    return w, (rng.standard_normal(n_out) * 0.1).astype(F32), rng.standard_normal(n_in).astype(F32)


def need(variant, have, kind):
    if variant not in have:
        pytest.skip(f"this CPU cannot run the {variant} {kind} kernel")


# ------------------------------------------------------------------ kernels
@pytest.mark.parametrize("variant", ALL_INT8)
@pytest.mark.parametrize("shape", SHAPES)
def test_int8_kernel_equals_reference_and_scalar(variant, shape):
    need(variant, HAVE_INT8, "int8")
    rng = np.random.default_rng(hash(shape) % 1000)
    w, b, x = layer(rng, *shape)
    for act in ACTS:
        y, ok = kernel_lowp_dense("int8", variant, w, b, act, x)
        ys, oks = kernel_lowp_dense("int8", "scalar", w, b, act, x)
        assert ok and oks
        np.testing.assert_array_equal(y, ys)          # same int32 dots, same fmaf chain
        np.testing.assert_allclose(y, ref_int8(w, b, x, act), rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("variant", ALL_BF16)
@pytest.mark.parametrize("shape", SHAPES)
def test_bf16_kernel_equals_reference(variant, shape):
    need(variant, HAVE_BF16, "bf16")
    rng = np.random.default_rng(hash(shape) % 1000)
    w, b, x = layer(rng, *shape)
    for act in ("identity", "relu"):
        y, ok = kernel_lowp_dense("bf16", variant, w, b, act, x)
        ref, mag = ref_bf16(w, b, x, act)
        assert ok
        # fp32 sums in another order; the native form carries x as two bf16 (~16 bits)
        tol = 3e-5 * mag + 1e-6 if variant == "avx512_bf16" else 2e-6 * mag + 1e-6
        assert np.all(np.abs(y - ref) <= tol), (variant, np.abs(y - ref).max())
    for act in ("tanh", "sigmoid"):
        y, _ = kernel_lowp_dense("bf16", variant, w, b, act, x)
        np.testing.assert_allclose(y, ref_bf16(w, b, x, act)[0], rtol=1e-4, atol=1e-4)


def test_int8_tiny_and_zero_inputs_quantize_to_zero():
    rng = np.random.default_rng(3)
    w, b, _ = layer(rng, 33, 9)
    for x in (np.zeros(33, F32), np.full(33, 1e-35, F32)):
        for v in HAVE_INT8:
            y, ok = kernel_lowp_dense("int8", v, w, b, "identity", x)
            assert ok
            np.testing.assert_array_equal(y, b)


def test_int8_all_zero_row_and_extreme_weights():
    rng = np.random.default_rng(4)
    w, b, x = layer(rng, 40, 17)
    w[3] = 0
    w[5, 7] = 1e4                  # one large weight: that row's scale is coarse, others not
    for v in HAVE_INT8:
        y, ok = kernel_lowp_dense("int8", v, w, b, "identity", x)
        assert ok
        np.testing.assert_allclose(y, ref_int8(w, b, x, "identity"), rtol=2e-6, atol=1e-6)
        assert y[3] == b[3]


@pytest.mark.parametrize("kind", ["bf16", "int8"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("where", [0, 16, 32])
def test_nonfinite_input_is_refused_by_every_variant(kind, bad, where):
    rng = np.random.default_rng(5)
    w, b, x = layer(rng, 33, 20)
    x[where] = bad
    for v in (HAVE_BF16 if kind == "bf16" else HAVE_INT8):
        for act in ACTS:
            y, ok = kernel_lowp_dense(kind, v, w, b, act, x)
            assert not ok, (v, act)


@pytest.mark.parametrize("kind", ["bf16", "int8"])
def test_overflowing_preactivation_is_refused(kind):
    # finite input and weights whose product overflows float32: relu would hide +Inf as Inf
    # and tanh would map it to 1, so the flag must see it before the activation
    w = np.full((9, 7), 1e30, F32)
    b = np.zeros(9, F32)
    x = np.full(7, 1e30, F32)
    for v in (HAVE_BF16 if kind == "bf16" else HAVE_INT8):
        for act in ACTS:
            _, ok = kernel_lowp_dense(kind, v, w, b, act, x)
            assert not ok, (v, act)


def test_bad_shim_arguments():
    with pytest.raises(InputError, match="weights must be one of"):
        kernel_lowp_dense("int4", "scalar", np.ones((2, 2)), np.ones(2), "relu", np.ones(2, F32))
    with pytest.raises(InputError, match="unknown int8 variant"):
        kernel_lowp_dense("int8", "neon", np.ones((2, 2)), np.ones(2), "relu", np.ones(2, F32))
    with pytest.raises(InputError, match="do not chain"):
        kernel_lowp_dense("int8", "scalar", np.ones((2, 3)), np.ones(2), "relu", np.ones(2, F32))


def test_engine_variant_choice_follows_cpu_bits():
    assert lowp_kernels("scalar") == ("scalar", "scalar")
    k = lowp_kernels("avx2")
    if k is not None:
        assert k[0] == "avx2" and k[1] in ("avx2", "avx2_vnni")
        assert (k[1] == "avx2_vnni") == ("avx2_vnni" in HAVE_INT8)
    k = lowp_kernels("avx512")
    if k is not None:
        assert k == ("avx512_bf16" if "avx512_bf16" in HAVE_BF16 else "avx512",
                     "avx512_vnni" if "avx512_vnni" in HAVE_INT8 else "avx512")


# ------------------------------------------------------------------ the MLP and the engine
def ref_mlp(model, x, kind):
    """numpy forward with `kind` hidden layers and an fp32 output layer."""
    h = np.asarray(x, F32)
    L = model.layers
    for i, l in enumerate(L):
        if i == len(L) - 1:
            h = act_np((l.weight.astype(np.float64) @ h + l.bias).astype(F32), l.activation)
        elif kind == "int8":
            h = ref_int8(l.weight, l.bias, h, l.activation)
        else:
            h = ref_bf16(l.weight, l.bias, h, l.activation)[0]
    return h


LOWP_ISAS = ("scalar", "avx2", "avx512")


@pytest.mark.parametrize("isa_name", LOWP_ISAS)
@pytest.mark.parametrize("kind", ["bf16", "int8"])
def test_lowp_mlp_equals_reference_on_every_set(isa_name, kind):
    if lowp_kernels(isa_name) is None:
        pytest.skip(f"this CPU cannot run kernel set {isa_name}")
    rng = np.random.default_rng(6)
    m = random_model(rng, [57, 33, 9, 2], acts=["relu", "tanh", "identity"])
    lm = LowpMLP([l.weight for l in m.layers], [l.bias for l in m.layers],
                 [l.activation for l in m.layers], kind, isa_name)
    for _ in range(5):
        x = rng.standard_normal(57).astype(F32)
        np.testing.assert_allclose(lm.forward(x), ref_mlp(m, x, kind), rtol=1e-4, atol=1e-4)


def test_engine_int8_same_on_every_kernel_set(isa):
    # the int8 hidden layers are bit-identical across sets (the kernel tests check that); only
    # the fp32 output layer's summation order differs
    rng = np.random.default_rng(7)
    m = random_model(rng, [40, 24, 17, 2]).with_weights("int8")
    xs = rng.standard_normal((20, 40)).astype(F32)
    out = np.stack([Engine(m, config=engine_cfg(isa)).predict(x) for x in xs])
    ref = np.stack([Engine(m, config=engine_cfg("scalar")).predict(x) for x in xs])
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out, np.stack([ref_mlp(m, x, "int8") for x in xs]), rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("kind", ["bf16", "int8"])
def test_engine_reduced_weights_match_reference(isa, kind):
    rng = np.random.default_rng(8)
    m = random_model(rng, [40, 24, 17, 2])
    e32 = Engine(m, config=engine_cfg(isa))
    e = Engine(m.with_weights(kind), config=engine_cfg(isa))
    x = rng.standard_normal(40).astype(F32)
    np.testing.assert_allclose(e.predict(x), ref_mlp(m, x, kind), rtol=1e-4, atol=1e-5)
    assert not np.array_equal(e.predict(x), e32.predict(x))     # the weights really changed
    # a step refuses NaN the same way as fp32
    raw = np.zeros(m.raw_len, F32)
    raw[0] = np.nan
    with pytest.raises(InputError):
        e.step(raw, 0)


def test_engine_refuses_overflow_with_reduced_weights(isa):
    layers = (Layer(np.full((8, 4), 1e30, F32), np.zeros(8, F32), "relu"),
              Layer(np.ones((2, 8), F32), np.zeros(2, F32), "identity"))
    for kind in ("bf16", "int8"):
        e = Engine(Model(layers).with_weights(kind), config=engine_cfg(isa))
        with pytest.raises(InputError):
            e.predict(np.full(4, 1e30, F32))


def test_config_weights_overrides_the_model(isa):
    rng = np.random.default_rng(9)
    m = random_model(rng, [40, 24, 2])
    x = rng.standard_normal(40).astype(F32)
    cfg = engine_cfg(isa)
    cfg["engine"]["weights"] = "int8"
    a = Engine(m, config=cfg).predict(x)
    b = Engine(m.with_weights("int8"), config=engine_cfg(isa)).predict(x)
    np.testing.assert_array_equal(a, b)
    cfg["engine"]["weights"] = "fp32"
    np.testing.assert_array_equal(Engine(m.with_weights("bf16"), config=cfg).predict(x),
                                  Engine(m, config=engine_cfg(isa)).predict(x))


@pytest.mark.parametrize("bad", ["fp16", "INT8", "", 8, ["int8"]])
def test_bad_config_weights_names_key_and_choices(bad):
    with pytest.raises(ConfigError) as ei:
        Engine(random_model(np.random.default_rng(0), [4, 2]), config={"engine": {"weights": bad}})
    msg = str(ei.value)
    assert "engine.weights" in msg
    if isinstance(bad, str):
        assert all(w in msg for w in ("fp32", "bf16", "int8"))


def test_bad_config_weights_in_toml(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('[engine]\nweights = "int4"\n')
    want = r"engine\.weights must be one of \['fp32', 'bf16', 'int8'\]"
    with pytest.raises(ConfigError, match=want):
        Engine(random_model(np.random.default_rng(0), [4, 2]), config=str(p))


def test_model_weights_validated_and_default_fp32():
    m = random_model(np.random.default_rng(0), [4, 2])
    assert m.weights == "fp32"
    with pytest.raises(ModelError, match="weights 'fp16' not supported"):
        m.with_weights("fp16")


def test_with_weights_drops_a_fitted_cache_policy():
    from dataclasses import replace
    # a hidden layer: a one-layer model runs fp32 whatever its weights, and keeps its policy
    m = random_model(np.random.default_rng(0), [4, 3, 2])
    m = m.with_cache_policy(replace(m.cache_policy, enabled=True, fitted_max_error=0.01))
    assert not m.with_weights("int8").cache_policy.enabled
    assert m.with_weights("fp32").cache_policy.enabled


@pytest.mark.parametrize("kind", ["fp32", "bf16", "int8"])
def test_bundle_records_weights(tmp_path, kind):
    m = random_model(np.random.default_rng(0), [6, 5, 2]).with_weights(kind)
    p = tmp_path / "m.fpm"
    m.save(p)
    back = Model.load(p)
    assert back.weights == kind
    x = np.random.default_rng(1).standard_normal(6).astype(F32)
    np.testing.assert_array_equal(Engine(back).predict(x), Engine(m).predict(x))


def test_bundle_with_a_bad_weights_value_is_a_model_error():
    import json
    import struct
    import zlib
    from fastpath.model import bundle as B
    blob = random_model(np.random.default_rng(0), [6, 2]).to_bytes()
    # rewrite the header with weights = "int4" and a matching CRC
    magic = blob[:8]
    _, hlen = struct.unpack("<II", blob[8:16])
    header = json.loads(blob[16:16 + hlen])
    header["weights"] = "int4"
    hb = json.dumps(header, sort_keys=True).encode()
    rest = blob[16 + hlen:len(blob) - 4 - len(B.END)]
    payload = rest.lstrip(b"\0")
    pad_old = len(rest) - len(payload)
    assert pad_old == (-(16 + hlen)) % 64
    body = magic + struct.pack("<II", B.VERSION, len(hb)) + hb
    body += b"\0" * ((-len(body)) % 64) + payload
    bad = body + struct.pack("<I", zlib.crc32(body)) + B.END
    with pytest.raises(ModelError, match="int4"):
        Model.from_bytes(bad, "bad.fpm")


# ------------------------------------------------------------------ bf16 layers past L2's share
@pytest.mark.parametrize("variant", ALL_BF16)
@pytest.mark.parametrize("shape", [(1024, 272), (1025, 288), (8193, 48)])
def test_bf16_streamed_layer_equals_reference(variant, shape):
    # past 512 KB of weights the vector variants prefetch each block's stream, and AVX2 walks
    # two 16-row blocks per pass: 17 and 3 blocks leave a lone block, 18 do not; odd widths
    # leave a half pair; 8193 inputs make chains of 4096 terms. The widths above are all in
    # cache, so none of them reaches this path.
    need(variant, HAVE_BF16, "bf16")
    rng = np.random.default_rng(shape[0] + shape[1])
    w, b, x = layer(rng, *shape)
    tol_k = 3e-5 if variant == "avx512_bf16" else 2e-6
    for act in ("identity", "relu", "tanh"):
        y, ok = kernel_lowp_dense("bf16", variant, w, b, act, x)
        ys, _ = kernel_lowp_dense("bf16", "scalar", w, b, act, x)
        ref, mag = ref_bf16(w, b, x, act)
        assert ok
        tol = tol_k * mag + 1e-6     # |tanh'| <= 1: the pre-activation's bound holds after it
        assert np.all(np.abs(y - ref) <= tol), (variant, act, np.abs(y - ref).max())
        assert np.all(np.abs(ys - ref) <= 2e-6 * mag + 1e-6), (act, np.abs(ys - ref).max())


