"""Classifier heads on outputs that are not probabilities.

A classifier head reads its outputs as probabilities (signal = p(up) - p(down), confidence =
the largest). The engine refuses a tick whose outputs are not (margins, decision scores,
z-scores) on every path, with an InputError naming the outputs and the state unchanged; a
model whose outputs are known not to be probabilities is refused a classifier head when it is
built, and a bundle saved with such a head loads only with another."""

import numpy as np
import pytest

import fastpath
from fastpath import Engine, InputError, ModelError
from fastpath.model import FeatureSpec, Head, Layer, Model
from helpers.builders import ISAS, engine_cfg
from helpers.models import three_target_stumps

F32 = np.float32
NOT_PROBS = r"not class probabilities \(output \d+ is -?[\d.]+; each must be in \[0, 1\]\)"


# --------------------------------------------------------------------------- models
PROBS = (0.2, 0.3, 0.5)
MARGINS = (1.7, 0.1, -0.9)          # what a classifier3 head read as p: signal -2.6, conf 1.7


def _tree_model():
    """A 3-target regressor whose x0 <= 0 ticks give probabilities and x0 > 0 ticks give
    margins, read by a classifier3 head (a regressor's outputs are not known at build time:
    the engine is what refuses the margins)."""
    return Model((), None, trees=three_target_stumps(PROBS, MARGINS),
                 head_spec=Head("classifier3"))


def _softmax_mlp(rng, n_in=4):
    return Model((Layer(rng.standard_normal((3, n_in)).astype(F32), np.zeros(3, F32)),),
                 post="softmax")


GOOD = np.array([-1.0, 0.5], F32)
BAD = np.array([1.0, 0.5], F32)


# ------------------------------------------------------------ the engine refuses the tick
def test_step_refuses_a_classifier_head_reading_margins(isa):
    m = _tree_model()
    eng = Engine(m, config=engine_cfg(isa, enabled=True, cos_threshold=0.5, norm_tol=10.0))
    r = eng.step(GOOD, 0, 1)
    assert r.signal == pytest.approx(0.3) and r.confidence == pytest.approx(0.5)
    with pytest.raises(InputError, match=NOT_PROBS) as ei:
        eng.step(BAD, 0, 2)
    msg = str(ei.value)
    assert "[1.7, 0.1, -0.9]" in msg and "'classifier3'" in msg and "state unchanged" in msg
    # nothing was written: no tick counted, no slot stored, the symbol's time not moved
    assert eng.ticks == 1 and eng.stats()["misses"] == 1
    assert eng.step(GOOD, 0, 2).cached          # the slot still holds the first tick's answer


def test_a_refused_tick_leaves_the_window_as_it_was(isa):
    # a windowed spec in front of the tree (raw[0] as it is, raw[1]'s rolling mean / std):
    # step() commits the window before the model runs; the refused tick's commit is undone
    fs = FeatureSpec(3, np.array([0], np.int32), np.array([1], np.int32), 4,
                     np.zeros(3, F32), np.ones(3, F32))
    m = Model((), fs, trees=three_target_stumps(PROBS, MARGINS, n_features=3),
              head_spec=Head("classifier3"))
    a, b = Engine(m, config=engine_cfg(isa)), Engine(m, config=engine_cfg(isa))
    ticks = [np.array([-1.0, 3.0, 5.0], F32), np.array([-2.0, 1.0, 9.0], F32)]
    a.step(ticks[0])
    b.step(ticks[0])
    with pytest.raises(InputError, match=NOT_PROBS):
        a.step(np.array([1.0, 100.0, -50.0], F32))
    np.testing.assert_array_equal(a.features(ticks[1]), b.features(ticks[1]))
    assert a.step(ticks[1]).signal == b.step(ticks[1]).signal
    assert a.ticks == b.ticks == 2


def test_step_batch_stops_at_the_refused_row_with_the_rows_before_applied(isa):
    eng = Engine(_tree_model(), config=engine_cfg(isa))
    raws = np.stack([GOOD, GOOD, BAD, GOOD])
    with pytest.raises(InputError, match=r"^row 2: the model's outputs \[1.7, 0.1, -0.9\]") as ei:
        eng.step_batch(raws, np.zeros(4, np.int32))
    assert ei.value.applied == 2 and len(ei.value.result.signal) == 2
    assert eng.ticks == 2
    np.testing.assert_allclose(ei.value.result.signal, [0.3, 0.3], rtol=1e-6)


def test_external_outputs_are_checked_too(isa):
    # the seam a GPU backend (and GpuEngine.step_batch) answers through
    rng = np.random.default_rng(0)
    eng = Engine(_softmax_mlp(rng), config=engine_cfg(isa))
    raw = rng.standard_normal(4).astype(F32)
    for bad in ([0.2, 1.6, -0.8], [-0.3, 0.5, 0.8], [0.5, 0.5, 1.2]):
        with pytest.raises(InputError, match=NOT_PROBS):
            eng._step_external(raw, 0, np.array(bad, F32), 1)
    assert eng.ticks == 0
    r = eng._step_external(raw, 0, np.array([0.1, 0.2, 0.7], F32), 1)
    assert r.signal == pytest.approx(0.6) and r.confidence == pytest.approx(0.7)


def test_rounding_within_the_tolerance_is_clamped_not_refused(isa):
    rng = np.random.default_rng(1)
    eng = Engine(_softmax_mlp(rng), config=engine_cfg(isa))
    raw = rng.standard_normal(4).astype(F32)
    r = eng._step_external(raw, 0, np.array([-5e-5, 0.0, 1.00005], F32), 1, 1)
    assert r.signal == 1.0 and r.confidence == 1.0
    s, c = Head("classifier3").apply(np.array([-5e-5, 0.0, 1.00005]))
    assert s == 1.0 and c == 1.0


def test_every_kernel_set_refuses_the_same_ticks():
    rng = np.random.default_rng(2)
    X = rng.standard_normal((200, 2)).astype(F32)
    answers = {}
    for isa in ISAS:
        eng = Engine(_tree_model(), config=engine_cfg(isa))
        got = []
        for x in X:
            try:
                got.append(eng.step(x).signal)
            except InputError:
                got.append("refused")
        answers[isa] = got
    first = next(iter(answers.values()))
    assert first.count("refused") == int((X[:, 0] > 0).sum())
    for isa, got in answers.items():
        assert got == first, isa


def test_the_server_refuses_it_naming_the_outputs():
    from helpers.serving import cfg, uname
    name = uname()
    conf = cfg()
    conf["engine"]["n_symbols"] = 1
    with fastpath.serve(name, model=_tree_model(), config=conf):
        c = fastpath.connect(name, timeout=5)
        try:
            assert c.step(GOOD, 0).signal == pytest.approx(0.3)
            with pytest.raises(InputError, match=r"range from -0.9 to 1.7: not class "
                                                 r"probabilities"):
                c.step(BAD, 0)
            seq = c.submit(BAD, 0)
            got = []
            while not got:
                got = c.poll()
            assert got[0][0] == seq and isinstance(got[0][1], InputError)
            assert "range from -0.9 to 1.7" in str(got[0][1])
        finally:
            c.close()


def test_head_apply_refuses_what_the_engine_refuses():
    with pytest.raises(InputError, match=r"output 0 of row 1 is 1.7: margins or scores"):
        Head("classifier3").apply(np.array([PROBS, MARGINS]))
    s, c = Head("classifier2").apply(np.array([0.25, 0.75]))
    assert s == pytest.approx(0.5) and c == pytest.approx(0.75)


# ------------------------------------------------------ refused when the model is built
@pytest.mark.parametrize("act", ["identity", "relu", "tanh"])
def test_a_classifier_head_on_raw_mlp_outputs_is_refused(act):
    rng = np.random.default_rng(3)
    layers = (Layer(rng.standard_normal((3, 4)).astype(F32), np.zeros(3, F32), act),)
    with pytest.raises(ModelError, match=rf"head 'classifier3' reads class probabilities, but "
                                         rf"this model's outputs are its last layer's {act} "
                                         rf"values with no post transform.*post='softmax'"):
        Model(layers, head_spec=Head("classifier3"))
    with pytest.raises(ModelError, match="reads class probabilities"):
        Model(layers, head_spec=Head("regression")).with_head(Head("classifier2", outputs=(0, 2)))
    # a sigmoid last layer gives probabilities (one per output), a softmax a distribution
    sig = (Layer(layers[0].weight, layers[0].bias, "sigmoid"),)
    assert Model(sig, head_spec=Head("classifier3")).head_spec.kind == "classifier3"
    assert Model(layers, post="softmax").head_spec.kind == "classifier3"


def test_a_classifier_head_given_to_a_tree_classifier_of_margins_is_refused():
    margins = three_target_stumps((-1.5, 0.2, 1.9), (2.0, -0.3, -1.8), classifier=True)
    with pytest.raises(ModelError, match=r"head 'classifier3' reads class probabilities, but "
                                         r"the tree classifier's outputs are not \(post "
                                         r"transform NONE, leaf sums outside \[0, 1\]"):
        Model((), None, trees=margins, head_spec=Head("classifier3"))
    with pytest.raises(ModelError, match=r"post transform PROBIT"):
        Model((), None, trees=three_target_stumps(PROBS, PROBS, classifier=True, post="PROBIT"),
              head_spec=Head("classifier3", outputs=(2, 1, 0)))
    assert Model((), None, trees=margins, head_spec=Head("regression", outputs=(2,)))


def test_an_onnx_linear_classifier_of_decision_scores_is_refused_a_classifier_head(tmp_path):
    from helpers.models import _linear_classifier
    p, _ = _linear_classifier(tmp_path, "NONE")
    with pytest.raises(ModelError, match="reads class probabilities"):
        Model.from_onnx(p, head=Head("classifier3"))


# ------------------------------------------------- a bundle saved with such a head
def _bundle_with_head(model, head_json):
    from helpers.models import _edited
    return _edited(model.to_bytes(), lambda h: h.__setitem__("head", head_json))


def test_a_bundle_with_a_classifier_head_over_margins_loads_with_another(tmp_path, monkeypatch):
    # a bundle written when XGBoost's margins got classifier3 by default: it no longer loads
    # as it is, and Model.load(head=...) / --head replace its head
    import fastpath.serving.server as server
    from fastpath.cli import main
    margins = three_target_stumps((-1.5, 0.2, 1.9), (2.0, -0.3, -1.8), classifier=True)
    m = Model((), None, trees=margins, head_spec=Head("regression", outputs=(2,)))
    blob = _bundle_with_head(m, {"kind": "classifier3", "scale": 1.0, "outputs": [0, 1, 2]})
    (tmp_path / "old.fpm").write_bytes(blob)
    with pytest.raises(ModelError, match=r"old.fpm: head 'classifier3' reads class "
                                         r"probabilities.*Model.load\(path, head=\.\.\.\).*"
                                         r"--head"):
        Model.load(tmp_path / "old.fpm")
    got = Model.load(tmp_path / "old.fpm", head=Head("regression", outputs=(2,)))
    assert got == m
    assert Model.from_bytes(blob, head=Head("regression", outputs=(2,))) == m
    seen = {}
    monkeypatch.setattr(server, "run_foreground",
                        lambda name, model=None, config=None, stats=False, tick_sizes=None:
                        seen.setdefault("m", model) and 0)
    assert main(["serve", "--name", "x", "--model", str(tmp_path / "old.fpm"),
                 "--head", "regression:2"]) == 0
    assert seen["m"] == m


def test_a_bundle_read_with_another_head_drops_its_fitted_cache_policy():
    from fastpath._build import DEMO_MODEL
    demo = Model.load(DEMO_MODEL)
    assert demo.cache_policy.fitted and demo.cache_policy.enabled
    other = Model.load(DEMO_MODEL, head=Head("tanh_sigmoid", outputs=(1, 0)))
    assert other == demo.with_head(Head("tanh_sigmoid", outputs=(1, 0)))
    assert not other.cache_policy.enabled and "cache_policy_fit" not in other.meta
    assert Model.load(DEMO_MODEL, head=demo.head_spec) == demo       # the same head keeps it
    with pytest.raises(ModelError, match="head must be a fastpath.model.Head, got str"):
        Model.load(DEMO_MODEL, head="regression")
