"""The ONNX importer's checks on the linear and dense ops: attributes of another type or given
twice, fractional target counts, opset-6 forms onnxruntime has no kernel for
(BatchNormalization in training mode, Add / Mul / Gemm broadcasting by attribute) and dense
layers on an unflattened rank-3 input are a ModelError naming what was wrong."""
import numpy as np
import pytest

from fastpath import ModelError


F = np.float32


def test_onnx_linear_classifier_with_two_label_lists_is_refused(tmp_path):
    """Defect: the int labels read, the string labels ignored (onnxruntime refuses the node)."""
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    from fastpath import Model
    node = helper.make_node("LinearClassifier", ["x"], ["label", "probabilities"],
                            domain="ai.onnx.ml", coefficients=[0.1] * 6, intercepts=[0.1, 0.2],
                            classlabels_ints=[0, 1], classlabels_strings=["a", "b"],
                            post_transform="SOFTMAX")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                      [None, 3])],
                          [helper.make_tensor_value_info("label", TensorProto.INT64, [None]),
                           helper.make_tensor_value_info("probabilities", TensorProto.FLOAT,
                                                         [None, 2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("ai.onnx.ml", 1)])
    p = tmp_path / "lc.onnx"
    p.write_bytes(m.SerializeToString())
    with pytest.raises(ModelError, match="both classlabels_ints and classlabels_strings"):
        Model.from_onnx(str(p))


@pytest.mark.parametrize("op,key", [("LinearRegressor", "coefficients"),
                                    ("LinearRegressor", "intercepts"),
                                    ("Scaler", "offset"), ("Scaler", "scale"),
                                    ("LinearClassifier", "coefficients")])
@pytest.mark.parametrize("bad", ["text", "tensor"])
def test_onnx_number_list_attribute_of_another_type_is_a_model_error(tmp_path, op, key, bad):
    """A damaged file with a string or a tensor where a list of floats belongs raised numpy's
    ValueError / TypeError from deep inside the importer."""
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    from fastpath import Model
    attrs = {"LinearRegressor": dict(coefficients=[0.1] * 6, intercepts=[0.0, 0.0], targets=2),
             "Scaler": dict(offset=[0.0], scale=[1.0]),
             "LinearClassifier": dict(coefficients=[0.1] * 6, intercepts=[0.1, 0.2],
                                      classlabels_ints=[0, 1])}[op]
    attrs[key] = "abc" if bad == "text" else numpy_helper.from_array(np.ones(6, F))
    outs = ["label", "y"] if op == "LinearClassifier" else ["y"]
    vi = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, None])]
    if op == "LinearClassifier":
        vi.insert(0, helper.make_tensor_value_info("label", TensorProto.INT64, [None]))
    g = helper.make_graph([helper.make_node(op, ["x"], outs, domain="ai.onnx.ml", **attrs)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3])], vi)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("ai.onnx.ml", 1)])
    p = tmp_path / "a.onnx"
    p.write_bytes(m.SerializeToString())
    with pytest.raises(ModelError, match=f"attribute {key} is a .*expected a list of numbers"):
        Model.from_onnx(str(p), head=None)


def test_onnx_fractional_linear_regressor_targets_is_refused(tmp_path):
    """Defect: targets = 2.5 read as 2 (six coefficients then made 2 x 3 weights)."""
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    from fastpath import Model
    node = helper.make_node("LinearRegressor", ["x"], ["y"], domain="ai.onnx.ml",
                            coefficients=[0.1] * 6, intercepts=[0.0, 0.0], targets=2.5)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                      [None, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("ai.onnx.ml", 1)])
    p = tmp_path / "lr.onnx"
    p.write_bytes(m.SerializeToString())
    with pytest.raises(ModelError, match="targets is 2.5, expected an integer"):
        Model.from_onnx(str(p))


@pytest.mark.parametrize("attrs", [{}, {"is_test": 0}])
def test_onnx_opset6_batchnorm_in_training_mode_is_refused(tmp_path, attrs):
    """Before opset 7 BatchNormalization ran in training mode unless is_test = 1 (batch
    statistics); fastpath folded the running mean / variance in as if it were inference."""
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    from fastpath.model.onnx_import import read_onnx

    def graph(opset, **a):
        rng = np.random.default_rng(0)
        arrs = {"W": rng.standard_normal((4, 3)).astype(F), "b": np.zeros(4, F)}
        arrs.update({k: rng.random(4).astype(F) + 0.5 for k in ("g", "be", "mu", "var")})
        arrs["W"] = arrs["W"].T.copy()      # MatMul: the dense layer opset 6 still runs
        nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]),
                 helper.make_node("BatchNormalization", ["h", "g", "be", "mu", "var"], ["y"],
                                  **a)]
        g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
            "x", TensorProto.FLOAT, [None, 3])], [helper.make_tensor_value_info(
                "y", TensorProto.FLOAT, [None, 4])],
            [numpy_helper.from_array(v, k) for k, v in arrs.items()])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
        m.ir_version = 7
        p = tmp_path / f"bn{opset}.onnx"
        p.write_bytes(m.SerializeToString())
        return str(p)
    with pytest.raises(ModelError, match="in training mode"):
        read_onnx(graph(6, **attrs))
    assert len(read_onnx(graph(6, is_test=1))["layers"]) == 1
    assert len(read_onnx(graph(9))["layers"]) == 1


@pytest.mark.parametrize("op", ["Add", "Mul", "Gemm"])
def test_onnx_opset6_broadcasting_ops_are_refused(tmp_path, op):
    """Before opset 7 Add / Mul / Gemm broadcast by attributes (an axis-0 constant is one
    value per row, not per feature) and onnxruntime has no kernel for them: fastpath read
    Add(x, c, broadcast=1, axis=0) as a per-feature bias."""
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    from fastpath.model.onnx_import import read_onnx
    arrs = {"W": np.ones((3, 3), F), "c": np.arange(3, dtype=F), "b": np.zeros(3, F)}
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"])]
    if op == "Gemm":
        nodes = [helper.make_node("Gemm", ["x", "W", "b"], ["y"], transB=1, broadcast=1)]
    else:
        nodes.append(helper.make_node(op, ["h", "c"], ["y"], broadcast=1, axis=0))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                     [3, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 3])],
                          [numpy_helper.from_array(v, k) for k, v in arrs.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 6)])
    m.ir_version = 7
    p = tmp_path / "o6.onnx"
    p.write_bytes(m.SerializeToString())
    with pytest.raises(ModelError, match=f"{op} node '' of opset 6: before opset 7"):
        read_onnx(str(p))


@pytest.mark.parametrize("op", ["Gemm", "MatMul"])
def test_onnx_dense_layer_on_an_unflattened_rank3_input_is_refused(tmp_path, op):
    """A (batch, 2, 3) input straight into a 6-input layer: onnxruntime refuses the graph
    (Gemm wants rank 2, MatMul multiplies each inner row); fastpath read it as flattened."""
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    from fastpath.model.onnx_import import read_onnx
    W = np.ones((2, 6), F)

    def graph(flatten):
        src = "f" if flatten else "x"
        nodes = [helper.make_node("Gemm", [src, "W", "b"], ["y"], transB=1) if op == "Gemm"
                 else helper.make_node("MatMul", [src, "W"], ["y"])]
        if flatten:
            nodes.insert(0, helper.make_node("Flatten", ["x"], ["f"], axis=1))
        g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
            "x", TensorProto.FLOAT, [None, 2, 3])], [helper.make_tensor_value_info(
                "y", TensorProto.FLOAT, None)], [
            numpy_helper.from_array(W if op == "Gemm" else W.T.copy(), "W"),
            numpy_helper.from_array(np.zeros(2, F), "b")])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        p = tmp_path / f"d{flatten}.onnx"
        p.write_bytes(m.SerializeToString())
        return str(p)
    with pytest.raises(ModelError, match=f"{op} node '' reads the rank-3 model input"):
        read_onnx(graph(False))
    assert read_onnx(graph(True))["layers"][0][0].shape == (2, 6)
