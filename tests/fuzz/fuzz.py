"""atheris fuzz targets for every public entry point that takes outside input.

    python tests/fuzz/fuzz.py step -atheris_runs=20000
    python tests/fuzz/fuzz.py {step,batch,bundle,onnx,config,trees,book} [libFuzzer flags]

A target passes an input when the call either works or raises one of the exception types
fastpath documents for bad input; anything else (another exception, a crash, a sanitizer
report, a NaN signal, a result outside its range) stops the run. Run it against the
FASTPATH_SANITIZE=1 build to have AddressSanitizer and UBSan watch the C side too.
"""
import os
import sys
import tempfile

import atheris

with atheris.instrument_imports():
    import numpy as np
    import fastpath
    import fastpath._build
    import fastpath.model.onnx_import
    import fastpath.control.config
    import fastpath.model
    import onnx
    from fastpath import ConfigError, Engine, FastpathError, InputError, Model, ModelError
    from fastpath.model import CachePolicy, FeatureSpec, Head, Layer

EXPECTED = (FastpathError, TypeError, OverflowError)
DTYPES = [np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8, ">f4", np.bool_]


def _model():
    rng = np.random.default_rng(0)
    fs = FeatureSpec(24, np.arange(0, 20), np.array([3, 7]), 4,
                     rng.standard_normal(24).astype(np.float32), np.ones(24, np.float32))
    layers = (Layer(rng.standard_normal((9, 24)) * 0.3, rng.standard_normal(9), "tanh"),
              Layer(rng.standard_normal((2, 9)), np.zeros(2), "identity"))
    return Model(layers, fs, CachePolicy(enabled=True, max_age_ns=1000, max_run=3))


MODEL = _model()
ENGINES = {isa: Engine(MODEL, config={"engine": {"simd": isa, "n_symbols": 8}})
           for isa in fastpath._engine.supported_isas()}
BUNDLE = None


def _array(fdp, n_max=64):
    kind = fdp.ConsumeIntInRange(0, 5)
    dt = DTYPES[fdp.ConsumeIntInRange(0, len(DTYPES) - 1)]
    if kind == 0:
        shape = (24,)
    elif kind == 1:
        shape = (fdp.ConsumeIntInRange(0, n_max),)
    elif kind == 2:
        shape = (fdp.ConsumeIntInRange(0, 4), fdp.ConsumeIntInRange(0, 30))
    else:
        shape = (24,)
    n = int(np.prod(shape))
    vals = fdp.ConsumeFloatListInRange(n, -1e30, 1e30) if fdp.ConsumeBool() else \
        fdp.ConsumeRegularFloatList(n) if hasattr(fdp, "ConsumeRegularFloatList") else \
        [fdp.ConsumeFloat() for _ in range(n)]
    vals = (list(vals) + [0.0] * n)[:n]
    with np.errstate(all="ignore"):
        a = np.array(vals, dtype=np.float64).astype(dt).reshape(shape)
    if kind == 4:
        a = np.repeat(a, 2)[::2]                       # non-contiguous view
    if kind == 5 and fdp.ConsumeBool():
        a = a.copy()
        a.flags.writeable = False
    return a


def _check_result(r):
    assert -1.0 <= r.signal <= 1.0 and 0.0 <= r.confidence <= 1.0, r
    assert r.latency.total_ns >= 0


def target_step(data):
    fdp = atheris.FuzzedDataProvider(data)
    eng = ENGINES[fdp.PickValueInList(sorted(ENGINES))]
    for _ in range(fdp.ConsumeIntInRange(1, 4)):
        raw = _array(fdp)
        sym = fdp.ConsumeIntInRange(-3, 12) if fdp.ConsumeBool() else fdp.ConsumeInt(9)
        sym = (sym, float(sym), np.int64(sym % 2**63), str(sym), np.float32(sym),
               bool(sym % 2))[fdp.ConsumeIntInRange(0, 5)]
        ts = None if fdp.ConsumeBool() else fdp.ConsumeIntInRange(-5, 2**64)
        if ts is not None and fdp.ConsumeBool():
            ts = (float(ts), np.uint64(ts % 2**64), str(ts))[fdp.ConsumeIntInRange(0, 2)]
        before = eng.ticks
        try:
            r = eng.step(raw, sym, ts)
        except FastpathError:               # every bad argument is an InputError, nothing else
            assert eng.ticks == before     # a rejected tick changes nothing
            continue
        _check_result(r)
        if fdp.ConsumeIntInRange(0, 20) == 0:
            eng.reset()


def target_batch(data):
    fdp = atheris.FuzzedDataProvider(data)
    eng = ENGINES[fdp.PickValueInList(sorted(ENGINES))]
    raws = _array(fdp, 200)
    n = raws.shape[0] if raws.ndim else 0
    syms = np.array([fdp.ConsumeIntInRange(-2, 10) for _ in range(max(n, 0))])
    if fdp.ConsumeBool() and len(syms):
        syms = syms[:-1]
    ts = None if fdp.ConsumeBool() else np.array([fdp.ConsumeIntInRange(-2, 50) for _ in syms])
    before = eng.ticks
    try:
        res = eng.step_batch(raws, syms, ts)
    except EXPECTED:
        assert eng.ticks == before
        return
    assert np.all(np.abs(res.signal) <= 1) and np.all((res.confidence >= 0) & (res.confidence <= 1))


def target_bundle(data):
    global BUNDLE
    if BUNDLE is None:
        with tempfile.TemporaryDirectory() as d:
            MODEL.save(os.path.join(d, "m.fpm"))
            with open(os.path.join(d, "m.fpm"), "rb") as f:
                BUNDLE = f.read()
    fdp = atheris.FuzzedDataProvider(data)
    mode = fdp.ConsumeIntInRange(0, 3)
    blob = bytearray(BUNDLE)
    if mode == 0:                                     # flip bytes
        for _ in range(fdp.ConsumeIntInRange(1, 8)):
            blob[fdp.ConsumeIntInRange(0, len(blob) - 1)] ^= fdp.ConsumeIntInRange(1, 255)
    elif mode == 1:                                   # truncate
        blob = blob[:fdp.ConsumeIntInRange(0, len(blob))]
    elif mode == 2:                                   # raw bytes
        blob = bytearray(fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 4096)))
    else:                                             # rewrite the header, fix the CRC
        import json, struct, zlib
        hlen = struct.unpack("<I", BUNDLE[12:16])[0]
        head = json.loads(BUNDLE[16:16 + hlen])
        key = fdp.PickValueInList(["layers", "feature_spec", "cache_policy", "arrays"])
        head[key] = fdp.PickValueInList([None, 1, "x", [], {}, [{"activation": "gelu"}],
                                         {"raw_len": -1, "window": 0, "field_names": []}])
        hb = json.dumps(head).encode()
        body = BUNDLE[:12] + struct.pack("<I", len(hb)) + hb
        body += b"\0" * ((-len(body)) % 64) + BUNDLE[16 + hlen + ((-(16 + hlen)) % 64):-12]
        blob = bytearray(body + struct.pack("<I", zlib.crc32(body)) + BUNDLE[-8:])
    try:
        m = Model.from_bytes(bytes(blob))
    except ModelError:
        return
    Engine(m).step(np.zeros(m.raw_len, np.float32))   # whatever loads must run


ONNX_OPS = ["Gemm", "MatMul", "Add", "Relu", "Tanh", "Sigmoid", "Flatten", "Identity", "Constant",
            "Softmax", "Conv", "Mul", "Transpose", "Dropout"]


def _onnx_graph(fdp):
    """A graph built from fuzz data: mostly the ops an MLP uses, wired mostly as a chain, with
    shapes that mostly fit; the rest is what the importer must refuse cleanly."""
    from onnx import TensorProto, helper, numpy_helper
    width = fdp.ConsumeIntInRange(1, 12)
    nodes, inits, cur = [], [], "x"
    for i in range(fdp.ConsumeIntInRange(0, 6)):
        op = fdp.PickValueInList(ONNX_OPS)
        src = cur if fdp.ConsumeIntInRange(0, 9) else fdp.PickValueInList(["x", "nope", cur])
        out = f"t{i}"
        if op in ("Gemm", "MatMul"):
            n_out = fdp.ConsumeIntInRange(1, 12)
            n_in = width if fdp.ConsumeIntInRange(0, 5) else fdp.ConsumeIntInRange(1, 12)
            shape = (n_out, n_in) if (op == "Gemm" and fdp.ConsumeBool()) else (n_in, n_out)
            w = np.array(fdp.ConsumeFloatListInRange(n_in * n_out, -3, 3), np.float32).reshape(shape)
            inits.append(numpy_helper.from_array(w, f"W{i}"))
            ins = [src, f"W{i}"]
            if op == "Gemm" and fdp.ConsumeBool():
                b = np.array(fdp.ConsumeFloatListInRange(fdp.PickValueInList([1, n_out, n_out + 1]),
                                                         -1, 1), np.float32)
                inits.append(numpy_helper.from_array(b, f"B{i}"))
                ins.append(f"B{i}")
            attrs = {}
            if op == "Gemm":
                attrs = {"transB": int(shape == (n_out, n_in)), "alpha": fdp.ConsumeFloatInRange(-2, 2),
                         "transA": int(fdp.ConsumeIntInRange(0, 9) == 0)}
            nodes.append(helper.make_node(op, ins, [out], **attrs))
            width = n_out
        elif op == "Add":
            b = np.array(fdp.ConsumeFloatListInRange(fdp.PickValueInList([1, width, width + 2]), -1, 1),
                         np.float32)
            inits.append(numpy_helper.from_array(b, f"A{i}"))
            nodes.append(helper.make_node("Add", [src, f"A{i}"] if fdp.ConsumeBool() else [f"A{i}", src],
                                          [out]))
        elif op == "Constant":
            c = np.array(fdp.ConsumeFloatListInRange(4, -1, 1), np.float32).reshape(2, 2)
            nodes.append(helper.make_node("Constant", [], [out], value=numpy_helper.from_array(c)))
            continue
        else:
            nodes.append(helper.make_node(op, [src], [out]))
        cur = out
    outs = cur if fdp.ConsumeIntInRange(0, 9) else "elsewhere"
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info(outs, TensorProto.FLOAT, [1, 2])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


def target_onnx(data):
    fdp = atheris.FuzzedDataProvider(data)
    mode = fdp.ConsumeIntInRange(0, 3)
    if mode == 0:
        blob = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 2048))
    else:
        blob = bytearray(_onnx_graph(fdp))
        if mode == 3 and blob:                      # and damage the serialized bytes
            for _ in range(fdp.ConsumeIntInRange(1, 4)):
                blob[fdp.ConsumeIntInRange(0, len(blob) - 1)] ^= fdp.ConsumeIntInRange(1, 255)
        blob = bytes(blob)
    with tempfile.NamedTemporaryFile(suffix=".onnx") as f:
        f.write(blob)
        f.flush()
        try:
            m = Model.from_onnx(f.name)
        except ModelError:
            return
    r = Engine(m).step(np.zeros(m.raw_len, np.float32))
    _check_result(r)


def target_config(data):
    fdp = atheris.FuzzedDataProvider(data)
    keys = ["engine", "cache", "n_symbols", "simd", "backend", "latency_records", "enabled",
            "cos_threshold", "norm_tol", "max_age_ns", "max_run", "x"]
    vals = ["1", "0", "-1", "4096", "1.5", "nan", "inf", "true", "\"avx2\"", "\"scalar\"",
            "\"auto\"", "\"gpu\"", "[]", "{}", "\"\"", "99999999999999999999", "65536"]
    lines = []
    for _ in range(fdp.ConsumeIntInRange(0, 8)):
        if fdp.ConsumeIntInRange(0, 3) == 0:
            lines.append(f"[{fdp.PickValueInList(keys)}]")
        else:
            lines.append(f"{fdp.PickValueInList(keys)} = {fdp.PickValueInList(vals)}")
    if fdp.ConsumeBool():
        lines.append(fdp.ConsumeUnicodeNoSurrogates(40))
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write("\n".join(lines))
    try:
        eng = Engine(MODEL, config=f.name)
    except (ConfigError, fastpath.BackendError):
        return
    finally:
        os.unlink(f.name)
    _check_result(eng.step(np.zeros(24, np.float32), 0))


# ------------------------------------------------------------------- tree ensembles
# thresholds at the float32 edges, each a float32 value (EQ / NEQ at a value no float32 holds
# are refused, and one such split would refuse the whole ensemble)
TREE_THRESHOLDS = [float(np.float32(v)) for v in (
    0.0, -0.0, 0.5, -0.25, 1.0, -3.0, 1e-40, -1e-40, 1.1754944e-38, -1.1754944e-38, 3e38, -3e38,
    1e20, float("inf"), float("-inf"))]
# leaves a reference can follow to ~1e-5 (SAFE_LEAVES), then values whose sums depend on
# their order (1e20 beside 1) or leave float32 (3e38 + 3e38); values refused outright (1e39,
# NaN, Inf) come in through the damaged field
SAFE_LEAVES = [0.0, -0.0, 1.0, -1.0, 0.5, 2.5, -7.0, 1e-3]
LEAVES = SAFE_LEAVES + [1e20, -1e20, 3e38, -3e38]
TREE_INPUTS = [0.0, 0.5, -0.25, 1.0, -3.0, 2.0, 1e-40, 1e30, -1e30, float("inf"), float("-inf"),
               float("nan")]
TREE_MAX_NODES = 1500


def _tree_ensemble(fdp):
    """A TreeEnsemble from fuzz data: mostly well formed (trees of depth 0 to 12, every split
    mode, thresholds at the float32 edges, single- and multi-target leaves), sometimes with one
    field damaged, which the constructor must refuse with a ModelError."""
    from fastpath.model import TreeEnsemble
    n_feat = fdp.ConsumeIntInRange(1, 6)
    n_targets = fdp.ConsumeIntInRange(1, 3)
    classifier = n_targets >= 2 and fdp.ConsumeIntInRange(0, 3) == 0
    safe = fdp.ConsumeBool()
    leaves = SAFE_LEAVES if safe else LEAVES
    off, mode, feat, thr, tc, fc, nt, wn, wt, wv = [0], [], [], [], [], [], [], [], [], []
    for _ in range(fdp.ConsumeIntInRange(1, 40)):
        base = len(mode)
        depth = fdp.ConsumeIntInRange(0, 12)

        def node(level):
            i = len(mode) - base
            mode.append(6), feat.append(0), thr.append(0.0), tc.append(0), fc.append(0), nt.append(0)
            if level >= depth or len(mode) > TREE_MAX_NODES or fdp.ConsumeIntInRange(0, 4) == 0:
                for _ in range(fdp.ConsumeIntInRange(0, 2) if fdp.ConsumeIntInRange(0, 7) == 0 else 1):
                    wn.append(base + i)
                    wt.append(fdp.ConsumeIntInRange(0, n_targets - 1))
                    wv.append(fdp.PickValueInList(leaves))
                return i
            mode[base + i] = fdp.ConsumeIntInRange(0, 5)
            feat[base + i] = fdp.ConsumeIntInRange(0, n_feat - 1)
            thr[base + i] = fdp.PickValueInList(TREE_THRESHOLDS)
            nt[base + i] = int(fdp.ConsumeBool())
            tc[base + i] = node(level + 1)
            fc[base + i] = node(level + 1)
            return i
        node(0)
        off.append(len(mode))
    arrays = {"tree_offsets": off, "mode": mode, "feature": feat, "threshold": thr,
              "true_child": tc, "false_child": fc, "nan_true": nt, "weight_node": wn,
              "weight_target": wt, "weight_value": wv}
    if fdp.ConsumeIntInRange(0, 7) == 0:             # one field damaged
        key = fdp.PickValueInList(sorted(arrays))
        a = arrays[key]
        if a:
            a[fdp.ConsumeIntInRange(0, len(a) - 1)] = fdp.PickValueInList(
                [-1, 0, 1, 2, 7, 255, len(mode), n_feat, n_targets, 2**31 - 1, 0.5, 1e39, 0.1,
                 float("nan"), float("inf")])
    base_values = [fdp.PickValueInList(SAFE_LEAVES) for _ in range(fdp.PickValueInList([0, 0, n_targets, 1]))]
    e = TreeEnsemble(n_feat, n_targets, *(np.asarray(arrays[k]) for k in (
        "tree_offsets", "mode", "feature", "threshold", "true_child", "false_child", "nan_true",
        "weight_node", "weight_target", "weight_value")), base_values=base_values,
        aggregate=fdp.PickValueInList(["SUM", "AVERAGE", "MIN", "MAX"]),
        post_transform=fdp.PickValueInList(["NONE", "NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO",
                                            "PROBIT"]),
        classifier=classifier)
    return e, safe and not any(abs(b) > 7 for b in base_values)


def _tree_onnx(e):
    """e as the ai.onnx.ml TreeEnsembleRegressor / TreeEnsembleClassifier node a converter
    writes (node ids local to their tree, as skl2onnx and onnxmltools number them)."""
    from onnx import TensorProto, helper
    from fastpath.model.trees import MODES
    off = e.tree_offsets
    tree_of = np.searchsorted(off, np.arange(off[-1]), side="right") - 1
    local = np.arange(off[-1]) - off[tree_of]
    a = {"nodes_treeids": tree_of.tolist(), "nodes_nodeids": local.tolist(),
         "nodes_featureids": e.feature.tolist(), "nodes_values": e.threshold.tolist(),
         "nodes_modes": [MODES[k] for k in e.mode],
         "nodes_truenodeids": [int(c) if k != 6 else 0 for c, k in zip(e.true_child, e.mode)],
         "nodes_falsenodeids": [int(c) if k != 6 else 0 for c, k in zip(e.false_child, e.mode)],
         "nodes_missing_value_tracks_true": e.nan_true.tolist(),
         "post_transform": e.post_transform}
    w = "class" if e.classifier else "target"
    a[f"{w}_ids"] = e.weight_target.tolist()
    a[f"{w}_nodeids"] = local[e.weight_node].tolist()
    a[f"{w}_treeids"] = tree_of[e.weight_node].tolist()
    a[f"{w}_weights"] = e.weight_value.tolist()
    if len(e.base_values):
        a["base_values"] = [float(v) for v in e.base_values]
    if e.classifier:
        op, outs = "TreeEnsembleClassifier", ["label", "probabilities"]
        a["classlabels_int64s"] = list(range(e.n_targets))
        vi = [helper.make_tensor_value_info("label", TensorProto.INT64, [None]),
              helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [None, e.n_targets])]
    else:
        op, outs = "TreeEnsembleRegressor", ["y"]
        a["n_targets"] = e.n_targets
        a["aggregate_function"] = e.aggregate
        vi = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, e.n_targets])]
    # an empty list has no type onnx could infer: left out, as a converter leaves it
    a = {k: v for k, v in a.items() if not (isinstance(v, list) and not v)}
    node = helper.make_node(op, ["x"], outs, domain="ai.onnx.ml", **a)
    g = helper.make_graph([node], "trees", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [None, e.n_features])], vi)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                               helper.make_opsetid("ai.onnx.ml", 3)]).SerializeToString()


def target_trees(data):
    """A fuzzed tree ensemble (or the ONNX file it exports to, damaged): every kernel set gives
    the same bits, the engine what the packed kernels give (or refuses a non-finite output),
    and, where the leaves are small, what the ONNX-spec reference (TreeEnsemble.forward) gives."""
    from fastpath._kernels import PackedTrees, tree_isas
    fdp = atheris.FuzzedDataProvider(data)
    try:
        e, safe = _tree_ensemble(fdp)
        # the default head where the outputs take one, else (several regression targets, a
        # classifier's sums that are not probabilities) a regression head on output 0
        try:
            m = Model((), trees=e)
        except ModelError:
            m = Model((), trees=e, head_spec=Head("regression", 1.0, (0,)))
    except ModelError:
        return
    via = fdp.ConsumeIntInRange(0, 5)
    if via >= 4:                                     # through an .onnx file or a bundle, maybe damaged
        blob = bytearray(_tree_onnx(e) if via == 4 else m.to_bytes())
        for _ in range(fdp.ConsumeIntInRange(0, 3)):
            blob[fdp.ConsumeIntInRange(0, len(blob) - 1)] ^= fdp.ConsumeIntInRange(1, 255)
        try:
            if via == 4:
                with tempfile.TemporaryDirectory() as d:
                    path = os.path.join(d, "t.onnx")
                    with open(path, "wb") as f:
                        f.write(blob)
                    m = Model.from_onnx(path)
            else:
                m = Model.from_bytes(bytes(blob))
        except ModelError:
            return
        if m.trees is None:
            return
        e = m.trees
    n = fdp.ConsumeIntInRange(1, 6)
    X = np.array([[fdp.PickValueInList(TREE_INPUTS) for _ in range(e.n_features)]
                  for _ in range(n)], np.float32)
    outs = {}
    for k in tree_isas():
        pk = PackedTrees(e, k)
        if pk.layout["lane_walk"]:      # any walk, whichever was timed fastest: the same bits
            pk.walk = fdp.PickValueInList(["compact", "lanes-rest", "gather-rest", "lanes-all",
                                           "gather-all"])
        pk.perfect_walk = fdp.PickValueInList(["gather", "steps"])
        outs[k] = pk.eval(X)
    first = outs[tree_isas()[0]]
    for k, o in outs.items():
        assert o.tobytes() == first.tobytes(), (k, X, o, first)
    if safe:
        ref = e.forward(X)
        tol = 1e-4 if e.post_transform == "PROBIT" else 1e-5
        fin = np.isfinite(ref)
        scale = max(1.0, float(np.max(np.abs(ref[fin]), initial=0.0)))
        assert np.array_equal(np.isfinite(first), fin), (X, first, ref)
        assert np.allclose(first[fin], ref[fin], rtol=tol, atol=tol * scale), (X, first, ref)
    isa = fdp.PickValueInList(sorted(outs))
    eng = Engine(m, config={"engine": {"simd": isa if isa in ENGINES else "scalar", "n_symbols": 2}})
    for x, o in zip(X, first):
        before = eng.ticks
        try:
            p = eng.predict(x)
        except InputError:
            assert not np.all(np.isfinite(o)), (x, o)
        else:
            assert np.isfinite(p).all() and p.tobytes() == o.tobytes(), (x, p, o)
        try:
            r = eng.step(x, 1)
        except InputError:
            assert eng.ticks == before
            continue
        _check_result(r)


BOOK_ENGINES = {isa: Engine(fastpath._build.DEMO_MODEL,
                            config={"engine": {"simd": isa, "n_symbols": 4}})
                for isa in fastpath._engine.supported_isas()}
BOOK_PRICES = [100.0, 100.01, 99.99, 0.0, -1.0, 1e-300, 1e300, float("nan"), float("inf")]


def _book_side(fdp, start, step):
    """Ten levels: mostly an ordered ladder from start, sometimes any values, sometimes not 10."""
    kind = fdp.ConsumeIntInRange(0, 3)
    if kind == 0:
        n = fdp.ConsumeIntInRange(0, 12)
        return np.array([fdp.PickValueInList(BOOK_PRICES) for _ in range(n)])
    px = start + step * np.arange(10) * fdp.ConsumeIntInRange(1, 3)
    if kind == 1:
        px[fdp.ConsumeIntInRange(0, 9)] = fdp.PickValueInList(BOOK_PRICES)
    return px


def target_book(data):
    """step_book with ladders near a valid book, bad levels, bad trades and time going back:
    every call works or is an InputError that leaves the book and counters as they were."""
    fdp = atheris.FuzzedDataProvider(data)
    eng = BOOK_ENGINES[fdp.PickValueInList(sorted(BOOK_ENGINES))]
    sym = fdp.ConsumeIntInRange(0, 4)
    if fdp.ConsumeIntInRange(0, 3) == 0:
        try:
            eng.set_tick_size(sym, fdp.PickValueInList([0.01, 0.5, 1e-300, 0.0, -1.0, 1e300]))
        except InputError:
            pass
    mid = fdp.PickValueInList([100.0, 1.0, 5e4, 1e-3])
    for _ in range(fdp.ConsumeIntInRange(1, 6)):
        gap = fdp.PickValueInList([0.01, 0.0, 0.5, -0.01])
        bp, ap = _book_side(fdp, mid - gap, -0.01), _book_side(fdp, mid + gap, 0.01)
        bz = np.array(fdp.ConsumeFloatListInRange(10, -1.0, 1e6)) if fdp.ConsumeBool() \
            else np.full(10, fdp.PickValueInList([0.0, 1.0, 1e300, float("nan")]))
        az = np.array(fdp.ConsumeFloatListInRange(10, 0.0, 1e3))
        ts = fdp.ConsumeIntInRange(-1, 2**40)
        tv = fdp.PickValueInList([0.0, 1.5, -2.0, float("nan"), 1e300])
        tc = fdp.PickValueInList([0, 1, 3, -1])
        tl = fdp.PickValueInList([0.0, 1.0, -1.0, float("inf")])
        before = (eng.book_state(sym) if sym < 4 else None, eng.ticks)
        try:
            r = eng.step_book(sym, bp, bz, ap, az, ts, tv, tc, tl)
        except InputError:
            assert (eng.book_state(sym) if sym < 4 else None, eng.ticks) == before
            continue
        _check_result(r)
        assert r.latency.book_ns >= 0
        if fdp.ConsumeIntInRange(0, 20) == 0:
            eng.reset(sym)


TARGETS = {"step": target_step, "batch": target_batch, "bundle": target_bundle,
           "onnx": target_onnx, "config": target_config, "trees": target_trees,
           "book": target_book}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        sys.exit(f"usage: fuzz.py {{{','.join(TARGETS)}}} [libFuzzer flags]")
    target = TARGETS[sys.argv.pop(1)]
    atheris.Setup(sys.argv, target)
    atheris.Fuzz()
