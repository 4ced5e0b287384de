"""Checks .ci/sdist_check.sh and .ci/wheel_check.sh run against an *installed* fastpath, never the
checkout (run it by path from outside the repository: sys.path[0] is then .ci/).

    python pkg_check.py sdist TARBALL REPO    # the sdist carries the sources, not generated files
    python pkg_check.py native OUT.npz        # contents, then steps on generated ticks; saves both
    python pkg_check.py emulated IN.npz       # on a CPU without AVX2: scalar kernels, same answers

The emulated run is kept to imports and a few steps: under qemu every instruction is translated.
Its answers are compared with the native (AVX2) ones within TOL: the kernels are twins, but
they sum in a different order and libm picks FMA variants on the native CPU.
"""
import json
import os
import sys
import tarfile

import numpy as np

TOL = 1e-6
N_TICKS, N_SYMBOLS, SEED = 48, 4, 11


def fail(msg: str) -> None:
    print(f"pkg_check: FAILED: {msg}", file=sys.stderr)
    sys.exit(1)


def check_sdist(tarball: str, repo: str) -> None:
    with tarfile.open(tarball) as tf:
        names = {n.split("/", 1)[1] for n in tf.getnames() if "/" in n}
    need = {"setup.py", "pyproject.toml", "README.md", "MANIFEST.in", "fastpath/_engine.pyx",
            "fastpath/_kernels.pyx", "fastpath/_csrc.pxd", "fastpath/_engine.pyi",
            "fastpath/_kernels.pyi", "fastpath/py.typed", "fastpath/data/demo.fpm",
            "fastpath/data/fastpath.example.toml", "bench/schema.json", "tests/conftest.py"}
    for top in ("csrc",):                    # setup.py globs csrc/*.c and csrc/kernels/*.c
        for d, _, files in os.walk(os.path.join(repo, top)):
            need |= {os.path.relpath(os.path.join(d, f), repo) for f in files
                     if f.endswith((".c", ".h"))}
    missing = sorted(need - names)
    if missing:
        fail(f"{os.path.basename(tarball)} lacks {missing}: add them to MANIFEST.in")
    pyx = {n[:-4] for n in names if n.endswith(".pyx")}
    generated = sorted(n for n in names if n.endswith((".so", ".pyc")) or
                       (n.endswith(".c") and n[:-2] in pyx))
    if generated:
        fail(f"{os.path.basename(tarball)} ships generated files {generated}")
    print(f"sdist {os.path.basename(tarball)}: {len(names)} files, sources complete, "
          f"no generated C or binaries")


def check_contents(fastpath) -> None:
    pkg = os.path.dirname(fastpath.__file__)
    if "site-packages" not in pkg:
        fail(f"fastpath imported from {pkg}, not from the installed package")
    need = ["py.typed", "_engine.pyi", "_kernels.pyi", "data/demo.fpm",
            "data/fastpath.example.toml", "bench/schema.json", "control/__init__.py"]
    missing = [f for f in need if not os.path.isfile(os.path.join(pkg, f))]
    if missing:
        fail(f"installed package {pkg} lacks {missing}")
    with open(os.path.join(pkg, "bench", "schema.json")) as f:
        json.load(f)
    import fastpath.control.doctor  # noqa: F401  the control plane imports on its own
    import fastpath.lob  # noqa: F401
    import fastpath.model  # noqa: F401
    print(f"installed at {pkg}: data, stubs, py.typed, control, bench schema present")


def steps(fastpath, raws, symbols, ts):
    fastpath.configure()                     # a fresh default engine: the embedded demo model
    out = np.zeros((len(raws), 3))
    for i in range(len(raws)):
        r = fastpath.step(np.ascontiguousarray(raws[i], dtype=np.float32), int(symbols[i]), int(ts[i]))
        out[i] = (r.signal, r.confidence, float(r.cached))
    return out


def native(path: str) -> None:
    import fastpath
    from fastpath.lob import generate_stream, raw_from_book
    check_contents(fastpath)
    bs = generate_stream(n_ticks=N_TICKS, n_symbols=N_SYMBOLS, seed=SEED)
    raws = raw_from_book(bs).astype(np.float32)
    got = steps(fastpath, raws, bs.symbols, bs.ts_ns)
    if not np.isfinite(got).all():
        fail(f"non-finite signal or confidence on generated ticks: {got[~np.isfinite(got).all(1)]}")
    np.savez(path, raws=raws, symbols=bs.symbols, ts=bs.ts_ns, expected=got,
             simd=fastpath.simd())
    print(f"native: simd {fastpath.simd()}, {len(raws)} ticks stepped, signal[0:3] "
          f"{np.round(got[:3, 0], 7).tolist()}, {int(got[:, 2].sum())} cache hits")


def emulated(path: str) -> None:
    import fastpath
    d = np.load(path)
    simd, feats = fastpath.simd(), fastpath.cpu_features()
    print(f"emulated: simd {simd}, cpu features {feats}")
    if simd != "scalar" or feats.get("avx2"):
        fail(f"on a CPU without AVX2 the engine must pick the scalar kernels, got {simd} ({feats})")
    got = steps(fastpath, d["raws"], d["symbols"], d["ts"])
    exp = d["expected"]
    print(f"native ({d['simd']}) signal[0:3]   {np.round(exp[:3, 0], 7).tolist()}")
    print(f"emulated (scalar) signal[0:3] {np.round(got[:3, 0], 7).tolist()}")
    diff = np.abs(got[:, :2] - exp[:, :2])
    print(f"max |diff| signal {diff[:, 0].max():.3g}, confidence {diff[:, 1].max():.3g} "
          f"over {len(got)} ticks; cache decisions equal: {bool((got[:, 2] == exp[:, 2]).all())}")
    bad = np.flatnonzero((diff > TOL).any(1) | (got[:, 2] != exp[:, 2]))
    if len(bad):
        i = bad[0]
        fail(f"{len(bad)} tick(s) differ from the native run beyond {TOL}; first: tick {i}, "
             f"native {exp[i].tolist()}, emulated {got[i].tolist()}")


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode == "sdist" and len(sys.argv) == 4:
        check_sdist(sys.argv[2], sys.argv[3])
    elif mode in ("native", "emulated") and len(sys.argv) == 3:
        (native if mode == "native" else emulated)(sys.argv[2])
    else:
        fail(__doc__)
