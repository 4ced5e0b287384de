"""Bundle (.fpm) header fields of the wrong JSON type are refused with the field named, never
converted (a JSON true read as 1.0, a string "2" as 2.0)."""
from __future__ import annotations


import pytest

from fastpath import ModelError
from fastpath._build import DEMO_MODEL
from fastpath.model import Model
from helpers.models import _edited, _linear_classifier


def _old_format(fit):
    """An old-format bundle (no fitted_max_error) whose meta records the fit `fit`."""
    def edit(h):
        del h["cache_policy"]["fitted_max_error"]
        h["cache_policy"]["enabled"] = True
        h["meta"]["cache_policy_fit"] = fit
    return edit


DEMO = open(DEMO_MODEL, "rb").read()
GOOD_FIT = {"chosen": {"cos_threshold": 0.999999, "norm_tol": 0.02}, "max_error": 0.01,
            "margin": 0.5}


def test_old_format_fit_with_numbers_still_turns_the_cache_on():
    m = Model.from_bytes(_edited(DEMO, _old_format(GOOD_FIT)))
    assert m.cache_policy.enabled and m.cache_policy.fitted_max_error == pytest.approx(0.005)


@pytest.mark.parametrize("key,value,says", [
    ("max_error", True, "meta.cache_policy_fit.max_error must be a number, got bool True"),
    ("max_error", "0.01", "meta.cache_policy_fit.max_error must be a number, got str"),
    ("margin", True, "meta.cache_policy_fit.margin must be a number, got bool True"),
    ("margin", "2", "meta.cache_policy_fit.margin must be a number, got str '2'"),
    ("margin", None, "meta.cache_policy_fit.margin must be a number, got NoneType"),
    ("margin", float("nan"), "is not a signal error in (0, 2]"),
    ("margin", -1, "is not a signal error in (0, 2]"),
    ("chosen", "no", "meta.cache_policy_fit.chosen must be the chosen policy"),
    ("chosen", True, "meta.cache_policy_fit.chosen must be the chosen policy"),
])
def test_old_format_fit_fields_of_another_type_are_refused(key, value, says):
    # before: max_error true was a fitted max error of 1.0 (cache on, vouched for errors up
    # to 1.0), margin true 1.0, margin "2" doubled the bound, chosen "no" kept the cache on,
    # max_error "0.01" silently switched it off, margin null was a TypeError
    with pytest.raises(ModelError, match="<bytes>: ") as e:
        Model.from_bytes(_edited(DEMO, _old_format({**GOOD_FIT, key: value})))
    assert says in str(e.value)


@pytest.mark.parametrize("key,value,says", [
    ("head", [], "head must be a JSON object (or absent), got list"),
    ("head", "x", "head must be a JSON object (or absent), got str"),
    ("feature_spec", [], "feature_spec must be a JSON object, got list"),
    ("feature_spec", None, "feature_spec must be a JSON object, got NoneType"),
    ("trees", [], "trees must be a JSON object (or absent), got list"),
    ("trees", False, "trees must be a JSON object (or absent), got bool"),
    ("layers", "ab", "layers must be a JSON list of objects"),
    ("layers", None, "layers must be a JSON list of objects"),
    ("version", 1.0, "version 1.0, expected 'fastpath-model' version 1"),
])
def test_header_fields_of_another_type_are_named(key, value, says):
    # before: "malformed bundle header (AttributeError: 'list' object has no attribute
    # 'get')" and the like, naming no field; version 1.0 was read as 1
    with pytest.raises(ModelError) as e:
        Model.from_bytes(_edited(DEMO, lambda h: h.__setitem__(key, value)))
    assert says in str(e.value)


def test_a_tree_bundle_with_layers_as_an_object_is_refused():
    # {} has a len() of 0: a tree bundle with "layers": {} was read as having no layers
    from fastpath.model import TreeEnsemble
    t = TreeEnsemble(2, 1, [0, 3], [0, 6, 6], [1, 0, 0], [0.5, 0, 0], [1, -1, -1],
                     [2, -1, -1], [0, 0, 0], [1, 2], [0, 0], [1.0, -1.0])
    blob = Model((), None, trees=t).to_bytes()
    assert Model.from_bytes(blob).trees == t
    with pytest.raises(ModelError, match="layers must be a JSON list of objects"):
        Model.from_bytes(_edited(blob, lambda h: h.__setitem__("layers", {})))


def test_an_empty_onnx_file_is_named_as_such(tmp_path):
    # an empty file parses as an empty ModelProto: it was "expected one graph input, found []"
    pytest.importorskip("onnx")
    p = tmp_path / "model.onnx"
    p.write_bytes(b"")
    with pytest.raises(ModelError, match=r"model.onnx holds no ONNX graph \(0 bytes\): an empty "
                                         r"or truncated file"):
        Model.from_onnx(p)


def test_the_opset5_tree_ensemble_op_names_the_ops_to_export_instead(tmp_path):
    # it was "fastpath imports dense models (MLPs, linear and logistic models) built from
    # Gemm, ...": no word of the tree ops fastpath does read, or of the opset that writes them
    import numpy as np
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper
    arr = numpy_helper.from_array
    node = helper.make_node(
        "TreeEnsemble", ["X"], ["Y"], domain="ai.onnx.ml", aggregate_function=1,
        leaf_targetids=[0, 0], leaf_weights=arr(np.array([1.0, 2.0], np.float32)), n_targets=1,
        nodes_falseleafs=[1], nodes_falsenodeids=[1], nodes_featureids=[0],
        nodes_modes=arr(np.array([0], np.uint8)), nodes_splits=arr(np.array([0.5], np.float32)),
        nodes_trueleafs=[1], nodes_truenodeids=[0], post_transform=0, tree_roots=[0])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT,
                                                                      [None, 2])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21),
                                            helper.make_opsetid("ai.onnx.ml", 5)])
    p = tmp_path / "te5.onnx"
    onnx.save(m, str(p))
    with pytest.raises(ModelError, match=r"unsupported ONNX op 'TreeEnsemble'.*"
                                         r"TreeEnsembleRegressor / TreeEnsembleClassifier "
                                         r"\(ai.onnx.ml opsets 1-3\): export with ai.onnx.ml "
                                         r"opset 3"):
        Model.from_onnx(p)


def test_the_generic_unsupported_op_hint_names_the_tree_ops_too(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    g = helper.make_graph([helper.make_node("Abs", ["X"], ["Y"])], "g",
                          [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 2])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 2])])
    p = tmp_path / "abs.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(p))
    with pytest.raises(ModelError, match=r"unsupported ONNX op 'Abs'.* and tree ensembles "
                                         r"\(TreeEnsembleRegressor / TreeEnsembleClassifier\)"):
        Model.from_onnx(p)


def _stump(**kw):
    from fastpath.model import TreeEnsemble
    return TreeEnsemble(2, 1, [0, 3], [0, 6, 6], [1, 0, 0], [0.5, 0, 0], [1, -1, -1],
                        [2, -1, -1], [0, 0, 0], [1, 2], [0, 0], [1.0, -1.0], **kw)


@pytest.mark.parametrize("build", [
    lambda a: Model.load(DEMO_MODEL).with_weights(a("bf16")),
    lambda a: Model.load(DEMO_MODEL).__class__(Model.load(DEMO_MODEL).layers, post=a("none")),
    lambda a: __import__("fastpath.model", fromlist=["Layer"]).Layer(
        [[1.0, 2.0]], [0.0], a("relu")),
    lambda a: _stump(aggregate=a("SUM")),
    lambda a: _stump(post_transform=a("NONE")),
], ids=["weights", "post", "activation", "aggregate", "post_transform"])
def test_a_numpy_array_for_a_named_choice_is_refused(build):
    # np.array(['bf16']) == 'bf16' is array([True]), so `in` took it: the model kept the
    # array, Engine(model) raised TypeError "unhashable type: 'numpy.ndarray'", and
    # Model.save wrote a bundle whose own reader refused it (a list where a name belongs)
    import numpy as np
    with pytest.raises(ModelError, match=r"array\(\[.*not supported; expected one of"):
        build(lambda s: np.array([s]))


def test_a_numpy_string_for_a_named_choice_is_kept_as_str():
    import numpy as np
    from fastpath.model import Layer
    assert type(Model.load(DEMO_MODEL).with_weights(np.str_("bf16")).weights) is str
    assert type(Layer([[1.0]], [0.0], np.str_("tanh")).activation) is str
    assert type(_stump(aggregate=np.str_("MAX")).aggregate) is str


@pytest.mark.parametrize("call", [
    lambda b: __import__("fastpath").Engine(b),
    lambda b: Model.load(b),
    lambda b: Model.from_onnx(b),
], ids=["Engine", "Model.load", "Model.from_onnx"])
def test_a_bundles_bytes_given_as_the_model_path_name_from_bytes(call):
    # it was open()'s ValueError "embedded null byte", naming neither the mistake nor the fix
    with pytest.raises(ModelError, match=r"takes a file path, got the bytes of a fastpath "
                                         r"bundle \(\d+ bytes\); read them with "
                                         r"Model.from_bytes\(blob\)"):
        call(DEMO)


@pytest.mark.parametrize("path", ["a\0b.fpm", "a\0b.onnx", b"x\0.fpm"])
def test_a_path_with_a_nul_is_a_model_error(path, tmp_path):
    import fastpath
    for call in (fastpath.Engine, Model.load, Model.from_onnx,
                 lambda p: Model.load(DEMO_MODEL).save(p)):
        with pytest.raises(ModelError, match="holds a NUL character"):
            call(path)


@pytest.mark.parametrize("pt", [None, "NONE"])
def test_decision_scores_of_a_linear_classifier_need_a_head(tmp_path, pt):
    # a LinearClassifier without a post transform (RidgeClassifier, LinearSVC as skl2onnx
    # writes them) returns raw decision scores; the classifier3 head it was given read them
    # as probabilities: on a RidgeClassifier the engine's signal reached +-4 and its
    # confidence -0.3 and 1.8, outside [-1, 1] and [0, 1]
    from fastpath import Engine
    from fastpath.model import Head
    p, np = _linear_classifier(tmp_path, pt)
    with pytest.raises(ModelError, match=r"LinearClassifier node .* writes decision scores "
                                         r"\(post_transform NONE.*give a head for the scores"):
        Model.from_onnx(p)
    m = Model.from_onnx(p, head=Head("regression", outputs=(2,)))
    r = Engine(m).step(np.array([2.0, -2.0], np.float32))
    assert -1.0 <= r.signal <= 1.0 and 0.0 <= r.confidence <= 1.0


@pytest.mark.parametrize("pt", ["LOGISTIC", "SOFTMAX"])
def test_probabilities_of_a_linear_classifier_keep_the_classifier_head(tmp_path, pt):
    p, _ = _linear_classifier(tmp_path, pt)
    assert Model.from_onnx(p).head_spec.kind == "classifier3"


def _classifier(weights, base=(), post="NONE", n_classes=3):
    """One stump per class: leaf weights for every class on both leaves."""
    from fastpath.model import TreeEnsemble
    n = len(weights)
    wn, wt, wv = [], [], []
    for k, (lo, hi) in enumerate(weights):
        for j in range(n_classes):
            wn += [3 * k + 1, 3 * k + 2]
            wt += [j, j]
            wv += [lo[j], hi[j]]
    return TreeEnsemble(2, n_classes, [3 * k for k in range(n + 1)], [0, 6, 6] * n,
                        [0, 0, 0] * n, [0.0, 0, 0] * n, [1, -1, -1] * n, [2, -1, -1] * n,
                        [0, 0, 0] * n, wn, wt, wv, list(base), "SUM", post, True)


def test_a_tree_classifier_without_probabilities_needs_a_head():
    # XGBoost's multi:softmax, as onnxmltools exports it: raw margins, post NONE; the
    # classifier3 head it got read them as probabilities (signals of +-2.3, confidence 1.4)
    import numpy as np
    from fastpath import Engine
    from fastpath.model import Head
    margins = _classifier([((-1.5, 0.2, 1.9), (2.0, -0.3, -1.8))])
    with pytest.raises(ModelError, match=r"the tree classifier's outputs are not class "
                                         r"probabilities \(post transform NONE, leaf sums "
                                         r"outside \[0, 1\].*give a head"):
        Model((), None, trees=margins)
    m = Model((), None, trees=margins, head_spec=Head("regression", outputs=(2,)))
    r = Engine(m).step(np.array([1.0, 0.0], np.float32))
    assert -1.0 <= r.signal <= 1.0 and 0.0 <= r.confidence <= 1.0
    with pytest.raises(ModelError, match=r"post transform PROBIT"):
        Model((), None, trees=_classifier([((0.1, 0.2, 0.3), (0.3, 0.2, 0.1))], post="PROBIT"))
    with pytest.raises(ModelError, match=r"not class probabilities"):
        # two classes with two base values: onnxruntime writes [-s, s]
        Model((), None, trees=_classifier([((0.1, 0.2), (0.3, 0.4))], base=(0.1, 0.1),
                                          n_classes=2))


@pytest.mark.parametrize("post", ["NONE", "LOGISTIC", "SOFTMAX"])
def test_a_tree_classifier_with_probabilities_keeps_the_classifier_head(post):
    # a random forest's averaged votes (two trees of halves: the sums stay within 1), and any
    # LOGISTIC / SOFTMAX output, are probabilities
    votes = _classifier([((0.5, 0.0, 0.0), (0.0, 0.0, 0.5)), ((0.0, 0.5, 0.0), (0.25, 0.0, 0.25))],
                        post=post)
    assert votes.gives_probabilities()
    assert Model((), None, trees=votes).head_spec.kind == "classifier3"


def test_a_bundle_named_onnx_and_an_onnx_file_named_otherwise_say_which_they_are(tmp_path):
    # Engine(path) and the CLI pick the reader by the suffix: a bundle named .onnx was "not a
    # readable ONNX model (DecodeError: ...)", an ONNX file named model.bin "bad magic
    # b'\x08\x04...'", neither naming what the file is
    import shutil
    import fastpath
    pytest.importorskip("onnx")
    shutil.copy(DEMO_MODEL, tmp_path / "demo.onnx")
    with pytest.raises(ModelError, match=r"demo.onnx is a fastpath bundle, not ONNX: name it "
                                         r"\.fpm, or read it with Model.load"):
        fastpath.Engine(str(tmp_path / "demo.onnx"))
    fastpath.Model.load(DEMO_MODEL).to_onnx(tmp_path / "m.onnx")
    shutil.copy(tmp_path / "m.onnx", tmp_path / "m.bin")
    with pytest.raises(ModelError, match=r"it looks like an ONNX file: name it \.onnx or read "
                                         r"it with Model.from_onnx"):
        fastpath.Engine(str(tmp_path / "m.bin"))


@pytest.mark.parametrize("value", [False, 0, "x"])
def test_a_damaged_scaler_layout_is_named_on_a_bundle_without_scaler_arrays(value):
    # it was "the array table does not match ...: missing arrays ['scaler.offset', ...]"
    with pytest.raises(ModelError, match=r"input_scaler must be 'after_feature_spec' \(or "
                                         r"absent\), got"):
        Model.from_bytes(_edited(DEMO, lambda h: h.__setitem__("input_scaler", value)))


def test_calibrate_on_decision_scores_says_how_to_give_a_head_from_the_command_line(
        tmp_path, capsys):
    from fastpath.cli import main
    p, np = _linear_classifier(tmp_path, "NONE")
    np.save(tmp_path / "t.npy", np.random.default_rng(0).normal(size=(50, 2)).astype(np.float32))
    rc = main(["calibrate", "--ticks", str(tmp_path / "t.npy"), "--model", str(p),
               "--out", str(tmp_path / "o.fpm")])
    err = capsys.readouterr().err
    assert rc == 2 and "writes decision scores" in err
    # the command line takes the head itself (--head)
    assert "on the command line (calibrate, serve, doctor) give it with --head" in err
