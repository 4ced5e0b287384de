"""pycuda backend: the device context, the kernels' module, the launch path and the persistent
path. Imported only when a GPU backend is asked for; `import fastpath` never gets here.

Design: every call into the driver runs inside `DeviceContext.current()`, which pushes the
device's primary context and pops it in a finally, so any thread may call and none leaves a
context behind. Everything a tick needs is allocated once (device buffers, page-locked host
buffers, events, a non-blocking stream); a tick is three async operations and one event wait
on the launch path, and one C call on mapped memory (fastpath.gpu._protocol) on the
persistent path. Driver objects come from the `cuda` argument (pycuda.driver in use), so the
logic here is tested with a stand-in where no GPU exists. Persistent kernels hold their whole
grid resident: the ones running in a device's context are counted (ResidentKernels) and one
that could not be resident beside them is refused before it is launched.
"""
from __future__ import annotations

import atexit
import os
import threading
import time
import weakref
from contextlib import contextmanager
from typing import NamedTuple

import numpy as np

from fastpath.errors import BackendError, ConfigError, InputError
from fastpath.gpu import _protocol
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


KERNELS = ("fp_mlp_batch", "fp_mlp_persistent")


class DeviceContext:
    """One device's primary context; `with ctx.current():` around every driver call.

    A persistent kernel never returns, and some driver calls wait for every kernel of the
    device: allocating or freeing device or page-locked memory, loading a module (lazily
    loaded kernels load at first use), tearing the context down. Made while one spins, such a
    call hangs. So the module is loaded once, with both kernels fetched, when the context is
    first used (with CUDA_MODULE_LOADING=EAGER set before the driver starts); a path refuses
    to allocate while a persistent kernel runs (refuse_while_spinning); frees asked for then
    wait (free_later) until the last persistent kernel has returned."""

    def __init__(self, cuda, ordinal: int = 0):
        self.cuda = cuda
        # read by the driver when it starts: kernels load with their module, not at first use
        os.environ.setdefault("CUDA_MODULE_LOADING", "EAGER")
        cuda.init()
        if ordinal >= cuda.Device.count():
            raise BackendError(f"CUDA device {ordinal} requested, {cuda.Device.count()} present")
        if ordinal < 0:
            raise BackendError(f"CUDA device {ordinal} requested; ordinals start at 0")
        self.ordinal = ordinal
        # every GpuBackend on this device shares its primary context, so the persistent
        # kernels that must be co-resident are counted per (driver, device), not per object
        self.resident = resident_kernels(cuda, ordinal)
        self._module = None         # (module, origin), loaded once
        self._deferred = []         # frees waiting for the persistent kernels to return
        # reentrant: a collected path's finalizer may flush while this thread holds it
        self._lock = threading.RLock()
        self.users = 0              # GpuBackends holding this context (shared_context)
        self.device = cuda.Device(ordinal)
        self.ctx = self.device.retain_primary_context()
        self.released = False
        try:
            self.sm_count = int(self.device.get_attribute(
                cuda.device_attribute.MULTIPROCESSOR_COUNT))
        except BaseException:
            self.release()          # retained above: no one else would let it go
            raise

    @contextmanager
    def current(self):
        if self.released:
            raise BackendError(f"the context of CUDA device {self.ordinal} was released")
        self.ctx.push()
        try:
            yield
        finally:
            self.cuda.Context.pop()

    def spinning(self) -> int:
        """Persistent kernels running in this context now."""
        return len(self.resident.running())

    def refuse_while_spinning(self, what: str) -> None:
        """BackendError when a persistent kernel runs: `what` would allocate (or load) and
        could wait on it forever."""
        n = self.spinning()
        if n:
            raise BackendError(
                f"cannot {what} while {n} persistent kernel(s) run in this process's context "
                f"on CUDA device {self.ordinal}: allocating device or page-locked memory and "
                f"loading a module may wait for every kernel on the device, and a persistent "
                f"kernel never returns. Make every GpuBackend first (persistent ones with "
                f"start=False, then start() them), or close the running ones before")

    @contextmanager
    def setup(self, what: str):
        """Around a path's allocations: no persistent kernel may start meanwhile (the lock,
        which start() takes too), none runs (refused: `what` could wait on it forever), and
        the context is current."""
        with self._lock:
            self.refuse_while_spinning(what)
            with self.current():
                yield

    def module(self) -> tuple:
        """(module, origin): the kernels' module, loaded the first time, both kernels fetched
        (a lazily loaded kernel would load at its first launch, maybe beside a spinning one)."""
        with self._lock:
            if self._module is None:
                self.refuse_while_spinning("load the GPU kernels")
                with self.current():
                    mod, origin = load_module(self.cuda)
                    for name in KERNELS:
                        mod.get_function(name)
                self._module = (mod, origin)
            return self._module

    def free_later(self, frees) -> None:
        """Run the callables `frees` (each one free of device or page-locked memory) inside
        the context: now when no persistent kernel runs, else once the last one returns."""
        with self._lock:
            if self.spinning():
                self._deferred.extend(frees)
                return
            self._run_frees(list(frees))

    def flush_deferred(self) -> None:
        """The frees free_later held back, once no persistent kernel runs."""
        with self._lock:
            if self.spinning() or not self._deferred:
                return
            frees, self._deferred = self._deferred, []
            self._run_frees(frees)

    def _run_frees(self, frees) -> None:
        with self.current():
            for f in frees:
                try:
                    f()
                except self.cuda.Error:
                    pass        # a context a fault killed: its memory went with it

    def info(self) -> dict:
        bus = self.device.pci_bus_id()
        drv = self.cuda.get_driver_version()
        return {"device": self.device.name(), "pci_bus_id": bus,
                "driver": f"{drv // 1000}.{drv % 1000 // 10}",
                "compute_capability": "%d.%d" % self.device.compute_capability(),
                "sm_count": self.sm_count, "numa_node": pci_numa_node(bus)}

    def release(self) -> None:
        """Let the primary context go (cuDevicePrimaryCtxRelease through pycuda's detach). It
        is made current first: pycuda's detach of a context that is not current pushes it and
        leaves it current on this thread after the release (and from another thread than the
        one that retained it, releases nothing). Refused while a persistent kernel runs:
        the teardown would wait for it."""
        if self.released:
            return
        self.refuse_while_spinning("release the CUDA context")
        self.flush_deferred()
        self.ctx.push()
        self.released = True
        self.ctx.detach()           # pops pycuda's entry for it: no Context.pop() after


_CONTEXTS = {}                      # (id of the driver module, ordinal) -> DeviceContext
_CONTEXTS_LOCK = threading.Lock()


def shared_context(cuda, ordinal: int) -> DeviceContext:
    """The process's one DeviceContext of device `ordinal` under driver `cuda` (retained once,
    released at exit by release_contexts), with one more user."""
    key = (id(cuda), ordinal)
    with _CONTEXTS_LOCK:
        dc = _CONTEXTS.get(key)
        if dc is None or dc.released or dc.cuda is not cuda:
            if not _CONTEXTS:
                atexit.register(release_contexts)
            dc = _CONTEXTS[key] = DeviceContext(cuda, ordinal)
        dc.users += 1
        return dc


def drop_user(dc: DeviceContext) -> None:
    """A GpuBackend is done with its context. The primary context stays (another backend,
    or another library in this process, may use it); it is released at exit."""
    with _CONTEXTS_LOCK:
        dc.users = max(dc.users - 1, 0)


def release_contexts() -> None:
    """At exit: release every shared context no persistent kernel still runs in (one still
    running, its backend never closed, would make the teardown wait on it: left to the
    process's end)."""
    with _CONTEXTS_LOCK:
        dcs = list(_CONTEXTS.values())
        _CONTEXTS.clear()
    for dc in dcs:
        try:
            dc.release()
        except Exception:  # noqa: BLE001 - BackendError (a kernel spins), a dead context
            pass


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


# --- how many persistent kernels fit at once ----------------------------------------------------
#
# A persistent kernel never returns, and each of its blocks waits for all the others at the
# grid barrier: every block must be resident for as long as it runs. The block scheduler does
# not preempt them, so once the resident blocks of the persistent kernels already running
# leave no room for a new one's whole grid, its missing blocks wait forever and its resident
# ones spin at the barrier: its start or its first request timed out, with no word of why.
# A PersistentPath counts the blocks first and refuses up front (BackendError).

REG_ALLOC_UNIT = 256             # registers are allocated per warp in units of 256
# the CUDA programming guide's "maximum number of resident grids per device" for every
# compute capability the fatbin is built for (8.0 and later): a persistent kernel is a grid
# that stays resident, so past this many the next one never starts however small it is
MAX_RESIDENT_GRIDS = 128


class Occupancy(NamedTuple):
    """BLOCK-thread blocks of one kernel an SM holds at once, and the resource that bounds it."""
    blocks_per_sm: int
    limit: str


def occupancy(cuda, device, fn, block: int = BLOCK) -> Occupancy:
    """How many `block`-thread blocks of kernel `fn` one SM of `device` holds at once: the least
    of what its threads, block slots, registers (the kernel's NUM_REGS, allocated per warp)
    and shared memory (the kernel's static shared memory plus the driver's reserve per block)
    allow, each counted where the driver reports it. Where it reports none: one block per SM,
    the residency grid_for has always assumed (its grids never exceed the SM count)."""
    def dev(name):
        a = getattr(cuda.device_attribute, name, None)
        if a is None:
            return None
        try:
            v = int(device.get_attribute(a))
        except Exception:  # noqa: BLE001 - an attribute this driver does not know
            return None
        return v if v > 0 else None

    def fun(name):
        a = getattr(getattr(cuda, "function_attribute", None), name, None)
        if a is None or not hasattr(fn, "get_attribute"):
            return None
        try:
            return int(fn.get_attribute(a))
        except Exception:  # noqa: BLE001 - as above
            return None

    limits = {}
    threads = dev("MAX_THREADS_PER_MULTIPROCESSOR")
    if threads:
        limits[f"threads ({threads} an SM)"] = threads // block
    slots = dev("MAX_BLOCKS_PER_MULTIPROCESSOR")
    if slots:
        limits[f"block slots ({slots} an SM)"] = slots
    regs_sm, regs = dev("MAX_REGISTERS_PER_MULTIPROCESSOR"), fun("NUM_REGS")
    if regs_sm and regs is not None:
        per_warp = -(-max(regs, 1) * 32 // REG_ALLOC_UNIT) * REG_ALLOC_UNIT
        limits[f"registers ({regs} a thread, {regs_sm} an SM)"] = regs_sm // (
            per_warp * (block // 32))
    smem_sm, smem = dev("MAX_SHARED_MEMORY_PER_MULTIPROCESSOR"), fun("SHARED_SIZE_BYTES")
    if smem_sm and smem is not None:
        per_block = smem + (dev("RESERVED_SHARED_MEMORY_PER_BLOCK") or 0)
        if per_block:
            limits[f"shared memory ({per_block} bytes a block, {smem_sm} an SM)"] = (
                smem_sm // per_block)
    max_block = fun("MAX_THREADS_PER_BLOCK")
    if max_block is not None and max_block < block:
        limits[f"the kernel's {max_block} threads a block (it is launched with {block})"] = 0
    if not limits:
        return Occupancy(1, "no occupancy attributes reported: one block per SM assumed")
    limit = min(limits, key=limits.get)
    return Occupancy(limits[limit], limit)


class ResidentKernels:
    """The persistent kernels running in one device's context in this process: the blocks
    each keeps resident. claim() before a launch, release() once the kernel has returned."""

    def __init__(self, ordinal: int):
        self.ordinal = ordinal
        self._lock = threading.Lock()
        self._blocks = {}        # token -> blocks of that kernel's grid
        self._next = 0
        self.held = 0            # blocks resident in all: read without the lock by launches

    def running(self) -> list:
        """Blocks of each running persistent kernel, in start order."""
        with self._lock:
            return list(self._blocks.values())

    def claim(self, grid: int, occ: Occupancy, sm_count: int) -> int:
        """A token for a new kernel of `grid` blocks, or a BackendError when it cannot be
        resident together with those already running (nothing is launched then)."""
        with self._lock:
            why = self._refusal(grid, occ, sm_count)
            if why is None:
                self._next += 1
                self._blocks[self._next] = grid
                self.held += grid
                return self._next
        raise BackendError(why)

    def check(self, grid: int, occ: Occupancy, sm_count: int) -> None:
        """claim()'s refusal without claiming: before a path allocates anything."""
        with self._lock:
            why = self._refusal(grid, occ, sm_count)
        if why is not None:
            raise BackendError(why)

    def _refusal(self, grid: int, occ: Occupancy, sm_count: int):
        held = list(self._blocks.values())
        cap = occ.blocks_per_sm * sm_count
        if occ.blocks_per_sm < 1:
            return (f"the persistent kernel cannot run on CUDA device {self.ordinal}: not one "
                    f"block of {BLOCK} threads fits an SM (bounded by {occ.limit}); use "
                    f"gpu.mode = \"launch\"")
        if grid <= cap - sum(held) and len(held) < MAX_RESIDENT_GRIDS:
            return None
        if len(held) >= MAX_RESIDENT_GRIDS:
            why = (f"{len(held)} persistent kernels already run in this process's context "
                   f"on CUDA device {self.ordinal}, the most resident grids a device holds")
        else:
            each = (f"{held[0]} blocks each" if len(set(held)) == 1
                    else f"{', '.join(map(str, held))} blocks")
            why = (f"{len(held)} persistent kernel(s) already run in this process's context "
                   f"on CUDA device {self.ordinal} ({each}, {sum(held)} blocks resident); "
                   f"this one needs {grid} more, and the device holds {cap} at once "
                   f"({occ.blocks_per_sm} blocks of {BLOCK} threads an SM, bounded by "
                   f"{occ.limit}, x {sm_count} SMs)")
        return (f"cannot start another persistent GPU kernel: {why}. Every block of a "
                f"persistent kernel must stay resident (its layers meet at a grid barrier), "
                f"so it could never start. Close (stop) a running persistent GpuBackend or "
                f"engine first, or use gpu.mode = \"launch\" for this one")

    def release(self, token) -> None:
        with self._lock:
            self.held -= self._blocks.pop(token, 0)


_RESIDENT = weakref.WeakKeyDictionary()     # driver module -> {ordinal: ResidentKernels}
_RESIDENT_LOCK = threading.Lock()


def resident_kernels(cuda, ordinal: int) -> ResidentKernels:
    """The one ResidentKernels of device `ordinal` under driver `cuda` (pycuda.driver, or a
    stand-in: each stand-in is a driver of its own)."""
    with _RESIDENT_LOCK:
        per = _RESIDENT.setdefault(cuda, {})
        if ordinal not in per:
            per[ordinal] = ResidentKernels(ordinal)
        return per[ordinal]


# The kernel counts a launch's work items (rows x a layer's width) and walks them in 32-bit
# ints: past this a batch's count wraps negative and the layer is skipped, leaving the
# previous launch's outputs in place (silently wrong), so such a batch size is refused. The
# margin keeps `it += n_warps` below INT_MAX as well.
MAX_ITEMS = (1 << 31) - (1 << 20)


def max_batch_for(p: PackedNet) -> int:
    """The most rows one launch of this model may carry (the kernel's 32-bit item count)."""
    return MAX_ITEMS // max(p.dims[1:])


MAX_TAG = 0x7FFFFFFF             # fp_mlp_batch's tag is an int


def upload(cuda, stream, copies, zeros) -> None:
    """Setup copies ordered before the path's first kernel: each (device, array) of `copies`
    through a page-locked staging buffer and each (device, words) of `zeros` as a memset, all
    async on `stream` (the kernels run on non-blocking streams, which do not wait for the
    legacy stream that memcpy_htod / memset_d32 use), then that stream synchronized (not the
    context: it would wait on persistent kernels that never return). The staging buffers are
    freed in the context; nothing persistent runs while a path is set up."""
    staged = []
    try:
        for dst, src in copies:
            src = np.ascontiguousarray(src).view(np.uint8).reshape(-1)
            h = cuda.pagelocked_empty(src.size, np.uint8)
            staged.append(h)
            h[:] = src
            cuda.memcpy_htod_async(int(dst), h, stream)
        for dst, words in zeros:
            cuda.memset_d32_async(int(dst), 0, words, stream)
        stream.synchronize()
    finally:
        for h in staged:
            h.base.free()


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
        with dc.setup("set up a GPU launch path"):
            self._fn = module.get_function("fp_mlp_batch")
            self._fn.prepare("PPPPPPPiiP")
            self.occupancy = occupancy(cuda, dc.device, self._fn)
            self.stream = cuda.Stream(STREAM_NON_BLOCKING)
            self.ev = [cuda.Event() for _ in range(4)]
            self.d_net = cuda.mem_alloc(p.net.nbytes)
            self.d_w = cuda.mem_alloc(p.weights.nbytes)
            self.d_x = cuda.mem_alloc(4 * n * p.n_in)
            self.d_a = cuda.mem_alloc(4 * n * w)
            self.d_b = cuda.mem_alloc(4 * n * w)
            self.d_y = cuda.mem_alloc(4 * n * p.n_out)
            self.d_st = cuda.mem_alloc(4 * n)
            self.d_bar = cuda.mem_alloc(8)
            self.h_x = cuda.pagelocked_empty((n, p.n_in), np.float32)
            self.h_y = cuda.pagelocked_empty((n, p.n_out), np.float32)
            self.h_st = cuda.pagelocked_empty(n, np.int32)
            upload(cuda, self.stream, ((self.d_net, p.net), (self.d_w, p.weights)),
                   ((self.d_st, n), (self.d_bar, 2)))
        self._tag = 0
        self._inflight = 0
        self._t0 = 0

    def _next_tag(self) -> int:
        """The tag of the next launch: status[s] == tag marks a refusal in that launch. Tags
        run 1..2**31-1 (the kernel's int) and are never 0. status is never cleared between
        launches, so when they wrap, a row refused 2**31-1 launches ago would read as refused
        again (answered right by the CPU recompute, but flagged and counted as refused): at
        the wrap the whole status buffer is zeroed, on the stream, before the launch."""
        if self._tag == MAX_TAG:
            self.cuda.memset_d32_async(int(self.d_st), 0, self.max_batch, self.stream)
            self._tag = 0
        self._tag += 1
        return self._tag

    def _grid(self, items: int, n: int) -> int:
        """grid_for's blocks, fewer where persistent kernels running in this context leave
        less room: this kernel's grid barrier needs all its blocks resident too, and those
        kernels never give theirs back (a grid past the room would spin until the timeout,
        and on after it). The kernel walks its items by the grid's warps: any grid is right.
        Blocks of the two kernels are counted alike (their footprints are the same on the
        GPUs the fatbin is built for: registers bound both, at 1280 a warp)."""
        grid = grid_for(self.dc.sm_count, items, self.p.macs * n)
        held = self.dc.resident.held
        if held:
            room = self.occupancy.blocks_per_sm * self.dc.sm_count - held
            if room < 1:
                raise BackendError(
                    f"the GPU launch path cannot run: the {len(self.dc.resident.running())} "
                    f"persistent kernel(s) running in this process's context on CUDA device "
                    f"{self.dc.ordinal} hold {held} blocks, all the device holds at once "
                    f"({self.occupancy.blocks_per_sm} an SM, bounded by "
                    f"{self.occupancy.limit}, x {self.dc.sm_count} SMs); close (stop) one of "
                    f"them first")
            grid = min(grid, room)
        return grid

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
        grid = self._grid(n * max(self.p.dims[1:]), n)
        cuda, s, ev = self.cuda, self.stream, self.ev
        self._t0 = time.perf_counter_ns()
        self.h_x[:n] = x
        with self.dc.current():
            try:
                tag = self._next_tag()   # before ev[0]: a wrap's memset is not in the stages
                ev[0].record(s)
                cuda.memcpy_htod_async(int(self.d_x), self.h_x[:n], s)
                ev[1].record(s)
                self._fn.prepared_async_call(
                    (grid, 1), (BLOCK, 1, 1), s,
                    int(self.d_net), int(self.d_w), int(self.d_x), int(self.d_a),
                    int(self.d_b), int(self.d_y), int(self.d_st), tag, n, int(self.d_bar))
                ev[2].record(s)
                cuda.memcpy_dtoh_async(self.h_y[:n], int(self.d_y), s)
                cuda.memcpy_dtoh_async(self.h_st[:n], int(self.d_st), s)
                ev[3].record(s)
            except cuda.Error as exc:
                # a launch the driver refuses ("too many resources requested for launch"),
                # or an earlier fault reported by this call: pycuda's own error escaped, not
                # a BackendError (backend="auto"'s measurement raised it, not taking the CPU)
                raise BackendError(f"GPU launch failed ({type(exc).__name__}: {exc}); the "
                                   f"context may be unusable") from None
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
        """Free the device and page-locked memory inside the context (the garbage collector
        skips cuMemFreeHost once the context is gone); deferred while a persistent kernel
        runs (DeviceContext.free_later)."""
        self.dc.free_later([a.free for a in (self.d_net, self.d_w, self.d_x, self.d_a, self.d_b,
                                             self.d_y, self.d_st, self.d_bar)]
                           + [h.base.free for h in (self.h_x, self.h_y, self.h_st)])


def _stop_on_collect(slot, done, dc, token) -> None:
    """A PersistentPath collected (or the interpreter exiting) with its kernel running: raise
    the stop flag and give the kernel a second to return before its memory goes. Its blocks
    count as resident until it has returned: one still running still holds them. Once it
    has, the frees other paths' close() held back are made."""
    slot.stop()
    # the event after the kernel says it returned, as in stop(): the slot's READY_EXITED is
    # written before the kernel's last instructions, and a free made then waits on it
    deadline = time.monotonic_ns() + DEFAULT_TIMEOUT_NS
    try:
        while True:
            try:
                with dc.current():
                    if done.query():
                        break
            except dc.cuda.Error:
                # a fault ended the kernel with its context: nothing left to free in it
                dc.resident.release(token)
                return
            if time.monotonic_ns() > deadline:
                return
            time.sleep(50e-6)
        dc.resident.release(token)
        dc.flush_deferred()
    except Exception:  # noqa: BLE001 - a finalizer: a released context
        pass


class PersistentPath:
    """A kernel launched once serves one request slot in mapped page-locked memory; each tick
    is fastpath.gpu._protocol.Slot.request (C, no pycuda call). start() and stop() wait with
    deadlines; a kernel that faults or stops answering is a BackendError, never a hang."""

    def __init__(self, dc: DeviceContext, module, p: PackedNet,
                 timeout_ns: int = DEFAULT_TIMEOUT_NS):
        self.P = _protocol
        cuda = self.cuda = dc.cuda
        self.dc, self.p, self.timeout_ns = dc, p, int(timeout_ns)
        self.running = False
        with dc.setup("set up a persistent GPU path"):
            self._fn = module.get_function("fp_mlp_persistent")
            self._fn.prepare("P" * 10)
            self.occupancy = occupancy(cuda, dc.device, self._fn)
            self.grid = grid_for(dc.sm_count, max(p.dims[1:]), p.macs)
            # a grid that cannot be resident now is refused before any memory is taken;
            # start() decides again (another path may have started in between)
            dc.resident.check(self.grid, self.occupancy, dc.sm_count)
            self.stream = cuda.Stream(STREAM_NON_BLOCKING)
            self.done = cuda.Event()
            self.d_net = cuda.mem_alloc(p.net.nbytes)
            self.d_w = cuda.mem_alloc(p.weights.nbytes)
            self.d_x = cuda.mem_alloc(4 * p.n_in)
            self.d_a = cuda.mem_alloc(4 * p.max_width)
            self.d_b = cuda.mem_alloc(4 * p.max_width)
            self.d_y = cuda.mem_alloc(4 * p.n_out)
            self.d_st = cuda.mem_alloc(4)
            self.d_bar = cuda.mem_alloc(8)
            self.d_ctl = cuda.mem_alloc(4)
            nbytes = _protocol.slot_bytes(p.n_in, p.n_out)
            # page-locked allocations are page-aligned: the slot's 64-byte lines hold
            self.h_slot = cuda.pagelocked_empty(nbytes, np.uint8,
                                                mem_flags=cuda.host_alloc_flags.DEVICEMAP)
            self.slot = _protocol.Slot.on_buffer(self.h_slot, p.n_in, p.n_out)
            self.d_slot = self.h_slot.base.get_device_pointer()
            upload(cuda, self.stream, ((self.d_net, p.net), (self.d_w, p.weights)),
                   ((self.d_st, 1), (self.d_bar, 2), (self.d_ctl, 1)))
        self._out = np.empty(p.n_out, np.float32)
        self._token = None
        self.fault = None        # the kernel's fault once one was seen: the context is dead

    def _faulted(self, err: str) -> None:
        """The kernel faulted (a CUDA fault is sticky: the context, and every kernel in it,
        is gone): no request is sent again. Its blocks are no longer resident, the collector
        has nothing to stop, and the stop flag is raised for whatever still reads the slot."""
        self.fault = err
        self.running = False
        self.slot.stop()
        self._fin.detach()
        self._release_blocks()

    def _release_blocks(self) -> None:
        if self._token is not None:
            self.dc.resident.release(self._token)
            self._token = None
            if not self.fault:
                # frees other paths' close() held back while this kernel ran
                self.dc.flush_deferred()

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
        # refused here, before the launch, when its grid cannot be resident beside the
        # persistent kernels already running in this context (its barrier would never open)
        # under the context's lock: no path allocates or frees between the claim and the launch
        with self.dc._lock:
            self._token = self.dc.resident.claim(self.grid, self.occupancy, self.dc.sm_count)
            try:
                with self.dc.current():
                    self._fn.prepared_async_call(
                        (self.grid, 1), (BLOCK, 1, 1), self.stream, int(self.d_net),
                        int(self.d_w), int(self.d_slot), int(self.d_x), int(self.d_a),
                        int(self.d_b), int(self.d_y), int(self.d_st), int(self.d_bar),
                        int(self.d_ctl))
                    self.done.record(self.stream)
            except BaseException:
                self._release_blocks()
                raise
        self.running = True
        # dropped without close() (a GpuBackend nobody closed), the device memory and the
        # slot would be freed under a kernel still polling them: stop it first. The finalizer
        # holds the slot (not self), so the slot outlives the wait; stop() detaches it.
        self._fin = weakref.finalize(self, _stop_on_collect, self.slot, self.done, self.dc,
                                     self._token)
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
            if self.fault:
                raise BackendError(f"persistent GPU path: the kernel faulted ({self.fault}); "
                                   f"the CUDA context is unusable: make a new GpuBackend")
            raise BackendError("the persistent kernel is not running: start() it first")
        rc, _seq, dev_ns, wait_ns = self.slot.request(x, self._out, self.timeout_ns)
        if rc == P.OK or rc == P.NONFINITE:
            dev_ns = min(int(dev_ns), int(wait_ns))
            return (self._out.copy(), rc == P.NONFINITE,
                    Timing(int(wait_ns) - dev_ns, dev_ns, 0, int(wait_ns)))
        err = self._kernel_error() if rc == P.TIMEOUT else None
        if err:
            # before: the path stayed "running" on a dead context, and every later tick sent
            # a request and spun out the whole timeout (holding the GIL) before saying so
            self._faulted(err)
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
                self._faulted(err)         # a fault ends every kernel of the context
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
        self._release_blocks()

    def close(self) -> None:
        self.stop()
        if self.fault:
            # after a fault every driver call in the context fails with it; its memory goes
            # with the context (GpuBackend.close releases it)
            return
        # the slot's memory goes too: nothing reads it once the kernel has returned
        self.dc.free_later([a.free for a in (self.d_net, self.d_w, self.d_x, self.d_a,
                                             self.d_b, self.d_y, self.d_st, self.d_bar,
                                             self.d_ctl)] + [self.h_slot.base.free])
