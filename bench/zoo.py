"""The model zoo: each kind of model traders deploy, as its exporter writes it, one sample from
Python, fastpath next to onnxruntime (one thread), the library's own predict and, for tree
ensembles, tl2cgen's compiled model through its Python predictor and (LightGBM) lleaves' LLVM
compiled one, all in the same run. The
tree rows cover the shapes: depth-limited, LightGBM's default leaf-wise growth (the two STAC-ML
El Popo shapes: 64 features / ~12K nodes, 128 features / ~512K nodes), XGBoost depthwise and
lossguide, CatBoost's oblivious trees, RandomForest; each call reads the next of 2048 rows (a
repeated row would train the branch predictor). A tree ensemble is also loaded from the
library's own model (Model.from_lightgbm / from_xgboost / from_catboost / from_sklearn) and
timed the same way, and both fastpath models are scored against the library's own predict
(fastpath.model.parity: random rows, rows on and beside every split threshold, missing and
zero values, and the timed rows): the ONNX export rounds thresholds to float32 and may drop
missing-value rules, the native loaders keep every decision.

    python bench/zoo.py            # every model (trains the tree ensembles first: 1-3 min)
    python bench/zoo.py --quick    # small models and fewer calls (< 1 min)
    python bench/zoo.py --only lightgbm

Method: each model is trained on synthetic data with the model's real library, exported to ONNX
with the real exporter (skl2onnx, onnxmltools), imported with fastpath.Model.from_onnx and run
with Engine.predict(x, out) (the raw outputs for one feature vector written into one reused
array, no cache: the same question each peer answers; predict(x), a new array each call, is
timed beside it). Each call is timed with time.perf_counter_ns() around it, minus the median cost
of an empty timed region; the input is copied into one reused buffer before each call. Before
timing, fastpath's outputs are compared with onnxruntime's on the timed inputs (printed: max
|difference| / max(|onnxruntime's value|, 1e-3)): a fast wrong answer is not a row. Ratios are the peer's p50 / fastpath's
p50 (and p99 / p99).
"""
from __future__ import annotations

import os

# one thread for every peer's pools, whatever the caller's environment says (set, not
# defaulted: the table reads "1 thread")
for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
           "VECLIB_MAXIMUM_THREADS"):
    os.environ[_v] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from importlib.metadata import version  # noqa: E402

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import fastpath  # noqa: E402
from fastpath import Engine, Model  # noqa: E402
from fastpath._kernels import PackedTrees  # noqa: E402
from fastpath.model import parity  # noqa: E402

from _commit import commit_stamp, results_dir  # noqa: E402
from _report import Dist  # noqa: E402

N_FEAT = 128
# the performance bar of the issue that asked for trees (bench, never a test): p50 ns
TARGETS = {"lightgbm-100x6": 1000, "lightgbm-500x8": 5500}


def _data(n_rows: int, n_feat: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n_rows, n_feat)).astype(np.float32)
    w = rng.standard_normal(n_feat) / np.sqrt(n_feat)
    y = X @ w + 0.5 * np.sin(3 * X[:, 0]) * X[:, 1] + 0.1 * rng.standard_normal(n_rows)
    return X, y.astype(np.float32)


def _classes(y, k):
    return np.digitize(y, np.quantile(y, np.linspace(0, 1, k + 1)[1:-1])).astype(np.int64)


def _skl(est, X, path):
    from onnx import helper
    from skl2onnx import to_onnx
    opts = {id(est): {"zipmap": False}} if hasattr(est, "predict_proba") else None
    # skl2onnx 1.20 hands HistGradientBoosting's missing-value tracks to onnx as Python bools,
    # which onnx 1.2x refuses in an int list: convert them, as the exporter meant to
    real = helper.make_attribute

    def fixed(key, value, *a, **k):
        if isinstance(value, (list, tuple)) and any(isinstance(v, (bool, np.bool_)) for v in value):
            value = [int(v) for v in value]
        return real(key, value, *a, **k)
    helper.make_attribute = fixed
    try:
        m = to_onnx(est, X[:1], options=opts, target_opset={"": 17, "ai.onnx.ml": 3})
    finally:
        helper.make_attribute = real
    with open(path, "wb") as f:
        f.write(m.SerializeToString())


def _onnxmltools(model, kind, path, n_feat=N_FEAT):
    import onnxmltools
    from onnxmltools.convert.common.data_types import FloatTensorType
    conv = {"lightgbm": onnxmltools.convert_lightgbm, "xgboost": onnxmltools.convert_xgboost}[kind]
    kw = {"zipmap": False} if kind == "lightgbm" else {}
    m = conv(model, initial_types=[("input", FloatTensorType([None, n_feat]))], target_opset=15, **kw)
    with open(path, "wb") as f:
        f.write(m.SerializeToString())


def _tl2cgen(native, kind, workdir):
    """tl2cgen's compiled C model and its Python predictor, or (None, reason)."""
    try:
        import tl2cgen
        import treelite
    except ImportError as exc:
        return None, f"tl2cgen not installed ({exc}); pip install tl2cgen"
    if kind == "lightgbm":
        tm = treelite.frontend.from_lightgbm(native.booster_)
    elif kind == "xgboost":
        tm = treelite.frontend.from_xgboost(native.get_booster())
    else:
        tm = treelite.sklearn.import_model(native)
    lib = os.path.join(workdir, f"tl2cgen-{kind}-{id(native)}.so")
    tl2cgen.export_lib(tm, toolchain="gcc", libpath=lib, params={"parallel_comp": 8})
    pred = tl2cgen.Predictor(lib, nthread=1)
    DM = tl2cgen.DMatrix

    def fn(x):
        return pred.predict(DM(x[None, :]))
    return fn, tl2cgen.__version__


# lleaves compiles a model in ~1 minute per 10K nodes on a loaded 2-core host: past this the
# row would wait many minutes for its peer, so the peer is skipped and says why
LLEAVES_MAX_NODES = 100_000


def _lleaves(native, workdir):
    """lleaves' LLVM-compiled LightGBM model, one thread, or (None, reason). lleaves 1.3 needs
    llvmlite < 0.45 (the legacy pass manager)."""
    try:
        import lleaves
    except ImportError as exc:
        return None, f"lleaves not installed ({exc}); pip install lleaves 'llvmlite<0.45'"
    nodes = int(native.booster_.trees_to_dataframe().shape[0])
    if nodes > LLEAVES_MAX_NODES:
        return None, (f"{nodes} nodes: compiling takes minutes past {LLEAVES_MAX_NODES} "
                      f"(bench/zoo.py LLEAVES_MAX_NODES)")
    path = os.path.join(workdir, f"lleaves-{id(native)}.txt")
    native.booster_.save_model(path)
    m = lleaves.Model(model_file=path)
    m.compile()

    def fn(x):
        return m.predict(x[None, :], n_jobs=1)
    return fn, version("lleaves")


def zoo(quick: bool):
    """(name, kind, size text, builder) for each model; builder(path) -> native model or None."""
    from sklearn.ensemble import (GradientBoostingRegressor, HistGradientBoostingRegressor,
                                  RandomForestRegressor)
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.neural_network import MLPRegressor
    n_rows = 4000 if quick else 20000
    X, y = _data(n_rows, N_FEAT)
    scale = 0.2 if quick else 1.0

    def sk(est, target):
        def build(path):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                est.fit(X, target)
            _skl(est, X, path)
            return est
        return build

    def lgb(n_trees, depth, leaves=None, n_feat=N_FEAT):
        """LightGBM; depth -1 with `leaves`: its default leaf-wise growth, no depth limit"""
        def build(path):
            import lightgbm
            est = lightgbm.LGBMRegressor(n_estimators=n_trees, max_depth=depth,
                                         num_leaves=leaves or 2 ** depth - 1, min_child_samples=5,
                                         learning_rate=0.05, verbose=-1, n_jobs=1)
            est.fit(X[:, :n_feat], y)
            _onnxmltools(est, "lightgbm", path, n_feat)
            return est
        return build

    def xgb(n_trees, depth, lossguide=False):
        def build(path):
            import xgboost
            kw = {"grow_policy": "lossguide", "max_leaves": 64, "max_depth": 0} if lossguide \
                else {"max_depth": depth}
            est = xgboost.XGBRegressor(n_estimators=n_trees, learning_rate=0.05,
                                       n_jobs=1, tree_method="hist", **kw)
            est.fit(X, y)
            _onnxmltools(est, "xgboost", path)
            return est
        return build

    def cb(n_trees, depth):
        """CatBoost's oblivious trees, exported by CatBoost itself"""
        def build(path):
            import catboost
            # allow_writing_files: its training logs went to catboost_info/ in the caller's
            # working directory
            est = catboost.CatBoostRegressor(iterations=n_trees, depth=depth, learning_rate=0.1,
                                             verbose=0, thread_count=1, random_seed=0,
                                             allow_writing_files=False)
            est.fit(X, y)
            est.save_model(path, format="onnx")
            return est
        return build

    t = lambda n: max(10, int(n * scale))  # noqa: E731
    models = [
        ("ridge", "linear", f"{N_FEAT} -> 1", sk(Ridge(alpha=1.0), y), None),
        ("logistic-3", "linear classifier", f"{N_FEAT} -> 3 classes",
         sk(LogisticRegression(max_iter=300), _classes(y, 3)), None),
        ("mlp-skl", "MLP (skl2onnx)", f"{N_FEAT}x64x32x1",
         sk(MLPRegressor(hidden_layer_sizes=(64, 32), max_iter=30, random_state=0), y), None),
        ("lightgbm-100x6", "LightGBM", f"{t(100)} trees, depth 6", lgb(t(100), 6), "lightgbm"),
        ("lightgbm-500x8", "LightGBM", f"{t(500)} trees, depth 8", lgb(t(500), 8), "lightgbm"),
        ("lightgbm-96x64leaf", "LightGBM leaf-wise (El Popo GBT_A shape)",
         f"{t(96)} trees x 64 leaves, 64 features", lgb(t(96), -1, 64, 64), "lightgbm", 64),
        ("lightgbm-1000x256leaf", "LightGBM leaf-wise (El Popo GBT_B shape)",
         f"{t(1000)} trees x 256 leaves, 128 features", lgb(t(1000), -1, 256), "lightgbm"),
        ("xgboost-100x6", "XGBoost", f"{t(100)} trees, depth 6", xgb(t(100), 6), "xgboost"),
        ("xgboost-100-lossguide", "XGBoost lossguide", f"{t(100)} trees x 64 leaves",
         xgb(t(100), 0, lossguide=True), "xgboost"),
        ("catboost-100x6", "CatBoost (oblivious trees)", f"{t(100)} trees, depth 6",
         cb(t(100), 6), None),
        ("gbr-100x4", "sklearn GradientBoosting", f"{t(100)} trees, depth 4",
         sk(GradientBoostingRegressor(n_estimators=t(100), max_depth=4, random_state=0), y), None),
        ("rf-50x10", "sklearn RandomForest", f"{t(50)} trees, depth 10",
         sk(RandomForestRegressor(n_estimators=t(50), max_depth=10, random_state=0, n_jobs=1), y),
         "sklearn"),
        ("hgb-100x6", "sklearn HistGradientBoosting", f"{t(100)} iters, depth 6",
         sk(HistGradientBoostingRegressor(max_iter=t(100), max_depth=6, random_state=0), y), None),
    ]
    return models, X


def _native_model(native):
    """The tree model a native loader makes of the library's own model (Model.from_lightgbm,
    from_xgboost, from_catboost, from_sklearn), or None for a model no native loader takes."""
    mod = type(native).__module__.split(".")[0]
    if mod == "lightgbm":
        return Model.from_lightgbm(native)
    if mod == "xgboost":
        return Model.from_xgboost(native)
    if mod == "catboost":
        return Model.from_catboost(native)
    if mod == "sklearn" and any(hasattr(native, a) for a in ("tree_", "estimators_",
                                                              "_predictors")):
        return Model.from_sklearn(native)
    return None


def _parity_row(model, native, eng, X) -> dict:
    """max relative error against the library's own predict (fastpath.model.parity), per
    kind of row: random, on and beside every split threshold, missing, zero, and the timed
    rows ("given"), each scored through the engine's predict."""
    rep = parity(model, native, X=X, predict=lambda R: np.stack([eng.predict(r) for r in R]))
    return {k: v["max_rel"] for k, v in rep.kinds.items() if "max_rel" in v}


def _native_rows(row, model, eng, native, Xm, n_calls, overhead, n_check) -> None:
    """For a tree model the library's own model can be loaded from: the natively loaded
    engine timed as the ONNX import was (model / eng: the ONNX import and its engine, None
    where fastpath refused it), and both engines' answers against the library's
    predict (the ONNX export rounds thresholds to float32, so rows on a threshold can go the
    other way; the native loaders keep every decision)."""
    try:
        nm = _native_model(native)
        if nm is None:
            return
        en = Engine(nm, config={"engine": {"n_symbols": 1}})
    except Exception as exc:  # noqa: BLE001 - the zoo says what fastpath refused, and goes on
        row["fastpath_native_error"] = f"{type(exc).__name__}: {exc}"
        return
    res = np.empty(en.n_outputs, np.float32)
    row["fastpath_native"] = _row_stats(Dist(time_fn(en.predict, Xm, n_calls, overhead, res)))
    row["parity_native_vs_library"] = _parity_row(nm, native, en, Xm[:n_check])
    if eng is not None and model.trees is not None:
        row["parity_onnx_vs_library"] = _parity_row(model, native, eng, Xm[:n_check])


def timer_overhead(n: int) -> int:
    pc = time.perf_counter_ns
    out = np.empty(n, np.int64)
    for i in range(n):
        t0 = pc()
        out[i] = pc() - t0
    return int(np.median(out))


def _peer_row(make, row, X, n: int, overhead: int) -> dict:
    """A compiled peer's entry of a zoo row: make() -> (predict one row, version), timed as
    fastpath was and set against it, or why it was skipped (a peer's failure is its note)."""
    try:
        fn, ver = make()
    except Exception as exc:  # noqa: BLE001
        fn, ver = None, f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"
    if fn is None:
        return {"skipped": ver}
    d = Dist(time_fn(fn, X, n, overhead))
    return _row_stats(d) | {"version": ver} | _ratios(d, row)


def time_fn(fn, X, n: int, overhead: int, res=None) -> np.ndarray:
    """ns of each of n calls fn(row) (fn(row, res) with res: Engine.predict's out, the
    outputs written into one array instead of a new one a call), each on the next row of X
    copied into one reused buffer, minus the timer's own cost"""
    pc = time.perf_counter_ns
    buf = np.empty(X.shape[1], np.float32)
    out = np.empty(n, np.int64)
    m = len(X)
    for i in range(min(n, 200)):        # warm-up: code, branch predictors, the model in cache
        buf[:] = X[i % m]
        fn(buf) if res is None else fn(buf, res)
    # two loops, so neither call carries the other's branch or argument
    if res is None:
        for i in range(n):
            buf[:] = X[i % m]
            t0 = pc()
            fn(buf)
            out[i] = pc() - t0
    else:
        for i in range(n):
            buf[:] = X[i % m]
            t0 = pc()
            fn(buf, res)
            out[i] = pc() - t0
    return np.maximum(out - overhead, 0)


def _ort(path):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3      # errors only: CatBoost's export warns on every run call
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    outs = [o.name for o in sess.get_outputs()]
    # classifiers: the probabilities output (what Engine.predict returns), not the label
    pick = next((o for o in outs if "prob" in o), outs[-1] if len(outs) > 1 else outs[0])
    run = sess.run

    def fn(x):
        return run([pick], {name: x[None, :]})[0]
    return fn, ort.__version__


def _row_stats(d: Dist) -> dict:
    return {"p50": d.q[50.0], "p99": d.q[99.0], "n": d.n}


def _ratios(peer: Dist, row) -> dict:
    """The peer against fastpath percentile for percentile (p50 / p50 and p99 / p99, as the
    docstring says); none where fastpath refused the model."""
    fp = row.get("fastpath")
    if not fp:
        return {}
    return {"ratio_p50": peer.q[50.0] / max(fp["p50"], 1),
            "ratio_p99": peer.q[99.0] / max(fp["p99"], 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="fastpath model zoo bench",
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--quick", action="store_true", help="smaller models, fewer calls (< 1 min)")
    ap.add_argument("--only", help="comma-separated names or kinds to run (substring match)")
    ap.add_argument("--calls", type=int, help="timed calls per row (default 20000, 3000 with --quick)")
    ap.add_argument("--cpu", type=int, help="pin this process to one CPU")
    ap.add_argument("--out", help="the JSON (default: bench/results/zoo-latest.json, the README "
                                  "table's source, for a full run; zoo-partial.json for a run "
                                  "with --quick, --only or --calls, so that table is not replaced)")
    args = ap.parse_args(argv)
    if args.calls is not None and args.calls < 1:
        # "--calls 0" ran the default 20000 ("or"), a negative count failed deep in the timing
        ap.error(f"--calls must be >= 1, got {args.calls}")
    if args.cpu is not None:
        try:
            os.sched_setaffinity(0, {args.cpu})
        except (OSError, ValueError, OverflowError) as exc:
            ap.error(f"--cpu {args.cpu}: cannot run on it ({exc}); this process may use "
                     f"{sorted(os.sched_getaffinity(0))}")
    if args.out is None:
        # a quick or partial run wrote zoo-latest.json, replacing the full table the README
        # quotes ("20,000 calls a row") with a few rows of 3000 calls
        partial = args.quick or args.only or args.calls is not None
        args.out = os.path.join(results_dir(HERE),
                                "zoo-partial.json" if partial else "zoo-latest.json")
    n_calls = args.calls if args.calls is not None else (3000 if args.quick else 20000)
    models, X = zoo(args.quick)
    if args.only:
        keys = [k.strip().lower() for k in args.only.split(",") if k.strip()]
        names = [m[0] for m in models]
        models = [m for m in models if any(k in m[0] or k in m[1].lower() for k in keys)]
        if not models:
            # refused before the run, so an empty table never replaces the results
            ap.error(f"--only {args.only!r} matches no model or kind; models: {', '.join(names)}")
    Xt = np.ascontiguousarray(X[:2048])
    # a few rows exactly on the model's inputs' grid edges are not needed for timing; the
    # agreement check below uses the same rows that are timed
    overhead = timer_overhead(20000)
    # the exported models and tl2cgen's libraries, removed after the run: nothing is left in /tmp
    work = tempfile.mkdtemp(prefix="fastpath-zoo-")
    try:
        rows = []
        print(f"fastpath {fastpath.__version__}, kernel set {fastpath.simd()}, {n_calls} calls per row, "
              f"timer overhead {overhead} ns subtracted")
        for name, kind, size, build, tl_kind, *nf in models:
            # a model over fewer features reads the first n of each row
            Xm = np.ascontiguousarray(Xt[:, :nf[0]]) if nf else Xt
            path = os.path.join(work, f"{name}.onnx")
            t0 = time.time()
            try:
                native = build(path)
            except Exception as exc:  # noqa: BLE001 - an exporter bug is not fastpath's to hide
                msg = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                rows.append({"name": name, "kind": kind, "size": size, "export_error": msg})
                print(f"{name:16s} the exporter failed, row skipped: {msg}")
                continue
            train_s = time.time() - t0
            row = {"name": name, "kind": kind, "size": size, "train_export_s": round(train_s, 1)}
            ort_fn, ort_ver = _ort(path)
            try:
                model = Model.from_onnx(path)
                eng = Engine(model, config={"engine": {"n_symbols": 1}})
            except Exception as exc:  # noqa: BLE001 - the zoo says what fastpath refused, and goes on
                row["fastpath_error"] = f"{type(exc).__name__}: {exc}"
                model = eng = None
            if eng is not None:
                # every input the timed calls will see (they cycle over the first n_calls rows), not
                # the first 256 of them: the docstring's "on the timed inputs" is the claim
                n_check = min(n_calls, len(Xm))
                # through predict(x, out), the call timed below
                res = np.empty(eng.n_outputs, np.float32)
                got = np.stack([eng.predict(Xm[i], res).copy() for i in range(n_check)])
                ref = np.stack([np.asarray(ort_fn(Xm[i]), np.float32).reshape(-1)
                                for i in range(n_check)])
                rel = np.abs(got - ref) / np.maximum(np.abs(ref), 1e-3)
                row["max_rel_diff_vs_onnxruntime"] = float(rel.max())
                row["agreement_inputs"] = n_check
                # predict(x, out), the call a latency-minded caller makes, and predict(x),
                # which returns a new array each call
                fp = Dist(time_fn(eng.predict, Xm, n_calls, overhead, res))
                row["fastpath"] = _row_stats(fp)
                row["fastpath_new_array"] = _row_stats(Dist(time_fn(eng.predict, Xm, n_calls,
                                                                    overhead)))
                if model.trees is not None:
                    # the walk timed fastest at load, and the compact walk (one tree at a time,
                    # what deep trees ran before the lane walk) through the packed kernels
                    pk = PackedTrees(model.trees, fastpath.simd())
                    row["walk"] = pk.walk
                    row["packed_chosen_walk"] = _row_stats(Dist(time_fn(pk.eval, Xm, n_calls, overhead)))
                    row["perfect_walk"] = pk.perfect_walk
                    # what the load measured for each candidate walk: median ns per row
                    row["walk_choice_ns"] = {f"{w}/{p}": ns for (w, p), ns in pk.choice.items()}
                    # the chosen walk alone, timed in C on each row once (no Python call)
                    reps = -(-n_calls // len(Xm))
                    row["c_walk_fresh_rows"] = _row_stats(Dist(np.concatenate(
                        [pk.time_rows(Xm) for _ in range(reps)])[:n_calls]))
                    pk.walk = "compact"
                    cw = Dist(time_fn(pk.eval, Xm, n_calls, overhead))
                    row["packed_compact_walk"] = _row_stats(cw)
                if name in TARGETS and not args.quick:
                    row["target_p50_ns"] = TARGETS[name]
                    row["target_met"] = fp.q[50.0] <= TARGETS[name]
            if native is not None:
                _native_rows(row, model, eng, native, Xm, n_calls, overhead,
                             min(n_calls, len(Xm)))
            orr = Dist(time_fn(ort_fn, Xm, n_calls, overhead))
            row["onnxruntime"] = _row_stats(orr) | {"version": ort_ver} | _ratios(orr, row)
            if native is not None and hasattr(native, "predict"):
                # the library's own predict, one row (the answer the model was trained to give)
                nat = Dist(time_fn(lambda x: native.predict(x[None, :]), Xm, n_calls, overhead))
                row["native"] = _row_stats(nat) | _ratios(nat, row)
            if tl_kind == "lightgbm":
                row["lleaves"] = _peer_row(lambda: _lleaves(native, work), row, Xm, n_calls,
                                           overhead)
            if tl_kind:
                row["tl2cgen"] = _peer_row(lambda: _tl2cgen(native, tl_kind, work), row, Xm,
                                           n_calls, overhead)
            rows.append(row)
            print(_line(row), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    res = {"bench": "zoo", "quick": args.quick, "calls": n_calls, "timer_overhead_ns": overhead,
           "simd": fastpath.simd(), "fastpath": fastpath.__version__, "commit": commit_stamp(HERE),
           "date": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": rows}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print()
    print(render_table(res))
    print(f"\nwritten {args.out}")
    return 0


def _line(row) -> str:
    o = row["onnxruntime"]
    fp = row.get("fastpath")
    s = f"{row['name']:16s} "
    s += (f"fastpath {fp['p50']:>8.0f} / {fp['p99']:>8.0f} ns "
          f"(new array each call {row['fastpath_new_array']['p50']:>8.0f} / "
          f"{row['fastpath_new_array']['p99']:>8.0f})   " if fp else
          f"fastpath refused it ({row['fastpath_error'][:80]})   ")
    s += f"onnxruntime {o['p50']:>8.0f} / {o['p99']:>8.0f} ns"
    s += f" ({o['ratio_p50']:.1f}x / {o['ratio_p99']:.1f}x)" if "ratio_p50" in o else ""
    if "walk" in row:
        cw, ch = row["packed_compact_walk"], row["packed_chosen_walk"]
        s += (f"   [PackedTrees.eval: {row['walk']} {ch['p50']:>8.0f} / {ch['p99']:>8.0f} ns, "
              f"compact {cw['p50']:>8.0f} / {cw['p99']:>8.0f} ns]")
    cr = row.get("c_walk_fresh_rows")
    if cr:
        s += f"   [C walk alone: {cr['p50']:>8.0f} / {cr['p99']:>8.0f} ns]"
    ll = row.get("lleaves")
    if ll and "p50" in ll:
        s += f"   lleaves {ll['p50']:>8.0f} / {ll['p99']:>8.0f} ns"
    elif ll:
        s += f"   lleaves skipped: {ll['skipped']}"
    nat = row.get("native")
    if nat:
        s += f"   native {nat['p50']:>8.0f} / {nat['p99']:>8.0f} ns"
    fn = row.get("fastpath_native")
    if fn:
        s += (f"   fastpath native loader {fn['p50']:>8.0f} / {fn['p99']:>8.0f} ns, max rel vs "
              f"the library {_worst(row['parity_native_vs_library']):.1e}")
        if "parity_onnx_vs_library" in row:
            s += f" (the ONNX import {_worst(row['parity_onnx_vs_library']):.1e})"
    elif "fastpath_native_error" in row:
        s += f"   native loader refused it ({row['fastpath_native_error'][:80]})"
    tl = row.get("tl2cgen")
    if tl and "p50" in tl:
        s += f"   tl2cgen {tl['p50']:>8.0f} / {tl['p99']:>8.0f} ns"
        s += f" ({tl['ratio_p50']:.1f}x / {tl['ratio_p99']:.1f}x)" if "ratio_p50" in tl else ""
    elif tl:
        s += f"   tl2cgen skipped: {tl['skipped']}"
    if fp:
        s += f"   max rel diff {row['max_rel_diff_vs_onnxruntime']:.1e}"
    return s


def _worst(kinds: dict) -> float:
    return max(kinds.values(), default=0.0)


def _us(ns: float) -> str:
    return f"{ns / 1000:.2f} us" if ns >= 1000 else f"{ns:.0f} ns"


def _pair(d) -> str:
    """"p50 / p99" of a timed entry, "skipped" / "n/a" where there is none"""
    if d and "p50" in d:
        return f"{_us(d['p50'])} / {_us(d['p99'])}"
    return "skipped" if d else "n/a"


def render_table(res) -> str:
    """The model-zoo table (markdown) from a zoo JSON: fastpath through the ONNX import and
    through the library's native loader, the peers, and how far each answer is from
    onnxruntime's and from the library's own predict (the worst kind of row)."""
    out = ["| model | kind | size | fastpath p50 / p99 | native loader p50 / p99 | "
           "onnxruntime 1 thread p50 / p99 | library's predict p50 / p99 | tl2cgen p50 / p99 | "
           "lleaves p50 / p99 | vs onnxruntime (p50 / p99) | max rel diff | "
           "max rel vs the library (ONNX / native) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        if "export_error" in r:
            out.append(f"| {r['name']} | {r['kind']} | {r['size']} | exporter failed: "
                       f"{r['export_error'][:60]} | | | | | | | | |")
            continue
        fp, o = r.get("fastpath"), r["onnxruntime"]
        fps = _pair(fp) if fp else "refused"
        nat = _pair(r.get("fastpath_native")) if "fastpath_native_error" not in r else "refused"
        # results without ratio_p99 have the p50 ratio only
        ratio = (f"{o['p50'] / max(fp['p50'], 1):.1f}x"
                 + (f" / {o['ratio_p99']:.1f}x" if "ratio_p99" in o else "")) if fp else ""
        diff = f"{r['max_rel_diff_vs_onnxruntime']:.1e}" if fp else ""
        lib = ""
        if "parity_native_vs_library" in r:
            onnx = r.get("parity_onnx_vs_library")
            lib = (f"{_worst(onnx):.1e} / " if onnx else "- / ") + \
                f"{_worst(r['parity_native_vs_library']):.1e}"
        out.append(f"| {r['name']} | {r['kind']} | {r['size']} | {fps} | {nat} | {_pair(o)} | "
                   f"{_pair(r.get('native'))} | {_pair(r.get('tl2cgen'))} | "
                   f"{_pair(r.get('lleaves'))} | {ratio} | {diff} | {lib} |")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
