"""A stand-in pycuda driver (no GPU needed): its kernels run packed_forward on the host, and fixtures
that install it with a fake fatbin."""
import os
import sys
import threading
import types

import numpy as np
import pytest

from fastpath.gpu import gpu_status
from fastpath.gpu import _backend as B
from fastpath.gpu import _protocol as P
from fastpath.gpu._pack import NET_DTYPE, packed_forward
from helpers.builders import random_model, windowed_model


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo


def _fake_pycuda(monkeypatch, driver):
    pkg = types.ModuleType("pycuda")
    pkg.driver = driver
    monkeypatch.setitem(sys.modules, "pycuda", pkg)
    monkeypatch.setitem(sys.modules, "pycuda.driver", driver)
    gpu_status.cache_clear()


class FakeError(Exception):
    pass


class FakeMem:
    """Device memory: allocations are numpy byte arrays at made-up addresses."""

    def __init__(self, fake=None):
        self.fake = fake
        self.blocks = {}
        self.next = 1 << 32

    def alloc(self, n):
        a = self.next
        self.blocks[a] = np.zeros(max(n, 1), np.uint8)
        self.next += (max(n, 1) + 4095) // 4096 * 4096 + 4096
        return a

    def view(self, addr, dtype, count):
        for base, arr in self.blocks.items():
            if base <= addr < base + arr.nbytes:
                off = addr - base
                return arr[off:off + np.dtype(dtype).itemsize * count].view(dtype)
        raise FakeError(f"invalid device address {addr:#x}")


class FakeAlloc:
    def __init__(self, mem, n):
        self.mem, self.addr, self.freed = mem, mem.alloc(n), False

    def __int__(self):
        return self.addr

    def free(self):
        if self.mem.fake is not None:
            self.mem.fake._device_wide("cuMemFree")
        self.freed = True


class HostAlloc:
    """A page-locked allocation: the .base of what pagelocked_empty returns, as in pycuda."""

    def __init__(self, shape, dtype, fake=None):
        self.fake, self.freed = fake, False
        dtype = np.dtype(dtype)
        n = int(np.prod(shape)) * dtype.itemsize
        self._raw = np.zeros(n + 4096, np.uint8)
        self.addr = self._raw.ctypes.data + (-self._raw.ctypes.data) % 4096
        self.__array_interface__ = {"shape": tuple(np.atleast_1d(shape)), "typestr": dtype.str,
                                    "data": (self.addr, False), "version": 3}

    def get_device_pointer(self):
        return self.addr

    def free(self):
        if self.fake is not None:
            self.fake._check_ctx()      # cuMemFreeHost needs its context current
            self.fake._device_wide("cuMemFreeHost")
        self.freed = True


def pinned(a) -> bool:
    """Whether array `a` is (a view of) page-locked memory from pagelocked_empty."""
    while a is not None:
        if isinstance(a, HostAlloc):
            return True
        a = getattr(a, "base", None)
    return False


class DeviceWideCall(Exception):
    """A driver call that may wait for every kernel on the device, made while a persistent
    kernel (which never returns) runs: on a GPU the call would hang."""


class FakeCuda:
    Error = FakeError
    device_attribute = types.SimpleNamespace(MULTIPROCESSOR_COUNT="sm")
    host_alloc_flags = types.SimpleNamespace(DEVICEMAP=2)

    def __init__(self, sm=4, kernel_mode="ok"):
        self.mem = FakeMem(self)
        self.depth = 0          # pushed contexts
        self.ops = []           # (what, stream) of copies, memsets, launches, syncs in order
        self.hazards = []       # device-wide calls made while a persistent kernel ran
        self.module_loads = 0
        self.retains = 0        # primary-context retains
        self.detached = 0       # primary-context releases
        self.left_current = 0   # releases of a context that was not current (pycuda leaves it)
        self.module_loading = None   # CUDA_MODULE_LOADING when the driver started
        self.launches = []
        self.kernel_mode = kernel_mode
        self.sm = sm
        self.threads = []
        fake = self

        class Ctx:
            def push(self):
                fake.depth += 1

            def detach(self):
                # pycuda's detach: of the current context, pops its entry; of one that is
                # not current, pushes it and leaves it current after the release
                fake._device_wide("primary context release")
                fake.detached += 1
                if fake.depth > 0:
                    fake.depth -= 1
                else:
                    fake.left_current += 1

        class Device:
            @staticmethod
            def count():
                return 1

            def __init__(self, i):
                pass

            def retain_primary_context(self):
                fake.retains += 1
                return Ctx()

            def get_attribute(self, a):
                return fake.sm

            def name(self):
                return "Fake GPU"

            def pci_bus_id(self):
                return "0000:00:00.0"

            def compute_capability(self):
                return (9, 0)

        class Context:
            @staticmethod
            def pop():
                fake.depth -= 1

            @staticmethod
            def synchronize():
                fake.ops.append(("context sync", None))

        class Stream:
            def __init__(self, flags=0):
                self.flags = flags

            def synchronize(self):
                fake.ops.append(("sync", self))

        class Event:
            def __init__(self):
                self.thread = None

            def record(self, stream=None):
                self.thread = fake.threads[-1] if stream is not None and fake.threads else None

            def query(self):
                if fake.kernel_mode == "fault":
                    raise FakeError("an illegal memory access was encountered")
                if fake.kernel_mode == "launch_never_ends":
                    return False
                if self.thread is not None and self.thread.is_alive():
                    self.thread.asked.set()
                    return False
                return True

            def time_since(self, other):
                return 0.001

        self.Device, self.Context, self.Stream, self.Event = Device, Context, Stream, Event

    def _check_ctx(self):
        assert self.depth > 0, "driver call without a current context"

    def spinning(self) -> bool:
        return any(t.is_alive() for t in self.threads)

    def _device_wide(self, what):
        if self.spinning():
            self.hazards.append(what)
            raise DeviceWideCall(f"{what}: device-wide call while a persistent kernel runs")

    def init(self):
        self.module_loading = os.environ.get("CUDA_MODULE_LOADING")

    def get_driver_version(self):
        return 13000

    def module_from_buffer(self, blob):
        self._check_ctx()
        self._device_wide("cuModuleLoadData")
        self.module_loads += 1
        return self._module()

    def _module(self):
        return FakeModule(self)

    def mem_alloc(self, n):
        self._check_ctx()
        self._device_wide("cuMemAlloc")
        return FakeAlloc(self.mem, n)

    def _htod(self, dst, src):
        self._check_ctx()
        src = np.ascontiguousarray(src).view(np.uint8).ravel()
        self.mem.view(int(dst), np.uint8, src.size)[:] = src

    def memcpy_htod(self, dst, src):
        self.ops.append(("htod pageable" if not pinned(src) else "htod", None))
        self._htod(dst, src)

    def memcpy_htod_async(self, dst, src, stream=None):
        self.ops.append(("htod pageable" if not pinned(src) else "htod", stream))
        self._htod(dst, src)

    def memcpy_dtoh_async(self, dst, src, stream=None):
        self._check_ctx()
        d = dst.view(np.uint8).reshape(-1)
        d[:] = self.mem.view(int(src), np.uint8, d.size)

    def memset_d32(self, dst, v, n):
        self.ops.append(("memset", None))
        self._check_ctx()
        self.mem.view(int(dst), np.uint32, n)[:] = v

    def memset_d32_async(self, dst, v, n, stream=None):
        self.ops.append(("memset", stream))
        self._check_ctx()
        self.mem.view(int(dst), np.uint32, n)[:] = v

    def pagelocked_empty(self, shape, dtype, order="C", mem_flags=0):
        self._check_ctx()
        self._device_wide("cuMemHostAlloc")
        return np.asarray(HostAlloc(shape, dtype, self))


class FakeFunction:
    def __init__(self, cuda, name):
        self.cuda, self.name, self.fmt = cuda, name, None

    def prepare(self, fmt):
        self.fmt = fmt
        return self

    def _net(self, d_net, d_w):
        net = self.cuda.mem.view(d_net, np.uint8, NET_DTYPE.itemsize).view(NET_DTYPE)
        n_w = self.cuda.mem.blocks[d_w].nbytes // 4
        w = self.cuda.mem.view(d_w, np.float32, n_w)
        from fastpath.gpu._pack import PackedNet
        nl = int(net["n_layers"][0])
        dims = [int(net["layers"][0, 0]["in"])] + [int(net["layers"][0, i]["out"])
                                                   for i in range(nl)]
        return PackedNet(net.copy(), w.copy(), tuple(dims), (), 0)

    def prepared_async_call(self, grid, block, stream, *args):
        cu = self.cuda
        cu._check_ctx()
        assert len(args) == len(self.fmt), (self.fmt, args)
        assert 1 <= grid[0] <= cu.sm and block == (B.BLOCK, 1, 1)
        cu.launches.append((self.name, grid, args))
        cu.ops.append(("launch", stream))
        if self.name == "fp_mlp_batch":
            d_net, d_w, d_x, d_a, d_b, d_y, d_st, tag, n, d_bar = args
            p = self._net(d_net, d_w)
            x = cu.mem.view(d_x, np.float32, n * p.dims[0]).reshape(n, -1)
            y, bad = packed_forward(p, x)
            cu.mem.view(d_y, np.float32, y.size)[:] = y.ravel()
            st = cu.mem.view(d_st, np.int32, n)
            st[bad] = tag
            return
        d_net, d_w, d_slot = args[:3]
        p = self._net(d_net, d_w)
        if cu.kernel_mode == "never_starts":
            return
        nl = int(p.net["n_layers"][0])
        layers = [p.net["layers"][0, i] for i in range(nl)]
        ws = [p.weights[int(L["w_off"]):int(L["w_off"]) + int(L["in"]) * int(L["out"])]
              .reshape(int(L["out"]), int(L["in"])) for L in layers]
        bs = [p.weights[int(L["b_off"]):int(L["b_off"]) + int(L["out"])] for L in layers]
        acts = [("identity", "relu", "tanh", "sigmoid")[int(L["act"])] for L in layers]
        dev = P.CpuDevice(ws, bs, acts, "scalar")
        slot = P.Slot(_Owner(), d_slot, p.dims[0], p.dims[-1], init=False)
        answers = 3 if cu.kernel_mode == "hangs_after_3" else 2**62
        asked = threading.Event()       # set once the event after the kernel is queried
        t = threading.Thread(target=_serve, args=(dev, slot, answers,
                                                  cu.kernel_mode == "returns_late", asked),
                             daemon=True)
        t.asked = asked
        cu.threads.append(t)
        t.start()


def _serve(dev, slot, answers, late, asked):
    """The persistent kernel's thread. late: after the slot says EXITED it returns only once
    the event after it was queried, as a kernel's last instructions outlast that store."""
    dev.serve(slot, answers)
    if late:
        asked.wait(30)


class _Owner:
    nbytes = 1 << 30    # the slot's memory belongs to the PersistentPath under test


class FakeModule:
    def __init__(self, cuda):
        self.cuda = cuda

    def get_function(self, name):
        self.cuda._check_ctx()
        return FakeFunction(self.cuda, name)


@pytest.fixture
def fake_fatbin(tmp_path, monkeypatch):
    f = tmp_path / "fp_mlp.fatbin"
    f.write_bytes(b"\x50\xed\x55\xba")
    monkeypatch.setattr(B, "FATBIN", str(f))
    monkeypatch.setattr(B.load_module, "__defaults__", (str(f), None))
    yield str(f)
    # the process's shared contexts of this test's stand-ins go with it (each holds its
    # driver, and so every buffer the test allocated, for the rest of the session)
    with B._CONTEXTS_LOCK:
        for k, dc in list(B._CONTEXTS.items()):
            if isinstance(dc.cuda, FakeCuda):
                del B._CONTEXTS[k]


@pytest.fixture
def fake_gpu(monkeypatch, fake_fatbin):
    """pycuda.driver is the stand-in: gpu_status() says a GPU is usable, Engine builds its
    GpuBackend on it (the kernels are packed_forward / the CPU device thread)."""
    cu = FakeCuda()
    _fake_pycuda(monkeypatch, cu)
    yield cu
    gpu_status.cache_clear()


# a loose policy so the stream below gives hits and misses; repeated raws with small noise
HIT_CACHE = {"enabled": True, "cos_threshold": 0.95, "norm_tol": 0.5, "max_age_ns": 10**12,
             "max_run": 3}


def _head_model(rng, kind):
    """A windowed model whose last layer and head are `kind`: 1 output (regression), 2
    (tanh_sigmoid), 3 with a softmax (classifier3), 1 logit with logistic2 (classifier2)."""
    from fastpath.model import Head, Model
    base = windowed_model(rng, hidden=(24,))
    nf = base.feature_spec.n_feat
    width, post, head = {"regression": (1, "none", Head("regression", 0.5, (0,))),
                         "tanh_sigmoid": (2, "none", None),
                         "classifier3": (3, "softmax", None),
                         "logistic2": (1, "logistic2", None)}[kind]
    from fastpath.model import Layer
    layers = tuple(Layer(rng.standard_normal((o, i)).astype(np.float32) / np.sqrt(i),
                         rng.standard_normal(o).astype(np.float32) * 0.1, a)
                   for i, o, a in ((nf, 24, "tanh"), (24, width, "identity")))
    return Model(layers, base.feature_spec, base.cache_policy, post=post, head_spec=head)


def _stream(rng, n=120, raw_len=40, n_sym=3):
    base = rng.standard_normal((n // 4, raw_len)).astype(np.float32)
    raws = np.repeat(base, 4, axis=0)
    raws += np.float32(1e-3) * rng.standard_normal(raws.shape).astype(np.float32)
    return np.ascontiguousarray(raws), rng.integers(0, n_sym, len(raws))


def _tree_model():
    from fastpath import TreeEnsemble
    from fastpath.model import Model
    t = TreeEnsemble(n_features=2, n_targets=2, tree_offsets=[0, 3], mode=[0, 6, 6],
                     feature=[0, 0, 0], threshold=[0.5, 0, 0], true_child=[1, -1, -1],
                     false_child=[2, -1, -1], nan_true=[0, 0, 0], weight_node=[1, 2, 1, 2],
                     weight_target=[0, 0, 1, 1], weight_value=[1.0, 2.0, 0.5, -0.5])
    return Model((), trees=t)


def _gpu_check():
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    try:
        import gpu_check
    finally:
        sys.path.pop(0)
    return gpu_check


# an H200 as the driver reports it, and fp_mlp_persistent as ptxas builds it for sm_90
H200 = {"MULTIPROCESSOR_COUNT": 132, "MAX_THREADS_PER_MULTIPROCESSOR": 2048,
        "MAX_BLOCKS_PER_MULTIPROCESSOR": 32, "MAX_REGISTERS_PER_MULTIPROCESSOR": 65536,
        "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR": 233472, "RESERVED_SHARED_MEMORY_PER_BLOCK": 1024}


PERSISTENT_SM90 = {"NUM_REGS": 33, "SHARED_SIZE_BYTES": 24, "MAX_THREADS_PER_BLOCK": 1024}


class OccFunction(FakeFunction):
    def get_attribute(self, a):
        return self.cuda.fn_attrs[a]

    def prepared_async_call(self, grid, block, stream, *args):
        n = len(self.cuda.threads)
        FakeFunction.prepared_async_call(self, grid, block, stream, *args)
        # the persistent "kernel" (a CPU thread) belongs to its own stream: a launch on
        # another stream is not held up by it, as on a GPU
        stream.kernel = self.cuda.threads[-1] if len(self.cuda.threads) > n else None


class OccModule(FakeModule):
    def get_function(self, name):
        self.cuda._check_ctx()
        return OccFunction(self.cuda, name)


class OccCuda(FakeCuda):
    """The stand-in driver (FakeCuda), reporting occupancy attributes (device and
    kernel) by name, and with memset_d32_async."""
    device_attribute = types.SimpleNamespace(**{k: k for k in H200})
    function_attribute = types.SimpleNamespace(**{k: k for k in PERSISTENT_SM90})

    def __init__(self, sm=4, dev=None, fn=None, **kw):
        super().__init__(sm=sm, **kw)
        self.dev_attrs = dict(H200, MULTIPROCESSOR_COUNT=sm, **(dev or {}))
        self.fn_attrs = dict(PERSISTENT_SM90, **(fn or {}))
        fake = self

        class Device(self.Device):
            def get_attribute(self, a):
                if a not in fake.dev_attrs:
                    raise fake.Error(f"invalid device attribute {a}")
                return fake.dev_attrs[a]

        class Event(self.Event):
            def record(self, stream=None):
                self.thread = getattr(stream, "kernel", None)
        self.Device, self.Event = Device, Event

    def _module(self):
        return OccModule(self)


def _wide(seed):
    # past SMALL_MACS, 256 outputs: a grid of every SM (4 on the stand-in)
    return random_model(np.random.default_rng(seed), [300, 256, 2])


def users(cu, ordinal: int = 0) -> int:
    """GpuBackends holding the process's shared context of stand-in `cu`'s device (0 once
    every one was closed or failed; the primary context itself stays until exit)."""
    dc = B._CONTEXTS.get((id(cu), ordinal))
    return 0 if dc is None or dc.cuda is not cu else dc.users
