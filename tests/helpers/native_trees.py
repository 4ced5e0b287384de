"""Small boosters trained by the real libraries, and the check every native loader is held to:
the engine (on a given kernel set) and the numpy reference answer as the library's own
predict on parity()'s random, on-threshold, missing-value and zero rows."""
import numpy as np

from fastpath import Engine
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
