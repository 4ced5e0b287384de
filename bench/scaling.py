"""How fastpath's latency scales with model size, against its peers, and how far the MLP
kernel is from the hardware bound at each size.

    python bench/scaling.py [--quick] [--calls N] [--weights fp32[,...]] [--models 32x16x2,...]
                            [--sets avx512,...] [--no-peers] [--out DIR]

Models: 32x16x2, 128x64x32x2, 256x256x2, 512x512x256x2, 1024x1024x1024x2 (ReLU hidden layers,
identity output, identity features, cache off), one tick at a time. Per model and weight type:
- fastpath Engine.step p50/p99 from Python for every kernel set this CPU runs (timer overhead
  removed), and for fp32 weights the MLP kernel alone (PackedMLP: the p50 of samples of
  back-to-back passes, see kernel_ns);
- the MLP kernel against two measured bounds: the FMA bound (multiply-adds of the 8-row
  blocked layout / the core's measured FMA rate) and the streaming-read bound (weight bytes /
  the bandwidth of a read probe over a buffer of the weights' size, so it reads from the cache
  level or memory the weights stream from). A GEMV uses each weight once, so whichever bound
  is slower binds: `bound` names it and `x_bound` = kernel ns / that bound (1.0 is at the
  bound). `x_fma` and `x_read` are the kernel against each bound alone. Where the weights fit
  L2 but not L1, L2 cannot feed the FMA rate (16 lanes x 2 FMAs x 4 bytes a cycle is 128 B,
  L2 gives at most 64), so the read bound binds there, not the FMA bound; in L1 the two are
  close (two 64-byte loads a cycle at best). The probe reads one sequential stream; past 512 KB
  each pass also runs with software prefetch 1 KB ahead (as the kernels prefetch their weight
  streams past 512 KB) and the faster one counts, so the kernel is not held to a bound it
  beats. `x_issue` keeps the original target's reading
  (FMA bound where the weights fit L2, read bound beyond) so nothing is hidden;
- the MLP's latency bound (`latency_bound_ns`): the time its critical path needs at the
  measured latency of each op (one dependent chain per op kind, fastpath._kernels.op_latency_ns,
  on the widest vector set). A throughput bound assumes every op can overlap; a small model
  cannot, as each layer waits for the previous one. Why it is a lower bound, for any code: with
  weights that are not special (no two equal, none a power of two), an output of a layer
  with n inputs depends on all n through their products, so every path from an input passes
  one multiply (mul or FMA, at least min(L_mul, L_fma)) and then the n products and the bias
  must meet: an add joins two partial sums, an FMA one partial sum to a product or to another
  sum times a constant, so the number of inputs a value covers at most doubles per op, each
  at least L_join = min(L_add, L_fma), and covering n takes ceil(log2 n) of them (the bias
  is ready from the start and joins for free). A relu is one more op (L_max); tanh and
  sigmoid at least the cheapest op. Every output of a layer needs every input of it, and
  those are the previous layer's outputs, so the layers' terms add up:
      sum over layers of  min(L_mul, L_fma) + ceil(log2 n_in) * L_join + L_act.
  Lane moves (the broadcasts and folds a SIMD kernel needs), loads and the call are left out,
  which only makes the bound lower. `x_max` = kernel ns / max(binding throughput bound,
  latency bound) is the kernel against the tighter of the two; `x_latency` against the
  latency bound alone. Where the build has no op-latency probe, these are reported skipped;
- kernel and read probe are sampled alternately (a warm-up pass before each kernel sample, so
  the probe's buffer does not leave the weights cold) and compared p50 to p50: on a shared
  host both see the same neighbours, where a best-of bound against a p50 kernel would charge
  the neighbours to the kernel;
- onnxruntime with one thread; numpy with one BLAS thread and with every core this process
  may run on (each in a fresh subprocess, as a BLAS pool's size is fixed when it starts; the
  threads the pool holds are in the JSON, blas_threads, where threadpoolctl is installed).
The JSON goes to bench/results/scaling-latest.json (a run of fewer models, sets, peers or
weight types than the full table: scaling-partial.json).

Weight types (`--weights fp32,bf16,int8`): the engine's `weights` option; the hidden layers
take the type, the output layer stays fp32, and a row's weight_bytes (the read bound's bytes)
are the engine's packing of that type (see weight_bytes). The peers (onnxruntime, numpy) run
fp32 weights in every row: they have no such option, so a bf16 / int8 row compares fastpath on
the reduced type with the peers on fp32 (peer_weights in the JSON, "fp32" in the table). A type
the engine does not accept is reported as skipped with the engine's error, not left out.
A bf16 / int8 row has Engine.step figures (no kernel-alone figure) and the read bound alone
(bounds_note in the JSON): the FMA and latency bounds above are fp32 figures, and those kernels
multiply with dot-product instructions (vdpbf16ps: 2 products a lane, vpdpbusd: 4) whose rate
and latency no probe here measures, so the fp32 FMA rate bounds nothing for them.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time

import numpy as np

# the sibling scripts by plain name, as bench/run.py loads them: run as a script, as
# fastpath.bench.scaling, or imported by the child process this bench starts
HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import fastpath  # noqa: E402
from _commit import commit_stamp, results_dir  # noqa: E402
from _report import percentiles  # noqa: E402
from fastpath._engine import supported_isas  # noqa: E402
from fastpath._kernels import (LowpMLP, PackedMLP, fma512_ns_per_instr,  # noqa: E402
                               fma_ns_per_instr, lowp_kernels, op_latency_ns, read_gbps)
from fastpath.model import CachePolicy, FeatureSpec, Layer, Model  # noqa: E402
from peers import onnxruntime_peer  # noqa: E402

MODELS = ((32, 16, 2), (128, 64, 32, 2), (256, 256, 2), (512, 512, 256, 2), (1024, 1024, 1024, 2))
BYTES_PER_WEIGHT = {"fp32": 4, "bf16": 2, "int8": 1}
# the read probe's smallest buffer: a tinier model (--models) is timed against the bandwidth
# over this many bytes, which come from L1 as its weights do
READ_MIN_BYTES = 256
# how long one timed sample of back-to-back kernel passes lasts (see _packed)
SAMPLE_NS = 10_000
REDUCED_BOUNDS_NOTE = ("read bound only: the FMA and latency bounds are fp32 figures (the core's "
                       "FMA rate, fp32 op latencies) and the bf16 / int8 kernels multiply with "
                       "dot-product instructions (vdpbf16ps, vpdpbusd) of 2 or 4 products a lane, "
                       "whose rate and latency are not measured")


def _name(dims) -> str:
    return "x".join(map(str, dims))


def build_model(dims, seed=0):
    """ReLU MLP with identity features and the cache off: every step is a miss through the MLP."""
    rng = np.random.default_rng(seed)
    layers = []
    for i in range(len(dims) - 1):
        w = (rng.standard_normal((dims[i + 1], dims[i])) / np.sqrt(dims[i])).astype(np.float32)
        b = (rng.standard_normal(dims[i + 1]) * 0.1).astype(np.float32)
        layers.append(Layer(w, b, "relu" if i < len(dims) - 2 else "identity"))
    return Model(tuple(layers), FeatureSpec.identity(dims[0]), CachePolicy(enabled=False))


def engine_config(isa: str, weights: str) -> dict:
    eng = {"simd": isa, "n_symbols": 1}
    if weights != "fp32":
        eng["weights"] = weights        # the engine's reduced-precision option, where it exists
    return {"engine": eng, "cache": {"enabled": False}}


def padded_macs(dims) -> int:
    return sum((o + 7) // 8 * 8 * i for i, o in zip(dims[:-1], dims[1:]))


def weight_bytes(model, weights: str, isas) -> int:
    """Bytes the MLP kernel streams per forward pass: fp32, the 8-row blocked layout
    (padded_macs x 4); bf16 / int8, the packed arena of the engine's own packing on the widest
    of `isas` with reduced-precision kernels (fastpath._kernels.LowpMLP): the output layer
    stays fp32 there and the blocks are padded as that set's kernels need them, so padded_macs
    x the type's bytes understated a small model's (int8 32x16x2: 640 bytes for 1280)."""
    if weights == "fp32":
        return padded_macs(model.dims) * 4
    isa = next((i for i in reversed(list(isas)) if lowp_kernels(i) is not None), "scalar")
    packed = LowpMLP([L.weight for L in model.layers], [L.bias for L in model.layers],
                     [L.activation for L in model.layers], weights, isa)
    return int(packed.arena_bytes)


def l2_bytes() -> int:
    try:
        with open("/sys/devices/system/cpu/cpu0/cache/index2/size") as f:
            s = f.read().strip()
        return int(s[:-1]) * {"K": 1024, "M": 1 << 20}[s[-1]] if s[-1] in "KM" else int(s)
    except (OSError, ValueError, KeyError):
        return 1 << 20


def pct(ns: np.ndarray) -> dict:
    p50, p99 = percentiles(ns, (50, 99))
    return {"p50": p50, "p99": p99, "n": int(len(ns))}


def timer_overhead(n=20000) -> int:
    pc = time.perf_counter_ns
    out = np.empty(n, np.int64)
    for i in range(n):
        t0 = pc()
        out[i] = pc() - t0
    return int(np.median(out))


def time_fn(fn, x, n: int, overhead: int) -> dict:
    """A peer's fn(x) from Python (the peer's own entry: onnxruntime's feed and fetch, numpy's
    layers)."""
    pc = time.perf_counter_ns
    for _ in range(max(n // 10, 50)):
        fn(x)
    out = np.empty(n, np.int64)
    for i in range(n):
        t0 = pc()
        fn(x)
        out[i] = pc() - t0
    return pct(np.maximum(out - overhead, 0))


def time_step(eng, x, n: int, overhead: int) -> dict:
    """Engine.step(x, 0) from Python, the bound method called in the timed region itself, as
    bench/run.py times fastpath.step(): a lambda around it (time_fn) would add a Python call
    that a caller of step() does not make, ~20 ns, a fifth of the 32x16x2 model's step."""
    pc = time.perf_counter_ns
    step = eng.step
    for _ in range(max(n // 10, 50)):
        step(x, 0)
    out = np.empty(n, np.int64)
    for i in range(n):
        t0 = pc()
        step(x, 0)
        out[i] = pc() - t0
    return pct(np.maximum(out - overhead, 0))


NUMPY_CHILD = r"""
import sys, time, json
import numpy as np
sys.path.insert(0, sys.argv[1])
from scaling import build_model, time_fn
dims, n, overhead = json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
m = build_model(dims)
layers = [(l.weight.T.copy(), l.bias, l.activation) for l in m.layers]
def fn(x):
    h = x[None, :]
    for w, b, act in layers:
        h = h @ w + b
        if act == "relu":
            h = np.maximum(h, 0)
    return h
x = np.random.default_rng(1).standard_normal(dims[0]).astype(np.float32)
res = time_fn(fn, x, n, overhead)
try:    # the threads the BLAS pool really holds: the row's label says how many it was asked for
    from threadpoolctl import threadpool_info
    res["blas_threads"] = [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]
except ImportError:
    pass
print(json.dumps(res))
"""


def numpy_peer(dims, threads: int, n: int, overhead: int) -> dict:
    env = dict(os.environ)
    for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[v] = str(threads)
    out = subprocess.run([sys.executable, "-c", NUMPY_CHILD, HERE, json.dumps(list(dims)),
                          str(n), str(overhead)], env=env, capture_output=True, text=True,
                         timeout=600)
    if out.returncode != 0:
        return {"skipped": out.stderr.strip().splitlines()[-1] if out.stderr else "failed"}
    return json.loads(out.stdout)


def ort_peer(model, n: int, overhead: int) -> dict:
    fn, ver = onnxruntime_peer(model)
    if fn is None:
        return {"skipped": ver}
    x = np.random.default_rng(1).standard_normal(model.dims[0]).astype(np.float32)
    return dict(time_fn(fn, x, n, overhead), version=ver)


def _packed(layers, isa):
    P = PackedMLP([l.weight for l in layers], [l.bias for l in layers],
                  [l.activation for l in layers], isa)
    x = np.random.default_rng(1).standard_normal(layers[0].weight.shape[1]).astype(np.float32)
    est = min(P.time_forward(x, 50) for _ in range(3))
    # k passes a sample, so one lasts ~10 us: a sample has a fixed cost of ~50 ns (two clock
    # reads, the GIL released and taken back; measured as time_forward(x, 1) against (x, 2)),
    # which at ~2 us a sample still charged the 128x64x32x2 kernel ~2.5 ns a pass (107 ns a
    # pass at 20 passes a sample, 102.4 at 2000, same process)
    return P, x, max(1, int(SAMPLE_NS / max(est, 1.0)))


def kernel_ns(model, isa: str, samples: int, layers=None) -> float:
    """The MLP kernel alone (or the given slice of its layers): p50 over `samples` timings of
    k back-to-back passes, in ns per pass (fp32 weights). A p50, not a mean: on a shared host
    a mean carries every preemption."""
    P, x, k = _packed(model.layers if layers is None else layers, isa)
    return float(np.median([P.time_forward(x, k) for _ in range(samples)]))


def kernel_and_read_ns(layers, isa: str, wbytes: int, samples: int) -> tuple:
    """(kernel ns, read-bound ns, read GB/s): p50s of `samples` kernel samples (as kernel_ns)
    alternating with read-probe passes over a buffer of `wbytes`. Each kernel sample follows
    six untimed passes, which bring the weights back into the cache level they live in after
    the probe's buffer went through it (measured on the 1024x1024x1024x2 model: 90 us a pass
    after two, 75 us after six, as without the probe)."""
    P, x, k = _packed(layers, isa)
    ks, gs = [], []
    for _ in range(samples):
        gs.append(read_gbps(max(wbytes, READ_MIN_BYTES), 1))
        P.time_forward(x, 6)
        ks.append(P.time_forward(x, k))
    g = float(np.median(gs))
    return float(np.median(ks)), wbytes / g, g


LAT_OPS = ("fma", "mul", "add", "max")


def op_latencies(tries=5):
    """ns from an op's inputs to its result, per op kind of the MLP's critical path (one
    dependent chain each, on the widest vector set), best of `tries` short probes; a dict with
    'skipped' where the CPU has no vector set."""
    out = {op: min(op_latency_ns(op, 200_000) for _ in range(tries)) for op in LAT_OPS}
    if not all(v > 0 for v in out.values()):
        return {"skipped": "the op-latency probe needs AVX2+FMA"}
    return out


def latency_bound_ns(layers, lat) -> float:
    """The critical path of these layers at the measured op latencies (see the module's
    docstring for why no code can beat it); NaN where the latencies are not measured.
    layers: (n_in, activation) per layer."""
    if "skipped" in lat:
        return float("nan")
    prod, add = min(lat["fma"], lat["mul"]), min(lat["add"], lat["fma"])
    act = {"identity": 0.0, "relu": lat["max"]}
    return sum(prod + math.ceil(math.log2(n)) * add + act.get(a, min(lat.values()))
               for n, a in layers)


def model_latency_bound(model, lat) -> float:
    return latency_bound_ns([(L.weight.shape[1], L.activation) for L in model.layers], lat)


def bounds(ns: float, fma_ns: float, read_ns: float, wbytes: int, l2: int,
           lat_ns: float = float("nan")) -> dict:
    """The kernel against the binding bound (the slower of FMA and read), each bound alone, the
    original target's reading (FMA where the weights fit L2, read beyond), and against the
    larger of the binding throughput bound and the latency bound (x_max; NaN where the latency
    bound is not measured)."""
    kind, bound = ("fma", fma_ns) if fma_ns >= read_ns else ("read", read_ns)
    issue_kind, issue_ns = ("fma", fma_ns) if wbytes <= l2 else ("read", read_ns)
    if issue_ns != issue_ns:    # no FMA bound (a bf16 / int8 row, a CPU without AVX2+FMA)
        issue_kind = None
    top = max(bound, lat_ns) if lat_ns == lat_ns else float("nan")
    return {"ns": ns, "bound": kind, "bound_ns": bound, "x_bound": ns / bound,
            "fma_bound_ns": fma_ns, "x_fma": ns / fma_ns, "read_bound_ns": read_ns,
            "x_read": ns / read_ns, "issue_bound": issue_kind, "x_issue": ns / issue_ns,
            "latency_bound_ns": lat_ns, "x_latency": ns / lat_ns,
            "max_bound": (("latency" if lat_ns > bound else kind) if top == top else None),
            "x_max": ns / top}


def fma_rates(isas, tries=10) -> dict:
    """MACs per ns at each vector set's FMA bound: best of `tries` short probes, so one quiet
    moment on a shared host is enough (a long probe averages the neighbours in)."""
    out = {}
    for isa, probe, lanes in (("avx2", fma_ns_per_instr, 8), ("avx512", fma512_ns_per_instr, 16)):
        if isa in isas:
            ns = min(probe(1_000_000) for _ in range(tries))
            out[isa] = lanes / ns if ns > 0 else 0.0
    return out


def layer_rows(model, isa, fma_rate, l2, samples, lat) -> list:
    out = []
    for L in model.layers:
        o, i = L.weight.shape
        pm = (o + 7) // 8 * 8 * i
        wb = pm * 4
        ns, read_ns, g = kernel_and_read_ns([L], isa, wb, samples)
        fma_ns = pm / fma_rate if fma_rate > 0 else float("nan")
        lat_ns = latency_bound_ns([(i, L.activation)], lat)
        out.append(dict(bounds(ns, fma_ns, read_ns, wb, l2, lat_ns), shape=[i, o], kernel_set=isa,
                        weight_bytes=wb, read_gbps=g))
    return out


def run(args) -> dict:
    isas = [i for i in supported_isas() if args.sets is None or i in args.sets]
    ov = timer_overhead()
    fma = fma_rates(supported_isas())   # every set, also with --sets: the bound is the core's
    fma_rate = max(fma.values(), default=0.0)   # the core's FMA bound, whichever set reaches it
    lat = op_latencies()
    l2 = l2_bytes()
    # the cores this process may run on, not the machine's: a BLAS pool sizes itself to the
    # allowed ones, so under taskset "numpy 2t" ran one thread
    ncpu = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else os.cpu_count() or 1)
    res = {"commit": commit_stamp(HERE), "machine": {"cpu": platform.processor() or platform.machine(),
                       "cpu_features": fastpath.cpu_features(), "cores": ncpu, "l2_bytes": l2,
                       "fma_macs_per_ns": fma, "op_latency_ns": lat,
                       "timer_overhead_ns": ov},
           "kernel_sets": isas, "weights": args.weights, "calls": args.calls,
           "fastpath_version": fastpath.__version__, "rows": []}
    bw_cache = {}
    for dims in args.models:
        model = build_model(dims)
        x = np.random.default_rng(1).standard_normal(dims[0]).astype(np.float32)
        macs = sum(i * o for i, o in zip(dims[:-1], dims[1:]))
        pm = padded_macs(dims)
        lat_ns = model_latency_bound(model, lat)
        if args.no_peers:
            ort = np1 = npall = {"skipped": "--no-peers"}
        else:
            ort = ort_peer(model, args.calls, ov)
            np1 = numpy_peer(dims, 1, args.calls, ov)
            # on one core "every core" is the one-thread row: not timed twice (the two rows
            # shared one JSON key, and the run died there)
            npall = numpy_peer(dims, ncpu, args.calls, ov) if ncpu > 1 else None
        for wt in args.weights:
            wbytes = weight_bytes(model, wt, isas)
            if wbytes not in bw_cache:
                bw_cache[wbytes] = read_gbps(max(wbytes, READ_MIN_BYTES), 5)
            # a bf16 / int8 row has the read bound alone: the FMA bound (the core's fp32 FMA
            # rate) and the latency bound (fp32 op latencies, one product an op) are fp32
            # figures, and its hidden layers multiply with dot-product instructions of 2
            # (vdpbf16ps) or 4 (vpdpbusd) products a lane, whose rate and latency no probe
            # measures: the fp32 figures named an int8 row's "binding fma" bound (256x256x2)
            reduced = wt != "fp32"
            fma_ns = pm / fma_rate if fma_rate > 0 and not reduced else float("nan")
            # the row's bounds from the best read pass; each kernel set's mlp figure below is
            # compared with read passes sampled alongside it instead (see kernel_and_read_ns)
            read_ns = wbytes / bw_cache[wbytes]
            row = dict(bounds(float("nan"), fma_ns, read_ns, wbytes, l2,
                              float("nan") if reduced else lat_ns), dims=list(dims),
                       weights=wt, macs=macs, padded_macs=pm, weight_bytes=wbytes,
                       read_gbps=bw_cache[wbytes], fastpath={}, peer_weights="fp32",
                       onnxruntime_1t=ort,
                       numpy_1t=np1, **({f"numpy_{ncpu}t": npall} if ncpu > 1 else {}),
                       **({"bounds_note": REDUCED_BOUNDS_NOTE} if reduced else {}))
            for key in ("ns", "x_bound", "x_fma", "x_read", "x_issue", "x_latency", "x_max"):
                del row[key]
            for isa in isas:
                try:
                    eng = fastpath.Engine(model, config=engine_config(isa, wt))
                except fastpath.FastpathError as exc:
                    row["fastpath"][isa] = {"skipped": str(exc)}
                    continue
                step = time_step(eng, x, args.calls, ov)
                d = {"step": step}
                if wt == "fp32" and isa != "scalar":
                    k, rns, g = kernel_and_read_ns(model.layers, isa, wbytes,
                                                   max(args.calls // 10, 50))
                    d["mlp"] = dict(bounds(k, fma_ns, rns, wbytes, l2, lat_ns), read_gbps=g)
                    d["mlp_ns"] = k
                elif wt == "fp32":
                    d["mlp_ns"] = kernel_ns(model, isa, max(args.calls // 10, 50))
                row["fastpath"][isa] = d
            if wt == "fp32" and isas[-1] != "scalar":
                # each layer alone on the widest set, against its own bounds
                row["layers"] = layer_rows(model, isas[-1], fma_rate, l2,
                                           max(args.calls // 10, 50), lat)
            res["rows"].append(row)
            print_row(row, isas, ncpu, file=sys.stderr)
    return res


def fmt_ns(v) -> str:
    if v is None or v != v:
        return "-"
    return f"{v:.0f} ns" if v < 1000 else f"{v / 1000:.2f} us"


def _p50(d) -> str:
    return fmt_ns(d["p50"]) if "p50" in d else "skipped"


def _x(v) -> str:
    return "-" if v is None or v != v else f"{v:.2f}x"


def _mlp_cell(m) -> str:
    return (f"mlp {fmt_ns(m['ns'])} {m['x_bound']:.2f}x {m['bound']} "
            f"(fma {m['x_fma']:.2f}x, read {m['x_read']:.2f}x, latency {_x(m['x_latency'])}; "
            f"max bound {_x(m['x_max'])})")


def print_row(row, isas, ncpu, file=sys.stdout):
    name = "x".join(map(str, row["dims"]))
    cells = [f"{name:<18}", f"{row['weights']:<5}", f"{row['macs']:>10,}"]
    for isa in isas:
        d = row["fastpath"].get(isa, {})
        if "step" in d:
            cells.append(f"{isa} {_p50(d['step'])}/{fmt_ns(d['step']['p99'])}"
                         + (" " + _mlp_cell(d["mlp"]) if "mlp" in d else
                            f" mlp {fmt_ns(d['mlp_ns'])}" if "mlp_ns" in d else ""))
        else:
            cells.append(f"{isa} skipped")
    # the peers have no reduced-precision weights: say which they ran on every row
    pw = row.get("peer_weights", "fp32")
    cells += [f"ort1 {pw} {_p50(row['onnxruntime_1t'])}", f"np1 {pw} {_p50(row['numpy_1t'])}"]
    if ncpu > 1:
        cells.append(f"np{ncpu} {pw} {_p50(row[f'numpy_{ncpu}t'])}")
    if "bounds_note" in row:    # bf16 / int8: no fp32 figure bounds their kernels
        cells.append(f"bounds: read {fmt_ns(row['read_bound_ns'])} (best pass "
                     f"{row['read_gbps']:.0f} GB/s; no FMA or latency bound for {row['weights']})")
    else:
        cells.append(f"bounds: fma {fmt_ns(row['fma_bound_ns'])}, read "
                     f"{fmt_ns(row['read_bound_ns'])} (best pass {row['read_gbps']:.0f} GB/s), "
                     f"latency {fmt_ns(row['latency_bound_ns'])}, binding {row['bound']}")
    print(" | ".join(cells), file=file, flush=True)


def print_layers(res):
    print("layers alone (widest set): in x out, ns, x binding bound (x each bound; x the larger "
          "of the binding and the latency bound)")
    for row in res["rows"]:
        cells = [f"{L['shape'][0]}x{L['shape'][1]} {fmt_ns(L['ns'])} {L['x_bound']:.2f}x "
                 f"{L['bound']} (fma {L['x_fma']:.2f}x, read {L['x_read']:.2f}x, latency "
                 f"{_x(L['x_latency'])}; max bound {_x(L['x_max'])})"
                 for L in row.get("layers", [])]
        if cells:
            print(f"{'x'.join(map(str, row['dims'])):<18} | " + " | ".join(cells))


def print_table(res):
    isas, ncpu = res["kernel_sets"], res["machine"]["cores"]
    print(f"scaling: one tick, cache off, identity features; p50/p99 of Engine.step from Python; "
          f"mlp = kernel alone (p50), Nx = mlp / the binding bound (the slower of the FMA bound "
          f"and the streaming-read bound at the weights' size, read passes sampled alongside "
          f"the kernel), then mlp against each bound alone and against the larger of the binding "
          f"bound and the MLP's latency bound (its critical path at measured op latencies "
          f"{res['machine']['op_latency_ns']}); the original target reads the FMA "
          f"bound where the weights fit L2 ({res['machine']['l2_bytes'] >> 10} KiB): x_issue "
          f"in the JSON; FMA MACs/ns {res['machine']['fma_macs_per_ns']}")
    hdr = ["model", "weights", "MACs"] + [f"fastpath {i} p50/p99 (mlp, x bound)" for i in isas] + [
        "onnxruntime 1t p50 (fp32 weights)", "numpy 1t p50 (fp32 weights)"] + (
        [f"numpy {ncpu}t p50 (fp32 weights)"] if ncpu > 1 else []) + ["bounds"]
    print(" | ".join(hdr))
    for row in res["rows"]:
        print_row(row, isas, ncpu)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="fastpath scaling bench",
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__)
    ap.add_argument("--quick", action="store_true", help="fewer calls per figure")
    ap.add_argument("--calls", type=int, help="timed calls per figure (default 5000, 1000 quick)")
    ap.add_argument("--weights", default="fp32",
                    help=f"comma-separated weight types of {sorted(BYTES_PER_WEIGHT)}")
    ap.add_argument("--models", help="comma-separated models to run, e.g. 32x16x2,128x64x32x2 "
                                      "(default: all of " + ", ".join(_name(d) for d in MODELS) + ")")
    ap.add_argument("--sets", help="comma-separated kernel sets to run (default: every set this "
                                   "CPU runs)")
    ap.add_argument("--no-peers", action="store_true", help="skip onnxruntime and numpy")
    ap.add_argument("--out", default=results_dir(HERE),
                    help="folder of the JSON (default: bench/results in a checkout, else "
                         "./fastpath-bench-results; scaling-latest.json for the full table: all "
                         "models, sets and peers, every weight type; any other run writes "
                         "scaling-partial.json, so the full table is not replaced)")
    args = ap.parse_args(argv)
    try:
        args.models = (MODELS if not args.models else
                       tuple(tuple(int(v) for v in m.strip().split("x"))
                             for m in args.models.split(",") if m.strip()))
    except ValueError:
        ap.error(f"--models takes widths joined by x, e.g. 32x16x2, got {args.models!r}")
    if not args.models or any(len(m) < 2 or min(m) < 1 for m in args.models):
        ap.error("--models needs at least one model of two or more positive widths")
    # the engine's head takes 1 output (regression) or 2 (signal, confidence): 32x16x3 ended in
    # a ModelError traceback from building the first model
    wide = [_name(m) for m in args.models if m[-1] not in (1, 2)]
    if wide:
        ap.error(f"--models: the last width is the model's outputs, 1 (regression) or 2 "
                 f"(signal, confidence); got {', '.join(wide)}")
    if args.sets is not None:
        args.sets = [v.strip() for v in args.sets.split(",") if v.strip()]
        bad = [v for v in args.sets if v not in supported_isas()]
        if bad or not args.sets:
            ap.error(f"--sets takes sets this CPU runs, {supported_isas()}, got {bad or args.sets}")
    calls_given = args.calls is not None
    # "is None", not "or": --calls 0 ran the default 1000 / 5000 calls without a word
    args.calls = args.calls if args.calls is not None else (1000 if args.quick else 5000)
    if args.calls < 100:
        ap.error("--calls must be >= 100")
    args.weights = [w.strip() for w in args.weights.split(",") if w.strip()]
    bad = [w for w in args.weights if w not in BYTES_PER_WEIGHT]
    if bad or not args.weights:
        ap.error(f"--weights takes {sorted(BYTES_PER_WEIGHT)}, got {bad or args.weights}")
    res = run(args)
    print_table(res)
    print_layers(res)
    os.makedirs(args.out, exist_ok=True)
    # a --quick run (1000 calls a figure) replaced the README table's source (5000) too
    # and so did a run of fp32 alone (the default --weights): the README's table has a row
    # per weight type, and its bf16 / int8 rows went missing from the file it cites
    partial = (args.models != MODELS or args.sets is not None or args.no_peers or args.quick
               or calls_given or set(args.weights) != set(BYTES_PER_WEIGHT))
    path = os.path.join(args.out, "scaling-partial.json" if partial else "scaling-latest.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
