"""Small boosters trained by the real libraries, and the check every native loader is held to:
the engine (on a given kernel set) and the numpy reference answer as the library's own
predict on parity()'s random, on-threshold, missing-value and zero rows; hand-built chain
ensembles of any depth for the walks' tests."""
import dataclasses

import numpy as np

from fastpath import Engine, TreeEnsemble
from fastpath.model import parity
from helpers.builders import engine_cfg

F = np.float32
BOUND = 1e-6


def mixed_data(rng, n=1500, n_features=6, nan=0.1, zero=0.1):
    """Normal features with NaNs and exact zeros sprinkled in; the last feature holds small
    integer categories."""
    X = rng.normal(size=(n, n_features)).astype(F)
    X[rng.random(X.shape) < zero] = 0.0
    X[:, -1] = rng.integers(0, 12, n)
    Xn = X.copy()
    Xn[:, :-1][rng.random((n, n_features - 1)) < nan] = np.nan
    z = np.nan_to_num(Xn)
    score = z[:, 0] + np.sin(z[:, 1]) + (X[:, -1] % 3 == 0) - 0.5 * (z[:, 2] == 0)
    return Xn, score


def labels(score, k):
    """k classes from a score: its quantiles."""
    return np.searchsorted(np.quantile(score, np.linspace(0, 1, k + 1)[1:-1]), score)


def assert_parity(model, native, isa, X=None):
    """Engine.predict on isa and the model's forward match native within BOUND on every kind
    of row parity() makes."""
    eng = Engine(model, config=engine_cfg(isa))
    rep = parity(model, native, X=X, predict=lambda R: np.stack([eng.predict(r) for r in R]))
    ref = parity(model, native, X=X)
    for r in (rep, ref):
        assert r.kinds["threshold"]["rows"] > 0
        for kind, k in r.kinds.items():
            assert k["max_rel"] <= BOUND, (kind, str(r))
    return rep


def threshold_rows(trees, seed=0):
    """Random rows, rows with one feature on, just below and just above a split threshold,
    rows with every feature on one of its thresholds, and rows holding NaN (float32, no Inf)."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((60, trees.n_features)).astype(F) * 1.5
    splits = trees.split_thresholds()
    rng.shuffle(splits)
    rows = [base]
    for i, (f, t) in enumerate(splits[:150]):
        for v in (F(t), np.nextafter(F(t), F(-np.inf)), np.nextafter(F(t), F(np.inf))):
            r = base[i % len(base)].copy()
            r[f] = v
            rows.append(r[None])
    by_f = {}
    for f, t in splits:
        by_f.setdefault(f, []).append(t)
    for i in range(20):
        r = base[i].copy()
        for f, ts in by_f.items():
            r[f] = ts[rng.integers(len(ts))]
        rows.append(r[None])
    nan = base[:20].copy()
    nan[np.arange(20), rng.integers(0, trees.n_features, 20)] = np.nan
    rows.append(nan)
    out = np.vstack(rows).astype(F)
    return out[~np.any(np.isinf(out), axis=1)]


# every walk PackedTrees can be pinned to (PackedTrees.walk), for tests that hold them equal
WALKS = ["compact", "lanes-rest", "gather-rest", "lanes-all", "gather-all"]


def regression_data(n, n_feat, seed):
    """(X, y): n standard-normal rows of n_feat >= 9 features and a smooth target with
    interactions and noise, to train trees deep enough to need every walk."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, n_feat)).astype(F)
    y = np.sin(2 * X[:, 0]) + 0.5 * X[:, 1] * X[:, 2] + 0.3 * X[:, 3:9].sum(1) \
        + 0.1 * rng.standard_normal(n)
    return X, y


def chain_tree(depth, values, feature=0):
    """A right-leaning chain tree of `depth` splits on `feature` at thresholds 0, 1, ...: the
    leaf left of split k carries values[k], the last right leaf values[depth]."""
    n = 2 * depth + 1
    mode = np.full(n, 6)
    feat = np.zeros(n, int)
    thr = np.zeros(n)
    tc = np.zeros(n, int)
    fc = np.zeros(n, int)
    leaves = []
    for k in range(depth):
        node = 2 * k
        mode[node] = 0
        feat[node] = feature
        thr[node] = k
        tc[node] = node + 1
        fc[node] = node + 2
        leaves.append(node + 1)
    leaves.append(n - 1)
    return mode, feat, thr, tc, fc, leaves, values


def chain_ensemble(specs, n_features=2):
    """One tree per (depth, values) chain, one target."""
    parts = [chain_tree(d, v) for d, v in specs]
    sizes = [len(p[0]) for p in parts]
    off = np.concatenate([[0], np.cumsum(sizes)])
    cat = [np.concatenate([p[i] for p in parts]) for i in range(5)]
    wn = np.concatenate([np.asarray(p[5]) + o for p, o in zip(parts, off[:-1])])
    wv = np.concatenate([p[6] for p in parts])
    return TreeEnsemble(n_features=n_features, n_targets=1, tree_offsets=off, mode=cat[0],
                        feature=cat[1], threshold=cat[2], true_child=cat[3], false_child=cat[4],
                        nan_true=np.zeros(off[-1], int), weight_node=wn,
                        weight_target=np.zeros(wn.size, int), weight_value=wv)


def with_eq_root(te, tree=-1):
    """te with tree `tree`'s root an EQ split (mode 4), which no lane layout takes"""
    mode = te.mode.copy()
    mode[te.tree_offsets[tree - 1 if tree < 0 else tree]] = 4
    return dataclasses.replace(te, mode=mode)
