"""Reduced-precision weights (bf16, int8): the MLP packing entry point's refusals (a NaN or Inf
weight or bias, arguments of the wrong kind), Model.with_weights and the cache policy (a
one-layer model keeps its fitted policy; a dropped fit drops its report), every kernel
variant at widths that are not multiples of a block, and the engine's paths (step,
step_batch, predict) on every kernel set."""
import re

import numpy as np
import pytest

from fastpath import Engine, InputError, Model
from fastpath._kernels import LowpMLP, PackedMLP, kernel_lowp_dense, lowp_variants
from fastpath.model import CachePolicy, Layer

from helpers.builders import ISAS, engine_cfg, random_model

F32 = np.float32
_, HAVE_BF16 = lowp_variants("bf16")
_, HAVE_INT8 = lowp_variants("int8")
FITTED = CachePolicy(True, 0.9999, 0.02, 50_000_000, 16, 0.005)
FIT_REPORT = {"max_error": 0.005, "chosen": {"hits": 12, "hit_rate": 0.1}}


def _two_layers(rng, n_in=3, hidden=4):
    return ([rng.standard_normal((hidden, n_in)).astype(F32), rng.standard_normal((2, hidden)).astype(F32)],
            [np.zeros(hidden, F32), np.zeros(2, F32)], ["identity", "identity"])


# ------------------------------------------------------------------ the packing entry point
@pytest.mark.parametrize("weight_type", ["fp32", "bf16", "int8"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("what", ["weight", "bias"])
def test_packing_refuses_a_nonfinite_weight_or_bias(isa, weight_type, bad, what):
    # int8: the packer's max|row| skipped a NaN, and lrintf(NaN / s) rounded it to -127: the
    # row ran with -max|row| in its place and forward() answered a finite, wrong [10, 10]
    # for ones (the right answer has no value); bf16 / fp32 refused only each forward pass
    ws, bs, acts = _two_layers(np.random.default_rng(0))
    ws[0][:] = 1
    ws[1][:] = 1
    if what == "weight":
        ws[0][0, 1] = bad
    else:
        bs[0][2] = bad
    idx = re.escape("(0, 1)" if what == "weight" else "(2,)")
    with pytest.raises(InputError, match=rf"layer 0: {what} holds .* at index {idx}.*finite"):
        LowpMLP(ws, bs, acts, weight_type, isa)
    with pytest.raises(InputError, match=rf"layer 0: {what} holds"):
        PackedMLP(ws, bs, acts, isa)


@pytest.mark.parametrize("args,match", [
    (lambda w, b, a: (5, b, a), "must be lists"),
    (lambda w, b, a: (w, b, [["relu"], "identity"]), "unknown activation"),
    (lambda w, b, a: (w, b, [None, "identity"]), "unknown activation"),
    (lambda w, b, a: ([np.array([["a", "b", "c"]] * 4), w[1]], b, a), "numeric arrays"),
])
def test_packing_names_arguments_of_the_wrong_kind(isa, args, match):
    # these were a TypeError (no len(), unhashable list) and a ValueError from numpy
    w, b, a = _two_layers(np.random.default_rng(1))
    with pytest.raises(InputError, match=match):
        LowpMLP(*args(w, b, a), "int8", isa)


def test_packing_still_takes_float64_and_lists():
    rng = np.random.default_rng(2)
    ws, bs, acts = _two_layers(rng)
    m = LowpMLP([w.astype(np.float64).tolist() for w in ws], [list(b) for b in bs], acts, "int8",
                "scalar")
    ref = LowpMLP(ws, bs, acts, "int8", "scalar")
    x = rng.standard_normal(3).astype(F32)
    np.testing.assert_array_equal(m.forward(x), ref.forward(x))


# ------------------------------------------------------------------ Model.with_weights
def _fitted(model):
    return Model(model.layers, model.feature_spec, FITTED, {"cache_policy_fit": FIT_REPORT, "k": 1})


@pytest.mark.parametrize("kind", ["bf16", "int8"])
def test_one_layer_model_keeps_its_fitted_cache_policy(isa, kind):
    # only hidden layers are packed reduced; a one-layer model (a linear model from sklearn,
    # say) runs its fp32 output layer either way, and with_weights dropped its fitted cache
    # for outputs that do not move
    m = _fitted(random_model(np.random.default_rng(3), [12, 2]))
    r = m.with_weights(kind)
    assert r.weights == kind
    assert r.cache_policy == FITTED and r.meta == m.meta
    xs = np.random.default_rng(4).standard_normal((20, 12)).astype(F32)
    a, b = Engine(m, config=engine_cfg(isa)), Engine(r, config=engine_cfg(isa))
    np.testing.assert_array_equal(np.stack([a.predict(x) for x in xs]),
                                  np.stack([b.predict(x) for x in xs]))


@pytest.mark.parametrize("kind", ["bf16", "int8"])
def test_dropping_a_fitted_policy_drops_its_fit_report(kind):
    # the policy went off but meta kept "cache_policy_fit", a report of hits for a policy no
    # longer in force (fastpath info prints meta; calibrate drops the report with the policy)
    m = _fitted(random_model(np.random.default_rng(5), [12, 8, 2]))
    r = m.with_weights(kind)
    assert not r.cache_policy.enabled and not r.cache_policy.fitted
    assert r.meta == {"k": 1}
    assert m.meta["cache_policy_fit"] == FIT_REPORT           # the original is untouched
    back = r.with_weights("fp32")
    assert back.meta == {"k": 1} and not back.cache_policy.fitted
    # no change of weights, no change of policy or meta
    same = m.with_weights("fp32")
    assert same.cache_policy == FITTED and same.meta == m.meta


# ------------------------------------------------------------------ differential checks
ODD = (1, 15, 17, 63, 65)


@pytest.mark.parametrize("n_in", ODD + (1023,))
@pytest.mark.parametrize("n_out", ODD)
def test_every_variant_agrees_at_widths_off_the_block(n_in, n_out):
    rng = np.random.default_rng(n_in * 100 + n_out)
    w = rng.standard_normal((n_out, n_in)).astype(F32)
    b = rng.standard_normal(n_out).astype(F32)
    x = rng.standard_normal(n_in).astype(F32)
    x[rng.integers(n_in)] = -40.0          # an outlier sets x's int8 step
    w[0] = 0                               # a zero row: scale 0
    if n_out > 1:
        w[-1, 0] = 1e6                     # a row with one huge weight
    mag = np.abs(w).astype(np.float64) @ np.abs(x).astype(np.float64)
    for act in ("identity", "relu", "tanh"):
        ys, oks = kernel_lowp_dense("int8", "scalar", w, b, act, x)
        assert oks
        np.testing.assert_allclose(ys[0], np.tanh(b[0]) if act == "tanh" else
                                   max(b[0], 0) if act == "relu" else b[0], rtol=1e-6)
        for v in HAVE_INT8:
            y, ok = kernel_lowp_dense("int8", v, w, b, act, x)
            assert ok and np.array_equal(y, ys), (v, act)
        ys, oks = kernel_lowp_dense("bf16", "scalar", w, b, act, x)
        for v in HAVE_BF16:
            y, ok = kernel_lowp_dense("bf16", v, w, b, act, x)
            assert ok, (v, act)
            assert np.all(np.abs(y - ys) <= 4e-5 * mag + 1e-6), (v, act, np.abs(y - ys).max())


@pytest.mark.parametrize("kind", ["bf16", "int8"])
@pytest.mark.parametrize("dims", [[1, 1, 2], [15, 63, 2], [65, 17, 33, 2]])
def test_step_step_batch_and_predict_agree(isa, kind, dims):
    rng = np.random.default_rng(len(dims) * 10 + dims[0])
    m = random_model(rng, dims).with_weights(kind)
    raws = rng.standard_normal((40, m.raw_len)).astype(F32)
    syms = (np.arange(40) % 3).astype(np.int32)
    one = Engine(m, config=engine_cfg(isa))
    s1 = np.array([one.step(r, int(s)).signal for r, s in zip(raws, syms)], F32)
    batch = Engine(m, config=engine_cfg(isa)).step_batch(raws, syms)
    np.testing.assert_array_equal(s1, batch.signal)
    # identity features: predict on the raw tick is the step's model output
    p = Engine(m, config=engine_cfg(isa))
    sig = np.array([m.signal(p.predict(r))[0] for r in raws], F32)
    np.testing.assert_allclose(sig, s1, rtol=1e-6, atol=1e-6)


def test_refusals_are_the_same_on_every_set_with_extreme_magnitudes():
    # weights and inputs spread over 1e-40..1e20 (products up to 1e39.5): each set sums (bf16) or scales (int8) in its
    # own way, and a layer refused by one order is redone in double, so the decision to answer
    # or refuse, and the int8 answer (up to the fp32 output layer's order), must not depend
    # on the set
    rng = np.random.default_rng(7)

    def mag(shape, lo, hi):
        return (np.sign(rng.standard_normal(shape)) * 10.0 ** rng.uniform(lo, hi, shape)).astype(F32)
    answered = refused = 0
    for t in range(60):
        n_in, h = int(rng.integers(1, 70)), int(rng.integers(1, 40))
        act = ("identity", "relu", "tanh", "sigmoid")[t % 4]
        m = Model((Layer(mag((h, n_in), -40, 20), rng.standard_normal(h), act),
                   Layer(rng.standard_normal((2, h)) * 1e-30, np.zeros(2))))
        x = mag(n_in, -40, 19.7)
        for kind in ("bf16", "int8"):
            got = []
            for isa in ISAS:
                try:
                    got.append(Engine(m.with_weights(kind), config=engine_cfg(isa)).predict(x))
                except InputError:
                    got.append(None)
            assert all(g is None for g in got) or all(g is not None for g in got), (t, kind)
            if got[0] is None:
                refused += 1
                continue
            answered += 1
            if kind == "int8":       # the same hidden layers; the fp32 output layer's order
                for g in got[1:]:
                    np.testing.assert_allclose(g, got[0], rtol=1e-5, atol=1e-5 * np.abs(got[0]).max())
    assert answered > 10 and refused > 3


@pytest.mark.parametrize("n_in", [2, 4, 64, 1023, 4096])
def test_int8_largest_products_do_not_saturate(n_in):
    # every x and weight at +-max quantizes to +-127: vpmaddubsw's int16 pair sums are at their
    # largest (2 * 127 * 127, inside int16 only because x is symmetric s8, not u8 + 128), and
    # vpdpbusd's u8 twins are 255. The dots are then exact integers: row r's is the number of
    # agreeing signs minus the disagreeing ones
    rng = np.random.default_rng(n_in)
    s = rng.choice([-1.0, 1.0], (17, n_in)).astype(F32)
    s[0] = 1
    s[1] = -1
    x = np.where(np.arange(n_in) % 3 == 0, -1.0, 1.0).astype(F32)
    s[2] = x                                 # every pair at +127 * 127
    s[3] = -x                                # every pair at -127 * 127
    want = s.astype(np.float64) @ x.astype(np.float64)
    b = np.zeros(17, F32)
    for v in HAVE_INT8:
        y, ok = kernel_lowp_dense("int8", v, s, b, "identity", x)
        assert ok
        np.testing.assert_allclose(y, want, rtol=1e-6, atol=0, err_msg=v)
        assert y[2] > 0 and y[3] < 0


def test_config_weights_run_as_with_weights_does():
    # README: `model.with_weights(...)` or `[engine] weights = ...` (which wins). The two
    # differ: with_weights drops a fitted cache policy (the fit measured other weights), the
    # config key keeps it, and stats()/config say "fitted (max error 0.005)" for a fit that
    # never ran on int8; Engine.model.weights says "fp32" while the engine runs int8
    m = _fitted(random_model(np.random.default_rng(9), [12, 8, 2]))
    via_cfg = Engine(m, config={"engine": {"weights": "int8", "n_symbols": 4}})
    via_model = Engine(m.with_weights("int8"), config={"engine": {"n_symbols": 4}})
    assert via_cfg.model.weights == "int8"
    assert via_cfg.config.cache_origin == via_model.config.cache_origin
    assert via_cfg.config.cache == via_model.config.cache
