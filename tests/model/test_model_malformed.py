"""What a user hands fastpath as a model, damaged or unusual: hand-edited .fpm bundles (every
header field set to values of the wrong kind, the array table pointing into other arrays),
damaged ONNX bytes, ONNX graphs onnxruntime computes differently from what a lenient reading
would serve (a second softmax, (n, 1) constants, row-changing Reshapes, batch-shaped Gemm
biases), tree ensembles with partial or doubled leaf weights and odd missing-value tracks
(random ensembles against onnxruntime), ONNX written by to_onnx with a post transform, and
Model / FeatureSpec / Head values that the engine would refuse only as an internal bug. Each
is a ModelError naming what was wrong, or the same numbers as onnxruntime."""
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastpath
from fastpath import Engine, Model, ModelError
from fastpath.model import CachePolicy, FeatureSpec, Head, Layer
from helpers.builders import engine_cfg
from helpers.model_bundles import BLOB, TREE_BLOB, bundle_mlp, edit_bundle, split_bundle
from helpers.oracle import ort_first, ort_run

# the tests directory (a child process imports helpers from it), and where the imported
# fastpath lives (site-packages, or the checkout for an editable install): a child started
# there imports the same build, not the source tree beside the tests
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(fastpath.__file__)))


NAMES = [e["name"] for e in split_bundle(BLOB)[0]["arrays"]]
W1 = NAMES.index("layer1.weight")


# --------------------------------------------------------------- .fpm header edits
@pytest.mark.parametrize("path,value,match", [
    # an offset into another array: the bytes are there, the numbers are someone else's
    (("arrays", W1, "offset"), 0, "overlap"),
    (("arrays", W1, "offset"), 1, "aligned"),
    (("arrays", W1, "offset"), 1.5, "integer"),
    (("arrays", W1, "offset"), True, "integer"),
    (("arrays", 0, "shape", 0), float("inf"), "integer"),
    (("arrays", 0, "shape", 0), 1e308, "integer"),
    (("arrays", 0, "shape", 0), 2 ** 70, "does not fit"),
    (("arrays", 0, "nbytes"), float("inf"), "integer"),
    (("arrays", 0, "offset"), float("inf"), "integer"),
    (("arrays", 0, "dtype"), "<f4,", "numeric type string"),
    (("arrays", 0, "dtype"), "(2,)<f4", "numeric type string"),
    (("arrays", 0, "name"), "layer7.weight", "unknown arrays"),
    (("extra",), {"input_transform": "log"}, "unknown header key"),
    (("version",), 2, "version"),
    (("version",), True, "version"),
    (("format",), "other-model", "format"),
    (("feature_spec", "field_names"), "bid", "field_names"),
    (("feature_spec", "window"), True, "window"),
    (("feature_spec", "raw_len"), True, "raw_len"),
    (("cache_policy",), [], "cache_policy"),
    (("head",), {"kind": "tanh_sigmoid", "scale": 1.0, "outputs": {}}, "outputs"),
    (("head",), {"kind": "regression", "scale": 1e39, "outputs": [0]}, "scale"),
])
def test_edited_bundle_header_is_a_model_error(path, value, match):
    blob = edit_bundle(BLOB, path, value)
    with pytest.raises(ModelError, match=match):
        Model.from_bytes(blob)


@pytest.mark.parametrize("path,value,match", [
    (("trees", "classifier"), "false", "classifier"),
    (("trees", "classifier"), 0, "classifier"),
    (("trees", "n_features"), 6.5, "n_features"),
    (("trees", "n_targets"), True, "n_targets"),
])
def test_edited_tree_bundle_header_is_a_model_error(path, value, match):
    # bool("false") is True: the regressor was read back as a two-class classifier
    with pytest.raises(ModelError, match=match):
        Model.from_bytes(edit_bundle(TREE_BLOB, path, value))


def test_the_array_table_is_read_only_as_written():
    # the writer's own table is still read, byte for byte
    m, m2 = bundle_mlp(), Model.from_bytes(BLOB)
    for a, b in zip(m.layers, m2.layers):
        assert np.array_equal(a.weight, b.weight) and np.array_equal(a.bias, b.bias)
    # the demo bundle, written by an earlier version, still loads
    Model.load(os.path.join(os.path.dirname(fastpath.__file__), "data", "demo.fpm"))


_FUZZ = r"""
import copy, json, struct, sys, zlib

import numpy as np
sys.path.insert(0, sys.argv[1])
from helpers.model_bundles import BLOB, TREE_BLOB, split_bundle, join_bundle

from fastpath import Engine, Model, ModelError, ConfigError, InputError

VALUES = [-1, 0, 1, 3, 2 ** 31, 2 ** 40, -2 ** 63, 1.5, 1e308, float("nan"), float("inf"),
          True, False, None, "x", "<f8", "<i8", "|u1", ">f4", "<f2", [], [1], [0, 5], {},
          {"a": 1}]


def leaves(o, path=()):
    yield path
    if isinstance(o, dict):
        for k, v in o.items():
            yield from leaves(v, path + (k,))
    elif isinstance(o, list):
        for i, v in enumerate(o):
            yield from leaves(v, path + (i,))


bad = []
raw = np.random.default_rng(1).standard_normal(24).astype(np.float32)
for blob, path in ((b, p) for b in (BLOB, TREE_BLOB) for p in leaves(split_bundle(b)[0])):
    h0, payload = split_bundle(blob)
    if not path or path[0] == "meta":
        continue
    for v in VALUES:
        h = copy.deepcopy(h0)
        x = h
        for p in path[:-1]:
            x = x[p]
        x[path[-1]] = v
        try:
            m = Model.from_bytes(join_bundle(h, payload))
        except ModelError:
            continue
        except Exception as exc:
            bad.append(f"load {path} = {v!r}: {type(exc).__name__}: {exc}")
            continue
        try:
            Engine(m).step(np.resize(raw, m.raw_len), 0)
        except (ModelError, ConfigError, InputError):
            pass
        except Exception as exc:
            bad.append(f"engine {path} = {v!r}: {type(exc).__name__}: {exc}")
print("\n".join(bad))
sys.exit(1 if bad else 0)
"""


def test_every_header_field_set_to_every_kind_of_value():
    """Each field of the header set to numbers of every size, NaN / Inf, bools, null,
    strings, lists and objects, the CRC made to match: the bundle loads and runs, or is a
    ModelError; never another exception, and never a crash (run in a child process)."""
    r = subprocess.run([sys.executable, "-c", _FUZZ, TESTS], capture_output=True, text=True,
                       timeout=120, cwd=PKG_ROOT)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]


# ------------------------------------------------------------- round trips and meta
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2 ** 16), weights=st.sampled_from(["fp32", "bf16", "int8"]),
       post=st.sampled_from(["none", "softmax", "logistic2"]), fitted=st.booleans(),
       n_w=st.integers(0, 3), window=st.integers(1, 300))
def test_bundle_round_trip_is_exact(seed, weights, post, fitted, n_w, window):
    rng = np.random.default_rng(seed)
    n_z = int(rng.integers(1, 6))
    raw_len = 12
    fs = FeatureSpec(raw_len, rng.integers(0, raw_len, n_z), rng.integers(0, raw_len, n_w),
                     window, rng.standard_normal(n_z + 2 * n_w), rng.random(n_z + 2 * n_w) + 0.5,
                     tuple(f"f{i}" for i in range(raw_len)))
    width = {"none": 2, "softmax": 3, "logistic2": 1}[post]
    m = Model((Layer(rng.standard_normal((5, fs.n_feat)), rng.standard_normal(5), "relu"),
               Layer(rng.standard_normal((width, 5)), rng.standard_normal(width))), fs,
              CachePolicy(True, 0.9995, 0.01, 12345, 9, 0.0125 if fitted else None),
              {"note": "x", "fit": {"sharpe": np.float64(1.25), "ids": np.arange(3)}}, post,
              weights=weights)
    m2 = Model.from_bytes(m.to_bytes())
    assert (m2.weights, m2.post, m2.head_spec, m2.cache_policy) == \
        (m.weights, m.post, m.head_spec, m.cache_policy)
    for k in ("z_idx", "w_idx", "mean", "inv_std"):
        assert np.array_equal(getattr(m2.feature_spec, k), getattr(m.feature_spec, k))
    assert (m2.feature_spec.raw_len, m2.feature_spec.window, m2.feature_spec.field_names) == \
        (fs.raw_len, fs.window, fs.field_names)
    for a, b in zip(m.layers, m2.layers):
        assert np.array_equal(a.weight, b.weight) and np.array_equal(a.bias, b.bias)
        assert a.activation == b.activation
    assert m2.meta == {"note": "x", "fit": {"sharpe": 1.25, "ids": [0, 1, 2]}}


def test_meta_with_numpy_values_saves_and_bad_keys_are_named(tmp_path):
    m = Model(bundle_mlp().layers, bundle_mlp().feature_spec, meta={"sharpe": np.float32(1.5),
                                                            "n": np.int64(7)})
    m.save(tmp_path / "m.fpm")
    assert Model.load(tmp_path / "m.fpm").meta == {"sharpe": 1.5, "n": 7}
    with pytest.raises(ModelError, match=r"meta\['fit'\] key 3 is a int"):
        Model(m.layers, m.feature_spec, meta={"fit": {3: "x"}}).to_bytes()
    with pytest.raises(ModelError, match="meta must hold JSON values"):
        Model(m.layers, m.feature_spec, meta={"tags": {"a", "b"}}).save(tmp_path / "n.fpm")
    assert sorted(os.listdir(tmp_path)) == ["m.fpm"]


def test_a_failed_save_leaves_no_temp_file(tmp_path, monkeypatch):
    (tmp_path / "dir.fpm").mkdir()
    with pytest.raises(ModelError, match="is a directory"):
        bundle_mlp().save(tmp_path / "dir.fpm")
    assert sorted(os.listdir(tmp_path)) == ["dir.fpm"]
    # a rename that fails after the temp file was written (a directory made at the path in
    # between, a disk error) removes the temp file
    from fastpath.model import bundle

    def failing_replace(src, dst):
        raise OSError(21, "Is a directory", str(dst))

    monkeypatch.setattr(bundle.os, "replace", failing_replace)
    with pytest.raises(OSError):
        bundle_mlp().save(tmp_path / "m.fpm")
    assert sorted(os.listdir(tmp_path)) == ["dir.fpm"]


# ------------------------------------------------------- Model / FeatureSpec / Head values
def test_bools_and_strings_are_not_counts_or_names():
    z, m, s = np.arange(3), np.zeros(3), np.ones(3)
    with pytest.raises(ModelError, match="raw_len"):
        FeatureSpec(True, [0], [], 1, [0.0], [1.0])
    with pytest.raises(ModelError, match="window"):
        FeatureSpec(8, [], [1], True, [0.0, 0.0], [1.0, 1.0])
    with pytest.raises(ModelError, match="field_names"):
        FeatureSpec(8, z, [], 1, m, s, "bid")


@pytest.mark.parametrize("scale", [1e39, 1e300, 1e-39, 1e-46])
def test_head_scale_outside_float32_is_a_model_error(scale):
    # the C core reads the scale as float32: 1e39 is Inf there, 1e-46 is 0
    with pytest.raises(ModelError, match="float32"):
        Head("regression", scale)


def test_head_scale_at_the_float32_edges_runs(isa):
    rng = np.random.default_rng(3)
    for scale in (float(np.finfo(np.float32).max), float(np.finfo(np.float32).tiny)):
        m = Model((Layer(rng.standard_normal((1, 4)), rng.standard_normal(1)),),
                  head_spec=Head("regression", scale))
        r = Engine(m, config=engine_cfg(isa)).step(rng.standard_normal(4).astype(np.float32))
        assert -1.0 <= r.signal <= 1.0 and np.isfinite(r.signal)


# ---------------------------------------------------------------- ONNX against ORT
onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

RNG = np.random.default_rng(11)
W = RNG.standard_normal((3, 4)).astype(np.float32)
BIAS = RNG.standard_normal(3).astype(np.float32)
W4 = RNG.standard_normal((4, 4)).astype(np.float32)


def _graph(tmp_path, nodes, inits, n_in=4, in_shape=None, ml=False):
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, in_shape or [1, n_in])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    ops = [helper.make_opsetid("", 17)] + ([helper.make_opsetid("ai.onnx.ml", 3)] if ml else [])
    m = helper.make_model(g, opset_imports=ops)
    m.ir_version = 8
    p = str(tmp_path / "m.onnx")
    onnx.save(m, p)
    return p


def _gemm(out="h"):
    return helper.make_node("Gemm", ["x", "W", "b"], [out], transB=1)


def _tree(inp, out):
    return helper.make_node(
        "TreeEnsembleRegressor", [inp], [out], domain="ai.onnx.ml",
        nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[1, 0, 0],
        nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"], nodes_values=[0.1, 0.0, 0.0],
        nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[2, 0, 0],
        target_treeids=[0, 0, 0, 0], target_nodeids=[1, 1, 2, 2], target_ids=[0, 1, 0, 1],
        target_weights=[1.0, 2.0, 3.0, 4.0], n_targets=2)


LINCLF = dict(domain="ai.onnx.ml", coefficients=W.ravel().tolist(), intercepts=BIAS.tolist(),
              classlabels_ints=[0, 1, 2])

# graphs that onnxruntime computes as something other than a per-row function of the
# features fastpath could serve (or cannot run at all): each must be refused
REFUSED = {
    "second softmax": ([helper.make_node("LinearClassifier", ["x"], ["lab", "s"],
                                         post_transform="SOFTMAX", **LINCLF),
                        helper.make_node("Softmax", ["s"], ["y"])], {}, True, "second softmax"),
    "Add (n, 1)": ([_gemm(), helper.make_node("Add", ["h", "c"], ["y"])],
                   {"W": W, "b": BIAS, "c": RNG.standard_normal((3, 1)).astype(np.float32)},
                   False, "not elementwise"),
    "Mul (n, 1)": ([_gemm(), helper.make_node("Mul", ["h", "c"], ["y"])],
                   {"W": W, "b": BIAS, "c": RNG.standard_normal((3, 1)).astype(np.float32)},
                   False, "not elementwise"),
    # the tensor becomes 3-d: onnxruntime's Gemm refuses it
    "Sub (1, 1, n)": ([helper.make_node("Sub", ["c", "x"], ["h"]),
                       helper.make_node("Gemm", ["h", "W", "b"], ["y"], transB=1)],
                      {"W": W, "b": BIAS, "c": RNG.standard_normal((1, 1, 4)).astype(np.float32)},
                      False, "not elementwise"),
    "Reshape (2, -1) after": ([_gemm(), helper.make_node("Reshape", ["h", "s"], ["y"])],
                              {"W": W4, "b": np.zeros(4, np.float32),
                               "s": np.array([2, -1], np.int64)}, False, "no-op"),
    "Reshape (-1, 2) before": ([helper.make_node("Reshape", ["x", "s"], ["h"]),
                                helper.make_node("Gemm", ["h", "W", "b"], ["y"], transB=1)],
                               {"W": W4[:2, :2].copy(), "b": np.zeros(2, np.float32),
                                "s": np.array([-1, 2], np.int64)}, False, "no-op"),
    "Gemm bias (n, 1)": ([helper.make_node("Gemm", ["x", "W", "c"], ["y"], transB=1)],
                         {"W": W, "c": RNG.standard_normal((3, 1)).astype(np.float32)}, False,
                         "not a bias"),
    # allowzero: the 0 is a zero-sized dimension, not "copy the batch"
    "Reshape (0, -1) allowzero": ([_gemm(), helper.make_node("Reshape", ["h", "s"], ["y"],
                                                             allowzero=1)],
                                  {"W": W, "b": BIAS, "s": np.array([0, -1], np.int64)}, False,
                                  "allowzero"),
    "trees: Reshape (0, -1) allowzero": ([_tree("x", "h"),
                                          helper.make_node("Reshape", ["h", "s"], ["y"],
                                                           allowzero=1)],
                                         {"s": np.array([0, -1], np.int64)}, True, "allowzero"),
    "Scaler sizes differ": ([helper.make_node("Scaler", ["x"], ["h"], domain="ai.onnx.ml",
                                              offset=[0.5], scale=[2.0, 1.0, 3.0, 4.0]),
                             helper.make_node("Gemm", ["h", "W", "b"], ["y"], transB=1)],
                            {"W": W, "b": BIAS}, True, "Scaler"),
    "first layer narrower than the input": ([helper.make_node("Gemm", ["x", "W", "b"], ["y"],
                                                              transB=1)],
                                            {"W": W[:, :2].copy(), "b": BIAS}, False,
                                            "graph input has 4 features"),
    "trees: Reshape (2, -1) before": ([helper.make_node("Reshape", ["x", "s"], ["h"]),
                                       _tree("h", "y")],
                                      {"s": np.array([2, -1], np.int64)}, True, "no-op"),
    "trees: Reshape (-1, 1) after": ([_tree("x", "h"), helper.make_node("Reshape", ["h", "s"],
                                                                       ["y"])],
                                     {"s": np.array([-1, 1], np.int64)}, True, "no-op"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_graphs_onnxruntime_computes_differently_are_refused(tmp_path, case):
    nodes, inits, ml, match = REFUSED[case]
    path = _graph(tmp_path, nodes, inits, ml=ml)
    x = RNG.standard_normal((1, 4)).astype(np.float32)
    ref = ort_first(path, x, or_none=True)
    # the point of each case: onnxruntime gives another shape or other numbers than the
    # lenient reading did (or cannot run the graph)
    assert ref is None or ref.shape != (1, 3) or case == "second softmax"
    with pytest.raises(ModelError, match=match):
        Model.from_onnx(path, head=Head("regression"))


# their well-formed neighbours still load, and equal onnxruntime
ACCEPTED = {
    "Add (1, n)": ([_gemm(), helper.make_node("Add", ["h", "c"], ["y"])],
                   {"W": W, "b": BIAS, "c": RNG.standard_normal((1, 3)).astype(np.float32)}, False),
    "Mul (1, n) first": ([helper.make_node("Mul", ["c", "x"], ["h"]),
                          helper.make_node("Gemm", ["h", "W", "b"], ["y"], transB=1)],
                         {"W": W, "b": BIAS, "c": RNG.standard_normal((1, 4)).astype(np.float32)},
                         False),
    "Reshape (1, -1) after": ([_gemm(), helper.make_node("Reshape", ["h", "s"], ["y"])],
                              {"W": W, "b": BIAS, "s": np.array([1, -1], np.int64)}, False),
    "Reshape (-1, 4) before": ([helper.make_node("Reshape", ["x", "s"], ["h"]),
                                helper.make_node("Gemm", ["h", "W", "b"], ["y"], transB=1)],
                               {"W": W, "b": BIAS, "s": np.array([-1, 4], np.int64)}, False),
    "Gemm bias (1, n)": ([helper.make_node("Gemm", ["x", "W", "c"], ["y"], transB=1)],
                         {"W": W, "c": RNG.standard_normal((1, 3)).astype(np.float32)}, False),
    "Scaler": ([helper.make_node("Scaler", ["x"], ["h"], domain="ai.onnx.ml",
                                 offset=[0.5, 0.0, -1.0, 2.0], scale=[2.0, 1.0, 3.0, 4.0]),
                helper.make_node("Gemm", ["h", "W", "b"], ["y"], transB=1)],
               {"W": W, "b": BIAS}, True),
    "LinearClassifier softmax": ([helper.make_node("LinearClassifier", ["x"], ["lab", "y"],
                                                   post_transform="SOFTMAX", **LINCLF)], {}, True),
    "trees: Reshape (1, -1) after": ([_tree("x", "h"), helper.make_node("Reshape", ["h", "s"],
                                                                       ["y"])],
                                     {"s": np.array([1, -1], np.int64)}, True),
}


@pytest.mark.parametrize("case", list(ACCEPTED))
def test_well_formed_neighbours_equal_onnxruntime(tmp_path, isa, case):
    nodes, inits, ml = ACCEPTED[case]
    path = _graph(tmp_path, nodes, inits, ml=ml)
    m = Model.from_onnx(path, head=None if "softmax" in case else Head("regression"))
    eng = Engine(m, config=engine_cfg(isa, enabled=False))
    for x in RNG.standard_normal((20, 4)).astype(np.float32):
        ref = ort_first(path, x[None, :], or_none=True)
        np.testing.assert_allclose(eng.predict(x), ref.reshape(-1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("post,width", [("softmax", 3), ("softmax", 2), ("logistic2", 1),
                                        ("none", 1), ("none", 3)])
def test_to_onnx_writes_the_post_transform(tmp_path, isa, post, width):
    """to_onnx wrote the layers only: onnxruntime returned logits where the model returns
    probabilities, and declared two outputs whatever the width."""
    rng = np.random.default_rng(width)
    head = Head("regression") if post == "none" and width == 3 else None
    m = Model((Layer(rng.standard_normal((6, 5)), rng.standard_normal(6), "relu"),
               Layer(rng.standard_normal((width, 6)) * 2, rng.standard_normal(width))),
              post=post, head_spec=head)
    p = str(tmp_path / "m.onnx")
    m.to_onnx(p)
    assert [d.dim_value for d in onnx.load(p).graph.output[0].type.tensor_type.shape.dim][1] \
        == m.n_outputs
    x = rng.standard_normal((30, 5)).astype(np.float32)
    ref = ort_first(p, x)
    np.testing.assert_allclose(ref, m.forward(x), rtol=1e-5, atol=1e-6)
    # and it reads back as the same model, run by each kernel set
    back = Model.from_onnx(p, head=head)
    assert back.post == post
    eng = Engine(back, config=engine_cfg(isa, enabled=False))
    for i in range(len(x)):
        np.testing.assert_allclose(eng.predict(x[i]), ref[i], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("weights,biases,acts,match", [
    ([np.zeros((0, 4), np.float32)], [np.zeros(0, np.float32)], ["relu"], "outside 1..65536"),
    ([np.zeros((2, 4), np.float32)], [np.zeros(2, np.float32)], ["gelu"], "unknown activation"),
])
def test_packing_entry_point_names_bad_layers(isa, weights, biases, acts, match):
    # these were a KeyError and a MemoryError ("cannot pack MLP") for a zero-width layer
    from fastpath import InputError
    from fastpath._kernels import PackedMLP
    with pytest.raises(InputError, match=match):
        PackedMLP(weights, biases, acts, isa=isa)


_ONNX_FUZZ = r"""
import os, sys, tempfile, warnings

import numpy as np
warnings.filterwarnings("ignore")
from fastpath import Engine, Model, ModelError, InputError, ConfigError
bad = []
for src, seed in zip(sys.argv[1:3], (21, 22)):
    blob = open(src, "rb").read()
    rng = np.random.default_rng(seed)
    p = os.path.join(tempfile.mkdtemp(), "f.onnx")
    for it in range(800):
        b = bytearray(blob)
        for _ in range(int(rng.integers(1, 4))):
            b[int(rng.integers(0, len(b)))] = int(rng.integers(0, 256))
        if rng.random() < 0.1:
            b = b[:int(rng.integers(0, len(b)))]
        with open(p, "wb") as f:
            f.write(b)
        try:
            m = Model.from_onnx(p)
        except ModelError:
            continue
        except Exception as exc:
            bad.append(f"{os.path.basename(src)} #{it}: {type(exc).__name__}: {exc}"[:300])
            continue
        try:
            Engine(m).predict(np.zeros(m.dims[0], np.float32))
        except (InputError, ModelError, ConfigError):
            pass
        except Exception as exc:
            bad.append(f"{os.path.basename(src)} #{it} engine: {type(exc).__name__}: {exc}"[:300])
print("\n".join(bad))
sys.exit(1 if bad else 0)
"""


def test_damaged_onnx_bytes_are_model_errors(tmp_path):
    """Seeded byte edits and truncations of an MLP and a tree-ensemble file: each loads and
    runs, or is a ModelError (a string attribute that is not UTF-8, a float where a list of
    node ids belongs were UnicodeDecodeError / TypeError); run in a child process so that a
    crash fails the test instead of the run."""
    mlp = _graph(tmp_path, [_gemm("h"), helper.make_node("Relu", ["h"], ["r"]),
                            helper.make_node("MatMul", ["r", "V"], ["y"])],
                 {"W": W, "b": BIAS, "V": RNG.standard_normal((3, 2)).astype(np.float32)})
    os.replace(mlp, tmp_path / "mlp.onnx")
    tree = _graph(tmp_path, [_tree("x", "y")], {}, ml=True)
    r = subprocess.run([sys.executable, "-c", _ONNX_FUZZ, str(tmp_path / "mlp.onnx"), tree],
                       capture_output=True, text=True, timeout=120, cwd=PKG_ROOT)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]


def _random_chain(rng):
    """A random chain of the ops the importer folds, with constants in every broadcast shape
    ONNX allows ((n,), (1, n), scalars, and the (n, 1) / (1, 1, n) shapes that change what
    onnxruntime computes), Gemm in both layouts with alpha / beta and biases of each shape."""
    n_in = int(rng.integers(1, 6))
    width, cur, nodes, inits = n_in, "x", [], {}

    def c(name, shape):
        inits[name] = rng.standard_normal(shape).astype(np.float32) + (3 if "D" in name else 0)
        return name
    for k in range(int(rng.integers(1, 7))):
        out = f"t{k}"
        op = str(rng.choice(["Gemm", "MatMul", "Add", "Sub", "Mul", "Div", "Relu", "Tanh",
                             "Sigmoid", "BN", "Scaler", "Identity", "Softmax", "LinReg"]))
        if op == "Gemm":
            m, tb = int(rng.integers(1, 6)), int(rng.integers(0, 2))
            args = [cur, c(f"W{k}", (m, width) if tb else (width, m))]
            if rng.random() < 0.7:
                args.append(c(f"C{k}", [(m,), (1, m), (), (m, 1), (1, 1)][int(rng.integers(0, 5))]))
            nodes.append(helper.make_node("Gemm", args, [out], transB=tb,
                                          alpha=float(rng.choice([1.0, 0.5, -2.0])),
                                          beta=float(rng.choice([1.0, 0.25]))))
            width = m
        elif op == "MatMul":
            m = int(rng.integers(1, 6))
            nodes.append(helper.make_node("MatMul", [cur, c(f"W{k}", (width, m))], [out]))
            width = m
        elif op == "LinReg":
            m = int(rng.integers(1, 4))
            nodes.append(helper.make_node(
                "LinearRegressor", [cur], [out], domain="ai.onnx.ml",
                coefficients=rng.standard_normal(m * width).tolist(),
                intercepts=rng.standard_normal(m).tolist(), targets=m))
            width = m
        elif op in ("Add", "Sub", "Mul", "Div"):
            shapes = [(width,), (1, width), (), (1,), (width, 1), (1, 1, width)]
            k_name = c(f"{'D' if op == 'Div' else 'K'}{k}", shapes[int(rng.integers(0, 6))])
            ins = [cur, k_name] if rng.random() < 0.6 else [k_name, cur]
            nodes.append(helper.make_node(op, ins, [out]))
        elif op == "Softmax":
            nodes.append(helper.make_node("Softmax", [cur], [out], axis=int(rng.choice([1, -1]))))
        elif op == "BN":
            nodes.append(helper.make_node(
                "BatchNormalization", [cur, c(f"g{k}", width), c(f"b{k}", width),
                                       c(f"m{k}", width), f"v{k}"], [out], epsilon=1e-3))
            inits[f"v{k}"] = (rng.random(width) + 0.1).astype(np.float32)
        elif op == "Scaler":
            s = int(rng.choice([1, width]))
            nodes.append(helper.make_node("Scaler", [cur], [out], domain="ai.onnx.ml",
                                          offset=rng.standard_normal(s).tolist(),
                                          scale=rng.standard_normal(s).tolist()))
        else:
            nodes.append(helper.make_node(op, [cur], [out]))
        cur = out
    nodes[-1].output[0] = "y"
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                     ["N", n_in])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", int(rng.choice([11, 13, 17]))),
                                            helper.make_opsetid("ai.onnx.ml", 1)])
    m.ir_version = 7
    return m, n_in


@settings(max_examples=300, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2 ** 32 - 1))
def test_random_op_chains_are_onnxruntime_or_refused(tmp_path_factory, seed):
    """Differential: a chain the importer accepts gives onnxruntime's numbers and shape (up to
    a 2-d (1, n) row); onnxruntime refusing or reshaping it means the importer must refuse
    ((n, 1) constants, (1, 1, n) constants and (n, 1) Gemm biases are not elementwise over the
    features)."""
    rng = np.random.default_rng(seed)
    m, n_in = _random_chain(rng)
    p = str(tmp_path_factory.mktemp("chain") / "m.onnx")
    onnx.save(m, p)
    try:
        model = Model.from_onnx(p, head=Head("regression", 1.0, (0,)))
    except ModelError:
        return
    x = rng.standard_normal((1, n_in)).astype(np.float32)
    ref = ort_first(p, x, or_none=True)
    assert ref is not None, "accepted a graph onnxruntime cannot run"
    got = model.forward(x)
    assert ref.shape == got.shape
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("track", [0, 1, 2, -1])
def test_missing_value_track_is_exactly_one_as_in_onnxruntime(tmp_path, isa, track):
    """onnxruntime sends a NaN to the true branch only where the track is 1; the importer read
    any nonzero value (2, -1) as 1 and served the other leaf."""
    node = helper.make_node(
        "TreeEnsembleRegressor", ["x"], ["y"], domain="ai.onnx.ml",
        nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[1, 0, 0],
        nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"], nodes_values=[0.1, 0.0, 0.0],
        nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[2, 0, 0],
        nodes_missing_value_tracks_true=[track, 0, 0], target_treeids=[0, 0],
        target_nodeids=[1, 2], target_ids=[0, 0], target_weights=[1.0, 3.0], n_targets=1)
    path = _graph(tmp_path, [node], {}, ml=True)
    eng = Engine(Model.from_onnx(path), config=engine_cfg(isa, enabled=False))
    for x in ([0.0, np.nan, 0.0, 0.0], [0.0, 0.05, 0.0, 0.0], [0.0, 0.5, 0.0, 0.0]):
        x = np.asarray(x, np.float32)
        np.testing.assert_array_equal(eng.predict(x), ort_first(path, x[None, :], or_none=True).reshape(-1))


@pytest.mark.parametrize("bad", [[2, 0, 0], [-1, 0, 0], [0.5, 0, 0]])
def test_tree_nan_track_other_than_0_or_1_is_refused(bad):
    # the C packer read any nonzero byte as true and the numpy reference only 1: the engine
    # and Model.forward disagreed on a NaN input
    from fastpath import TreeEnsemble
    with pytest.raises(ModelError, match="nan_true"):
        TreeEnsemble(6, 1, [0, 3], [0, 6, 6], [1, 0, 0], [0.1, 0.0, 0.0], [1, -1, -1],
                     [2, -1, -1], bad, [1, 2], [0, 0], [1.0, 3.0])


def test_loading_a_huge_file_that_is_no_bundle_reads_only_its_magic(tmp_path):
    """Model.load read the whole file before looking at its magic: a wrong file handed over
    by mistake was a MemoryError (a sparse 8 TiB file here), or a long read."""
    p = tmp_path / "ticks.bin"
    with open(p, "wb") as f:
        f.write(b"NOTAFPM!")
        try:
            f.truncate(1 << 43)
        except OSError:
            pytest.skip("this filesystem has no sparse 8 TiB files")
    with pytest.raises(ModelError, match="bad magic"):
        Model.load(p)
    with pytest.raises(ModelError, match="bad magic"):
        Engine(str(p))


def test_a_model_keeps_the_arrays_it_validated(isa):
    """Layer and FeatureSpec kept the caller's float32 arrays themselves: a later write to them
    (an optimizer step, a NaN) changed the validated model, and every tick was then refused
    as if the tick were at fault."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((2, 4)).astype(np.float32)
    b = np.zeros(2, np.float32)
    mean, inv = np.zeros(4, np.float32), np.ones(4, np.float32)
    m = Model((Layer(w, b),), FeatureSpec(4, np.arange(4), [], 1, mean, inv))
    raw = rng.standard_normal(4).astype(np.float32)
    before = Engine(m, config=engine_cfg(isa, enabled=False)).step(raw).signal
    w[0, 0], b[1], mean[2], inv[0] = np.nan, 1e30, 5.0, np.inf
    assert np.all(np.isfinite(m.layers[0].weight)) and np.all(np.isfinite(m.feature_spec.inv_std))
    assert Engine(m, config=engine_cfg(isa, enabled=False)).step(raw).signal == before
    assert np.isfinite(Model.from_bytes(m.to_bytes()).layers[0].weight).all()


def test_save_refuses_an_onnx_name(tmp_path):
    # Engine(path) reads a path by its suffix: a bundle saved as m.onnx went to the ONNX
    # reader and never loaded
    with pytest.raises(ModelError, match="to_onnx"):
        bundle_mlp().save(tmp_path / "m.ONNX")
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize("opset", [1, 6, 10 ** 3, "17", 17.0, True])
def test_to_onnx_refuses_an_opset_it_cannot_write(tmp_path, opset):
    # opsets below 7 and above the onnx package's newest were written without a word, as
    # files onnxruntime cannot load; a str / float was a TypeError
    with pytest.raises(ModelError, match="opset"):
        bundle_mlp().to_onnx(tmp_path / "m.onnx", opset=opset)


@pytest.mark.parametrize("opset", [7, 11, 13, 17])
def test_to_onnx_opsets_run_in_onnxruntime(tmp_path, opset):
    rng = np.random.default_rng(opset)
    m = Model((Layer(rng.standard_normal((4, 5)), rng.standard_normal(4), "tanh"),
               Layer(rng.standard_normal((3, 4)), rng.standard_normal(3))), post="softmax")
    p = str(tmp_path / "m.onnx")
    m.to_onnx(p, opset=opset)
    x = rng.standard_normal((8, 5)).astype(np.float32)
    ref = ort_first(p, x)
    np.testing.assert_allclose(ref, m.forward(x), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------- tree ensembles against ORT
def _stump_forest(path, n_targets, agg, trees, base=None, post="NONE"):
    """Regressor over 1 feature; trees: [(threshold, {leaf 1 | 2: [(target, weight), ...]})]."""
    kw = {k: [] for k in ("nodes_treeids", "nodes_nodeids", "nodes_featureids", "nodes_modes",
                          "nodes_values", "nodes_truenodeids", "nodes_falsenodeids",
                          "target_treeids", "target_nodeids", "target_ids", "target_weights")}
    for t, (thr, leaves) in enumerate(trees):
        kw["nodes_treeids"] += [t, t, t]
        kw["nodes_nodeids"] += [0, 1, 2]
        kw["nodes_featureids"] += [0, 0, 0]
        kw["nodes_modes"] += ["BRANCH_LEQ", "LEAF", "LEAF"]
        kw["nodes_values"] += [thr, 0.0, 0.0]
        kw["nodes_truenodeids"] += [1, 0, 0]
        kw["nodes_falsenodeids"] += [2, 0, 0]
        for leaf, ws in leaves.items():
            for j, w in ws:
                kw["target_treeids"].append(t)
                kw["target_nodeids"].append(leaf)
                kw["target_ids"].append(j)
                kw["target_weights"].append(w)
    if base is not None:
        kw["base_values"] = base
    node = helper.make_node("TreeEnsembleRegressor", ["x"], ["y"], domain="ai.onnx.ml",
                            n_targets=n_targets, aggregate_function=agg, post_transform=post,
                            **kw)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                      [None, 1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("ai.onnx.ml", 3)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return str(path)


def _check_trees_against_ort(path, isa, xs=(-1.0, 0.25, 1.0, np.nan)):
    m = Model.from_onnx(path, head=Head("regression"))
    eng = Engine(m, config=engine_cfg(isa, enabled=False))
    X = np.asarray(xs, np.float32)[:, None]
    ref = ort_first(path, X, or_none=True)
    np.testing.assert_allclose(np.stack([eng.predict(x) for x in X]), ref, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(m.forward(X), ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("agg", ["SUM", "AVERAGE", "MIN", "MAX"])
@pytest.mark.parametrize("post", ["NONE", "SOFTMAX"])
def test_target_weighted_on_some_leaves_keeps_its_score(tmp_path, isa, agg, post):
    """Two targets, target 1 weighted on one leaf only (exporters leave out zero weights):
    the engine wrote target 1 as 0 on every path, the leaf that scores it included."""
    path = _stump_forest(tmp_path / "t.onnx", 2, agg,
                         [(0.0, {1: [(0, 1.0)], 2: [(0, 4.0), (1, -3.0)]}),
                          (0.5, {1: [(0, 0.5), (1, 2.0)], 2: [(0, -1.0)]})], post=post)
    _check_trees_against_ort(path, isa)


@pytest.mark.parametrize("agg", ["SUM", "AVERAGE", "MIN", "MAX"])
def test_one_target_leaf_without_weight_is_zero(tmp_path, isa, agg):
    """onnxruntime's one-target regressor reads a leaf without a weight as 0, also under MIN /
    MAX; fastpath skipped it (MAX of -2 and that leaf was -2, not 0)."""
    path = _stump_forest(tmp_path / "t.onnx", 1, agg,
                         [(0.0, {1: [(0, 5.0)], 2: [(0, -2.0)]}), (0.5, {1: [(0, 7.0)]})])
    _check_trees_against_ort(path, isa)


@pytest.mark.parametrize("agg", ["SUM", "AVERAGE", "MIN", "MAX"])
@pytest.mark.parametrize("order", [(1.0, 2.0), (2.0, 1.0)])
def test_one_target_leaf_reads_its_first_weight(tmp_path, isa, agg, order):
    """A one-target leaf with two weights: onnxruntime reads the first one listed; fastpath
    combined them (SUM gave 3 where onnxruntime gives 1)."""
    path = _stump_forest(tmp_path / "t.onnx", 1, agg,
                         [(0.0, {1: [(0, order[0]), (0, order[1])], 2: [(0, 4.0)]})],
                         base=[0.5])
    _check_trees_against_ort(path, isa)


_MODES = ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ"]


def _random_forest_graph(rng):
    """A random regressor or classifier: 1-3 random binary trees of up to 7 nodes over 1-4
    features, every split mode and missing-value track, leaf weights left out at random,
    random aggregate / post transform / base values."""
    F = int(rng.integers(1, 5))
    clf = bool(rng.random() < 0.5)
    T = int(rng.integers(2, 4)) if clf else int(rng.integers(1, 4))
    a = {k: [] for k in ("nodes_treeids", "nodes_nodeids", "nodes_featureids", "nodes_modes",
                         "nodes_values", "nodes_truenodeids", "nodes_falsenodeids",
                         "nodes_missing_value_tracks_true")}
    wt, wn, wi, ww = [], [], [], []
    for t in range(int(rng.integers(1, 4))):
        kids, n, frontier = {}, 1, [0]
        while frontier and n < 7:
            i = frontier.pop(int(rng.integers(0, len(frontier))))
            if rng.random() < 0.6:
                kids[i] = (n, n + 1)
                frontier += [n, n + 1]
                n += 2
        for i in range(n):
            inner = i in kids
            a["nodes_treeids"].append(t)
            a["nodes_nodeids"].append(i)
            a["nodes_featureids"].append(int(rng.integers(0, F)) if inner else 0)
            a["nodes_modes"].append(_MODES[int(rng.integers(0, 6))] if inner else "LEAF")
            a["nodes_values"].append(float(np.float32(rng.choice([0.0, 0.5, -0.5,
                                                                  rng.standard_normal()])))
                                     if inner else 0.0)
            a["nodes_truenodeids"].append(kids[i][0] if inner else 0)
            a["nodes_falsenodeids"].append(kids[i][1] if inner else 0)
            a["nodes_missing_value_tracks_true"].append(int(rng.integers(0, 2)) if inner else 0)
            for j in range(T if not inner else 0):
                for _ in range(int(rng.choice([0, 1, 1, 1, 2]))):
                    wt.append(t), wn.append(i), wi.append(j)
                    ww.append(float(np.float32(rng.standard_normal())))
    if not ww:
        wt, wn, wi, ww = [0], [a["nodes_nodeids"][-1]], [0], [1.0]
    post = str(rng.choice(["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO"] if clf or T > 1
                          else ["NONE"]))
    if rng.random() < 0.5:
        a["base_values"] = rng.standard_normal(T).astype(np.float32).tolist()
    if clf:
        a.update(class_treeids=wt, class_nodeids=wn, class_ids=wi, class_weights=ww,
                 classlabels_int64s=list(range(T)))
        node = helper.make_node("TreeEnsembleClassifier", ["x"], ["label", "y"],
                                domain="ai.onnx.ml", post_transform=post, **a)
        outs = [helper.make_tensor_value_info("label", TensorProto.INT64, None)]
    else:
        a.update(target_treeids=wt, target_nodeids=wn, target_ids=wi, target_weights=ww,
                 n_targets=T,
                 aggregate_function=str(rng.choice(["SUM", "AVERAGE", "MIN", "MAX"])))
        node = helper.make_node("TreeEnsembleRegressor", ["x"], ["y"], domain="ai.onnx.ml",
                                post_transform=post, **a)
        outs = []
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                      [None, F])],
                          outs + [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("ai.onnx.ml", 3)])
    m.ir_version = 8
    return m, F


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # isa: a name
@given(seed=st.integers(0, 2 ** 32 - 1))
def test_random_ensembles_equal_onnxruntime(tmp_path_factory, isa, seed):
    """Differential: a random ensemble that fastpath accepts gives onnxruntime's outputs, on
    this kernel set and in the numpy reference, for random inputs, inputs on the thresholds
    and NaNs. Leaf weights are left out and doubled at random, which is where the engine
    wrote partly weighted targets as 0 and the one-target rules differed."""
    rng = np.random.default_rng(seed)
    g, F = _random_forest_graph(rng)
    p = str(tmp_path_factory.mktemp("forest") / "m.onnx")
    onnx.save(g, p)
    try:
        m = Model.from_onnx(p, head=Head("regression"))
    except ModelError:
        return
    X = rng.choice([0.0, 0.5, -0.5, np.nan, 1.5, -2.0], size=(24, F)).astype(np.float32)
    X[:12] = rng.standard_normal((12, F))
    ref = ort_run(p, X, "y")
    np.testing.assert_allclose(m.forward(X), ref, rtol=1e-5, atol=1e-6)
    eng = Engine(m, config=engine_cfg(isa, enabled=False))
    np.testing.assert_allclose(np.stack([eng.predict(x) for x in X]), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("window", [-3, 0, 1.5, True, 1 << 17])
def test_calibrate_refuses_a_bad_window_before_replaying(window):
    """FeatureSpec.fit (calibrate's first step) names a bad window: -3 was an IndexError from
    the numpy replay, 0 warned before the spec's own check."""
    from fastpath.model import FeatureSpec
    raws = np.random.default_rng(0).standard_normal((20, 8)).astype(np.float32)
    with pytest.raises(ModelError, match="window must be an int in 1..65536"):
        FeatureSpec.fit(raws, [0, 1], [2], window=window)
