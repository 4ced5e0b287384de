"""Defects left open by the last review, each inside the per-tick C (fixed this time with an A/B
against the code-placement noise): the engine clock after a TSC that goes back, stats() telling a
hit from a miss when the clock is coarse, and the cosine threshold's slack applied by the C plan
(so a C-only caller gets it too).

Each test failed before its fix. The clock tests move fields of a module's own copy of the clock
through ctypes (a TSC reset cannot be made on demand; an anchor taken "in the future" is what a
TSC that went back looks like to every later reading) and put them back.
"""
import ctypes
import os
import shutil
import subprocess

import numpy as np
import pytest

import fastpath
from fastpath import Engine
from fastpath import _engine as E
from fastpath import _kernels as K
from helpers.builders import engine_cfg, random_model
from helpers.clock import _Clock
from helpers.clock import JUMP, _Restore, _clock, _needs_tsc  # noqa: F401

F32 = np.float32
# subprocesses run outside the checkout, so the installed package is imported, not the source
# folder (which has no built extensions when CI installs a wheel-like build)
PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(fastpath.__file__)))


def test_readings_after_the_tsc_went_back_do_not_go_back():
    """A TSC that went back (reset on resume, a VM moved to a host whose TSC is behind) mapped
    every later reading from the old anchor: minutes in the past, for as long as it took the
    TSC to catch up with the anchor (re-anchoring only fired on a reading past the anchor's
    period). Now the first such reading re-anchors: it is not before any reading taken before
    the jump, and it is CLOCK_MONOTONIC within the old mapping's lead (at most a ms)."""
    _needs_tsc(K.clock_info())
    clk = _clock(K)
    with _Restore(clk, lambda: K.clock_reanchor()):
        before = K.clock_ticks_to_mono_ns(K.clock_ticks())
        backs0 = K.clock_info()["tsc_backs"]
        # the anchor JUMP ticks ahead of the TSC: every reading now is JUMP before it
        clk.base_tick += JUMP
        clk.fit_tick += JUMP
        after = K.clock_ticks_to_mono_ns(K.clock_ticks())
        mono = K.clock_mono_ns()
        assert after >= before - 1000, (after - before)
        assert abs(after - mono) < 2_000_000, (after - mono)
        assert K.clock_info()["tsc_backs"] == backs0 + 1
        # durations keep the calibrated rate, and later readings go on from the new anchor
        t = K.clock_ticks()
        a, b = K.clock_ticks_to_mono_ns(t), K.clock_ticks_to_mono_ns(t + 10 ** 6)
        assert 0 < b - a < 10 ** 7
        assert K.clock_ticks_to_mono_ns(K.clock_ticks()) >= after


def test_a_reading_just_before_the_anchor_is_not_a_tsc_jump():
    """A reading taken shortly before another thread re-anchored maps back from the new anchor
    (a few us before it), with no re-anchor and no jump counted."""
    _needs_tsc(K.clock_info())
    clk = _clock(K)
    t = K.clock_ticks()
    base = clk.base_tick
    if t - base > clk.reanchor_ticks // 2:
        K.clock_reanchor()
        base = clk.base_tick
    n0 = K.clock_info()["reanchors"]
    v = K.clock_ticks_to_mono_ns(base - 1000)
    assert K.clock_info()["reanchors"] == n0
    assert 0 < clk.base_ns - v < 10_000


def test_engine_steps_after_the_tsc_went_back(isa):
    """The engine's clock (fastpath._engine's copy) after the TSC went back: every step()
    without ts_ns was refused as 'timestamps must not go backwards' (the engine clock read
    minutes before the symbol's last tick) until the TSC caught up with the old anchor."""
    _needs_tsc(fastpath.clock_info())
    rng = np.random.default_rng(3)
    m = random_model(rng, [8, 6, 2])
    eng = Engine(m, config=engine_cfg(isa))
    raws = rng.standard_normal((6, m.raw_len)).astype(F32)
    clk = _clock(E)
    with _Restore(clk, lambda: fastpath.clock_info()):
        for x in raws[:3]:
            eng.step(x, 1)
        backs0 = fastpath.clock_info()["tsc_backs"]
        clk.base_tick += JUMP
        clk.fit_tick += JUMP
        for x in raws[3:]:
            eng.step(x, 1)
        assert eng.ticks == 6
        assert fastpath.clock_info()["tsc_backs"] == backs0 + 1


def test_stats_tells_a_miss_from_a_hit_on_a_coarse_clock(isa):
    """stats() splits hits from misses by a record's infer > 0; on a clock whose ticks are
    coarser than a small model's forward pass (clock_gettime on a host without an invariant
    TSC) a miss recorded infer 0 and was counted under total_hit. Made here by a rate of 0 ns
    a tick (every duration 0): every tick of a cache-off engine is a miss, and stats() must
    say so."""
    rng = np.random.default_rng(4)
    m = random_model(rng, [8, 6, 2])
    eng = Engine(m, config=engine_cfg(isa))
    raws = rng.standard_normal((20, m.raw_len)).astype(F32)
    clk = _clock(E)
    with _Restore(clk, lambda: fastpath.clock_info()):
        clk.ns_per_tick = 0.0
        for i, x in enumerate(raws):
            r = eng.step(x, 2, ts_ns=1000 + i)
            assert not r.cached
    st = eng.stats()
    assert st["misses"] == 20 and st["hits"] == 0
    lat = st["latency_ns"]
    assert "total_hit" not in lat, lat.keys()
    assert lat["total_miss"]["n"] == 20


@pytest.mark.parametrize("t", [1.0, -1.0])
def test_cos_threshold_slack_is_the_plans(isa, t):
    """The 2^-50 slack that lets an exact repeat (cosine exactly 1; at -1 a key's opposite)
    pass a threshold of +-1 was applied by the Python side that fills the policy, so the C
    plan itself (what a C-only caller, or the kernel entry point given the threshold as is,
    builds) still missed one exact repeat in four. The kernel entry point now hands the
    threshold over unchanged and the plan slackens it."""
    rng = np.random.default_rng(5)
    misses = 0
    for _ in range(64):
        c = rng.standard_normal(24).astype(F32)
        f = c if t > 0 else -c
        misses += K.kernel_cache_decide(isa, f, c, t, 1e-6 if t > 0 else 1.0) != "hit"
    assert misses == 0


_PLAN_C = r"""
#include <stdio.h>
#include "fp_cache.h"
int main(void) {
    const double ts[] = {1.0, -1.0, 0.999999, 0.5, 0.0};
    for (int i = 0; i < 5; i++) {
        fp_cache_policy p = {0};
        p.cos_threshold = ts[i];
        p.norm_tol = 0.01;
        p.enabled = 1;
        fp_cache_plan pl;
        fp_cache_plan_init(&pl, &p, 24);
        printf("%a\n", pl.pol.cos_threshold);
    }
    return 0;
}
"""


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH")
def test_the_c_plan_holds_the_slackened_threshold(tmp_path):
    """A C caller of the cache (fp_cache_plan_init, fp_cache_lookup) gets the slack from the
    plan itself: the threshold the double path decides on is t - |t| 2^-50 (before, the plan
    kept t as given and only the Python side slackened it)."""
    csrc = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "csrc")
    if not os.path.exists(os.path.join(csrc, "fp_cache.h")):
        pytest.skip("no csrc/ beside the tests")
    src = tmp_path / "plan.c"
    src.write_text(_PLAN_C)
    exe = tmp_path / "plan"
    subprocess.run(["cc", "-std=c99", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{csrc}",
                    f"-I{os.path.join(csrc, 'kernels')}", str(src), "-o", str(exe), "-lm"],
                   check=True, timeout=120)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True, timeout=30)
    got = [float.fromhex(v) for v in out.stdout.split()]
    want = [t - abs(t) * 2.0 ** -50 for t in (1.0, -1.0, 0.999999, 0.5, 0.0)]
    assert got == want


def test_cli_bad_input_exits_2_whichever_check_finds_it(tmp_path):
    """fastpath calibrate exited 2 on a bad option (argparse) or a bad model file, but 1 on a
    bad ticks file (its own checks raised SystemExit(message)): a script could not tell a
    usage error from a failed check by the code. Every bad-input path now exits 2."""
    import sys
    from fastpath._build import DEMO_MODEL
    ticks = tmp_path / "t.npy"
    np.save(ticks, np.zeros((4, 3, 2), np.float32))        # 3-d: not (ticks, raw_len)
    out = subprocess.run([sys.executable, "-m", "fastpath.cli", "calibrate", "--ticks",
                          str(ticks), "--model", DEMO_MODEL, "--out", str(tmp_path / "o.fpm")],
                         capture_output=True, text=True, timeout=120, cwd=PKG_PARENT)
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert "must hold a 2-d array" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "o.fpm").exists()


def test_a_server_that_fails_to_start_removes_its_segment(monkeypatch):
    """A server whose start timed out (placement slower than start_timeout) was asked to stop
    and its segment left in /dev/shm (the loop returned at once, nothing closed the worker)
    until the next serve under that name replaced it. Now the failed start removes it."""
    import time
    from fastpath import ServeError
    from fastpath.serving import server as S
    from helpers.serving import cfg, uname

    def slow_place(self):
        time.sleep(0.5)
        return {"placed": False, "why": "test: slow placement"}

    monkeypatch.setattr(S.Server, "_place", slow_place)
    name = uname()
    with pytest.raises(ServeError, match="did not start within"):
        S.Server(name, config=cfg(), start_timeout=0.05)
    path = f"/dev/shm/fastpath.{name}"
    time.sleep(0.7)            # the thread has left _place: the old code's loop ran and returned
    assert not os.path.exists(path), os.listdir("/dev/shm")
    # the name is free for a real server at once, with nothing to replace
    srv = fastpath.serve(name, config=cfg())
    try:
        assert not srv.replaced
    finally:
        srv.stop()


def test_a_served_client_refuses_masked_values():
    """fastpath.connect(...).step() read a masked array's data under its mask as if valid, as
    Engine.step did (fixed beside it): refused now, and an unmasked one still served."""
    from fastpath import InputError
    from helpers.serving import cfg, uname
    name = uname()
    eng = fastpath.get_default_engine()
    raw = np.zeros(eng.raw_len, F32)
    m = np.ma.array(raw.copy())
    m[5] = np.ma.masked
    with fastpath.serve(name, config=cfg()), fastpath.connect(name) as c:
        with pytest.raises(InputError, match="masked array with 1 masked value"):
            c.step(m, 0, 5)
        assert c.step(np.ma.array(raw), 0, 6).signal == c.step(raw, 1, 6).signal


def test_weights_error_measures_the_signal_cost_on_the_users_ticks():
    """The cost of bf16/int8 weights depends on the inputs (a model fed raw inputs of mixed
    scale lost its signal under int8 where z-scored features lost 0.01): tuning.weights_error
    measures it on the user's ticks, against an independent replay of the same engines."""
    from fastpath import lob
    from fastpath.model import Model
    from fastpath._build import DEMO_MODEL
    from fastpath.tuning import weights_error
    m = Model.load(DEMO_MODEL)
    bs = lob.generate_stream(600, n_symbols=3, seed=5)
    raws = np.ascontiguousarray(lob.raw_from_book(bs))
    for wt in ("bf16", "int8"):
        e = weights_error(m, raws, wt, bs.symbols)
        cfg = {"engine": {"n_symbols": 3}, "cache": {"enabled": False}}
        ts = np.arange(len(raws), dtype=np.int64) * 1_000_000
        ref = Engine(m.with_weights("fp32"), config=cfg).step_batch(raws, bs.symbols, ts).signal
        sig = Engine(m.with_weights(wt), config=cfg).step_batch(raws, bs.symbols, ts).signal
        d = np.abs(sig.astype(np.float64) - ref)
        assert e["n"] == len(raws) and e["weights"] == wt
        assert e["max_abs"] == d.max() > 0 and e["mean_abs"] == pytest.approx(d.mean())
        assert e["worst_tick"] == int(np.argmax(d))
        assert e["sign_flips"] == int(np.count_nonzero(np.sign(sig) * np.sign(ref) < 0))
    assert weights_error(m, raws, "fp32", bs.symbols)["max_abs"] == 0.0
    with pytest.raises(fastpath.ModelError, match="not supported"):
        weights_error(m, raws, "fp16")


def test_calibrate_weights_prints_the_cost_and_records_the_choice(tmp_path):
    import sys
    from fastpath import lob
    from fastpath.model import Model
    from fastpath._build import DEMO_MODEL
    bs = lob.generate_stream(400, n_symbols=2, seed=6)
    np.save(tmp_path / "t.npy", np.ascontiguousarray(lob.raw_from_book(bs)))
    np.save(tmp_path / "s.npy", bs.symbols)
    out = subprocess.run([sys.executable, "-m", "fastpath.cli", "calibrate", "--ticks",
                          str(tmp_path / "t.npy"), "--symbols", str(tmp_path / "s.npy"),
                          "--model", DEMO_MODEL, "--out", str(tmp_path / "o.fpm"),
                          "--weights", "int8"], capture_output=True, text=True, timeout=300,
                         cwd=PKG_PARENT)
    assert out.returncode == 0, out.stderr
    assert "weights: int8 hidden layers (signal against fp32 on these ticks: max |d|" in out.stdout
    assert Model.load(tmp_path / "o.fpm").weights == "int8"
    # and back: the report is what int8 cost, not fp32 against itself (0)
    back = subprocess.run([sys.executable, "-m", "fastpath.cli", "calibrate", "--ticks",
                           str(tmp_path / "t.npy"), "--symbols", str(tmp_path / "s.npy"),
                           "--model", str(tmp_path / "o.fpm"), "--out", str(tmp_path / "b.fpm"),
                           "--weights", "fp32"], capture_output=True, text=True, timeout=300,
                          cwd=PKG_PARENT)
    assert back.returncode == 0, back.stderr
    assert "weights: fp32 hidden layers (were int8; int8's signal against fp32" in back.stdout
    assert "max |d| 0 " not in back.stdout
    assert Model.load(tmp_path / "b.fpm").weights == "fp32"


def test_save_to_a_directory_is_a_model_error(tmp_path):
    """Model.save(a directory) raised a bare IsADirectoryError about a temp file name."""
    from fastpath.model import Model
    from fastpath._build import DEMO_MODEL
    m = Model.load(DEMO_MODEL)
    with pytest.raises(fastpath.ModelError, match="is a directory; give the bundle's file name"):
        m.save(tmp_path)
    assert os.listdir(tmp_path) == []


def test_gpu_stage_takes_a_one_layer_model_whatever_its_weights_say():
    """A one-layer model has no hidden layer: bf16/int8 change nothing it runs (the output
    layer stays fp32), yet the GPU check refused it as 'bf16/int8 weights'. A deeper one is
    still refused."""
    from fastpath._build import gpu_refusal
    from fastpath.control.config import load_config
    rng = np.random.default_rng(8)
    one, two = random_model(rng, [8, 2]), random_model(rng, [8, 4, 2])
    for wt in ("bf16", "int8"):
        cfg = load_config({"engine": {"weights": wt}})
        assert gpu_refusal(one, cfg) is None
        assert gpu_refusal(one.with_weights(wt), load_config(None)) is None
        assert "fp32 MLPs only" in gpu_refusal(two, cfg)


def test_onnx_trees_with_interleaved_nodes_are_refused(tmp_path):
    """Two stumps whose nodes are listed interleaved (tree 1's root, tree 2's root, then their
    leaves): onnxruntime starts a new tree at every change of tree id and answered 44 where
    fastpath, grouping by id, answered 11. Such a file is refused now, naming the tree."""
    from fastpath.model import Model
    from helpers.models import _tree_graph
    rows = [(1, 0, 0, "BRANCH_LEQ", 0.0, 1, 2), (2, 0, 1, "BRANCH_LEQ", 0.0, 1, 2),
            (1, 1, 0, "LEAF", 0, 0, 0), (1, 2, 0, "LEAF", 0, 0, 0),
            (2, 1, 0, "LEAF", 0, 0, 0), (2, 2, 0, "LEAF", 0, 0, 0)]
    w = [(1, 1, 1.0), (1, 2, 1.0), (2, 1, 10.0), (2, 2, 10.0)]
    with pytest.raises(fastpath.ModelError, match="the nodes of tree id 1 are not listed together"):
        Model.from_onnx(_tree_graph(tmp_path, rows, w))
    # the same trees listed tree by tree load and answer 11
    m = Model.from_onnx(_tree_graph(tmp_path, [rows[0], rows[2], rows[3], rows[1], rows[4],
                                               rows[5]], w))
    assert float(Engine(m).predict(np.zeros(2, F32))[0]) == 11.0


def test_a_tree_models_refused_tick_names_the_post_transform(isa):
    """A tree ensemble whose PROBIT left (0, 1) was refused by step() and step_batch() as 'a
    hidden layer or the output overflowed: raw values too large for the model' (a tree model
    has no layer, and nothing overflowed); it names the post transform now, as predict()
    did."""
    from helpers.models import good_tick, tree_model
    m = tree_model(1, 4, cache=False, probit=True)
    eng = Engine(m, config={"engine": {"simd": isa, "n_symbols": 3}})
    rng = np.random.default_rng(9)
    x = good_tick(rng, 1)
    bad = x.copy()
    bad[0] = 2.0                      # the stump on raw[0] >= 1 pushes the score past 1
    for call in (lambda: eng.step(bad, 0, 5),
                 lambda: eng.step_batch(np.stack([bad]), [0], [5])):
        with pytest.raises(fastpath.InputError, match="post transform left its range") as e:
            call()
        assert "hidden layer" not in str(e.value)
    assert eng.ticks == 0
    eng.step(x, 0, 5)


def test_doctor_gpu_with_no_gpu_fails_and_says_why(tmp_path):
    """`fastpath doctor --gpu` on a host with no GPU (or no pycuda) passed gpu_numa as 'no GPU
    found: the CPU backend has no PCIe trip' and said nothing of the backend it was asked to
    check. Now gpu_numa fails when the GPU checks were asked for, and a gpu_backend check
    reports fastpath.gpu_status() with the fix."""
    import dataclasses
    import json
    import sys
    from fastpath.control import doctor
    from fastpath.control.placement import read_topology
    from helpers.host import make_host
    host = make_host(tmp_path)
    topo = dataclasses.replace(read_topology(host), gpus=[])
    by = {c["name"]: c for c in doctor.run_checks(host, topo=topo, use_gpu=True)["checks"]}
    assert by["gpu_numa"]["status"] == "fail" and "no GPU found" in by["gpu_numa"]["detail"]
    assert "gpu_backend" not in by
    by = {c["name"]: c for c in doctor.run_checks(host, topo=topo, use_gpu=False)["checks"]}
    assert by["gpu_numa"]["status"] == "pass"
    res = doctor.run_checks(host, use_gpu=True, gpu_backend=(False, "pycuda not importable"))
    by = {c["name"]: c for c in res["checks"]}
    assert by["gpu_backend"]["status"] == "fail" and "fastpath[gpu]" in by["gpu_backend"]["fix"]
    # the command line asks the running host (in a fresh process: tests in this one may have
    # put a pycuda stand-in in sys.modules)
    ok, why = json.loads(subprocess.run(
        [sys.executable, "-c", "import json, fastpath; print(json.dumps(fastpath.gpu_status()))"],
        capture_output=True, text=True, timeout=120, check=True, cwd=PKG_PARENT).stdout)
    out = subprocess.run([sys.executable, "-m", "fastpath.cli", "doctor", "--gpu", "--json"],
                         capture_output=True, text=True, timeout=120, cwd=PKG_PARENT)
    by = {c["name"]: c for c in json.loads(out.stdout)["checks"]}
    assert by["gpu_backend"]["status"] == ("pass" if ok else "fail")
    assert why in by["gpu_backend"]["detail"]


def test_onnx_tree_node_with_an_attribute_twice_is_refused(tmp_path):
    """A TreeEnsembleRegressor giving nodes_values twice: onnxruntime refuses the node, the
    reader kept the last copy (the MLP path refused it already)."""
    import onnx
    from onnx import helper
    from fastpath.model import Model
    from helpers.models import _tree_graph
    rows = [(0, 0, 0, "BRANCH_LEQ", 0.0, 1, 2), (0, 1, 0, "LEAF", 0, 0, 0),
            (0, 2, 0, "LEAF", 0, 0, 0)]
    p = _tree_graph(tmp_path, rows, [(0, 1, 1.0), (0, 2, 2.0)])
    Model.from_onnx(p)
    m = onnx.load(p)
    m.graph.node[0].attribute.append(helper.make_attribute("nodes_values", [5.0, 0.0, 0.0]))
    onnx.save(m, p)
    with pytest.raises(fastpath.ModelError, match="attribute nodes_values twice"):
        Model.from_onnx(p)


def test_a_reading_from_before_a_faster_anchor_does_not_go_back():
    """A thread reads the TSC, is preempted, and converts after another thread re-anchored
    at a rate faster than the mapping its earlier readings used (a refit within tolerance,
    here +0.3%): mapped back from the new anchor at the new rate, the reading landed
    0.9 ms x 0.3% = 2.7 us behind what the old mapping gave for the same tick (test_clock's
    readers saw 7 us under load), and the engine refuses a step more than 1 us behind its
    symbol's last. Readings before the anchor now map back at a rate below any mapping's."""
    _needs_tsc(K.clock_info())
    clk = _clock(K)
    with _Restore(clk, lambda: K.clock_reanchor()):
        K.clock_reanchor()
        k = clk.map_ns_per_tick
        t = K.clock_ticks()
        old = K.clock_ticks_to_mono_ns(t)
        x = int(900_000 / k)                            # 0.9 ms of ticks
        new_bt = t + x
        new_bn = K.clock_ticks_to_mono_ns(new_bt)       # the new anchor continues the old map
        clk.base_tick, clk.base_ns, clk.map_ns_per_tick = new_bt, new_bn, k * 1.003
        v = K.clock_ticks_to_mono_ns(t)
        assert v >= old - 1000, old - v
        # and still close: early by at most 1% of how far it predates the anchor
        assert old - v < 0.011 * 900_000 + 1000


def test_doctor_sees_the_serve_table_of_a_config_with_a_byte_order_mark(tmp_path):
    """load_config reads a TOML file saved with a UTF-8 byte-order mark; doctor's "this host
    serves" check read it with tomllib directly, failed, and left the serve segment out of
    the mlock total."""
    from fastpath.control import doctor
    p = tmp_path / "c.toml"
    p.write_bytes(b"\xef\xbb\xbf[serve]\nslots = 64\n")
    assert doctor._serving_configured(str(p))
    assert doctor._serving_configured(p)
    assert not doctor._serving_configured(str(tmp_path / "missing.toml"))
