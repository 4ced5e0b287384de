"""The GPU stage: the model's forward pass on an NVIDIA GPU through pycuda, features and the
cache staying on the CPU. `import fastpath` (and this package) never imports pycuda.

Design: gpu_status() is one cached probe, (ok, reason). Without a driver `import
pycuda.driver` raises ImportError (it links libcuda.so.1); with a driver and no device,
cuda.init() raises a pycuda.driver.Error subclass; both become (False, reason).
GpuBackend runs the model (the launch path or the persistent path, fastpath.gpu._backend).
fastpath.Engine(model, backend="gpu" | "auto") puts it behind the engine's validation,
features, cache, post transform, head and store: the GPU tick (fastpath.gpu._tick) drives the
engine's split tick (fp_step_begin / fp_step_finish). This package sits above the engine and
registers, when imported, how an engine chooses the GPU (resolve_backend) and opens its stage
(fastpath._resolve.register_gpu_stage); the engine never imports it.
GpuEngine is a compatibility wrapper over that engine, plus a batched-launch step_batch.
"""
from __future__ import annotations

import functools
import os
import time
from dataclasses import replace
from typing import Any, NamedTuple

import numpy as np

from fastpath import _kernels
import fastpath._engine as _engine
from fastpath._batch import stopped_note
from fastpath._core import best_isa
from fastpath._resolve import register_gpu_stage
from fastpath.config import load_config
from fastpath.errors import BackendError, ConfigError, FastpathError, InputError
from fastpath.gpu import _backend as B
from fastpath.gpu import _tick
from fastpath.gpu._pack import MAX_LAYERS, pack
from fastpath.gpu._refusal import gpu_refusal
from fastpath.model import Layer, Model


def _cpu_outputs(eng, x, nan):
    """The CPU backend's model outputs for features x (the first layer's inputs, as
    Engine.features makes them), or nan where it refuses them too. Not Engine.predict, which
    takes the model's input and would apply an input scaler a second time."""
    try:
        return eng._predict_features(x)
    except InputError:
        return nan

MODES = ("launch", "persistent")
_MAX_TIMEOUT_NS = (1 << 63) - 1


def _driver_error(what: str, exc: BaseException) -> BackendError:
    """A pycuda.driver.Error raised while the GPU backend is set up, as a BackendError."""
    return BackendError(f"{what} ({type(exc).__name__}: {exc})")


def _positive_ns(v) -> bool:
    return (isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
            and bool(np.isfinite(v)) and v >= 1)


@functools.lru_cache(maxsize=1)
def gpu_status() -> tuple:
    try:
        import pycuda.driver as cuda
    except Exception as exc:  # noqa: BLE001 - ImportError, and what a broken build raises
        # not only ImportError: a pycuda built against another CUDA or numpy can fail at
        # import with anything, and backend="auto" must still fall back to the CPU
        what = "" if isinstance(exc, ImportError) else f"{type(exc).__name__}: "
        return False, (f"pycuda not importable ({what}{exc}); install fastpath[gpu] on a host "
                       f"with a driver")
    try:
        # read when the driver starts: kernels load with their module, never lazily beside a
        # spinning persistent kernel (DeviceContext)
        os.environ.setdefault("CUDA_MODULE_LOADING", "EAGER")
        cuda.init()
        n = cuda.Device.count()
        name = cuda.Device(0).name() if n else ""
    except Exception as exc:  # noqa: BLE001 - pycuda.driver.Error and subclasses
        return False, f"CUDA init failed ({type(exc).__name__}: {exc})"
    if n < 1:
        return False, "no CUDA device"
    return True, f"{n} CUDA device(s), device 0: {name}"


def gpu_mode(config: Any) -> str:
    """The GPU mode a config asks for ({"gpu": {"mode": ...}}, default "launch")."""
    sec = (config or {}).get("gpu", {}) if isinstance(config, dict) else {}
    mode = sec.get("mode", "launch") if isinstance(sec, dict) else None
    if mode not in MODES:
        raise ConfigError(f"gpu.mode must be one of {list(MODES)}, got {mode!r}")
    return mode


class GpuBackend:
    """The model on device `device`: weights uploaded once, buffers allocated once.

    mode "launch": per call pinned H2D -> one kernel launch -> pinned D2H on one stream,
    each stage timed with CUDA events; infer_batch sends up to max_batch rows per launch.
    mode "persistent": a kernel launched at construction serves a slot in mapped host memory;
    infer is one C call (write features, publish, spin for the answer, with a deadline). Its
    grid stays resident while it runs: one that cannot be resident beside the persistent
    kernels already running on the device in this process is a BackendError at construction.
    close() (or the context manager) stops the kernel and frees the device memory.

    Nothing is allocated while a persistent kernel runs in the process (the driver call could
    wait on it forever): making a backend then is a BackendError. Make every backend first,
    persistent ones with start=False, then start() each. All backends of a device share one
    primary context, released at exit."""

    def __init__(self, model, mode: str = "launch", device: int = 0, max_batch: int = 1024,
                 timeout_ns: int = 1_000_000_000, cuda=None, start: bool = True):
        if mode not in MODES:
            raise ConfigError(f"gpu mode must be one of {list(MODES)}, got {mode!r}")
        if not _positive_ns(timeout_ns):
            # 0 or less made every answer late (launch: a BackendError after one poll;
            # persistent: an InputError from each request), only found at the first tick
            raise ConfigError(f"timeout_ns must be a number of ns >= 1 (how long a GPU answer "
                              f"may take), got {timeout_ns!r}")
        timeout_ns = int(timeout_ns)
        if isinstance(model, Model):
            # a tree ensemble was "the GPU kernels take 1..8 layers, got 0"; bf16 / int8
            # hidden layers ran in fp32 here, answering otherwise than the model's CPU engine
            why = gpu_refusal(model)
            if why:
                raise BackendError(f"GpuBackend: {why}")
        if timeout_ns > _MAX_TIMEOUT_NS:
            # the persistent path's waits take a C int64: past it an OverflowError at start
            raise ConfigError(f"timeout_ns must be at most 2**63 - 1 ns (about 292 years), got "
                              f"{timeout_ns!r}")
        if cuda is None:
            ok, why = gpu_status()
            if not ok:
                raise BackendError(f"no usable GPU: {why}")
            import pycuda.driver as cuda
        layers = getattr(model, "layers", model)
        self.packed = pack(layers)
        self._xshape = (self.packed.n_in,)
        self.path = None
        self.mode = mode
        # a driver error setting the device up (its context: a device in exclusive-process
        # mode held by another process, "all CUDA-capable devices are busy or unavailable";
        # device memory: out of memory; a launch the device refuses) is a BackendError that
        # names it, so backend="auto" takes the CPU; raised as pycuda's own error, it escaped
        # Engine(backend="auto") past gpu_status(), which makes no context
        try:
            # one context per device and process, shared by every backend, released at exit
            self.dc = B.shared_context(cuda, device)
        except cuda.Error as exc:
            raise _driver_error(f"CUDA device {device} cannot be used", exc) from None
        try:
            # nothing is allocated or loaded beside a running persistent kernel (it may wait
            # on it forever): refused before the module load and the allocations
            self.dc.refuse_while_spinning(f"set up a GPU {mode} path")
            module, self.module_origin = self.dc.module()
            self.info = self.dc.info()
            if mode == "launch":
                self.path = B.LaunchPath(self.dc, module, self.packed, max_batch, timeout_ns)
            else:
                self.path = B.PersistentPath(self.dc, module, self.packed, timeout_ns)
        except BaseException as exc:
            # no kernels, a refused max_batch, no memory: this backend no longer uses the
            # context (the primary context itself stays until exit)
            self.path = None
            B.drop_user(self.dc)
            if isinstance(exc, cuda.Error):
                raise _driver_error(f"the GPU {mode} path could not be set up on CUDA device "
                                    f"{device}", exc) from None
            raise
        self._cuda = cuda
        self._module = module
        if mode == "persistent" and start:
            self.start()

    def start(self) -> None:
        """Launch the persistent kernel (made with start=False: every backend is made before
        any persistent kernel runs, then each started). A no-op once it runs."""
        if self.mode != "persistent":
            raise BackendError("start() launches a persistent kernel; this backend is in "
                               f"{self.mode!r} mode")
        path, cuda = self._open_path(), self._cuda
        try:
            path.start()
        except (BackendError, cuda.Error) as exc:
            self.path = None
            if not path.running:
                # never launched (start refused it: another persistent kernel took the
                # room) or stopped after a failed start: its memory goes now (or when the
                # running kernels return). One whose kernel may still run keeps it
                try:
                    path.close()
                except (BackendError, cuda.Error):
                    pass
            B.drop_user(self.dc)
            if isinstance(exc, cuda.Error):
                raise _driver_error(f"the persistent kernel could not be launched on CUDA "
                                    f"device {self.dc.ordinal}", exc) from None
            raise

    @property
    def macs(self) -> int:
        return self.packed.macs

    def _open_path(self):
        if self.path is None:
            raise BackendError("this GpuBackend was closed; make a new one")
        return self.path

    def infer(self, x: np.ndarray) -> tuple:
        """features (n_in,) float32 -> (outputs (n_out,), nonfinite: bool, Timing). The
        features are the first layer's inputs, as Engine.features makes them: a model's input
        scaler is not run here (it is part of the feature stage), and the outputs are the last
        layer's, before the post transform."""
        path = self.path
        if path is None:
            raise BackendError("this GpuBackend was closed; make a new one")
        x = np.ascontiguousarray(x, np.float32)
        if x.shape != self._xshape:
            raise InputError(f"x must hold the model's {self.packed.n_in} features (shape "
                             f"({self.packed.n_in},)), got shape {x.shape}")
        return path.infer(x)

    def infer_batch(self, X: np.ndarray) -> tuple:
        """rows (n, n_in) -> (outputs (n, n_out), nonfinite (n,), [Timing per launch]);
        launch mode sends max_batch rows per launch, persistent mode one request per row."""
        self._open_path()
        X = np.ascontiguousarray(X, np.float32)
        if X.ndim != 2 or X.shape[1] != self.packed.n_in:
            raise InputError(f"X must be rows of the model's {self.packed.n_in} features (shape "
                             f"(n, {self.packed.n_in})), got shape {X.shape}")
        if len(X) == 0:
            return (np.empty((0, self.packed.n_out), np.float32), np.empty(0, bool), [])
        if self.mode == "persistent":
            outs = [self.path.infer(x) for x in X]
            return (np.array([o[0] for o in outs]).reshape(len(X), -1),
                    np.array([o[1] for o in outs], bool), [o[2] for o in outs])
        ys, bads, ts = [], [], []
        for i in range(0, len(X), self.path.max_batch):
            self.path.submit(X[i:i + self.path.max_batch])
            y, bad, t = self.path.collect()
            ys.append(y), bads.append(bad), ts.append(t)
        return np.concatenate(ys), np.concatenate(bads), ts

    def close(self) -> None:
        """Stop the persistent kernel, free this backend's memory (later, while other
        persistent kernels run) and leave the shared context (released at exit)."""
        if self.path is not None:
            try:
                self.path.close()
            finally:
                self.path = None
                B.drop_user(self.dc)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# what auto_choice's two figures are, in the words its reason and backend_report give
AUTO_MEASURE = ("the inference a tick that misses the cache pays, from the features to the last "
                "layer's outputs (the post transform after it is the same C code on both): cpu "
                "= the engine's C forward, timed in C around the call; gpu = the "
                "GpuBackend.infer call the engine makes (the host round trip, its Python "
                "included), timed around the call from Python less an empty timed region; each "
                "the p50 of single calls on CLOCK_MONOTONIC after a warm-up")


def _call_p50_ns(fn, x, iters: int) -> int:
    """p50 ns of single calls fn(x), each timed around the call with time.perf_counter_ns
    (CLOCK_MONOTONIC, the clock the CPU figure's C timer reads), less the p50 of an empty
    timed region (the timer's own cost, which a C timer around a C call does not pay)."""
    pc = time.perf_counter_ns
    calls = np.empty(iters, np.int64)
    empty = np.empty(iters, np.int64)
    for i in range(iters):
        t0 = pc()
        fn(x)
        t1 = pc()
        t2 = pc()
        calls[i] = t1 - t0
        empty[i] = t2 - t1
    return max(int(np.median(calls)) - int(np.median(empty)), 1)


def _auto_layers(model) -> tuple:
    """(dense layers, refusal or None) of what auto_choice was given: a fastpath.Model (a tree
    ensemble or reduced weights: the GPU stage's refusal, as Engine(backend="auto") gives it)
    or a sequence of its Layers."""
    if isinstance(model, Model):
        return model.layers, gpu_refusal(model)
    layers = tuple(model) if isinstance(model, (list, tuple)) else None
    if layers is None or not all(isinstance(L, Layer) for L in layers):
        raise InputError(f"model must be a fastpath.Model or a sequence of fastpath.model.Layer, "
                         f"got {type(model).__name__}")
    if not 1 <= len(layers) <= MAX_LAYERS:
        return layers, (f"{len(layers)} layers; the GPU kernels take 1..{MAX_LAYERS} (run it "
                        f"with backend='cpu')")
    return layers, None


def auto_choice(model, mode: str = "launch", iters: int = 300, isa: str | None = None,
                cuda=None, device: int = 0) -> dict:
    """What backend="auto" should run: the inference a tick that misses the cache pays on
    this CPU (the engine's kernel set) and, when a GPU is usable, on the GPU in `mode`, timed
    alike (AUTO_MEASURE); the faster at p50 wins, a tie keeps the CPU.

    Both figures are what the engine's tick pays between its features and the post
    transform, timed around that call on CLOCK_MONOTONIC: on the CPU the C forward, called
    from C (PackedMLP.time_forward times one such call in C); on the GPU the
    GpuBackend.infer call the engine makes from Cython, whose Python (the argument checks,
    the path's submit and collect, the output copy) the tick pays on every miss. Timing.total_ns,
    the GPU figure before, left part of that call out (launch: the checks, the grid and the
    copy; persistent: everything but the C wait), so it under-counted what the GPU costs a tick.

    model: a fastpath.Model or a sequence of its Layers. A model the GPU stage does not run
    (a tree ensemble, bf16/int8 hidden layers, more layers than its kernels take) is not
    measured: the CPU, with the reason. Returns {"backend", "reason", "cpu_p50_ns",
    "gpu_p50_ns", "mode", "measure"}; the reason names both figures and what they are, or
    why the GPU was not measured."""
    if isinstance(iters, bool) or not isinstance(iters, (int, np.integer)) or iters < 1:
        raise ConfigError(f"iters must be an int >= 1 (timed calls per backend), got {iters!r}")
    iters = int(iters)
    layers, refusal = _auto_layers(model)
    out = {"backend": "cpu", "mode": mode, "cpu_p50_ns": None, "gpu_p50_ns": None,
           "measure": AUTO_MEASURE}
    if refusal:
        out["reason"] = f"auto: cpu chosen ({refusal})"
        return out
    isa = isa or best_isa()
    m = _kernels.PackedMLP([L.weight for L in layers], [L.bias for L in layers],
                  [L.activation for L in layers], isa)
    x = np.zeros(m.n_in, np.float32)
    for _ in range(min(iters, 50)):
        m.time_forward(x, 1)
    cpu = max(int(np.median([m.time_forward(x, 1) for _ in range(iters)])), 1)
    out["cpu_p50_ns"] = cpu
    if cuda is None:
        ok, why = gpu_status()
        if not ok:
            out["reason"] = f"auto: cpu chosen ({why})"
            return out
    try:
        with GpuBackend(layers, mode, device, cuda=cuda) as be:
            for _ in range(min(iters, 50)):
                be.infer(x)
            gpu = _call_p50_ns(be.infer, x, iters)
    except BackendError as exc:
        out["reason"] = f"auto: cpu chosen (the GPU {mode} path failed: {exc})"
        return out
    out["gpu_p50_ns"] = gpu
    won = "gpu" if gpu < cpu else "cpu"
    out["backend"] = won
    dims = "x".join(str(d) for d in [layers[0].weight.shape[1]]
                    + [L.weight.shape[0] for L in layers])
    out["reason"] = (f"auto: {won} chosen (inference a cache miss pays, p50 of {iters} single "
                     f"calls on CLOCK_MONOTONIC: cpu {cpu} ns, the C forward on {isa} timed in "
                     f"C; gpu {mode} {gpu} ns, the GpuBackend.infer round trip with its Python, "
                     f"timed around the call; {dims}, "
                     f"{sum(L.weight.size for L in layers)} multiply-adds)")
    return out


def resolve_backend(m: Any, cfg: Any, backend: str, simd: str) -> tuple:
    """What Engine(backend="gpu" | "auto") runs: (backend "cpu" | "gpu", reason in words,
    auto's measurement or None).

    backend="gpu": the GPU or an error (BackendError: no usable GPU, or a model the GPU stage
    does not serve). backend="auto" takes the GPU only where all hold: gpu_status() is ok,
    the model is an fp32 MLP, and [gpu] auto says so: auto = "gpu" takes it without measuring,
    auto = "measure" (the default) times the inference a cache miss pays on this CPU's kernel
    set and on the GPU in [gpu] mode, alike (auto_choice), and keeps the faster at p50.
    Anything else: the CPU, and the reason says which condition failed
    (Engine.backend_reason, Engine.backend_report). gpu_status and auto_choice are looked up
    per call, so that they stay replaceable."""
    refusal = gpu_refusal(m, cfg)
    ok, why = gpu_status()
    if backend == "gpu":
        if refusal:
            raise BackendError(f"backend='gpu': {refusal}")
        if not ok:
            raise BackendError(f"backend='gpu' is not available: {why}")
        return "gpu", f"gpu requested ({why}; mode {cfg.gpu.mode})", None
    if not ok:
        return "cpu", f"auto: cpu chosen ({why})", None
    if refusal:
        return "cpu", f"auto: cpu chosen ({refusal})", None
    if cfg.gpu.auto == "gpu":
        return "gpu", f"auto: gpu chosen (gpu.auto = 'gpu'; {why}; mode {cfg.gpu.mode})", None
    c = auto_choice(m, cfg.gpu.mode, isa=simd, device=cfg.gpu.device)
    return c["backend"], c["reason"], c


def open_stage(engine) -> _tick.GpuStage:
    """The GPU stage of `engine` (its backend resolved to "gpu"), under its [gpu] config: a
    GpuBackend (looked up per call, so that it stays replaceable) behind the GPU tick."""
    g = engine.config.source.gpu
    backend = GpuBackend(engine.model, g.mode, g.device, max_batch=g.max_batch,
                         timeout_ns=g.timeout_ms * 1_000_000)
    return _tick.GpuStage(engine, backend)


register_gpu_stage(resolve_backend, open_stage)


class GpuTick(NamedTuple):
    """One tick through GpuEngine: the engine's Result and its GPU stages (0 on a cache hit:
    the GPU was not called); total_ns is the host time of the whole call, Python included."""
    result: Any
    h2d_ns: int
    infer_ns: int
    d2h_ns: int
    total_ns: int


def _with_gpu(config: Any, **over):
    """config (None, dict, TOML path or EngineConfig) as an EngineConfig whose [gpu] keys
    given in `over` (not None) replace the config's; replace() validates them again."""
    c = load_config(config)
    return replace(c, gpu=replace(c.gpu, **{k: v for k, v in over.items() if v is not None}))


def _check_batch(eng, raws, symbols, ts_ns) -> tuple:
    """GpuEngine.step_batch's arguments checked before any row is sent or applied, as
    Engine.step_batch checks its own: (raws, symbols, ts or None). A row the engine would
    refuse for itself (non-finite values, a symbol out of range, time going backwards within
    the batch) is refused here, with the engine's own words where it has them."""
    def describe(a):
        return f"{type(a).__name__} {getattr(a, 'dtype', '')} shape {np.shape(a)}"
    R = raws
    rl = eng.raw_len
    if not (isinstance(R, np.ndarray) and R.dtype == np.float32 and R.ndim == 2
            and R.shape[1] == rl and R.flags.c_contiguous):
        raise InputError(f"raws must be a float32 C-contiguous array of shape (n, {rl}), got "
                         f"{describe(R)}; pass np.ascontiguousarray(raws, dtype=np.float32)")
    n = R.shape[0]
    S = np.asarray(symbols)
    if S.ndim != 1 or S.shape[0] != n or (n and S.dtype.kind not in "iu"):
        raise InputError(f"symbols must be an integer array of shape ({n},), got "
                         f"{describe(S)}")
    T = None
    if ts_ns is not None:
        T = np.asarray(ts_ns)
        if T.ndim != 1 or T.shape[0] != n or (n and T.dtype.kind not in "iu"):
            raise InputError(f"ts_ns must be an integer array of shape ({n},), got "
                             f"{describe(T)}")
        T = T.astype(np.int64) if n else np.empty(0, np.int64)
    if n == 0:
        return R, np.empty(0, np.int64), T
    S = S.astype(np.int64)
    out = (S < 0) | (S >= eng.n_symbols)
    bad = out | ~np.isfinite(R).all(axis=1)
    if T is not None:
        bad |= T < 0
    if bad.any():
        i = int(np.argmax(bad))
        if T is not None and T[i] < 0 and not out[i]:
            raise InputError(f"ts_ns must be >= 0, row {i} is {T[i]}; no row was applied")
        try:
            eng.features(R[i], int(S[i]))     # the engine's own refusal of this row
        except InputError as exc:
            raise InputError(f"row {i}: {exc}; no row was applied") from None
        raise InputError(f"row {i} is refused (non-finite raw or symbol {S[i]} out of range "
                         f"0..{eng.n_symbols - 1}); no row was applied")
    if T is not None and n > 1:
        order = np.lexsort((np.arange(n), S))      # by symbol, each symbol's rows in order
        back = (np.diff(T[order]) < 0) & (np.diff(S[order]) == 0)
        if back.any():
            # the first offending row in batch order among all the backward steps
            rows = order[1:][back]
            i = int(rows.min())
            prev = int(order[:-1][back][rows == i][0])
            raise InputError(f"ts_ns row {i} is {T[i]}, before row {prev}'s {T[prev]} for "
                             f"symbol {S[i]}: time going backwards; no row was applied")
    return R, S, T


class GpuEngine:
    """fastpath.Engine(model, backend="gpu") behind the older interface: step() returns a
    GpuTick, step_batch() sends many rows per launch (launch mode). mode, device, max_batch and
    timeout_ns override the config's [gpu] keys. New code can use the Engine directly."""

    def __init__(self, model, config: Any = None, mode: str | None = None,
                 device: int | None = None, max_batch: int | None = None,
                 timeout_ns: int | None = None):
        if mode is not None and mode not in MODES:
            raise ConfigError(f"gpu mode must be one of {list(MODES)}, got {mode!r}")
        if timeout_ns is not None and not _positive_ns(timeout_ns):
            # it became 1 ms (the config's floor) without a word for 0 or a negative value
            raise ConfigError(f"timeout_ns must be a number of ns >= 1, got {timeout_ns!r}")
        tmo = None if timeout_ns is None else -(-int(timeout_ns) // 1_000_000)
        cfg = _with_gpu(config, mode=mode, device=device, max_batch=max_batch, timeout_ms=tmo)
        self.engine = _engine.Engine(model, backend="gpu", config=cfg)
        self.backend = self.engine.gpu_backend
        self.mode = self.backend.mode

    def step(self, raw, symbol: int = 0, ts_ns=None) -> GpuTick:
        t0 = time.perf_counter_ns()
        res = self.engine.step(raw, symbol, ts_ns)
        lat = res.latency
        kern = lat.infer_ns if not res.cached else 0
        return GpuTick(res, lat.h2d_ns, kern, lat.d2h_ns, time.perf_counter_ns() - t0)

    def step_batch(self, raws: np.ndarray, symbols: np.ndarray, ts_ns=None) -> list:
        """Ticks in order, the GPU work in launches of many rows. A tick's features depend on
        its symbol's earlier ticks (the rolling windows), so with windows a launch holds at
        most one tick per symbol (the cache lookup is the engine's, done when the row is
        applied: a GPU answer for a row that hits is not used); with stateless features (no window
        fields) the features of the next launch are computed while the GPU works on this one
        (launch mode). The features are computed twice per row here (once for the launch,
        once when the row is applied): the price of sending rows before any is applied;
        Engine.step_batch computes them once and calls the GPU per miss."""
        eng = self.engine
        if eng.gpu_backend is None:
            raise BackendError("this GPU engine was closed; make a new GpuEngine")
        try:
            raws, symbols, ts = _check_batch(eng, raws, symbols, ts_ns)
            # and the engine's own pre-check, which also sees a row behind the engine's last
            # tick of its symbol (the check above sees time order within the batch only: such
            # a row was refused after the rows before it had been applied, where
            # Engine.step_batch applies none)
            eng._check_batch(raws, symbols, ts)
        except BaseException as exc:
            # every refusal carries what a refusal mid-batch carries, in this method's types:
            # the checks above left none (exc.applied was an AttributeError) or the engine's
            # empty BatchResult where a refusal mid-batch gives a list of GpuTicks; so does a
            # signal handler's exception (Ctrl-C) during them
            exc.applied = 0
            exc.result = []
            raise
        n = len(raws)
        fs = eng.model.feature_spec
        stateless = fs is None or len(fs.w_idx) == 0
        cap = self.backend.path.max_batch if self.mode == "launch" else 1
        chunks, cur, seen = [], [], set()
        for i in range(n):
            s = int(symbols[i])
            if len(cur) == cap or (not stateless and s in seen):
                chunks.append(cur)
                cur, seen = [], set()
            cur.append(i)
            seen.add(s)
        if cur:
            chunks.append(cur)
        nan = np.full(eng.n_outputs, np.nan, np.float32)
        out = []
        # busy for other threads for the whole batch, as Engine.step_batch is: a launch
        # releases the GIL, and another thread's tick between the launch's features and the
        # rows' application moved the windows under them
        eng._hold()
        try:
            self._run_chunks(raws, symbols, ts, chunks, stateless, nan, out)
        except FastpathError as exc:
            note = f"; rows 0..{len(out) - 1} were applied" if out else "; no row was applied"
            err = type(exc)(str(exc) + note)
            # as Engine.step_batch's refusals: how many rows went in and their answers (the
            # rows moved the windows and the cache; stepping them again applies them twice)
            err.applied = len(out)
            err.result = list(out)
            raise err from None
        except BaseException as exc:
            # a signal handler's exception (Ctrl-C's KeyboardInterrupt) between two rows or in
            # a launch: the rows in `out` are the rows applied (_step_external appends a
            # row's answer before it returns), as a refusal says
            exc.applied = len(out)
            exc.result = list(out)
            exc.add_note(stopped_note(len(out), n))
            raise
        finally:
            eng._release()
            path = self.backend.path
            if self.mode == "launch" and path is not None and path._inflight:
                # a chunk sent and never collected (an error between the two) would refuse
                # every later launch ("a batch is already in flight"): take it back
                try:
                    path.collect()
                except BackendError:
                    pass
        return out

    def _run_chunks(self, raws, symbols, ts, chunks, stateless, nan, out) -> None:
        eng = self.engine
        feats = self._features(raws, symbols, chunks[0]) if chunks else None
        for k, idx in enumerate(chunks):
            if self.mode == "launch":
                self.backend.path.submit(feats)
                # overlap: only stateless features may be computed before this chunk applies
                nxt = (self._features(raws, symbols, chunks[k + 1])
                       if stateless and k + 1 < len(chunks) else None)
                y, bad, t = self.backend.path.collect()
            else:
                y, bad, tl = self.backend.infer_batch(feats)
                t = tl[0]
                nxt = None
            gpu_ns = (t.h2d_ns + t.infer_ns + t.d2h_ns) // len(idx)
            for j, i in enumerate(idx):
                # a row the GPU flagged (a layer's float32 sums overflowed) is answered as the
                # CPU backend answers it: its model re-sums such a layer in double and refuses
                # only a pre-activation past float32's range (NaN outputs: the engine refuses
                # the tick, as on the CPU)
                o = _cpu_outputs(eng, feats[j], nan) if bad[j] else _tick.post_apply(eng, y[j])
                eng._step_external(raws[i], int(symbols[i]), o, gpu_ns,
                                   None if ts is None else int(ts[i]), into=out)
            if k + 1 < len(chunks):
                feats = nxt if nxt is not None else self._features(raws, symbols, chunks[k + 1])

    def _features(self, raws, symbols, idx) -> np.ndarray:
        return np.stack([self.engine.features(raws[i], int(symbols[i])) for i in idx])

    def close(self) -> None:
        self.engine.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
