"""fastpath serving bench: client -> worker -> client round trip through the shared-memory
rings, from Python and from a C client, beside an in-process Engine.step; and a soak.

    python bench/serve.py               # round trips + 10,000,000-request soak from 2 clients
    python bench/serve.py --quick       # smaller (seconds)
    python bench/serve.py --soak 1000000

Method (printed with the results):
- The worker runs fastpath.serve() in a thread of this process (GIL released), pinned by the
  control plane to the last allowed core ([placement] core); the client (this thread, or the C
  client process) is pinned to another one. With fewer than 2 allowed cores both share one and
  the figures say so.
- "request hand-off" = the reply's wait_ns: from the client's TSC stamp at submit to the
  worker picking the request up (the rest of a round trip is the worker's step, the reply's
  way back and the client's own work). It and "worker fp_step in C" are read from the
  worker's latency records of the same round trips (a ring sized to hold every one, up to
  2^24; n in the table).
- "from Python" = time.perf_counter_ns() around one client.step() (submit, spin for the
  reply), minus the median cost of an empty timed region; "in-process step" = the same around
  Engine.step() on the same ticks, same model, same config. "from C" = the TSC (lfence;
  rdtsc, converted at the rate seen against CLOCK_MONOTONIC over the run) around one submit +
  spin in tests/c/client.c built with cc -O2 against fastpath.get_include(), after an untimed
  pass over the tick pool.
- Book update rows: the same, one order book update a call (fastpath.lob.generate_stream,
  10 levels a side, a pool of 4096 updates of one symbol, ts_ns moving on 1 us a call) through
  Engine.step_book in-process, client.step_book (a book request: the worker runs the live
  book stage, then the tick), and tests/c/book_client.c's fp_client_try_submit_book; the
  worker's row is its fp_step_book, book stage included.
- The soak: 2 client processes, each owning its symbols, pipeline submit()/poll(); every reply
  must come back once, in order, and equal what a local Engine gives for the same ticks
  (checked chunk by chunk with Engine.step_batch). Ticks cycle through a pool of 4096 raw rows.
Writes bench/results/serve-latest.json (a run with --quick, --calls or --soak:
serve-partial.json, so the README's figures' source is not replaced by a short run).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid

import numpy as np

# the sibling scripts by plain name, as bench/run.py loads them: run as a script or as
# fastpath.bench.serve alike
HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import fastpath  # noqa: E402
from _commit import commit_stamp, results_dir  # noqa: E402
from _report import percentiles  # noqa: E402
from fastpath._build import DEMO_MODEL  # noqa: E402
from fastpath.lob import generate_stream  # noqa: E402

REPO = os.path.dirname(HERE)
POOL = 4096


def pct(x) -> dict:
    x = np.asarray(x, dtype=np.float64)
    q = percentiles(x, (50, 90, 99, 99.9))
    return {"p50": float(q[0]), "p90": float(q[1]), "p99": float(q[2]), "p999": float(q[3]),
            "max": float(x.max()), "n": int(len(x))}


# the engine's largest latency record ring (engine.latency_records)
MAX_RECORDS = 1 << 24


def server_config(worker_core: int, calls: int) -> dict:
    """The worker's config: placed on worker_core, spinning, and a latency record ring that
    holds every timed round trip of a row (the worker's fp_step and hand-off rows are read
    from it), so those rows are of the same calls as the row they sit beside, up to the
    engine's largest ring."""
    rec = 1 << max(int(min(calls, MAX_RECORDS)) - 1, 0).bit_length()
    return {"placement": {"core": worker_core, "policy": "other", "priority": 0},
            "serve": {"idle": "spin", "place": True},
            "engine": {"latency_records": max(rec, 65536)}}


def pool(raw_len: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((16, raw_len)).astype(np.float32)
    return np.ascontiguousarray(base[rng.integers(0, 16, POOL)]
                                + 0.01 * rng.standard_normal((POOL, raw_len)).astype(np.float32))


def timer_overhead() -> float:
    t = time.perf_counter_ns
    d = [0] * 20000
    for i in range(20000):
        a = t()
        d[i] = t() - a
    return float(np.median(d))


def book_pool(seed: int = 0):
    """POOL updates of one symbol (fastpath.lob's generator) and its tick size."""
    bs = generate_stream(POOL, 1, seed=seed)
    return bs, float(np.asarray(bs.tick_size).flat[0])


def timed_book_calls(step_book, bs, symbol, n, overhead, ts0=0):
    """ns of step_book(symbol, levels..., ts_ns, trades...) per call (Engine.step_book or
    Client.step_book), the updates of bs in turn, ts_ns = ts0 + 1000 (i + 1); minus the empty
    region's cost. -> (times, the last ts_ns used)."""
    t = time.perf_counter_ns
    out = np.empty(n, np.int64)
    bp, bz, ap, az = bs.bid_px, bs.bid_sz, bs.ask_px, bs.ask_sz
    tv, tc, ls = bs.trade_vol.tolist(), bs.trade_cnt.tolist(), bs.last_trade_sz.tolist()
    for i in range(n):
        k = i % POOL
        b0, b1, a0, a1, v, c, z = bp[k], bz[k], ap[k], az[k], tv[k], int(tc[k]), ls[k]
        ts = ts0 + 1000 * (i + 1)
        a = t()
        step_book(symbol, b0, b1, a0, a1, ts, v, c, z)
        out[i] = t() - a
    return np.maximum(out - overhead, 0), ts0 + 1000 * n


def timed_calls(step, raws, n, overhead):
    """ns of step(raw, 0) (Engine.step or Client.step, the bound method itself) per call, minus
    the empty region's cost. The bound method is called directly: a lambda around it would add
    a Python call (~20 ns) that a caller of step() does not make."""
    t = time.perf_counter_ns
    out = np.empty(n, np.int64)
    for i in range(n):
        raw = raws[i % POOL]
        a = t()
        step(raw, 0)
        out[i] = t() - a
    return np.maximum(out - overhead, 0)


SOAK_CLIENT = textwrap.dedent("""
    import sys, time, numpy as np, fastpath
    from numpy.lib.format import open_memmap
    name, pool_path, sym0, n, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    raws = np.load(pool_path); P = len(raws)
    c = fastpath.connect(name, timeout=10)
    # answers go to disk-backed arrays: the client's memory stays small at any n
    sig = open_memmap(out + ".sig.npy", "w+", np.float32, (n,))
    conf = open_memmap(out + ".conf.npy", "w+", np.float32, (n,))
    seen = np.zeros(n + 1, bool)
    expect, dup, reordered, errors, k = 1, 0, 0, 0, 0

    def take(items):
        global expect, dup, reordered, errors, k
        for s, r in items:
            if s < expect or seen[s]:
                dup += 1
                continue
            if s != expect:
                reordered += 1
            seen[s] = True
            expect = s + 1
            if isinstance(r, Exception):
                errors += 1
                continue
            sig[s - 1] = r.signal; conf[s - 1] = r.confidence; k += 1

    t0 = time.perf_counter()
    for i in range(n):
        c.submit(raws[i % P], sym0 + i % 4, 1000 * (i + 1))
        if i % 128 == 127:
            take(c.poll())
    deadline = time.monotonic() + 60
    while c.outstanding and time.monotonic() < deadline:
        take(c.poll())
    t1 = time.perf_counter()
    wall = t1 - t0
    c.close()
    sig.flush(); conf.flush()
    np.savez(out, received=int(seen.sum()), duplicated=dup, reordered=reordered, errors=errors,
             answered=k, wall_s=wall, t0=t0, t1=t1)
""")


def soak(name, model_cfg, raws, n_total, tmp):
    """2 client processes, n_total / 2 requests each; counts per client, then every answer
    compared with a local Engine, 65,536 ticks at a time."""
    n = n_total // 2
    pool_path = os.path.join(tmp, "pool.npy")
    np.save(pool_path, raws)
    script = os.path.join(tmp, "soak_client.py")
    with open(script, "w") as f:
        f.write(SOAK_CLIENT)
    # the clients import the fastpath this process imported (an installed wheel, or a built
    # checkout), not the checkout's sources, which a non-editable install leaves unbuilt
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(fastpath.__file__)))
    t0 = time.perf_counter()
    # symbols 8.. : the timed rows step symbol 0 on the engine clock
    outs = [os.path.join(tmp, f"soak{k}") for k in range(2)]
    procs = [subprocess.Popen([sys.executable, script, name, pool_path, str(8 + 4 * k), str(n),
                               outs[k]], env=env) for k in range(2)]
    rcs = [p.wait() for p in procs]
    wall = time.perf_counter() - t0
    # wall_s includes starting two Python processes (interpreter, numpy, fastpath: ~1 s, most
    # of a quick soak); req_per_s is over the serving window, from the first client's first
    # submit to the last one's last reply (perf_counter is CLOCK_MONOTONIC: one clock for
    # every process of the host)
    res = {"requests": 2 * n, "clients": 2, "wall_s": wall, "serving_s": None,
           "req_per_s": None, "exit_codes": rcs, "per_client": []}
    spans = []
    t1 = time.perf_counter()
    for k in range(2):
        if rcs[k] != 0:
            res["per_client"].append({"exit_code": rcs[k]})
            continue
        st = np.load(outs[k] + ".npz")
        sig = np.load(outs[k] + ".sig.npy", mmap_mode="r")
        conf = np.load(outs[k] + ".conf.npy", mmap_mode="r")
        eng = fastpath.Engine(DEMO_MODEL, config=model_cfg)
        differ = 0
        for a in range(0, n, 65536):
            b = min(n, a + 65536)
            idx = np.arange(a, b)
            ref = eng.step_batch(raws[idx % POOL], 8 + 4 * k + idx % 4, 1000 * (idx + 1))
            differ += int(np.count_nonzero((sig[a:b] != ref.signal) | (conf[a:b] != ref.confidence)))
        res["per_client"].append({
            "requests": n, "received": int(st["received"]), "lost": n - int(st["received"]),
            "duplicated": int(st["duplicated"]), "reordered": int(st["reordered"]),
            "error_replies": int(st["errors"]), "differ_from_local_engine": differ,
            "client_wall_s": float(st["wall_s"])})
        spans.append((float(st["t0"]), float(st["t1"])))
    if spans:
        res["serving_s"] = max(b for _, b in spans) - min(a for a, _ in spans)
        res["req_per_s"] = sum(c.get("requests", 0) for c in res["per_client"]) / res["serving_s"]
    res["check_s"] = time.perf_counter() - t1
    pc = res["per_client"]
    res["ok"] = all(rc == 0 for rc in rcs) and all(
        c["lost"] == 0 and c["duplicated"] == 0 and c["reordered"] == 0 and c["error_replies"] == 0
        and c["differ_from_local_engine"] == 0 for c in pc)
    return res


def _book_c_rows(out, cc, src, books, name, calls, client_core, tmp, srv) -> None:
    """The C feed handler's book update round trips (tests/c/book_client.c, symbol 2)."""
    exe = os.path.join(tmp, "book_client")
    subprocess.run([cc, "-O2", f"-I{fastpath.get_include()}", src, "-o", exe], check=True)
    rec = np.zeros(POOL, [("symbol", "<i4"), ("pad", "<i4"), ("ts_ns", "<i8"),
                          ("bid_px", "<f8", 10), ("bid_sz", "<f8", 10), ("ask_px", "<f8", 10),
                          ("ask_sz", "<f8", 10), ("trade_vol", "<f8"), ("trade_cnt", "<f8"),
                          ("last_trade_sz", "<f8")])
    rec["symbol"] = 2
    for k in ("bid_px", "bid_sz", "ask_px", "ask_sz", "trade_vol", "trade_cnt",
              "last_trade_sz"):
        rec[k] = getattr(books, k)
    rec.tofile(os.path.join(tmp, "book.bin"))
    subprocess.run([exe, name, "bench", os.path.join(tmp, "book.bin"), str(POOL),
                    os.path.join(tmp, "book.i64"), str(calls), str(POOL)], check=True,
                   preexec_fn=lambda: os.sched_setaffinity(0, {client_core}))
    out["book_round_trip_c_ns"] = pct(np.fromfile(os.path.join(tmp, "book.i64"), np.int64))
    out["worker_in_c_book_total_c_run_ns"] = pct(srv.latency_records()[-calls:, 3])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer calls and a 200,000-request soak")
    ap.add_argument("--calls", type=int, help="timed round trips per row")
    ap.add_argument("--soak", type=int, help="soak requests over 2 clients (default 10,000,000)")
    ap.add_argument("--out", help="the JSON (default: bench/results/serve-latest.json; "
                                  "serve-partial.json for a run with --quick, --calls or --soak)")
    args = ap.parse_args(argv)
    # checked here: "--calls 0" would fall back to the default, a negative soak means nothing
    if args.calls is not None and args.calls < 1:
        ap.error(f"--calls must be >= 1, got {args.calls}")
    if args.soak is not None and args.soak < 0:
        ap.error(f"--soak must be >= 0 (0: no soak), got {args.soak}")
    if args.out is None:
        # a quick run wrote serve-latest.json, the source of the README's serving figures
        partial = args.quick or args.calls is not None or args.soak is not None
        args.out = os.path.join(results_dir(HERE),
                                "serve-partial.json" if partial else "serve-latest.json")
    # a bare file name has no folder: os.makedirs("") failed after the whole run
    args.out = os.path.abspath(args.out)
    calls = args.calls if args.calls is not None else (20_000 if args.quick else 200_000)
    n_soak = args.soak if args.soak is not None else (200_000 if args.quick else 10_000_000)

    cores = sorted(os.sched_getaffinity(0))
    worker_core, client_core = cores[-1], cores[0]
    shared = worker_core == client_core
    cfg = server_config(worker_core, calls)
    local_cfg = {"placement": {"core": worker_core, "policy": "other", "priority": 0}}
    name = f"bench-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    eng = fastpath.Engine(DEMO_MODEL, config=local_cfg)
    raws = pool(eng.raw_len)
    # book updates on symbols of their own (1: Python, 2: C): time goes forward on each
    books, tick = book_pool()
    eng.set_tick_size(1, tick)
    overhead = timer_overhead()
    out = {"commit": commit_stamp(HERE), "fastpath": fastpath.__version__,
           "host": {"cpu": platform.processor() or platform.machine(), "cores_allowed": cores,
                    "worker_core": worker_core, "client_core": client_core,
                    "shared_core": shared, "simd": eng.simd},
           "timer_overhead_ns": overhead, "calls": calls}
    print(f"worker on core {worker_core}, client on core {client_core}"
          + (" (one core: both share it)" if shared else "") + f"; {calls} calls per row")

    # the worker thread is placed from this thread's affinity: pin this one after it started
    with fastpath.serve(name, None, cfg, tick_sizes={1: tick, 2: tick}) as srv:
        os.sched_setaffinity(0, {client_core})
        out["placement"] = srv.placement.get("lines", srv.placement)
        # in-process Engine.step on the client's core: the baseline the rings add to
        timed_calls(eng.step, raws, min(calls, 5000), overhead)
        out["in_process_step_ns"] = pct(timed_calls(eng.step, raws, calls, overhead))
        with fastpath.connect(name) as c:
            timed_calls(c.step, raws, min(calls, 5000), overhead)
            out["round_trip_python_ns"] = pct(timed_calls(c.step, raws, calls, overhead))
            lat = srv.latency_records()[-calls:]
            out["worker_in_c_total_ns"] = pct(lat[:, 3])
            # submit (the client's TSC stamp) to the worker picking the request up
            out["request_handoff_python_ns"] = pct(lat[:, 4])
            # book updates: in-process, then through the ring (same symbol, same updates)
            warm = min(calls, 5000)
            _, ts = timed_book_calls(eng.step_book, books, 1, warm, overhead)
            t_in, _ = timed_book_calls(eng.step_book, books, 1, calls, overhead, ts)
            out["in_process_step_book_ns"] = pct(t_in)
            _, ts = timed_book_calls(c.step_book, books, 1, warm, overhead)
            t_rt, _ = timed_book_calls(c.step_book, books, 1, calls, overhead, ts)
            out["book_round_trip_python_ns"] = pct(t_rt)
            out["worker_in_c_book_total_ns"] = pct(srv.latency_records()[-calls:, 3])
        cc = shutil.which("cc")
        with tempfile.TemporaryDirectory() as tmp:
            if cc:
                exe = os.path.join(tmp, "client")
                subprocess.run([cc, "-O2", f"-I{fastpath.get_include()}",
                                os.path.join(REPO, "tests", "c", "client.c"), "-o", exe], check=True)
                raws.tofile(os.path.join(tmp, "in.f32"))
                # one process, warmed on a full pass of the pool before the timed calls
                subprocess.run([exe, name, "bench", os.path.join(tmp, "in.f32"), str(POOL),
                                os.path.join(tmp, "rt.i64"), str(calls), str(POOL)], check=True,
                               preexec_fn=lambda: os.sched_setaffinity(0, {client_core}))
                out["round_trip_c_ns"] = pct(np.fromfile(os.path.join(tmp, "rt.i64"), np.int64))
                lat = srv.latency_records()[-calls:]
                out["worker_in_c_total_c_run_ns"] = pct(lat[:, 3])
                out["request_handoff_c_ns"] = pct(lat[:, 4])
                book_src = os.path.join(REPO, "tests", "c", "book_client.c")
                if os.path.exists(book_src):
                    _book_c_rows(out, cc, book_src, books, name, calls, client_core, tmp, srv)
            else:
                out["round_trip_c_ns"] = None
                print("no cc on PATH: the C client row is skipped")
            if n_soak:
                os.sched_setaffinity(0, set(cores))
                out["soak"] = soak(name, cfg, raws, n_soak, tmp)
        out["server_stats"] = srv.stats()

    rows = [("in-process Engine.step()", out["in_process_step_ns"]),
            ("round trip from Python", out["round_trip_python_ns"]),
            ("  request hand-off", out["request_handoff_python_ns"]),
            ("  worker fp_step in C", out["worker_in_c_total_ns"]),
            ("round trip from C", out["round_trip_c_ns"]),
            ("  request hand-off", out.get("request_handoff_c_ns")),
            ("  worker fp_step in C", out.get("worker_in_c_total_c_run_ns")),
            ("in-process step_book()", out["in_process_step_book_ns"]),
            ("book round trip from Python", out["book_round_trip_python_ns"]),
            ("  worker fp_step_book in C", out["worker_in_c_book_total_ns"]),
            ("book round trip from C", out.get("book_round_trip_c_ns")),
            ("  worker fp_step_book in C", out.get("worker_in_c_book_total_c_run_ns"))]
    # n: a row of fewer calls than its round trips (a ring past MAX_RECORDS) says so
    print(f"{'':28s} {'p50 ns':>9s} {'p90 ns':>9s} {'p99 ns':>9s} {'p99.9 ns':>9s} {'n':>9s}")
    for label, r in rows:
        if r:
            print(f"{label:28s} {r['p50']:9.0f} {r['p90']:9.0f} {r['p99']:9.0f} {r['p999']:9.0f}"
                  f" {r['n']:9d}")
    if n_soak:
        s = out["soak"]
        rate = (f"{s['serving_s']:.1f} s of serving ({s['req_per_s']:,.0f}/s; "
                f"{s['wall_s']:.1f} s with the clients' start)" if s["serving_s"] else
                f"{s['wall_s']:.1f} s (no client finished)")
        print(f"soak: {s['requests']:,} requests from 2 client processes in {rate}, "
              f"answers checked against a local Engine in "
              f"{s['check_s']:.1f} s")
        for k, c in enumerate(s["per_client"]):
            if "lost" not in c:
                print(f"  client {k}: exit code {c['exit_code']}")
                continue
            print(f"  client {k}: {c['requests']:,} sent, {c['received']:,} answered, lost "
                  f"{c['lost']}, duplicated {c['duplicated']}, reordered {c['reordered']}, "
                  f"error replies {c['error_replies']}, differing from a local Engine "
                  f"{c['differ_from_local_engine']}")
        print(f"soak {'passed' if s['ok'] else 'FAILED'}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1, default=str)
    print(f"wrote {args.out}")
    return 0 if not n_soak or out["soak"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
