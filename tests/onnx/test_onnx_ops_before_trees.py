"""Leading ops before an ONNX tree ensemble are read in onnxruntime's float32 semantics or
refused: a Div whose reciprocal is inexact, two shifts, two scales; one shift then one scale is
read and matches onnxruntime on the threshold, on every kernel set."""
import numpy as np
import pytest

from fastpath import Engine, ModelError
from fastpath.model import Head, Model
from helpers.builders import engine_cfg
from helpers.oracle import ort_runner

F = np.float32



onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")


def _tree_after(path, lead_nodes, consts, threshold):
    """x [N, 1] -> lead_nodes (ending in "s") -> one split s <= threshold: 1.0, else 2.0."""
    from onnx import TensorProto, helper, numpy_helper
    tree = helper.make_node(
        "TreeEnsembleRegressor", ["s"], ["y"], domain="ai.onnx.ml", n_targets=1,
        nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[0, 0, 0],
        nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"], nodes_values=[float(threshold), 0.0, 0.0],
        nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[2, 0, 0], target_treeids=[0, 0],
        target_nodeids=[1, 2], target_ids=[0, 0], target_weights=[1.0, 2.0])
    g = helper.make_graph(
        list(lead_nodes) + [tree], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])],
        [numpy_helper.from_array(np.asarray([v], F), k) for k, v in consts.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("ai.onnx.ml", 3)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return str(path)


def _ort(path, x):
    s = ort_runner(path)
    return s.run(None, {"x": np.asarray([[x]], F)})[0][0]


def _first(xs, ref, fused):
    """The first x whose fused float32 value is above onnxruntime's step-by-step one."""
    i = np.flatnonzero(fused > ref)
    assert i.size
    return xs[i[0]], ref[i[0]]


def test_div_before_a_tree_off_by_an_ulp_is_refused(tmp_path, isa):
    """x / 3 read as x * (1 / 3) is an ulp off onnxruntime: at x = 270.51694, onnxruntime's x / 3 = 90.17231 sits
    on the threshold (leaf 1.0), 90.17232 takes the other branch (2.0): refused."""
    from onnx import helper
    xs = np.random.default_rng(0).uniform(1, 1000, 100000).astype(F)
    x, t = _first(xs, xs / F(3), xs * (F(1) / F(3)))
    p = _tree_after(tmp_path / "div3.onnx", [helper.make_node("Div", ["x", "c"], ["s"])],
                    {"c": 3.0}, t)
    assert _ort(p, x)[0] == 1.0
    with pytest.raises(ModelError, match="Div node.*reciprocal is not exact"):
        Model.from_onnx(p)
    # by a power of 2 the product is the quotient: read, and on the threshold as onnxruntime
    p4 = _tree_after(tmp_path / "div4.onnx", [helper.make_node("Div", ["x", "c"], ["s"])],
                     {"c": 4.0}, F(x) / F(4))
    m = Model.from_onnx(p4, head=Head("regression", 1.0, (0,)))
    assert _ort(p4, x)[0] == 1.0
    assert Engine(m, config=engine_cfg(isa)).predict(np.asarray([x], F))[0] == 1.0
    assert m.forward(np.asarray([x], F))[0] == 1.0


def test_two_shifts_before_a_tree_are_refused_one_shift_one_scale_read(tmp_path, isa):
    """(x - a) - b read as x - (a + b), rounded once, puts a value on the threshold in
    onnxruntime an ulp above it: refused. One Sub then one Mul is onnxruntime's own two
    roundings and is read, matching it at the threshold on every kernel set."""
    from onnx import helper
    a, b = F(1234.567), F(0.1)
    xs = np.random.default_rng(1).uniform(1000, 2000, 100000).astype(F)
    step = (xs - a) - b
    fused = xs - F(np.float64(a) + np.float64(b))
    x, t = _first(xs, step, fused)
    p = _tree_after(tmp_path / "subsub.onnx",
                    [helper.make_node("Sub", ["x", "a"], ["u"]),
                     helper.make_node("Sub", ["u", "b"], ["s"])], {"a": a, "b": b}, t)
    assert _ort(p, x)[0] == 1.0
    with pytest.raises(ModelError, match="second shift"):
        Model.from_onnx(p)
    # two scales likewise
    p2 = _tree_after(tmp_path / "mulmul.onnx",
                     [helper.make_node("Mul", ["x", "a"], ["u"]),
                      helper.make_node("Mul", ["u", "b"], ["s"])], {"a": a, "b": b}, 0.0)
    with pytest.raises(ModelError, match="second scale"):
        Model.from_onnx(p2)
    # Sub then Mul: exact at a value on the threshold
    s = F(0.37)
    t1 = (F(x) - a) * s
    p3 = _tree_after(tmp_path / "submul.onnx",
                     [helper.make_node("Sub", ["x", "a"], ["u"]),
                      helper.make_node("Mul", ["u", "s2"], ["s"])], {"a": a, "s2": s}, t1)
    m = Model.from_onnx(p3, head=Head("regression", 1.0, (0,)))
    xv = np.asarray([x], F)
    assert _ort(p3, x)[0] == 1.0
    e = Engine(m, config=engine_cfg(isa))
    assert e.predict(xv)[0] == 1.0 and m.forward(xv)[0] == 1.0
    assert e.step(xv, 0).signal == pytest.approx(np.tanh(1.0), abs=1e-6)
    # a shift of 0 beside another (a Scaler with offset 0 after a Sub) changes nothing: read
    p5 = _tree_after(tmp_path / "sub_scaler.onnx",
                     [helper.make_node("Sub", ["x", "a"], ["u"]),
                      helper.make_node("Scaler", ["u"], ["s"], domain="ai.onnx.ml",
                                       offset=[0.0], scale=[float(s)])], {"a": a}, t1)
    m5 = Model.from_onnx(p5, head=Head("regression", 1.0, (0,)))
    assert m5.forward(xv)[0] == _ort(p5, x)[0] == 1.0
