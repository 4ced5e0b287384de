"""Models whose ticks the engine refuses after committing their rolling windows (a 1e30 weight,
an inv_std of 1e30, a PROBIT pushed past 1), and good ticks for them: the builders of the
window undo and refusal tests. numpy only, so the core tests can use them where onnx is not
installed."""
import numpy as np

from fastpath import TreeEnsemble
from fastpath.model import CachePolicy, FeatureSpec, Layer, Model


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


# the symbols the window refusal tests step (each its own window)
N_SYM = 3


def mlp_model(n_w: int, window: int, cache: bool, seed: int = 0) -> Model:
    """overflow_mlp over n_w window fields (window `window`) and the z fields Z."""
    return overflow_mlp(_spec(n_w, window), cache, seed)


def spoil(x: np.ndarray, how: str, n_w: int) -> np.ndarray:
    """A copy of the good tick x that the engine refuses after committing its window: "out" (the
    first layer overflows), "zfeat" (a z-score overflows) or "wfeat" (a finite field whose
    window feature overflows)."""
    bad = x.copy()
    if how == "out":
        bad[0] = 1e10                 # 1e10 * 1e30 overflows the first layer
    elif how == "zfeat":
        bad[1] = 1e10                 # 1e10 * 1e30 overflows the z-score
    else:                             # "wfeat"
        bad[W0 + (n_w - 1)] = 3e38
    return bad


def engine_cfg(isa: str, memory: bool = False) -> dict:
    """The engine config of these tests on kernel set isa; memory: state in a [memory] region."""
    c = {"engine": {"simd": isa, "n_symbols": N_SYM}}
    if memory:
        c["memory"] = {"huge_pages": "none", "mlock": False}
    return c
