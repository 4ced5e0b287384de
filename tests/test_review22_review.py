"""A hostile review of the input scaler (Model.input_scaler), the GPU engine's batch path and
the ONNX tree import: each test here failed on the merged code before its fix.

- the GPU engine answers a row the GPU flagged (a float32 sum overflowed) with the CPU model
  on that row's features; it called Engine.predict, which now applies the input scaler, on
  features that already held it: the scaler ran twice (a signal of -1.08 came out as 3e5);
- Engine.predict of a finite input that the input scaler takes past float32's range blamed
  "a layer" (an MLP) or walked the Inf and answered (a tree ensemble), where step() refuses
  such a tick;
- before a tree ensemble, x / 3 was read as x * (1 / 3) and two shifts as one: an ulp off
  onnxruntime's value, which took the other branch at a threshold (onnxruntime 1, fastpath 2).
"""
import warnings

import numpy as np
import pytest

import fastpath
from fastpath import Engine, InputError, ModelError
from fastpath.model import CachePolicy, Head, Layer, Model, TreeEnsemble
from fastpath.model.types import InputScaler
from helpers.builders import engine_cfg
from helpers.fake_cuda import fake_fatbin  # noqa: F401 - fixture

F = np.float32


def _scaler_mlp(offset=65000.0, scale=2.0, n=6, seed=0):
    rng = np.random.default_rng(seed)
    layers = (Layer(rng.standard_normal((8, n)).astype(F), np.zeros(8, F), "relu"),
              Layer(rng.standard_normal((2, 8)).astype(F), np.zeros(2, F), "identity"))
    sc = InputScaler(np.full(n, offset, F), np.full(n, scale, F))
    return Model(layers, None, CachePolicy(enabled=False), input_scaler=sc)


def _prices(n, width=6, seed=1):
    return (65000 + np.random.default_rng(seed).uniform(-0.5, 0.5, (n, width))).astype(F)


# ------------------------------------------------- the GPU's CPU recompute of a flagged row

def test_cpu_recompute_of_a_flagged_row_applies_the_scaler_once(isa):
    """fastpath.gpu answers a flagged row with the CPU model on Engine.features (the first
    layer's inputs, the scaler already in them): before the fix through Engine.predict,
    which applies the scaler again (outputs [323637.9, -893410.8] for [-1.08, -2.83])."""
    from fastpath.gpu import _cpu_outputs
    m = _scaler_mlp()
    eng = Engine(m, config=engine_cfg(isa))
    nan = np.full(2, np.nan, F)
    for raw in _prices(20):
        got = _cpu_outputs(eng, eng.features(raw, 0), nan)
        np.testing.assert_allclose(got, m.outputs(raw[None])[0], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got, eng.predict(raw), rtol=1e-6, atol=1e-6)
    # features that the CPU refuses too still give the NaN row (the engine refuses the tick)
    assert np.isnan(_cpu_outputs(eng, np.full(6, np.inf, F), nan)).all()
    with pytest.raises(InputError, match="6 features"):
        eng._predict_features(np.zeros(5, F))


def test_gpu_engine_batch_of_flagged_rows_matches_the_cpu_on_a_scaler_model(monkeypatch, isa):
    """The same through GpuEngine.step_batch on the stand-in driver, every row flagged: the
    signals are the CPU engine's (before the fix: tanh of the doubly scaled outputs)."""
    pytest.importorskip("helpers.fake_cuda")
    from helpers.fake_cuda import FakeCuda, _fake_pycuda
    from fastpath.gpu import GpuBackend, GpuEngine, gpu_status

    _fake_pycuda(monkeypatch, FakeCuda())
    gpu_status.cache_clear()
    real_infer = GpuBackend.infer
    monkeypatch.setattr(GpuBackend, "infer_batch", lambda self, X: (
        np.full((len(X), 2), np.nan, F), np.ones(len(X), bool), [real_infer(self, X[0])[2]]))
    m = _scaler_mlp(seed=3)
    cfg = engine_cfg(isa)
    raws = _prices(8, seed=4)
    cpu = Engine(m, config=cfg)
    want = [cpu.step(r, 0, i + 1) for i, r in enumerate(raws)]
    try:
        with GpuEngine(m, cfg, mode="persistent") as ge:
            got = ge.step_batch(raws, np.zeros(8, np.int32), np.arange(1, 9))
        for g, w in zip(got, want):
            assert abs(g.signal - w.signal) < 1e-6 and abs(g.confidence - w.confidence) < 1e-6
    finally:
        gpu_status.cache_clear()


# ------------------------------------------------- predict: an input the scaler overflows

def _scaler_stump(offset, scale):
    t = TreeEnsemble(1, 1, [0, 3], [0, 6, 6], [0, 0, 0], np.asarray([0.5, 0, 0]), [1, 0, 0],
                     [2, 0, 0], [0, 0, 0], [1, 2], [0, 0], [1.0, 2.0])
    return Model((), None, CachePolicy(enabled=False), head_spec=Head("regression", 1.0, (0,)),
                 trees=t, input_scaler=InputScaler(np.asarray([offset], F),
                                                   np.asarray([scale], F)))


@pytest.mark.parametrize("kind", ["mlp", "trees"])
def test_predict_refuses_a_finite_input_its_scaler_overflows(kind, isa):
    """step() refuses the tick (its features overflow); predict blamed a layer (MLP) or
    answered 2.0 from the Inf (tree), and numpy's overflow warning escaped it."""
    if kind == "mlp":
        m = _scaler_mlp(offset=0.0, scale=1e30, n=6)
        x = np.full(6, 1e10, F)
    else:
        m = _scaler_stump(0.0, 1e30)
        x = np.asarray([1e10], F)
    eng = Engine(m, config=engine_cfg(isa))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(InputError, match=r"x\[0\] = 1e\+?10.*input scaler.*is inf"):
            eng.predict(x)
        with pytest.raises(InputError, match="overflowed"):
            eng.step(x, 0)
        # in range, the two agree with the numpy reference
        ok = np.full_like(x, 1e-31)
        np.testing.assert_allclose(eng.predict(ok), m.forward(ok), rtol=1e-6)
    assert eng.ticks == 0


# ------------------------------------------------- leading ops before a tree ensemble

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")


def _tree_after(path, lead_nodes, consts, threshold):
    """x [N, 1] -> lead_nodes (ending in "s") -> one split s <= threshold: 1.0, else 2.0."""
    from onnx import TensorProto, helper, numpy_helper
    tree = helper.make_node(
        "TreeEnsembleRegressor", ["s"], ["y"], domain="ai.onnx.ml", n_targets=1,
        nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[0, 0, 0],
        nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"], nodes_values=[float(threshold), 0.0, 0.0],
        nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[2, 0, 0], target_treeids=[0, 0],
        target_nodeids=[1, 2], target_ids=[0, 0], target_weights=[1.0, 2.0])
    g = helper.make_graph(
        list(lead_nodes) + [tree], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])],
        [numpy_helper.from_array(np.asarray([v], F), k) for k, v in consts.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("ai.onnx.ml", 3)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return str(path)


def _ort(path, x):
    s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return s.run(None, {"x": np.asarray([[x]], F)})[0][0]


def _first(xs, ref, fused):
    """The first x whose fused float32 value is above onnxruntime's step-by-step one."""
    i = np.flatnonzero(fused > ref)
    assert i.size
    return xs[i[0]], ref[i[0]]


def test_div_before_a_tree_off_by_an_ulp_is_refused(tmp_path, isa):
    """x / 3 was read as x * (1 / 3): at x = 270.51694, onnxruntime's x / 3 = 90.17231 sits
    on the threshold (leaf 1.0); fastpath's 90.17232 took the other branch (2.0)."""
    from onnx import helper
    xs = np.random.default_rng(0).uniform(1, 1000, 100000).astype(F)
    x, t = _first(xs, xs / F(3), xs * (F(1) / F(3)))
    p = _tree_after(tmp_path / "div3.onnx", [helper.make_node("Div", ["x", "c"], ["s"])],
                    {"c": 3.0}, t)
    assert _ort(p, x)[0] == 1.0
    with pytest.raises(ModelError, match="Div node.*reciprocal is not exact"):
        Model.from_onnx(p)
    # by a power of 2 the product is the quotient: read, and on the threshold as onnxruntime
    p4 = _tree_after(tmp_path / "div4.onnx", [helper.make_node("Div", ["x", "c"], ["s"])],
                     {"c": 4.0}, F(x) / F(4))
    m = Model.from_onnx(p4, head=Head("regression", 1.0, (0,)))
    assert _ort(p4, x)[0] == 1.0
    assert Engine(m, config=engine_cfg(isa)).predict(np.asarray([x], F))[0] == 1.0
    assert m.forward(np.asarray([x], F))[0] == 1.0


def test_two_shifts_before_a_tree_are_refused_one_shift_one_scale_read(tmp_path, isa):
    """(x - a) - b was read as x - (a + b), rounded once: a value on the threshold in
    onnxruntime landed an ulp above it. One Sub then one Mul is onnxruntime's own two
    roundings and is read, matching it at the threshold on every kernel set."""
    from onnx import helper
    a, b = F(1234.567), F(0.1)
    xs = np.random.default_rng(1).uniform(1000, 2000, 100000).astype(F)
    step = (xs - a) - b
    fused = xs - F(np.float64(a) + np.float64(b))
    x, t = _first(xs, step, fused)
    p = _tree_after(tmp_path / "subsub.onnx",
                    [helper.make_node("Sub", ["x", "a"], ["u"]),
                     helper.make_node("Sub", ["u", "b"], ["s"])], {"a": a, "b": b}, t)
    assert _ort(p, x)[0] == 1.0
    with pytest.raises(ModelError, match="second shift"):
        Model.from_onnx(p)
    # two scales likewise
    p2 = _tree_after(tmp_path / "mulmul.onnx",
                     [helper.make_node("Mul", ["x", "a"], ["u"]),
                      helper.make_node("Mul", ["u", "b"], ["s"])], {"a": a, "b": b}, 0.0)
    with pytest.raises(ModelError, match="second scale"):
        Model.from_onnx(p2)
    # Sub then Mul: exact at a value on the threshold
    s = F(0.37)
    t1 = (F(x) - a) * s
    p3 = _tree_after(tmp_path / "submul.onnx",
                     [helper.make_node("Sub", ["x", "a"], ["u"]),
                      helper.make_node("Mul", ["u", "s2"], ["s"])], {"a": a, "s2": s}, t1)
    m = Model.from_onnx(p3, head=Head("regression", 1.0, (0,)))
    xv = np.asarray([x], F)
    assert _ort(p3, x)[0] == 1.0
    e = Engine(m, config=engine_cfg(isa))
    assert e.predict(xv)[0] == 1.0 and m.forward(xv)[0] == 1.0
    assert e.step(xv, 0).signal == pytest.approx(np.tanh(1.0), abs=1e-6)
    # a shift of 0 beside another (a Scaler with offset 0 after a Sub) changes nothing: read
    p5 = _tree_after(tmp_path / "sub_scaler.onnx",
                     [helper.make_node("Sub", ["x", "a"], ["u"]),
                      helper.make_node("Scaler", ["u"], ["s"], domain="ai.onnx.ml",
                                       offset=[0.0], scale=[float(s)])], {"a": a}, t1)
    m5 = Model.from_onnx(p5, head=Head("regression", 1.0, (0,)))
    assert m5.forward(xv)[0] == _ort(p5, x)[0] == 1.0


# ------------------------------------------------- numpy's bool for a config's bool key

def test_numpy_bools_are_bools_for_bool_keys():
    """np.bool_ (what mask.any() returns) for a bool key was refused with "cache.enabled must
    be bool, got bool np.True_", a message that contradicts itself; numpy numbers were made
    plain for numeric keys, numpy bools for bool keys were not."""
    from fastpath.control.config import EngineConfig, load_config
    d = {"cache": {"enabled": np.bool_(False)}, "memory": {"mlock": np.bool_(False)},
         "serve": {"place": np.bool_(True)}, "placement": {"allow_priority_above_80": np.False_}}
    c = EngineConfig.from_dict(d)
    for v in (c.cache.enabled, c.memory.mlock, c.serve.place, c.placement.allow_priority_above_80):
        assert type(v) is bool
    assert (c.cache.enabled, c.memory.mlock, c.serve.place) == (False, False, True)
    assert load_config(d) == c
    m = _scaler_mlp()
    e = Engine(m, config={"cache": {"enabled": np.bool_(False)}})
    assert e.config.cache.enabled is False
    e.close()
    # still no bool for a number, nor a number for a bool
    with pytest.raises(fastpath.ConfigError, match="engine.n_symbols must be int"):
        EngineConfig(n_symbols=np.bool_(True))
    with pytest.raises(fastpath.ConfigError, match="cache.enabled must be bool"):
        EngineConfig(cache={"enabled": np.int64(1)})


# ------------------------------------------------- GpuEngine.step_batch refusals before any row

def test_gpu_engine_refusals_before_any_row_carry_applied_and_a_list(monkeypatch):
    """A refusal mid-batch carries .applied and .result (a list of GpuTicks); one before any
    row had no .applied (its own checks: AttributeError) or the Engine's BatchResult as
    .result (the engine's pre-check), so `exc.result` was of two types or missing."""
    pytest.importorskip("helpers.fake_cuda")
    from helpers.fake_cuda import FakeCuda, _fake_pycuda
    from fastpath.gpu import GpuEngine, gpu_status

    _fake_pycuda(monkeypatch, FakeCuda())
    gpu_status.cache_clear()
    m = _scaler_mlp(seed=5)
    raws = _prices(4, seed=6)
    try:
        with GpuEngine(m, {"engine": {"n_symbols": 2}}, mode="launch") as ge:
            ge.step(raws[0], 0, 100)
            cases = [(np.array([0, 1, 5, 0]), None, "out of range|symbol"),    # its own check
                     (np.zeros(4, np.int64), np.array([200, 50, 300, 400]), "earlier|before"),
                     (np.zeros(4, np.int64), np.array([10, 200, 300, 400]), "earlier")]
            for syms, ts, what in cases:
                with pytest.raises(InputError, match=what) as ei:
                    ge.step_batch(raws, syms, ts)
                assert ei.value.applied == 0 and ei.value.result == []
            assert ge.engine.ticks == 1
    finally:
        gpu_status.cache_clear()


# ------------------------------------------------- a persistent start refused after its check

def test_persistent_backend_refused_at_start_frees_its_device_memory(monkeypatch, fake_fatbin):
    """The constructor checks the room for its grid before allocating; start() claims it, and
    refuses when another kernel took it in between. The refused path's device buffers were
    dropped unfreed (no finalizer covers a path that never ran) while the other backends kept
    the primary context: device memory lost per refusal."""
    pytest.importorskip("test_review22_misc")
    from helpers.fake_cuda import OccCuda, _wide
    from fastpath.errors import BackendError
    from fastpath.gpu import GpuBackend
    from fastpath.gpu import _backend as B
    cu = OccCuda(sm=4, fn={"NUM_REGS": 128})
    kw = dict(cuda=cu, timeout_ns=5 * 10**9)
    a = GpuBackend(_wide(1), "persistent", **kw)
    b = GpuBackend(_wide(2), "persistent", **kw)
    allocs = []
    real = cu.mem_alloc

    def tracked(n):
        allocs.append(real(n))
        return allocs[-1]

    try:
        # the race: the check passes, then the room is gone when start() claims it
        monkeypatch.setattr(B.ResidentKernels, "check", lambda self, *a: None)
        monkeypatch.setattr(cu, "mem_alloc", tracked)
        with pytest.raises(BackendError, match="cannot start another persistent GPU kernel"):
            GpuBackend(_wide(3), "persistent", **kw)
        assert allocs and all(x.freed for x in allocs)
        assert B.resident_kernels(cu, 0).running() == [4, 4] and cu.depth == 0
    finally:
        a.close(), b.close()
    assert B.resident_kernels(cu, 0).running() == []
