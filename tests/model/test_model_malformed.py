"""What a user hands fastpath as a model bundle, damaged or unusual: hand-edited .fpm headers
(every field set to values of the wrong kind, the array table pointing into other arrays) are a
ModelError naming what was wrong; bundles round-trip exactly; a failed save leaves no temp
file; Model / FeatureSpec / Head values the engine would refuse only as an internal bug are
refused when built; a huge file that is no bundle is read only as far as its magic."""
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastpath
from fastpath import Engine, Model, ModelError
from fastpath.model import CachePolicy, FeatureSpec, Head, Layer
from helpers.builders import engine_cfg
from helpers.model_bundles import BLOB, TREE_BLOB, bundle_mlp, edit_bundle, split_bundle

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
