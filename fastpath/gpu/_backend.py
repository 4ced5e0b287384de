"""pycuda backend: the device context, the kernels' module, the launch path and the persistent
path. Imported only when a GPU backend is asked for; `import fastpath` never gets here.

Design: every call into the driver runs inside `DeviceContext.current()`, which pushes the
device's primary context and pops it in a finally, so any thread may call and none leaves a
context behind. Everything a tick needs is allocated once (device buffers, page-locked host
buffers, events, a non-blocking stream); a tick is three async operations and one event wait
on the launch path, and one C call on mapped memory (fastpath.gpu._protocol) on the
persistent path. Driver objects come from the `cuda` argument (pycuda.driver in use), so the
logic here is tested with a stand-in where no GPU exists.
"""
from __future__ import annotations

import os
import time
import weakref
from contextlib import contextmanager
from typing import NamedTuple

import numpy as np

from fastpath.errors import BackendError, ConfigError, InputError
from fastpath.gpu._pack import PackedNet

HERE = os.path.dirname(os.path.abspath(__file__))
FATBIN = os.path.join(HERE, "fp_mlp.fatbin")
BLOCK = 256                      # 8 warps a block; one warp per output row
WARPS_PER_BLOCK = BLOCK // 32
STREAM_NON_BLOCKING = 1          # CU_STREAM_NON_BLOCKING: no implicit sync with stream 0
DEFAULT_TIMEOUT_NS = 1_000_000_000


class Timing(NamedTuple):
    """ns of one GPU call. Launch path: h2d, infer (kernel) and d2h from CUDA events, total on
    the host clock. Persistent path: infer from the device's %globaltimer (request seen to
    answer published), h2d = the rest of the round trip (the doorbell's and the features'
    trip over PCIe, the answer's write back; one figure: the path cannot split it), d2h = 0."""
    h2d_ns: int
    infer_ns: int
    d2h_ns: int
    total_ns: int


def kernel_sources() -> tuple:
    """(path of fp_mlp.cu, include dirs): beside this module in an installed wheel, under
    csrc/ in a source tree."""
    if os.path.exists(os.path.join(HERE, "fp_mlp.cu")):
        return os.path.join(HERE, "fp_mlp.cu"), [HERE]
    csrc = os.path.normpath(os.path.join(HERE, "..", "..", "csrc"))
    cu = os.path.join(csrc, "cuda", "fp_mlp.cu")
    if os.path.exists(cu):
        return cu, [csrc]
    raise BackendError("the CUDA kernel source fp_mlp.cu is not installed and no fatbin was "
                       "built: reinstall fastpath (with nvcc on PATH for a prebuilt fatbin)")


def cache_dir() -> str:
    return os.environ.get("FASTPATH_CUDA_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "fastpath", "cuda")


def load_module(cuda, fatbin: str = FATBIN, source_module=None) -> tuple:
    """(module, origin): the packaged fatbin through module_from_buffer when it exists and
    loads, else fp_mlp.cu compiled by pycuda.compiler.SourceModule (cached on disk). origin
    says which, and why the fatbin was not used."""
    why = "no fatbin was built (nvcc absent at install)"
    if os.path.exists(fatbin):
        with open(fatbin, "rb") as f:
            blob = f.read()
        try:
            return cuda.module_from_buffer(blob), f"fatbin {fatbin}"
        except cuda.Error as exc:   # e.g. a driver older than the toolkit that built it
            why = f"the fatbin did not load ({type(exc).__name__}: {exc})"
    cu, incs = kernel_sources()
    cdir = cache_dir()
    try:
        if source_module is None:
            from pycuda.compiler import SourceModule as source_module
        with open(cu) as f:
            src = f.read()
        os.makedirs(cdir, exist_ok=True)
        mod = source_module(src, no_extern_c=True, include_dirs=incs, cache_dir=cdir)
    except Exception as exc:  # noqa: BLE001 - CompileError, nvcc absent (OSError), ImportError
        # a host with a driver but no CUDA toolkit (the usual production GPU host) cannot
        # compile: a BackendError, so backend="auto" falls back to the CPU and says why
        raise BackendError(f"the GPU kernels cannot be loaded: {why}, and compiling {cu} at "
                           f"run time failed ({type(exc).__name__}: {str(exc)[:500]}); "
                           f"install fastpath where nvcc is on PATH so it ships a fatbin, "
                           f"or put nvcc on PATH here") from None
    return mod, f"SourceModule, cached in {cdir} ({why})"


def pci_numa_node(bus_id: str) -> int:
    """NUMA node of a PCI device from sysfs; -1 when the kernel does not say."""
    try:
        with open(f"/sys/bus/pci/devices/{bus_id.lower()}/numa_node") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return -1


class DeviceContext:
    """One device's primary context; `with ctx.current():` around every driver call."""

    def __init__(self, cuda, ordinal: int = 0):
        self.cuda = cuda
        cuda.init()
        if ordinal >= cuda.Device.count():
            raise BackendError(f"CUDA device {ordinal} requested, {cuda.Device.count()} present")
        self.device = cuda.Device(ordinal)
        self.ctx = self.device.retain_primary_context()
        self.sm_count = int(self.device.get_attribute(
            cuda.device_attribute.MULTIPROCESSOR_COUNT))

    @contextmanager
    def current(self):
        self.ctx.push()
        try:
            yield
        finally:
            self.cuda.Context.pop()

    def info(self) -> dict:
        bus = self.device.pci_bus_id()
        drv = self.cuda.get_driver_version()
        return {"device": self.device.name(), "pci_bus_id": bus,
                "driver": f"{drv // 1000}.{drv % 1000 // 10}",
                "compute_capability": "%d.%d" % self.device.compute_capability(),
                "sm_count": self.sm_count, "numa_node": pci_numa_node(bus)}

    def release(self):
        self.ctx.detach()


SMALL_MACS = 1 << 16


def grid_for(sm_count: int, items: int, macs: int) -> int:
    """Blocks for `items` warp-sized work items: enough warps for all, never more blocks than
    SMs (the kernels' grid barrier needs every block resident at once). A model of at most
    SMALL_MACS multiply-adds per row runs in one block: its barriers are then __syncthreads
    (tens of ns) instead of grid barriers through L2 atomics (about a microsecond each),
    which cost more than the warps they would add."""
    if macs <= SMALL_MACS:
        return 1
    want = -(-max(items, 1) // WARPS_PER_BLOCK)
    return max(1, min(sm_count, want))


# The kernel counts a launch's work items (rows x a layer's width) and walks them in 32-bit
# ints: past this a batch's count wraps negative and the layer is skipped, leaving the
# previous launch's outputs in place (silently wrong), so such a batch size is refused. The
# margin keeps `it += n_warps` below INT_MAX as well.
MAX_ITEMS = (1 << 31) - (1 << 20)


def max_batch_for(p: PackedNet) -> int:
    """The most rows one launch of this model may carry (the kernel's 32-bit item count)."""
    return MAX_ITEMS // max(p.dims[1:])


class LaunchPath:
    """One launch per call: pinned H2D, the kernel, pinned D2H on one stream, with events."""

    def __init__(self, dc: DeviceContext, module, p: PackedNet, max_batch: int = 1024,
                 timeout_ns: int = DEFAULT_TIMEOUT_NS):
        cuda = self.cuda = dc.cuda
        if not 1 <= int(max_batch) <= max_batch_for(p):
            raise ConfigError(f"gpu.max_batch = {max_batch} rows per launch; with this model's "
                              f"widest layer ({max(p.dims[1:])}) the kernel takes "
                              f"1..{max_batch_for(p)} (its work items are counted in 32-bit)")
        self.dc, self.p, self.max_batch = dc, p, int(max_batch)
        self.timeout_ns = int(timeout_ns)
        n, w = self.max_batch, p.max_width
        with dc.current():
            self._fn = module.get_function("fp_mlp_batch")
            self._fn.prepare("PPPPPPPiiP")
            self.d_net = cuda.mem_alloc(p.net.nbytes)
            self.d_w = cuda.mem_alloc(p.weights.nbytes)
            cuda.memcpy_htod(int(self.d_net), p.net)
            cuda.memcpy_htod(int(self.d_w), p.weights)
            self.d_x = cuda.mem_alloc(4 * n * p.n_in)
            self.d_a = cuda.mem_alloc(4 * n * w)
            self.d_b = cuda.mem_alloc(4 * n * w)
            self.d_y = cuda.mem_alloc(4 * n * p.n_out)
            self.d_st = cuda.mem_alloc(4 * n)
            self.d_bar = cuda.mem_alloc(8)
            cuda.memset_d32(int(self.d_st), 0, n)
            cuda.memset_d32(int(self.d_bar), 0, 2)
            self.h_x = cuda.pagelocked_empty((n, p.n_in), np.float32)
            self.h_y = cuda.pagelocked_empty((n, p.n_out), np.float32)
            self.h_st = cuda.pagelocked_empty(n, np.int32)
            self.stream = cuda.Stream(STREAM_NON_BLOCKING)
            self.ev = [cuda.Event() for _ in range(4)]
        self._tag = 0
        self._inflight = 0
        self._t0 = 0

    def _next_tag(self) -> int:
        # status[s] == tag marks a refusal; tags never repeat within 2**31 calls, never 0
        self._tag = self._tag % 0x7FFFFFFF + 1
        return self._tag

    def submit(self, x: np.ndarray) -> None:
        """Queue rows x (n <= max_batch, n_in) without waiting; collect() returns them."""
        if self._inflight:
            raise BackendError("a batch is already in flight: collect() it first")
        if not (isinstance(x, np.ndarray) and x.ndim == 2 and x.shape[1] == self.p.n_in):
            # the copy into the pinned rows below broadcasts: one value or one row would
            # have been sent as every feature / every row, and answered without a word
            raise InputError(f"a batch must be an array of shape (n, {self.p.n_in}) (rows of "
                             f"the model's {self.p.n_in} features), got shape "
                             f"{np.shape(x)}")
        n = x.shape[0]
        if not 1 <= n <= self.max_batch:
            raise BackendError(f"batch of {n} rows; this path takes 1..{self.max_batch}")
        cuda, s, ev = self.cuda, self.stream, self.ev
        self._t0 = time.perf_counter_ns()
        self.h_x[:n] = x
        items = n * max(self.p.dims[1:])
        with self.dc.current():
            ev[0].record(s)
            cuda.memcpy_htod_async(int(self.d_x), self.h_x[:n], s)
            ev[1].record(s)
            self._fn.prepared_async_call(
                (grid_for(self.dc.sm_count, items, self.p.macs * n), 1), (BLOCK, 1, 1), s,
                int(self.d_net), int(self.d_w), int(self.d_x), int(self.d_a), int(self.d_b),
                int(self.d_y), int(self.d_st), self._next_tag(), n, int(self.d_bar))
            ev[2].record(s)
            cuda.memcpy_dtoh_async(self.h_y[:n], int(self.d_y), s)
            cuda.memcpy_dtoh_async(self.h_st[:n], int(self.d_st), s)
            ev[3].record(s)
        self._inflight = n

    def collect(self) -> tuple:
        """(outputs (n, n_out) copy, nonfinite (n,) bool, Timing) of the batch in flight."""
        n = self._inflight
        if not n:
            raise BackendError("no batch in flight")
        ev = self.ev
        deadline = time.monotonic_ns() + self.timeout_ns
        with self.dc.current():
            # polled, not Event.synchronize(): a kernel that never ends is an error, not a hang
            try:
                while not ev[3].query():
                    if time.monotonic_ns() > deadline:
                        raise BackendError(f"the launch did not complete within "
                                           f"{self.timeout_ns / 1e9:g} s")
            except self.cuda.Error as exc:
                raise BackendError(f"GPU kernel failed ({type(exc).__name__}: {exc}); the "
                                   f"context may be unusable") from None
            finally:
                self._inflight = 0
            t = Timing(int(ev[1].time_since(ev[0]) * 1e6), int(ev[2].time_since(ev[1]) * 1e6),
                       int(ev[3].time_since(ev[2]) * 1e6), time.perf_counter_ns() - self._t0)
        return self.h_y[:n].copy(), self.h_st[:n] == self._tag, t

    def infer(self, x: np.ndarray) -> tuple:
        """One feature vector -> (outputs (n_out,), nonfinite bool, Timing)."""
        self.submit(x.reshape(1, -1))
        y, bad, t = self.collect()
        return y[0], bool(bad[0]), t

    def close(self) -> None:
        with self.dc.current():
            for a in (self.d_net, self.d_w, self.d_x, self.d_a, self.d_b, self.d_y, self.d_st,
                      self.d_bar):
                a.free()


def _stop_on_collect(slot, exited) -> None:
    """A PersistentPath collected (or the interpreter exiting) with its kernel running: raise
    the stop flag and give the kernel a second to return before its memory goes."""
    slot.stop()
    slot.wait_ready(exited, DEFAULT_TIMEOUT_NS)


class PersistentPath:
    """A kernel launched once serves one request slot in mapped page-locked memory; each tick
    is fastpath.gpu._protocol.Slot.request (C, no pycuda call). start() and stop() wait with
    deadlines; a kernel that faults or stops answering is a BackendError, never a hang."""

    def __init__(self, dc: DeviceContext, module, p: PackedNet,
                 timeout_ns: int = DEFAULT_TIMEOUT_NS):
        from fastpath.gpu import _protocol
        self.P = _protocol
        cuda = self.cuda = dc.cuda
        self.dc, self.p, self.timeout_ns = dc, p, int(timeout_ns)
        self.running = False
        with dc.current():
            self._fn = module.get_function("fp_mlp_persistent")
            self._fn.prepare("P" * 10)
            self.d_net = cuda.mem_alloc(p.net.nbytes)
            self.d_w = cuda.mem_alloc(p.weights.nbytes)
            cuda.memcpy_htod(int(self.d_net), p.net)
            cuda.memcpy_htod(int(self.d_w), p.weights)
            self.d_x = cuda.mem_alloc(4 * p.n_in)
            self.d_a = cuda.mem_alloc(4 * p.max_width)
            self.d_b = cuda.mem_alloc(4 * p.max_width)
            self.d_y = cuda.mem_alloc(4 * p.n_out)
            self.d_st = cuda.mem_alloc(4)
            self.d_bar = cuda.mem_alloc(8)
            self.d_ctl = cuda.mem_alloc(4)
            for a, n in ((self.d_st, 1), (self.d_bar, 2), (self.d_ctl, 1)):
                cuda.memset_d32(int(a), 0, n)
            nbytes = _protocol.slot_bytes(p.n_in, p.n_out)
            # page-locked allocations are page-aligned: the slot's 64-byte lines hold
            self.h_slot = cuda.pagelocked_empty(nbytes, np.uint8,
                                                mem_flags=cuda.host_alloc_flags.DEVICEMAP)
            self.slot = _protocol.Slot.on_buffer(self.h_slot, p.n_in, p.n_out)
            self.d_slot = self.h_slot.base.get_device_pointer()
            self.stream = cuda.Stream(STREAM_NON_BLOCKING)
            self.done = cuda.Event()
        self._out = np.empty(p.n_out, np.float32)

    def _kernel_error(self):
        """The kernel's fault, or None while it runs / after it returned cleanly."""
        try:
            with self.dc.current():
                self.done.query()
        except self.cuda.Error as exc:
            return f"{type(exc).__name__}: {exc}"
        return None

    def start(self, timeout_ns: int | None = None) -> None:
        if self.running:
            return
        if self.slot.state["stop"]:
            # the slot's stop flag stays set: a kernel launched on it would return at once
            raise BackendError("this persistent path was stopped; make a new GpuBackend")
        P = self.P
        with self.dc.current():
            grid = grid_for(self.dc.sm_count, max(self.p.dims[1:]), self.p.macs)
            self._fn.prepared_async_call(
                (grid, 1), (BLOCK, 1, 1), self.stream, int(self.d_net), int(self.d_w),
                int(self.d_slot), int(self.d_x), int(self.d_a), int(self.d_b), int(self.d_y),
                int(self.d_st), int(self.d_bar), int(self.d_ctl))
            self.done.record(self.stream)
        self.running = True
        # dropped without close() (a GpuBackend nobody closed), the device memory and the
        # slot would be freed under a kernel still polling them: stop it first. The finalizer
        # holds the slot (not self), so the slot outlives the wait; stop() detaches it.
        self._fin = weakref.finalize(self, _stop_on_collect, self.slot, P.READY_EXITED)
        if self.slot.wait_ready(P.READY_RUNNING, timeout_ns or self.timeout_ns) != P.OK:
            err = self._kernel_error()
            try:
                self.stop(timeout_ns)
            except BackendError:
                pass
            raise BackendError(f"the persistent kernel did not start within "
                               f"{(timeout_ns or self.timeout_ns) / 1e9:g} s"
                               + (f": {err}" if err else ""))

    def infer(self, x: np.ndarray) -> tuple:
        """One feature vector -> (outputs (n_out,) copy, nonfinite bool, Timing)."""
        P = self.P
        if not self.running:
            raise BackendError("the persistent kernel is not running: start() it first")
        rc, _seq, dev_ns, wait_ns = self.slot.request(x, self._out, self.timeout_ns)
        if rc == P.OK or rc == P.NONFINITE:
            dev_ns = min(int(dev_ns), int(wait_ns))
            return (self._out.copy(), rc == P.NONFINITE,
                    Timing(int(wait_ns) - dev_ns, dev_ns, 0, int(wait_ns)))
        err = self._kernel_error() if rc == P.TIMEOUT else None
        what = {P.TIMEOUT: f"no answer within {self.timeout_ns / 1e9:g} s",
                P.STOPPED: "the slot was stopped or the kernel has returned (it will not "
                           "answer; make a new GpuBackend)",
                P.BADSEQ: "the answer carried a sequence number that was never asked"}
        raise BackendError(f"persistent GPU path: {what.get(rc, f'error {rc}')}"
                           + (f" (kernel fault: {err})" if err else ""))

    def stop(self, timeout_ns: int | None = None) -> None:
        """Ask the kernel to return and wait for it, up to timeout_ns; BackendError when it
        does not (the context is then left as it is: nothing is freed under a live kernel)."""
        if not self.running:
            return
        P = self.P
        # a request deadline may be microseconds; the kernel's exit gets at least a second
        timeout_ns = timeout_ns or max(self.timeout_ns, DEFAULT_TIMEOUT_NS)
        deadline = time.monotonic_ns() + timeout_ns
        self.slot.stop()
        # the event after the kernel is what says it returned (also one that never started)
        while True:
            err = self._kernel_error()
            if err:
                self.running = False
                self._fin.detach()
                raise BackendError(f"the persistent kernel faulted: {err}")
            with self.dc.current():
                if self.done.query():
                    break
            if time.monotonic_ns() > deadline:
                raise BackendError("the persistent kernel did not exit within "
                                   f"{timeout_ns / 1e9:g} s of the stop "
                                   f"flag (slot ready={self.slot.state['ready']}, "
                                   f"{P.READY_EXITED} once it returns)")
            time.sleep(50e-6)
        self.running = False
        self._fin.detach()

    def close(self) -> None:
        self.stop()
        with self.dc.current():
            for a in (self.d_net, self.d_w, self.d_x, self.d_a, self.d_b, self.d_y, self.d_st,
                      self.d_bar, self.d_ctl):
                a.free()
