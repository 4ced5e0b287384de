"""ONNX tree ensembles behind a Reshape of an input whose width is open or unstated."""
import numpy as np
import pytest

import fastpath
from fastpath.model import Head, Model
from helpers.oracle import ort_runner


# ------------------------------------------------------------------ ONNX: trees, width left open
def _reshaped_stump(path, in_shape, rshape):
    """Reshape(x, rshape) -> a one-split TreeEnsembleRegressor on feature 2."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper
    kw = dict(nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[2, 0, 0],
              nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"], nodes_values=[0.5, 0.0, 0.0],
              nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[2, 0, 0], target_treeids=[0, 0],
              target_nodeids=[1, 2], target_ids=[0, 0], target_weights=[1.0, -2.0])
    nodes = [helper.make_node("Reshape", ["x", "shp"], ["xr"]),
             helper.make_node("TreeEnsembleRegressor", ["xr"], ["y"], domain="ai.onnx.ml",
                              n_targets=1, **kw)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                     in_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(np.array(rshape, np.int64), "shp")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("ai.onnx.ml", 3)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return str(path)


@pytest.mark.parametrize("in_shape", [[None, None], None], ids=["open-width", "no-shape"])
def test_tree_ensemble_behind_a_reshape_on_an_input_of_open_width_loads(tmp_path, in_shape):
    """Regression: a tree ensemble behind a no-op Reshape of an open-width input was refused."""
    pytest.importorskip("onnxruntime")
    p = _reshaped_stump(tmp_path / "t.onnx", in_shape, [-1, 4])
    m = Model.from_onnx(p, head=Head("regression"))
    assert m.dims[0] == 4
    X = np.random.default_rng(0).standard_normal((16, 4)).astype(np.float32)
    ref = ort_runner(p).run(["y"], {"x": X})[0]
    np.testing.assert_allclose(m.forward(X), ref, rtol=1e-6, atol=1e-6)
    # rows narrower than the features the trees read are still refused
    with pytest.raises(fastpath.ModelError, match="feature 2"):
        Model.from_onnx(_reshaped_stump(tmp_path / "n.onnx", in_shape, [-1, 2]),
                        head=Head("regression"))
