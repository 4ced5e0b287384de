"""LightGBM's linear_tree through onnxmltools: the leaves' linear models are dropped from the
ONNX file, and fastpath loads it as onnxruntime runs it."""
import numpy as np
import pytest

from fastpath import Model

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from helpers.models import predict_rows  # noqa: E402
from helpers.oracle import ort_run  # noqa: E402


N_FEAT = 6


def test_lightgbm_linear_tree_loses_its_leaf_models_in_onnxmltools(tmp_path):
    # The fact this records (README, Models): onnxmltools (1.16) writes a linear_tree
    # LightGBM model as a plain TreeEnsembleRegressor, its leaves' linear models dropped
    # without a word; onnxruntime and fastpath then agree with each other and not with
    # LightGBM. Nothing in the file marks it (no metadata, the same nodes and attributes as
    # a constant-leaf model), so fastpath cannot refuse it: check such a model against
    # LightGBM's own predict before serving it.
    lgb = pytest.importorskip("lightgbm")
    onnxmltools = pytest.importorskip("onnxmltools")
    from onnxmltools.convert.common.data_types import FloatTensorType
    rng = np.random.default_rng(0)
    X = rng.standard_normal((400, N_FEAT)).astype(np.float32)
    y = (3 * X[:, 0] + 2 * X[:, 1] * (X[:, 2] > 0) + 0.1 * rng.standard_normal(400))
    files, dropped = {}, False
    for linear in (False, True):
        est = lgb.LGBMRegressor(n_estimators=10, num_leaves=4, linear_tree=linear,
                                verbose=-1).fit(X, y.astype(np.float32))
        m = onnxmltools.convert_lightgbm(est, initial_types=[("x", FloatTensorType(
            [None, N_FEAT]))], zipmap=False)
        path = tmp_path / f"lgb_linear{int(linear)}.onnx"
        path.write_bytes(m.SerializeToString())
        files[linear] = m
        Xt = X[:40]
        ref = est.predict(Xt).astype(np.float64)
        theirs = ort_run(path, Xt, 0).astype(np.float64)[:, 0]
        ours = predict_rows(Model.from_onnx(str(path)), Xt)[:, 0]
        # fastpath runs what the file says, as onnxruntime does
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
        if not linear or np.allclose(theirs, ref, rtol=1e-4, atol=1e-4):
            # constant leaves (or an onnxmltools that exports the leaf models): LightGBM's own
            np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4)
            continue
        assert np.abs(theirs - ref).max() > 0.1          # the leaf models are gone
        dropped = True
    if not dropped:
        return
    # ... and nothing tells the two files apart but the numbers
    plain, linear = files[False], files[True]
    assert not plain.metadata_props and not linear.metadata_props
    assert [(n.op_type, sorted(a.name for a in n.attribute)) for n in plain.graph.node] == \
        [(n.op_type, sorted(a.name for a in n.attribute)) for n in linear.graph.node]
