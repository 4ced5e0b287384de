"""Valgrind memcheck workload: both kernel sets through step, step_batch, a rejected tick,
stats and reset, on the generated stream (run by tests/valgrind/run.sh)."""
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
print("ok")
