"""Model builders: hand-built ONNX graphs, tree ensembles, bundles edited byte by byte, exporter
outputs. onnx is imported where a builder needs it, so a test without onnx can import this."""
import json
import struct
import zlib

import numpy as np
import pytest

from fastpath import TreeEnsemble
from fastpath.model import Head, Layer, Model
from fastpath.model.bundle import END, MAGIC
from helpers.builders import strip_fastpath_record


def _patched_make_attribute():
    """skl2onnx 1.20 hands HistGradientBoosting's missing-value tracks to onnx as Python bools,
    which onnx 1.2x refuses in an int list: convert them, as the exporter meant to."""
    from onnx import helper
    real = helper.make_attribute

    def fixed(key, value, *a, **k):
        if isinstance(value, (list, tuple)) and any(isinstance(v, (bool, np.bool_)) for v in value):
            value = [int(v) for v in value]
        return real(key, value, *a, **k)
    return real, fixed


def _skl(est, X, path, opset=None):
    from onnx import helper
    from skl2onnx import to_onnx
    opts = {id(est): {"zipmap": False}} if hasattr(est, "predict_proba") else None
    real, fixed = _patched_make_attribute()
    helper.make_attribute = fixed
    try:
        m = to_onnx(est, X[:1], options=opts, target_opset=opset)
    finally:
        helper.make_attribute = real
    path.write_bytes(m.SerializeToString())
    return str(path)


F32 = np.float32


def _tree_graph(tmp_path, rows, weights, n_in=2):
    """TreeEnsembleRegressor from rows (tree id, node id, feature, mode, value, true id,
    false id) and weights (tree id, node id, value)."""
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    a = dict(nodes_treeids=[r[0] for r in rows], nodes_nodeids=[r[1] for r in rows],
             nodes_featureids=[r[2] for r in rows], nodes_modes=[r[3] for r in rows],
             nodes_values=[r[4] for r in rows], nodes_truenodeids=[r[5] for r in rows],
             nodes_falsenodeids=[r[6] for r in rows], target_treeids=[w[0] for w in weights],
             target_nodeids=[w[1] for w in weights], target_ids=[0] * len(weights),
             target_weights=[w[2] for w in weights], n_targets=1)
    node = helper.make_node("TreeEnsembleRegressor", ["x"], ["y"], domain="ai.onnx.ml", **a)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                      [None, n_in])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("ai.onnx.ml", 3)])
    p = tmp_path / "t.onnx"
    p.write_bytes(m.SerializeToString())
    return str(p)


def _prices(n, seed=0):
    """Two price-like columns (6.5e4 +- 0.5) beside four 1e-2-scale ones."""
    rng = np.random.default_rng(seed)
    X = np.empty((n, 6), np.float32)
    X[:, 0] = 65000 + rng.uniform(-0.5, 0.5, n)
    X[:, 1] = 65000.25 + rng.uniform(-0.5, 0.5, n)
    X[:, 2:] = rng.normal(0, 1e-2, (n, 4))
    y = (X[:, 0] - 65000.0) * 2 - (X[:, 1] - 65000.25) + X[:, 2] * 50 + np.sin(X[:, 3] * 100)
    return X, y


def _edited(blob: bytes, edit) -> bytes:
    """The bundle with its JSON header changed by edit(header) and the CRC recomputed."""
    hlen = struct.unpack("<I", blob[12:16])[0]
    header = json.loads(blob[16:16 + hlen])
    payload = blob[16 + hlen + (-(16 + hlen)) % 64:-len(END) - 4]
    edit(header)
    hb = json.dumps(header, sort_keys=True).encode()
    body = MAGIC + struct.pack("<II", 1, len(hb)) + hb
    body += b"\0" * ((-len(body)) % 64) + payload
    return body + struct.pack("<I", zlib.crc32(body)) + END


def _linear_classifier(tmp_path, post_transform):
    import numpy as np
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    attrs = dict(coefficients=[3.0, -1.0, 0.5, 0.5, -3.0, 1.0], intercepts=[0.2, 0.0, -0.2],
                 classlabels_ints=[0, 1, 2])
    if post_transform is not None:
        attrs["post_transform"] = post_transform
    node = helper.make_node("LinearClassifier", ["x"], ["label", "scores"], domain="ai.onnx.ml",
                            **attrs)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                      [None, 2])],
                          [helper.make_tensor_value_info("label", TensorProto.INT64, [None]),
                           helper.make_tensor_value_info("scores", TensorProto.FLOAT,
                                                         [None, 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("ai.onnx.ml", 1)])
    p = tmp_path / f"lc_{post_transform}.onnx"
    onnx.save(m, str(p))
    return p, np


# ------------------------------------------------------------- calibrate's --features
def _tree_onnx(tmp_path):
    """A one-stump regressor on field 0 at 10 (raw units): above it 1, else -1."""
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    node = helper.make_node(
        "TreeEnsembleRegressor", ["x"], ["y"], domain="ai.onnx.ml", n_targets=1,
        nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[0, 0, 0],
        nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"], nodes_values=[10.0, 0.0, 0.0],
        nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[2, 0, 0],
        target_ids=[0, 0], target_nodeids=[1, 2], target_treeids=[0, 0],
        target_weights=[-1.0, 1.0])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                      [None, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 1])])
    import onnx
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("ai.onnx.ml", 3)])
    m.ir_version = 8
    p = tmp_path / "tree.onnx"
    onnx.save(m, str(p))
    return p


def _model(n_out, seed=4):
    rng = np.random.default_rng(seed)
    return Model((Layer(rng.standard_normal((n_out, 6)).astype(F32),
                        rng.standard_normal(n_out).astype(F32)),),
                 head_spec=Head("regression"))


def _onnx(tmp_path, n_out, name):
    pytest.importorskip("onnx")
    p = tmp_path / name
    _model(n_out).to_onnx(str(p))
    # as another exporter writes it: without to_onnx's fastpath record (which carries the head)
    return strip_fastpath_record(p)


F = np.float32


def _mlp(seed=0):
    rng = np.random.default_rng(seed)
    dims = [8, 16, 3]
    layers = tuple(Layer(rng.standard_normal((dims[i + 1], dims[i])).astype(F) / 3,
                         rng.standard_normal(dims[i + 1]).astype(F) * 0.1,
                         "relu" if i == 0 else "identity") for i in range(2))
    # three raw outputs: no default head; the model reads output 2 as a regression
    return Model(layers, head_spec=Head("regression", 1.0, (2,)))


def three_target_stumps(lo, hi, classifier=False, post="NONE", n_features=2):
    """Three targets, one stump on x0 (<= 0: the `lo` leaf, else `hi`); a regressor unless
    classifier (its outputs are whatever the leaves hold)."""
    wn, wt, wv = [], [], []
    for j in range(3):
        wn += [1, 2]
        wt += [j, j]
        wv += [lo[j], hi[j]]
    return TreeEnsemble(n_features, 3, [0, 3], [0, 6, 6], [0, 0, 0], [0.0, 0, 0], [1, -1, -1],
                        [2, -1, -1], [0, 0, 0], wn, wt, wv, (), "SUM", post, classifier)


def predict_rows(model, X):
    """Engine.predict row by row (one symbol, the default config), as float64 rows."""
    from fastpath import Engine
    eng = Engine(model, config={"engine": {"n_symbols": 1}})
    return np.stack([np.asarray(eng.predict(x), np.float64).ravel() for x in X])
