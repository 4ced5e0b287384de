"""parity(model, native): how far a tree model loaded natively answers from the library that
trained it, on the rows where trees disagree first.

Design: the rows are made from the model's own splits: random rows over the thresholds'
range, a row on every split threshold and on both float32 neighbours of it, and rows with
missing values (NaN), rows with zeros and values inside LightGBM's zero band. The native answer is the
library's own predict (lightgbm / xgboost / catboost / sklearn, imported only here, as optional
dependencies) in the form the model outputs (probabilities for classifiers, values for
regressors). Errors are reported per kind of row: max absolute, and relative to
max(|native|, 1) (float32 leaf sums round at ~1e-7 of the output's scale).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from fastpath.errors import ModelError
from fastpath.model.native_lightgbm import booster_of
from fastpath.model.trees import LEAF

F32 = np.float32
MAX_THRESHOLD_ROWS = 30000


@dataclass(frozen=True)
class ParityReport:
    """Per kind of row ("random", "threshold", "missing", "zero", and "given" for X): rows,
    max_abs, max_rel (and "skipped", the reason, where the native model refused the rows);
    "raw": all those rows again, the leaf sums plus base values against the library's raw
    score (margin), for models with a logistic / softmax transform."""
    kinds: dict = field(default_factory=dict)

    @property
    def max_abs(self) -> float:
        return max((k["max_abs"] for k in self.kinds.values()), default=0.0)

    @property
    def max_rel(self) -> float:
        return max((k["max_rel"] for k in self.kinds.values()), default=0.0)

    def ok(self, tol: float = 1e-6) -> bool:
        return self.max_rel <= tol

    def __str__(self) -> str:
        lines = [f"{'rows':>10} {'n':>7} {'max abs':>10} {'max rel':>10}"]
        for kind, k in self.kinds.items():
            lines.append(f"{kind:>10} {k['rows']:>7} {k['max_abs']:10.3g} {k['max_rel']:10.3g}")
        return "\n".join(lines)


def parity_rows(trees, n_random: int = 512, seed: int = 0) -> dict:
    """{kind: float32 rows} for a TreeEnsemble: random, on and beside every threshold,
    missing / zero values."""
    rng = np.random.default_rng(seed)
    nf = trees.n_features
    split = trees.mode != LEAF
    feat = trees.feature[split]
    thr = trees.threshold[split]
    fin = np.isfinite(thr)
    feat, thr = feat[fin], thr[fin]
    lo = np.full(nf, -1.0)
    hi = np.full(nf, 1.0)
    if thr.size:
        np.minimum.at(lo, feat, thr.astype(np.float64) - 1.0)
        np.maximum.at(hi, feat, thr.astype(np.float64) + 1.0)
    rand = lambda n: (lo + (hi - lo) * rng.random((n, nf))).astype(F32)  # noqa: E731
    pairs = np.unique(np.stack([feat.astype(np.float64), thr.astype(np.float64)], 1), axis=0) \
        if thr.size else np.zeros((0, 2))
    if pairs.shape[0] * 3 > MAX_THRESHOLD_ROWS:
        pairs = pairs[rng.choice(pairs.shape[0], MAX_THRESHOLD_ROWS // 3, replace=False)]
    on = rand(3 * pairs.shape[0])
    for j, (f, t) in enumerate(pairs):
        t = F32(t)
        with np.errstate(over="ignore"):       # a border at -FLT_MAX has -inf below it
            on[3 * j:3 * j + 3, int(f)] = [t, np.nextafter(t, F32(-np.inf)),
                                            np.nextafter(t, F32(np.inf))]
    k = max(n_random // 2, 8)
    miss = rand(k)
    miss[rng.random(miss.shape) < 0.3] = np.nan
    zero = rand(k)
    m = rng.random(zero.shape) < 0.3
    zero[m] = rng.choice(np.array([0.0, -0.0, 1e-36, -1e-36, 1e-35, -1e-35], F32),
                         size=int(m.sum()))
    return {"random": rand(n_random), "threshold": on, "missing": miss, "zero": zero}


def native_predict(native) -> Callable:
    """rows -> the library's own answer, shaped as the model's outputs ((n, outputs))."""
    mod = type(native).__module__.split(".")[0]
    if mod == "lightgbm":
        native = booster_of(native)
        binary = native.dump_model(num_iteration=0)["objective"].startswith("binary")

        def f(X):
            p = np.asarray(native.predict(X), np.float64)
            return np.stack([1 - p, p], 1) if p.ndim == 1 and binary else p.reshape(len(X), -1)
        return f
    if mod == "xgboost":
        import xgboost
        b = native.get_booster() if hasattr(native, "get_booster") else native

        obj = b.save_config()

        def f(X):
            dm = xgboost.DMatrix(X, missing=np.nan)
            if '"multi:softmax"' in obj:
                # its predict gives the class; the model gives the probabilities behind it
                m = np.asarray(b.predict(dm, output_margin=True), np.float64)
                e = np.exp(m - m.max(1, keepdims=True))
                return e / e.sum(1, keepdims=True)
            p = np.asarray(b.predict(dm), np.float64)
            if p.ndim == 1 and ('"binary:logistic"' in obj or '"reg:logistic"' in obj):
                return np.stack([1 - p, p], 1)
            return p.reshape(len(X), -1)
        return f
    if mod == "catboost":
        clf = native.get_all_params().get("loss_function") in ("Logloss", "CrossEntropy",
                                                                "MultiClass")
        return lambda X: np.asarray(native.predict(X, prediction_type="Probability") if clf
                                    else native.predict(X), np.float64).reshape(len(X), -1)
    if mod == "sklearn":
        def f(X):
            if hasattr(native, "predict_proba"):
                return np.asarray(native.predict_proba(X), np.float64)
            return np.asarray(native.predict(X), np.float64).reshape(len(X), -1)
        return f
    raise ModelError(f"parity: no native predict for a {type(native).__module__}."
                     f"{type(native).__name__}; expected a lightgbm, xgboost, catboost or "
                     f"scikit-learn model")


def native_raw(native) -> Callable | None:
    """rows -> the library's raw score (margin) as the model's leaf sums hold it, (n, k);
    None where the library has none (forests)."""
    mod = type(native).__module__.split(".")[0]
    if mod == "lightgbm":
        native = booster_of(native)
        words = native.dump_model(num_iteration=0)["objective"].split()
        s = float(dict(w.split(":", 1) for w in words[1:] if ":" in w).get("sigmoid", 1.0)) \
            if words and words[0] in ("binary", "multiclassova", "ova", "ovr") else 1.0
        return lambda X: np.asarray(native.predict(X, raw_score=True),
                                    np.float64).reshape(len(X), -1) * s
    if mod == "xgboost":
        import xgboost
        b = native.get_booster() if hasattr(native, "get_booster") else native
        return lambda X: np.asarray(b.predict(xgboost.DMatrix(X, missing=np.nan),
                                              output_margin=True), np.float64).reshape(len(X), -1)
    if mod == "catboost":
        return lambda X: np.asarray(native.predict(X, prediction_type="RawFormulaVal"),
                                    np.float64).reshape(len(X), -1)
    if mod == "sklearn" and hasattr(native, "decision_function"):
        # the exponential loss's probability is expit(2 * raw): the model holds 2 * raw
        s = 2.0 if getattr(native, "loss", None) == "exponential" else 1.0
        return lambda X: np.asarray(native.decision_function(X),
                                    np.float64).reshape(len(X), -1) * s
    return None


def _raw_kind(trees, native, rows: dict, skip: set):
    """The "raw" kind: the leaf sums plus base (the model with no post transform) against the
    library's raw score, on every row set the library took; None where there is none."""
    theirs = native_raw(native)
    if theirs is None or trees.post_transform == "NONE":
        return None
    bare = replace(trees, post_transform="NONE")
    R = np.concatenate([r for k, r in rows.items() if k not in skip and r.shape[0]])
    got = np.asarray(bare.forward(R), np.float64).reshape(R.shape[0], -1)
    if trees.classifier and trees.n_targets == 2:
        got = got[:, 1:]
    return _score(got, theirs(R), False)


def _score(got: np.ndarray, want: np.ndarray, classifier2: bool) -> dict:
    if classifier2:
        # a two-class model's score is its positive class; the other column is 1 - p
        got, want = got[:, 1:], want[:, 1:]
    if got.shape != want.shape:
        raise ModelError(f"parity: the model answers {got.shape[1:]} values a row, the native "
                         f"model {want.shape[1:]}")
    err = np.abs(got.astype(np.float64) - want)
    err = np.where(np.isnan(got) & np.isnan(want), 0.0, err)
    return {"rows": int(got.shape[0]), "max_abs": float(np.max(err, initial=0.0)),
            "max_rel": float(np.max(err / np.maximum(np.abs(want), 1.0), initial=0.0))}


def parity(model, native, X=None, predict: Callable | None = None,
           n_random: int = 512) -> ParityReport:
    """Compare model (a tree Model or TreeEnsemble) with the library's native model on the
    rows of parity_rows (and on X when given, as "given"); predict: rows -> outputs, the
    model's forward by default (pass an Engine's predict to score the engine)."""
    trees = getattr(model, "trees", model)
    if trees is None or not hasattr(trees, "forward"):
        raise ModelError("parity needs a tree model (Model with trees, or a TreeEnsemble)")
    rows = parity_rows(trees, n_random)
    if X is not None:
        rows["given"] = np.ascontiguousarray(X, F32).reshape(-1, trees.n_features)
    ours = predict or trees.forward
    theirs = native_predict(native)
    two = bool(trees.classifier) and trees.n_targets == 2
    kinds = {}
    for kind, R in rows.items():
        if not R.shape[0]:
            continue
        got = np.asarray(ours(R), np.float64).reshape(R.shape[0], -1)
        try:
            want = theirs(R)
        except ValueError as exc:
            if kind != "missing":
                raise
            # an estimator fitted without missing-value support refuses NaN rows itself
            kinds[kind] = {"rows": 0, "max_abs": 0.0, "max_rel": 0.0,
                           "skipped": str(exc).splitlines()[0]}
            continue
        kinds[kind] = _score(got, want, two)
    raw = _raw_kind(trees, native, rows, {k for k, v in kinds.items() if "skipped" in v})
    if raw is not None:
        kinds["raw"] = raw
    return ParityReport(kinds)
