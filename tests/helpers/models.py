"""Model builders: hand-built ONNX graphs, tree ensembles, bundles edited byte by byte, exporter
outputs. onnx is imported where a builder needs it, so a test without onnx can import this."""
import json
import struct
import zlib

import numpy as np
import pytest

from fastpath import TreeEnsemble
from fastpath.model import CachePolicy, FeatureSpec, Head, Layer, Model
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


Z = [0, 1, 2]        # raw[0]: a 1e30 weight on it overflows layer 1; raw[1]: inv_std 1e30


W0 = 3               # window fields are raw[3 .. 3 + n_w)


def _spec(n_w: int, window: int) -> FeatureSpec:
    n_feat = len(Z) + 2 * n_w
    inv_std = np.ones(n_feat, np.float32)
    inv_std[1] = 1e30
    # the window features read ~1 for good ticks (fields ~1e-3), Inf for a field near FLT_MAX
    inv_std[len(Z):] = 1e3
    return FeatureSpec(W0 + max(n_w, 1), np.array(Z), np.arange(W0, W0 + n_w), window,
                       np.zeros(n_feat, np.float32), inv_std)


def tree_model(n_w: int, window: int, cache: bool, probit: bool = False) -> Model:
    """Per feature a chain of splits at 17 thresholds over [-2, 2] (a staircase leaf per step):
    every feature moves the output in steps of a quarter, so a window restored wrongly changes
    the answers, not only the features. probit: the scores stay inside (0, 1) for good ticks
    and a stump on raw[0] >= 1 pushes them past 1, where PROBIT is NaN (the model refuses a
    tick with finite features, the tree ensemble's way to an "out" refusal)."""
    fs = _spec(n_w, window)
    n_feat = len(Z) + 2 * n_w
    thresholds = np.linspace(-2.0, 2.0, 17)
    mode, feat, thr, tc, fc, nt, wn, wt, wv, off = [], [], [], [], [], [], [], [], [], [0]
    for f in range(n_feat):
        # node 2i: x < thresholds[i] ? leaf 2i+1 : node 2i+2; the last node is a leaf
        n_split = len(thresholds)
        for i, th in enumerate(thresholds):
            mode += [1, 6]                      # BRANCH_LT, LEAF
            feat += [f, 0]
            thr += [float(th), 0.0]
            tc += [2 * i + 1, -1]
            fc += [2 * i + 2, -1]
            nt += [0, 0]
        mode += [6]
        feat += [0]
        thr += [0.0]
        tc += [-1]
        fc += [-1]
        nt += [0]
        base = off[-1]
        scale = (0.3 / (n_feat * n_split)) if probit else 0.01 * (f + 1)
        for i in range(n_split):
            wn.append(base + 2 * i + 1)
            wt.append(0)
            wv.append(scale * i)
        wn.append(base + 2 * n_split)
        wt.append(0)
        wv.append(scale * n_split)
        off.append(base + 2 * n_split + 1)
    extra = {}
    if probit:
        base = off[-1]
        mode += [1, 6, 6]
        feat += [0, 0, 0]
        thr += [1.0, 0.0, 0.0]
        tc += [1, -1, -1]
        fc += [2, -1, -1]
        nt += [0, 0, 0]
        wn += [base + 1, base + 2]
        wt += [0, 0]
        wv += [0.0, 5.0]
        off.append(base + 3)
        extra = dict(base_values=[0.3], post_transform="PROBIT")
    trees = TreeEnsemble(n_features=n_feat, n_targets=1, tree_offsets=off, mode=mode,
                         feature=feat, threshold=thr, true_child=tc, false_child=fc,
                         nan_true=nt, weight_node=wn, weight_target=wt, weight_value=wv,
                         **extra)
    pol = CachePolicy(enabled=cache, cos_threshold=0.9, norm_tol=0.5, max_age_ns=10**15,
                      max_run=3)
    return Model((), fs, pol, trees=trees)


def good_tick(rng, n_w: int) -> np.ndarray:
    x = rng.standard_normal(W0 + max(n_w, 1)).astype(np.float32)
    x[0] = 0.0
    x[1] *= np.float32(1e-31)
    x[W0:] *= np.float32(1e-3)
    return x


F32 = np.float32


def refusing_model(rng, n_w, W, w_scale):
    """A model over n_w window fields (window W) and one z field, raw = [fields, z], whose
    first-layer weight of 1e30 on the z field makes a tick with z = 1e10 overflow: the model
    refuses it after fp_step has committed its window. Other weights: w_scale."""
    fs = FeatureSpec(n_w + 1, np.array([n_w]), np.arange(n_w), W, np.zeros(1 + 2 * n_w, F32),
                     np.ones(1 + 2 * n_w, F32))
    w = rng.standard_normal((2, 1 + 2 * n_w)).astype(F32) * w_scale
    w[:, 0] = 1e30
    return Model((Layer(w, np.zeros(2, F32), "identity"),), fs, CachePolicy(enabled=False))


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


def overflow_mlp(fs: FeatureSpec, cache: bool, seed: int) -> Model:
    """n_feat -> 8 (tanh) -> 2 with a 1e30 weight on feature 0: a tick with raw[z_idx[0]] ~ 1e10
    overflows the first layer (the model refuses it), one with that field 0 does not."""
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((8, fs.n_feat)) * 0.3).astype(np.float32)
    w1[0, 0] = 1e30
    w2 = (rng.standard_normal((2, 8)) * 0.3).astype(np.float32)
    pol = CachePolicy(enabled=cache, cos_threshold=0.9, norm_tol=0.5, max_age_ns=10**15,
                      max_run=3)
    return Model((Layer(w1, np.zeros(8, np.float32), "tanh"),
                  Layer(w2, np.zeros(2, np.float32), "identity")), fs, pol)


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
