"""Tree ensembles built directly and from ONNX: ids, thresholds, weights and attributes the
importer or the C packer would misread (ids past int32, float64 thresholds, weights of another
type, attributes given twice or of another type, fractional target counts) are refused with a
ModelError naming the file and its own tree and node ids, or read as onnxruntime reads them."""
import numpy as np
import pytest

from fastpath import ModelError, TreeEnsemble
from fastpath._kernels import PackedTrees, tree_isas
from helpers.models import _tree_graph
from helpers.oracle import ort_first

F = np.float32


def _stump(mode, thr, n_feat=1, feature=0, values=(1.0, 2.0)):
    """One split on `feature` in `mode` (an index into trees.MODES) at `thr`; true leaf
    values[0], false leaf values[1]."""
    return TreeEnsemble(n_feat, 1, [0, 3], [mode, 6, 6], [feature, 0, 0],
                        np.asarray([thr, 0, 0]), [1, 0, 0], [2, 0, 0], [0, 0, 0], [1, 2], [0, 0],
                        list(values))


def _eval_all(trees, X):
    """forward() and every kernel set this CPU runs, on rows X."""
    X = np.asarray(X, F)
    out = {"forward": trees.forward(X)}
    for k in tree_isas():
        out[k] = PackedTrees(trees, k).eval(X)
    return out


# ------------------------------------------------------------ integer ids that wrap

@pytest.mark.parametrize("field,value", [("feature", 2 ** 32 + 1), ("weight_target", 2 ** 32),
                                         ("feature", -2 ** 32), ("tree_offsets", 2 ** 32 + 3)])
def test_ids_outside_int32_are_refused_not_wrapped(field, value):
    """Defect: np.array(x, dtype=int32) wrapped 2**32 + 1 to 1, a split silently on feature 1."""
    kw = dict(n_features=4, n_targets=2, tree_offsets=np.array([0, 3], np.int64),
              mode=[0, 6, 6], feature=np.array([1, 0, 0], np.int64), threshold=[0.5, 0, 0],
              true_child=[1, 0, 0], false_child=[2, 0, 0], nan_true=[0, 0, 0],
              weight_node=[1, 2], weight_target=np.array([0, 1], np.int64),
              weight_value=[1.0, 2.0])
    arr = np.array(kw[field], np.int64)
    arr[-1 if field == "tree_offsets" else 0] = value
    kw[field] = arr
    with pytest.raises(ModelError, match=f"{field} holds {value}, outside"):
        TreeEnsemble(**kw)


def test_onnx_feature_id_past_int32_is_refused(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    from fastpath import Model
    node = helper.make_node(
        "TreeEnsembleRegressor", ["x"], ["y"], domain="ai.onnx.ml", nodes_treeids=[0, 0, 0],
        nodes_nodeids=[0, 1, 2], nodes_featureids=[2 ** 32 + 1, 0, 0],
        nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"], nodes_values=[0.5, 0, 0],
        nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[2, 0, 0], target_treeids=[0, 0],
        target_nodeids=[1, 2], target_ids=[0, 0], target_weights=[1.0, 2.0], n_targets=1)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                      [None, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("ai.onnx.ml", 3)])
    p = tmp_path / "wide_id.onnx"
    p.write_bytes(m.SerializeToString())
    # onnxruntime refuses this file; fastpath read it as a split on feature 1
    with pytest.raises(ModelError, match="4294967297"):
        Model.from_onnx(str(p))
    del onnx


# ------------------------------------------------- float64 thresholds, rounded per mode

def _f64_cases():
    one = F(1.0)
    nxt = np.nextafter(one, F(2))
    mid = (np.float64(one) + np.float64(nxt)) / 2      # rounds (to even) onto 1.0
    mid2 = (np.float64(nxt) + np.float64(np.nextafter(nxt, F(2)))) / 2   # rounds up
    return [mid, mid2, 1e39, -1e39, 0.1, -0.1, 1e-46, -1e-46]


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
@pytest.mark.parametrize("t64", _f64_cases())
def test_float64_threshold_splits_float32_inputs_as_given(mode, t64):
    """A float64 threshold rounded to the nearest float32 sent the input equal to the rounded
    value the other way: t = (1 + nextafter(1)) / 2 with BRANCH_LT sent x = 1.0 (< t) to the
    false leaf; 1e39 with BRANCH_LEQ became +inf and sent x = inf (> 1e39) to the true one."""
    t = _stump(mode, np.float64(t64))
    fmax = float(np.finfo(F).max)
    c = F(min(max(t64, -fmax), fmax))
    with np.errstate(over="ignore"):
        xs = [c, np.nextafter(c, F(-np.inf)), np.nextafter(c, F(np.inf)), F(np.inf),
              F(-np.inf), F(0), F(-0.0)]
    X = np.asarray(xs, F)[:, None]
    x64 = X[:, 0].astype(np.float64)
    want = np.where([x64 <= t64, x64 < t64, x64 >= t64, x64 > t64][mode], 1.0, 2.0)
    for k, got in _eval_all(t, X).items():
        np.testing.assert_array_equal(got[:, 0], want.astype(F), err_msg=f"{k} mode {mode}")


@pytest.mark.parametrize("mode", [4, 5])
def test_float64_equality_threshold_no_float32_equals_is_refused(mode):
    t64 = (np.float64(1.0) + np.float64(np.nextafter(F(1), F(2)))) / 2
    with pytest.raises(ModelError, match="no float32 input equals"):
        _stump(mode, t64)
    # a float64 value that is a float32 is kept exactly
    t = _stump(mode, np.float64(0.5))
    assert t.threshold[0] == F(0.5)


def test_sklearn_tree_arrays_match_sklearn_predict(isa):
    """A TreeEnsemble built straight from a fitted sklearn tree (float64 thresholds at the
    midpoints of float32 training values) predicts what sklearn does on the training values
    themselves, on every kernel set: sklearn compares float32 x with the float64 threshold."""
    sk = pytest.importorskip("sklearn.tree")
    rng = np.random.default_rng(4)
    # consecutive float32 values, one feature: a node holds a run of them, so each split lies
    # between two neighbours a < b, its midpoint is no float32 and half of them round onto b
    # (at 2.0, where they are 2.4e-7 apart: sklearn does not split values within 1e-7)
    X = (F(2.0) + np.arange(64, dtype=F) * 2 * np.finfo(F).eps)[:, None]
    y = rng.standard_normal(64)
    est = sk.DecisionTreeRegressor(random_state=0).fit(X, y)
    tr = est.tree_
    leaf = tr.children_left == -1
    n = tr.node_count
    wn = np.flatnonzero(leaf)
    t = TreeEnsemble(1, 1, [0, n], np.where(leaf, 6, 0), np.where(leaf, 0, tr.feature),
                     tr.threshold, np.where(leaf, -1, tr.children_left),
                     np.where(leaf, -1, tr.children_right), np.zeros(n), wn, np.zeros(wn.size),
                     tr.value[wn, 0, 0].astype(F))
    want = est.predict(X).astype(F)
    got = PackedTrees(t, isa).eval(X)[:, 0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(t.forward(X)[:, 0], want, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------- ONNX weights of another type

def _gemm_graph(tmp_path, W, b, in_type, cast_first=False):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper
    nodes = [helper.make_node("Gemm", ["xf" if cast_first else "x", "W", "b"], ["y"], transB=1)]
    if cast_first:
        nodes.insert(0, helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", in_type,
                                                                     [None, W.shape[1]])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT if cast_first
                                                         else in_type, [None, W.shape[0]])],
                          [numpy_helper.from_array(W, "W"), numpy_helper.from_array(b, "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    p = tmp_path / "g.onnx"
    p.write_bytes(m.SerializeToString())
    del onnx
    return str(p)


def test_onnx_weights_of_another_type_than_the_input_are_refused(tmp_path):
    """float64 weights (numpy's default) beside a float32 input: onnxruntime refuses to load
    the graph; fastpath served it as if it were a float32 model."""
    pytest.importorskip("onnx")
    from onnx import TensorProto

    from fastpath import Model
    rng = np.random.default_rng(0)
    W, b = rng.standard_normal((2, 3)), rng.standard_normal(2).astype(F)
    with pytest.raises(ModelError, match="constant 'W' is float64 but the tensor it meets is "
                                         "float32; onnxruntime refuses mixed"):
        Model.from_onnx(_gemm_graph(tmp_path, W, b, TensorProto.FLOAT))
    # an integer input feeding a layer: integer math is not what fastpath computes
    with pytest.raises(ModelError, match="computes on the int64 input"):
        Model.from_onnx(_gemm_graph(tmp_path, np.ones((2, 3), np.int64), np.ones(2, np.int64),
                                    TensorProto.INT64))
    # consistent types still load: a double model, and an int input cast to float first
    m = Model.from_onnx(_gemm_graph(tmp_path, W, b.astype(np.float64), TensorProto.DOUBLE))
    np.testing.assert_allclose(m.layers[0].weight, W.astype(F))
    m = Model.from_onnx(_gemm_graph(tmp_path, W.astype(F), b, TensorProto.INT64, cast_first=True))
    x = np.array([1, -2, 3], F)
    np.testing.assert_allclose(m.forward(x), W.astype(F) @ x + b, rtol=1e-6)


# --------------------------------------------- ONNX tree errors in the file's own ids


def test_onnx_tree_errors_name_the_files_tree_and_node_ids(tmp_path):
    """The errors named trees by position and nodes by index inside their tree ("tree 1 node
    0"), numbers that appear nowhere in the file; they name its tree id and node id now."""
    from fastpath import Model
    ok = [(3, 10, 0, "BRANCH_LEQ", 0.0, 11, 12), (3, 11, 0, "LEAF", 0, 0, 0),
          (3, 12, 0, "LEAF", 0, 0, 0)]
    bad = [(7, 20, 5, "BRANCH_LEQ", 0.0, 21, 22), (7, 21, 0, "LEAF", 0, 0, 0),
           (7, 22, 0, "LEAF", 0, 0, 0)]
    w = [(3, 11, 1.0), (3, 12, 2.0), (7, 21, 1.0), (7, 22, 2.0)]
    with pytest.raises(ModelError, match="tree id 7 node id 20 splits on feature 5"):
        Model.from_onnx(_tree_graph(tmp_path, ok + bad, w))
    # a tree listed leaf first: onnxruntime takes the first listed node as the root
    shuffled = ok + [bad[1], (7, 20, 1, "BRANCH_LEQ", 0.0, 21, 22), bad[2]]
    with pytest.raises(ModelError, match=r"tree id 7: node id 20 cannot be reached from the "
                                         r"root \(a tree's root is its first listed node, here "
                                         r"node id 21"):
        Model.from_onnx(_tree_graph(tmp_path, shuffled, w))


# ------------------------------------------------------------ forward's input shape

@pytest.mark.parametrize("shape", [(4,), (2,), (5, 4), (5, 2), (2, 3, 3), (0,)])
def test_forward_refuses_rows_of_another_width(shape):
    """The numpy reference took a 4-feature row for a 3-feature tree model and answered
    (the extra feature ignored, or the features misplaced), and raised IndexError /
    numpy's ValueError for narrower rows, for trees and MLPs alike."""
    from fastpath import InputError, Model
    from fastpath.model import Layer
    t = _stump(0, 0.5, n_feat=3, feature=2)
    mlp = Model((Layer(np.ones((2, 3), F), np.zeros(2, F), "identity"),))
    for m in (Model((), trees=t), mlp):
        with pytest.raises(InputError, match=r"features must have shape \(3,\) or \(n, 3\)"):
            m.forward(np.zeros(shape, F))
    with pytest.raises(InputError, match="features must be numbers"):
        t.forward(np.array(["a", "b", "c"]))
    # the shapes it documents still work, empty batches included
    assert Model((), trees=t).forward(np.zeros((0, 3), F)).shape == (0, 1)
    assert mlp.forward(np.zeros(3, F)).shape == (2,)


def _regressor_attrs(**extra):
    a = dict(nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[0, 0, 0],
             nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"], nodes_truenodeids=[1, 0, 0],
             nodes_falsenodeids=[2, 0, 0], target_treeids=[0, 0], target_nodeids=[1, 2],
             target_ids=[0, 0], n_targets=1)
    a.update(extra)
    return a


def _one_node_graph(tmp_path, op, attrs, outs):
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    node = helper.make_node(op, ["x"], outs, domain="ai.onnx.ml", **attrs)
    vi = [helper.make_tensor_value_info(outs[-1], TensorProto.FLOAT, [None, None])]
    if len(outs) == 2:
        vi.insert(0, helper.make_tensor_value_info(outs[0], TensorProto.INT64, [None]))
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                      [None, 1])], vi)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("ai.onnx.ml", 3)])
    p = tmp_path / "n.onnx"
    p.write_bytes(m.SerializeToString())
    return str(p)


@pytest.mark.parametrize("key", ["nodes_values", "target_weights", "base_values"])
def test_onnx_tree_attribute_given_twice_is_refused(tmp_path, key):
    """A list given both as floats and as a tensor (onnxruntime refuses the node): fastpath
    read the float list and served thresholds / weights / base values the tensor contradicts."""
    from onnx import numpy_helper

    from fastpath import Model
    vals = {"nodes_values": [1.0, 0.0, 0.0], "target_weights": [1.0, 2.0], "base_values": [3.0]}
    a = _regressor_attrs(nodes_values=[1.0, 0, 0], target_weights=[1.0, 2.0])
    if key == "base_values":
        a["base_values"] = vals[key]
    a[key + "_as_tensor"] = numpy_helper.from_array(-np.asarray(vals[key], F))
    with pytest.raises(ModelError, match=f"has both {key} and {key}_as_tensor"):
        Model.from_onnx(_one_node_graph(tmp_path, "TreeEnsembleRegressor", a, ["y"]))


def test_onnx_tree_without_thresholds_is_refused(tmp_path):
    """Defect: every split read at threshold 0 (onnxruntime refuses the node)."""
    from fastpath import Model
    p = _one_node_graph(tmp_path, "TreeEnsembleRegressor", _regressor_attrs(
        target_weights=[1.0, 2.0]), ["y"])
    with pytest.raises(ModelError, match="has no nodes_values"):
        Model.from_onnx(p)


def test_onnx_classifier_with_two_label_lists_is_refused(tmp_path):
    # int64 and string labels of different counts: fastpath took the first list's count
    from fastpath import Model
    a = dict(nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[0, 0, 0],
             nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"], nodes_values=[1.0, 0, 0],
             nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[2, 0, 0],
             class_treeids=[0, 0, 0, 0], class_nodeids=[1, 1, 2, 2], class_ids=[0, 1, 0, 1],
             class_weights=[0.2, 0.8, 0.6, 0.4], classlabels_int64s=[0, 1],
             classlabels_strings=["a", "b", "c"])
    p = _one_node_graph(tmp_path, "TreeEnsembleClassifier", a, ["label", "probabilities"])
    with pytest.raises(ModelError, match="both classlabels_int64s .2. and classlabels_strings .3."):
        Model.from_onnx(p)


def test_onnx_op_of_another_domain_is_refused(tmp_path):
    """A node is its domain and type: a "Gemm" of a custom domain, or a
    TreeEnsembleRegressor outside ai.onnx.ml, was read as the standard op."""
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    from fastpath import Model
    W, b = np.ones((2, 3), F), np.zeros(2, F)
    g = helper.make_graph([helper.make_node("Gemm", ["x", "W", "b"], ["y"], transB=1,
                                            domain="com.example")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 2])],
                          [numpy_helper.from_array(W, "W"), numpy_helper.from_array(b, "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("com.example", 1)])
    p = tmp_path / "custom.onnx"
    p.write_bytes(m.SerializeToString())
    with pytest.raises(ModelError, match=r"\(Gemm\) is in domain 'com.example'; fastpath reads "
                                         r"Gemm of the default \(ai.onnx\) domain only"):
        Model.from_onnx(str(p))
    a = _regressor_attrs(nodes_values=[1.0, 0, 0], target_weights=[1.0, 2.0])
    node = helper.make_node("TreeEnsembleRegressor", ["x"], ["y"], **a)     # default domain
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                      [None, 1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    p.write_bytes(m.SerializeToString())
    with pytest.raises(ModelError, match="of the ai.onnx.ml domain only"):
        Model.from_onnx(str(p))


@pytest.mark.parametrize("flag", ["false", "no", 2, None, [0]])
def test_classifier_flag_of_another_type_is_refused(flag):
    """Defect: bool("false") is True, so a regressor was finished as a two-class classifier."""
    with pytest.raises(ModelError, match="classifier must be True or False"):
        TreeEnsemble(1, 2, [0, 3], [0, 6, 6], [0, 0, 0], [0.5, 0, 0], [1, 0, 0], [2, 0, 0],
                     [0, 0, 0], [1, 1, 2, 2], [0, 1, 0, 1], [0.2, 0.8, 0.6, 0.4],
                     classifier=flag)


@pytest.mark.parametrize("where", ["weight_value", "base_values"])
def test_values_beyond_float32_are_named(where):
    """Defect: "leaf weights contain NaN/Inf" for a finite 1e39 (the cast made it Inf)."""
    kw = dict(weight_value=[1.0, 2.0], base_values=[0.5])
    kw[where] = [1e39, 2.0] if where == "weight_value" else [-1e39]
    with pytest.raises(ModelError, match=r"hold -?1e\+39, beyond float32's range"):
        TreeEnsemble(1, 1, [0, 3], [0, 6, 6], [0, 0, 0], [0.5, 0, 0], [1, 0, 0], [2, 0, 0],
                     [0, 0, 0], [1, 2], [0, 0], **kw)


def test_onnx_fractional_target_count_is_refused(tmp_path):
    """Defect: n_targets = 2.5 read as 2 targets."""
    from fastpath import Model
    a = _regressor_attrs(nodes_values=[1.0, 0, 0], target_weights=[1.0, 2.0], n_targets=2.5)
    with pytest.raises(ModelError, match="n_targets is 2.5, expected an integer"):
        Model.from_onnx(_one_node_graph(tmp_path, "TreeEnsembleRegressor", a, ["y"]))


def test_onnx_tree_on_a_rank3_input(tmp_path):
    """onnxruntime refuses an ensemble reading a (batch, 2, 3) input; fastpath took its last
    dimension as the features (3), so feature 4 of the flattened row was out of reach. Now it
    is refused unflattened, and read as 6 features behind a Flatten (equal to onnxruntime)."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    from fastpath import Model
    a = _regressor_attrs(nodes_values=[0.5, 0, 0], target_weights=[1.0, 2.0],
                         nodes_featureids=[4, 0, 0])

    def graph(flatten):
        nodes = [helper.make_node("TreeEnsembleRegressor", ["f" if flatten else "x"], ["y"],
                                  domain="ai.onnx.ml", **a)]
        if flatten:
            nodes.insert(0, helper.make_node("Flatten", ["x"], ["f"], axis=1))
        g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
            "x", TensorProto.FLOAT, [None, 2, 3])], [helper.make_tensor_value_info(
                "y", TensorProto.FLOAT, [None, 1])])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                                helper.make_opsetid("ai.onnx.ml", 3)])
        p = tmp_path / f"r3{flatten}.onnx"
        p.write_bytes(m.SerializeToString())
        return str(p)
    with pytest.raises(ModelError, match="reads the rank-3 model input"):
        Model.from_onnx(graph(False))
    p = graph(True)
    m = Model.from_onnx(p)
    assert m.trees.n_features == 6
    X = np.random.default_rng(0).standard_normal((20, 2, 3)).astype(F)
    want = ort_first(p, X)
    for k, got in _eval_all(m.trees, X.reshape(20, 6)).items():
        np.testing.assert_array_equal(got, want, err_msg=k)


def test_onnx_tree_model_errors_name_the_file(tmp_path):
    # the MLP path named the file in a Model-level error (no head for 4 outputs); trees did not
    from fastpath import Model
    a = _regressor_attrs(nodes_values=[1.0, 0, 0], target_weights=[1.0, 2.0, 3.0, 4.0],
                         target_treeids=[0, 0, 0, 0], target_nodeids=[1, 1, 2, 2],
                         target_ids=[0, 1, 2, 3], n_targets=4)
    p = _one_node_graph(tmp_path, "TreeEnsembleRegressor", a, ["y"])
    with pytest.raises(ModelError, match=r"n\.onnx: the tree ensemble has 4 outputs"):
        Model.from_onnx(p)
