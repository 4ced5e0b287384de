"""The model objects: Model / Layer / FeatureSpec / TreeEnsemble equality and hashing, model
arrays frozen once validated, FeatureSpec.fit / apply refusing symbols, indices and ticks they
would misread, the bundle's message for a file cut inside its first bytes, save / load paths,
Model(meta=None), Model.signal on outputs of the wrong width, values beyond float32."""
import os

import numpy as np
import pytest

from fastpath import Engine, InputError, ModelError
from fastpath.model import CachePolicy, FeatureSpec, Head, Layer, Model
from fastpath.model.bundle import MAGIC
from fastpath.model.trees import TreeEnsemble
from helpers.builders import engine_cfg, random_model

F32 = np.float32


def _stumps(values, n_features=2):
    T = len(values)
    return TreeEnsemble(n_features=n_features, n_targets=1,
                        tree_offsets=np.arange(0, 3 * T + 1, 3), mode=np.tile([0, 6, 6], T),
                        feature=np.zeros(3 * T, int), threshold=np.zeros(3 * T),
                        true_child=np.tile([1, 0, 0], T), false_child=np.tile([2, 0, 0], T),
                        nan_true=np.zeros(3 * T, int),
                        weight_node=np.concatenate([[3 * t + 1, 3 * t + 2] for t in range(T)]),
                        weight_target=np.zeros(2 * T, int),
                        weight_value=np.concatenate([[v, 0.0] for v in values]))


def _windowed_model(rng):
    fs = FeatureSpec(4, np.array([0, 1]), np.array([2]), 5, np.zeros(4, F32), np.ones(4, F32))
    return random_model(rng, [4, 6, 2], fs=fs)


# ------------------------------------------------------------------- equality and hashing
def test_a_model_read_back_equals_the_one_written_and_hashes_alike():
    # every comparison of two distinct models raised ValueError ("truth value of an array
    # ... is ambiguous"), and hash() raised TypeError (unhashable ndarray, then dict)
    m = _windowed_model(np.random.default_rng(0))
    back = Model.from_bytes(m.to_bytes())
    assert back is not m and back == m and not (back != m)
    assert hash(back) == hash(m) and len({m, back}) == 1
    assert back.layers[0] == m.layers[0] and back.feature_spec == m.feature_spec
    t = Model((), trees=_stumps([0.5, -1.0]))
    tb = Model.from_bytes(t.to_bytes())
    assert tb == t and tb.trees == t.trees and hash(tb.trees) == hash(t.trees)
    assert {tb: 1}[t] == 1


def test_models_that_differ_anywhere_are_unequal():
    rng = np.random.default_rng(1)
    m = _windowed_model(rng)
    w = m.layers[0].weight.copy()
    w[2, 3] = np.nextafter(w[2, 3], F32(9))
    other = Model((Layer(w, m.layers[0].bias, m.layers[0].activation),) + m.layers[1:],
                  m.feature_spec)
    assert other != m and m != other
    fs = m.feature_spec
    for changed in (FeatureSpec(fs.raw_len, fs.z_idx, fs.w_idx, fs.window + 1, fs.mean, fs.inv_std),
                    FeatureSpec(fs.raw_len, fs.z_idx, fs.w_idx, fs.window, fs.mean + 1, fs.inv_std),
                    FeatureSpec(fs.raw_len, fs.z_idx[::-1], fs.w_idx, fs.window, fs.mean,
                                fs.inv_std)):
        assert changed != fs and m.with_feature_spec(changed) != m
    assert m.with_weights("bf16") != m and m.with_head(Head("tanh_sigmoid", 1.0, (1, 0))) != m
    assert Model(m.layers, fs, meta={"a": 1}) != Model(m.layers, fs, meta={"a": 2})
    assert Model((), trees=_stumps([0.5])) != Model((), trees=_stumps([0.25]))
    assert m != "a model" and m.layers[0] != "a layer" and m.feature_spec != 3


# ----------------------------------------------------------------------------- immutability
def test_a_models_arrays_cannot_change_under_an_engine_built_from_it():
    # the arrays were writable: weight[:] = 0 after Engine(m) left the engine running the
    # old weights while engine.model (the same object) and a save of it had the new ones
    rng = np.random.default_rng(2)
    m = _windowed_model(rng)
    e = Engine(m, config=engine_cfg("scalar"))
    for a in (m.layers[0].weight, m.layers[1].bias, m.feature_spec.mean, m.feature_spec.inv_std,
              m.feature_spec.z_idx, m.feature_spec.w_idx):
        with pytest.raises(ValueError, match="read-only"):
            a[...] = 0
    x = rng.standard_normal(4).astype(F32)
    assert np.allclose(e.predict(x), e.model.forward(x), atol=1e-5)


def test_the_callers_arrays_stay_theirs():
    rng = np.random.default_rng(3)
    w, b = rng.standard_normal((2, 3)).astype(F32), np.zeros(2, F32)
    mean, inv = np.zeros(3, F32), np.ones(3, F32)
    m = Model((Layer(w, b),), FeatureSpec(3, np.arange(3), np.zeros(0, int), 1, mean, inv))
    before = m.to_bytes()
    w[:] = np.nan
    mean[:] = 7
    assert w.flags.writeable and mean.flags.writeable      # the caller's still writable
    assert m.to_bytes() == before


def test_with_methods_keep_arrays_frozen_and_the_model_equal_where_unchanged():
    m = _windowed_model(np.random.default_rng(4))
    for m2 in (m.with_cache_policy(m.cache_policy), m.with_feature_spec(m.feature_spec)):
        assert m2 == m and not m2.layers[0].weight.flags.writeable


# --------------------------------------------------------------------------- the bundle
@pytest.mark.parametrize("k", range(1, 28))
def test_a_bundle_cut_inside_its_first_bytes_is_named_truncated(k):
    # k = 7..27 said "unsupported bundle version byte b''" (or b'\x01', this reader's own
    # version), k = 1..6 "bad magic": the file is a bundle, cut short
    blob = Model((Layer(np.ones((2, 3), F32), np.zeros(2, F32)),)).to_bytes()
    with pytest.raises(ModelError, match=rf"is truncated: {k} bytes") as err:
        Model.from_bytes(blob[:k])
    assert "version" not in str(err.value)


def test_other_first_bytes_are_still_named_for_what_they_are():
    with pytest.raises(ModelError, match="bad magic"):
        Model.from_bytes(b"PK\x03\x04" + bytes(40))
    with pytest.raises(ModelError, match="bad magic"):
        Model.from_bytes(b"")
    with pytest.raises(ModelError, match=r"unsupported bundle version byte b'\\x02'"):
        Model.from_bytes(MAGIC[:-1] + b"\x02" + bytes(40))


def test_every_truncation_and_byte_flip_of_a_bundle_is_a_model_error():
    m = Model((), trees=_stumps([0.5, -1.0]))
    blob = m.to_bytes()
    for k in range(len(blob)):
        with pytest.raises(ModelError):
            Model.from_bytes(blob[:k])
    for k in range(0, len(blob), 7):
        bad = bytearray(blob)
        bad[k] ^= 0x40
        with pytest.raises(ModelError):
            Model.from_bytes(bytes(bad))


def test_save_load_save_is_byte_identical(tmp_path):
    m = _windowed_model(np.random.default_rng(5))
    m = Model(m.layers, m.feature_spec, CachePolicy(True, 0.9999, 0.01, 10, 3, 0.004),
              {"note": "x", "arr": np.arange(3), "f": np.float32(0.1)})
    m.save(tmp_path / "a.fpm")
    b = Model.load(tmp_path / "a.fpm")
    b.save(tmp_path / "b.fpm")
    assert (tmp_path / "a.fpm").read_bytes() == (tmp_path / "b.fpm").read_bytes()
    # meta comes back as JSON keeps it (lists, plain numbers), and still compares equal: a
    # numpy array in it made == raise "truth value is ambiguous"
    assert b == m and m == b and b.meta["arr"] == [0, 1, 2]
    assert Model(m.layers, m.feature_spec, meta={"t": (1, 2)}) == \
        Model(m.layers, m.feature_spec, meta={"t": [1, 2]})


# ------------------------------------------------------------------------ FeatureSpec.fit
def test_fit_refuses_symbols_that_do_not_match_the_ticks():
    # fewer symbols than ticks: the rows past them were never written (np.empty) and the fit
    # came back with a mean of ~1e33; more: numpy's IndexError
    raws = np.random.default_rng(6).standard_normal((200, 4)).astype(F32)
    for sy in (np.zeros(150, int), np.zeros(250, int), np.zeros((200, 1), int),
               np.zeros(200, float)):
        with pytest.raises(InputError, match=r"symbols must be an integer array of shape \(200,\)"):
            FeatureSpec.fit(raws, [0], [1], window=4, symbols=sy)


@pytest.mark.parametrize("z,match", [([1.7], "integer field indices, got 1.7"),
                                     ([True], "integer field indices, got True"),
                                     ([7], "field 7, outside the ticks' fields 0..3"),
                                     ([-1], "field -1, outside")])
def test_fit_refuses_field_indices_it_would_misread(z, match):
    # 1.7 was cast to field 1 and True to field 1 (a spec on another field than named), 7
    # was numpy's IndexError
    raws = np.random.default_rng(7).standard_normal((50, 4)).astype(F32)
    with pytest.raises(ModelError, match=match):
        FeatureSpec.fit(raws, z, [], window=4)
    with pytest.raises(ModelError, match=match.replace("z_idx", "w_idx")):
        FeatureSpec.fit(raws, [0], z, window=4)


def test_apply_refuses_ticks_of_another_width():
    # a wider tick was read by its first raw_len fields without a word
    fs = FeatureSpec.identity(4)
    for shape in ((10, 5), (10, 3), (4,)):
        with pytest.raises(InputError, match=r"raws must have shape \(n, 4\)"):
            fs.apply(np.zeros(shape, F32))
    with pytest.raises(InputError, match="symbols"):
        fs.apply(np.zeros((10, 4), F32), np.zeros(9, int))


def _naive_spec(raws, symbols, z, w, window):
    """The docstring read plainly: per tick, raw[z], then mean and std (ddof 0) of its
    symbol's last `window` ticks of raw[w]; mean / inv_std over all ticks."""
    pre = []
    for i in range(len(raws)):
        rows = [j for j in range(i + 1) if symbols[j] == symbols[i]][-window:]
        v = raws[rows][:, w].astype(np.float64)
        pre.append(np.concatenate([raws[i, z], v.mean(0), v.std(0)]))
    pre = np.array(pre)
    sd = pre.std(0)
    return pre.mean(0), np.where(sd > 1e-12, 1 / np.maximum(sd, 1e-12), 1.0)


def test_fit_matches_a_plain_reading_with_gaps_an_outlier_and_a_constant_field():
    rng = np.random.default_rng(8)
    n = 120
    raws = rng.standard_normal((n, 5)).astype(F32) * 3 + 10
    raws[:, 2] = 65432.1                        # constant: std 0, inv_std 1
    raws[17, 1] = 1e6                           # one outlier
    sy = rng.choice([3, 40, 1000], n)           # ids with gaps
    fs = FeatureSpec.fit(raws, [0, 2], [1, 2, 4], window=6, symbols=sy)
    mean, inv = _naive_spec(raws, sy, [0, 2], [1, 2, 4], 6)
    assert np.allclose(fs.mean, mean, rtol=1e-6, atol=1e-6)
    assert np.allclose(fs.inv_std, inv, rtol=1e-5)
    # features [z0, z2, mean1, mean2, mean4, sd1, sd2, sd4]: the constant field's three
    assert (fs.inv_std[[1, 3, 6]] == 1).all()
    feats = fs.apply(raws, sy)
    assert np.allclose(feats.std(0)[[0, 2, 4, 5, 7]], 1, atol=1e-4)


# ------------------------------------------------------------------------ Model odds and ends
def test_meta_none_is_no_meta_and_other_non_mappings_are_refused():
    layers = (Layer(np.ones((2, 3), F32), np.zeros(2, F32)),)
    assert Model(layers, meta=None).meta == {}       # was TypeError: 'NoneType' not iterable
    for bad in ([("a", 1)], "ab", 3):
        with pytest.raises(ModelError, match="meta must be a dict"):
            Model(layers, meta=bad)


def test_signal_refuses_outputs_of_another_width():
    # a classifier's confidence is the max over the row: a row with one output too many was
    # read silently (0.9 from an output the model does not have); one too few, IndexError
    m = Model((Layer(np.ones((3, 3), F32), np.zeros(3, F32)),), post="softmax")
    with pytest.raises(InputError, match=r"outputs must have shape \(3,\) or \(n, 3\)"):
        m.signal(np.array([0.2, 0.3, 0.5, 0.9]))
    two = Model((Layer(np.ones((2, 3), F32), np.zeros(2, F32)),))
    with pytest.raises(InputError, match=r"\(2,\)"):
        two.signal(np.zeros(1))
    s, c = m.signal(np.array([[0.2, 0.3, 0.5]]))
    assert s[0] == pytest.approx(0.3) and c[0] == pytest.approx(0.5)


def test_values_of_the_wrong_kind_are_model_errors_not_type_errors():
    # each was a TypeError or ValueError from tuple(), dict lookup or numpy's cast
    layer = Layer(np.ones((2, 3), F32), np.zeros(2, F32))
    with pytest.raises(ModelError, match=r"wrap a single one, \(layer,\)"):
        Model(layer)
    with pytest.raises(ModelError, match="layers must be a sequence of Layer"):
        Model(None)
    assert Model(None, trees=_stumps([0.5])).kind == "trees"
    with pytest.raises(ModelError, match=r"e.g. \(0,\), got the int 0"):
        Head("regression", 1.0, 0)
    with pytest.raises(ModelError, match="head kind"):
        Head(["regression"])
    with pytest.raises(ModelError, match="calibration ticks must be numbers"):
        FeatureSpec.fit([["a", "b"], ["c", "d"]], [0])
    with pytest.raises(ModelError, match="numeric array, got dtype bool"):
        FeatureSpec.fit(np.ones((3, 2), bool), [0])
    with pytest.raises(ModelError, match="z_idx must be a sequence of field indices"):
        FeatureSpec.fit(np.ones((3, 2), F32), 0)


def test_copies_and_pickles_keep_the_arrays_frozen():
    # copy.deepcopy / pickle restored the dataclasses' state as is: the arrays came back
    # writable, so a copy could be changed under an engine (and its hash go stale)
    import copy
    import pickle
    for m in (_windowed_model(np.random.default_rng(11)), Model((), trees=_stumps([0.5, -1.0]))):
        for c in (copy.deepcopy(m), pickle.loads(pickle.dumps(m)), copy.copy(m)):
            assert c == m and hash(c) == hash(m)
            arrays = [c.feature_spec.mean, c.feature_spec.z_idx]
            arrays += [c.trees.threshold] if c.trees is not None else [c.layers[0].weight]
            for a in arrays:
                with pytest.raises(ValueError, match="read-only"):
                    a[...] = 0


FITTED = CachePolicy(True, 0.9999, 0.02, 50_000_000, 16, 0.005)
FIT_REPORT = {"max_error": 0.005, "chosen": {"hits": 12, "hit_rate": 0.1}}


def test_another_feature_spec_or_head_drops_the_fitted_policy_and_its_report():
    # with_feature_spec kept a policy fitted on other features (enabled, claiming its
    # fitted_max_error), where calibrate drops it; with_head dropped the policy but left
    # the fit report in meta, describing a policy no longer in force
    rng = np.random.default_rng(12)
    m = _windowed_model(rng)
    m = Model(m.layers, m.feature_spec, FITTED, {"cache_policy_fit": FIT_REPORT, "keep": 1})
    fs = m.feature_spec
    other = FeatureSpec(fs.raw_len, fs.z_idx, fs.w_idx, fs.window, fs.mean, fs.inv_std * 2)
    for changed in (m.with_feature_spec(other), m.with_head(Head("tanh_sigmoid", 1.0, (1, 0)))):
        assert not changed.cache_policy.enabled and not changed.cache_policy.fitted
        assert changed.meta == {"keep": 1}
    # the same spec or head changes nothing: the fit still holds
    same_fs = FeatureSpec(fs.raw_len, fs.z_idx.copy(), fs.w_idx, fs.window, fs.mean, fs.inv_std)
    for same in (m.with_feature_spec(same_fs), m.with_head(Head())):
        assert same == m and same.cache_policy == FITTED


def test_another_cache_policy_drops_the_report_of_the_old_fit():
    m = _windowed_model(np.random.default_rng(14))
    m = Model(m.layers, m.feature_spec, FITTED, {"cache_policy_fit": FIT_REPORT, "keep": 1})
    assert m.with_cache_policy(CachePolicy()).meta == {"keep": 1}
    assert m.with_cache_policy(FITTED).meta == m.meta


def test_a_header_length_past_the_end_of_the_file_is_named():
    import struct
    import zlib
    blob = Model((Layer(np.ones((2, 3), F32), np.zeros(2, F32)),)).to_bytes()
    body = bytearray(blob[:-12])
    body[12:16] = struct.pack("<I", 10 ** 9)
    bad = bytes(body) + struct.pack("<I", zlib.crc32(bytes(body))) + blob[-8:]
    with pytest.raises(ModelError, match=r"header length field says 1000000000 bytes, but only"):
        Model.from_bytes(bad)


def test_from_bytes_takes_any_bytes_like_and_names_a_path():
    # a memoryview was "malformed bundle header (AttributeError: ... no attribute 'decode')",
    # None a TypeError, a path "bad magic 'fastpath'"
    m = _windowed_model(np.random.default_rng(15))
    blob = m.to_bytes()
    for b in (bytearray(blob), memoryview(blob), np.frombuffer(blob, np.uint8)):
        assert Model.from_bytes(b) == m
    with pytest.raises(ModelError, match=r"takes the bundle's bytes.*Model.load\(path\)"):
        Model.from_bytes("fastpath/data/demo.fpm")
    for bad in (None, 10 ** 12, 3.5):
        with pytest.raises(ModelError, match="takes bytes"):
            Model.from_bytes(bad)


def test_load_and_save_take_paths_only():
    # load(None) / save(None) were TypeErrors from open() / os.fspath(); load(0) read stdin's
    # file descriptor
    m = _windowed_model(np.random.default_rng(16))
    for bad in (None, 0, 2.5):
        with pytest.raises(ModelError, match=r"Model.load takes a file path"):
            Model.load(bad)
        with pytest.raises(ModelError, match=r"Model.save takes a file path"):
            m.save(bad)


def test_load_and_save_take_str_bytes_and_pathlike(tmp_path):
    m = _windowed_model(np.random.default_rng(17))
    m.save(str(tmp_path / "a.fpm"))
    m.save(bytes(tmp_path / "b.fpm"))
    for p in (tmp_path / "a.fpm", str(tmp_path / "b.fpm"), bytes(tmp_path / "b.fpm")):
        assert Model.load(p) == m


def test_fit_names_a_float64_tick_beyond_float32_as_such():
    # 1e39 was cast to Inf and the message said "row 2 field 1 is inf"
    r = np.ones((4, 2))
    r[2, 1] = 1e39
    with pytest.raises(ModelError, match=r"^calibration ticks: row 2 field 1 is 1e\+39, beyond"):
        FeatureSpec.fit(r, [0, 1])
    r[2, 1] = np.nan
    with pytest.raises(ModelError, match="must be finite: row 2 field 1 is nan"):
        FeatureSpec.fit(r, [0, 1])


def test_threads_saving_one_path_leave_one_whole_bundle(tmp_path):
    # the temp file was named by the process only: threads saving the same path wrote into
    # one file, and the rename left a bundle mixing both, or failed with FileNotFoundError
    import threading
    rng = np.random.default_rng(20)
    models = [random_model(rng, [64, 256, 2]) for _ in range(4)]
    path = tmp_path / "m.fpm"
    errors = []

    def save(m):
        try:
            for _ in range(5):
                m.save(path)
        except Exception as exc:       # noqa: BLE001 - any failure is the finding
            errors.append(exc)

    threads = [threading.Thread(target=save, args=(m,)) for m in models]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert Model.load(path) in models and sorted(os.listdir(tmp_path)) == ["m.fpm"]


def test_a_meta_that_holds_itself_is_a_model_error_on_save(tmp_path):
    # _check_meta recursed without end: RecursionError
    meta = {}
    meta["self"] = meta
    m = Model((Layer(np.ones((2, 3), F32), np.zeros(2, F32)),), meta=meta)
    with pytest.raises(ModelError, match="meta holds a reference to itself"):
        m.to_bytes()
    with pytest.raises(ModelError, match="meta holds a reference to itself"):
        m.save(tmp_path / "m.fpm")
    assert os.listdir(tmp_path) == []


def test_layer_value_beyond_float32_is_named():
    """Defect: "layer weight contains NaN/Inf" for a finite 1e39 (the float32 cast made it Inf)."""
    from fastpath.model import Layer
    w = np.ones((2, 3))
    w[1, 2] = -1e39
    with pytest.raises(ModelError, match=r"layer weight holds -1e\+39 at index \(1, 2\), beyond "
                                         r"float32's range"):
        Layer(w, np.zeros(2))
    with pytest.raises(ModelError, match="contains NaN/Inf"):
        Layer(np.full((2, 3), np.inf), np.zeros(2))
