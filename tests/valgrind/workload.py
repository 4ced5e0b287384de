"""Valgrind memcheck workload: both kernel sets through step, step_batch, a rejected tick,
stats and reset, on the generated stream; a tree ensemble (perfect groups, trees too deep or
with EQ splits for them, inputs with NaN) through predict, step and step_batch (run by
tests/valgrind/run.sh)."""
import numpy as np, fastpath
from fastpath import lob
bs = lob.generate_stream(2000, 4, seed=1); raws = lob.raw_from_book(bs)
for isa in fastpath._engine.supported_isas():
    e = fastpath.Engine(fastpath._build.DEMO_MODEL, config={"engine": {"simd": isa, "n_symbols": 8}})
    for i in range(1000):
        e.step(raws[i], int(bs.symbols[i]), int(bs.ts_ns[i]))
    e.step_batch(raws[1000:], bs.symbols[1000:], bs.ts_ns[1000:])
    try:
        x = raws[0].copy(); x[5] = np.nan; e.step(x, 0, 2**62)
    except fastpath.InputError:
        pass
    e.stats(); e.latency_records(); e.reset()


def forest(rng, n_feat=4, n_trees=37):
    off, mode, feat, thr, tc, fc, nt, wn, wv = [0], [], [], [], [], [], [], [], []
    for t in range(n_trees):
        base, depth = len(mode), (2, 5, 10, 12)[t % 4]

        def node(level):
            i = len(mode) - base
            mode.append(6); feat.append(0); thr.append(0.0); tc.append(0); fc.append(0); nt.append(0)
            if level >= depth or (level > 1 and rng.random() < 0.3):
                wn.append(base + i); wv.append(float(rng.standard_normal()))
                return i
            mode[-1] = int(rng.integers(6 if t % 5 == 0 else 4))
            feat[base + i] = int(rng.integers(n_feat))
            thr[base + i] = float(np.float32(rng.standard_normal()))
            nt[base + i] = int(rng.integers(2))
            tc[base + i] = node(level + 1)
            fc[base + i] = node(level + 1)
            return i
        node(0)
        off.append(len(mode))
    return fastpath.TreeEnsemble(n_feat, 1, np.array(off), np.array(mode), np.array(feat, np.int32),
                                 np.array(thr), np.array(tc), np.array(fc), np.array(nt, np.uint8),
                                 np.array(wn), np.zeros(len(wn), np.int32), np.array(wv))


rng = np.random.default_rng(3)
trees = fastpath.Model((), trees=forest(rng))
X = rng.standard_normal((300, 4)).astype(np.float32)
X[rng.random(X.shape) < 0.1] = np.nan
for isa in fastpath._engine.supported_isas():
    e = fastpath.Engine(trees, config={"engine": {"simd": isa, "n_symbols": 4}})
    for i, x in enumerate(X):
        e.predict(x)
        if np.isfinite(x).all():
            e.step(x, i % 4, i)
    e.step_batch(np.nan_to_num(X), np.arange(300) % 4, np.arange(300, 600))
    e.stats(); e.reset()
print("ok")
