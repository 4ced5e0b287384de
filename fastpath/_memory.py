"""Memory for the weights arena and the cache slots: huge pages where the host allows, locked.

Design: the C engine never allocates this memory itself; it receives one 64-byte-aligned
buffer. The order tried is: mmap(MAP_HUGETLB) from the hugetlb pool (1 GB pages when asked
and configured, else 2 MB), then an ordinary mapping with madvise(MADV_HUGEPAGE)
(transparent huge pages), then ordinary pages; then mlock. What actually backs the mapping
is read back from /proc/self/smaps (KernelPageSize, AnonHugePages, Locked) when the report is
first read, never assumed, and every refusal is in the report with its errno and, for mlock,
the capability and rlimit the kernel went by. It sits beside the engine (which calls
allocate()); fastpath.control.memory re-exports it with what a config will lock, for
`fastpath doctor`.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os
from dataclasses import dataclass, field

from fastpath._privileges import MEMLOCK_FIX, read_privileges

MAP_HUGETLB = getattr(mmap, "MAP_HUGETLB", 0x40000)
MAP_HUGE_SHIFT = 26
MAP_HUGE_2MB = 21 << MAP_HUGE_SHIFT
MAP_HUGE_1GB = 30 << MAP_HUGE_SHIFT
MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", 14)
MB2 = 2 << 20
GB1 = 1 << 30

_libc = None


def _mlock(addr: int, n: int) -> int:
    """0, or the errno mlock failed with."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    rc = _libc.mlock(ctypes.c_void_p(addr), ctypes.c_size_t(n))
    return 0 if rc == 0 else ctypes.get_errno()


@dataclass
class MemoryReport:
    asked: str
    bytes: int
    tried: list = field(default_factory=list)     # [method, "ok" | error]
    method: str = "none"                           # hugetlb-1g | hugetlb-2m | thp | normal
    mlock: str = "not asked"
    addr: int | None = field(default=None, repr=False, compare=False)   # inside the mapping
    _smaps: dict | None = field(default=None, init=False, repr=False, compare=False)

    def smaps(self) -> dict:
        """The mapping's smaps fields (kB), read back at first use, while its engine lives:
        /proc/self/smaps costs tens of ms in a process with many mappings, too much for
        every engine to pay at creation."""
        if self._smaps is None:
            self._smaps = smaps_entry(self.addr) if self.addr is not None else {}
        return self._smaps

    @property
    def kernel_page_kb(self) -> int | None:
        return self.smaps().get("KernelPageSize")

    @property
    def anon_huge_kb(self) -> int | None:
        return self.smaps().get("AnonHugePages")

    @property
    def rss_kb(self) -> int | None:
        return self.smaps().get("Rss")

    @property
    def locked_kb(self) -> int | None:
        return self.smaps().get("Locked")

    def to_dict(self) -> dict:
        return {"asked": self.asked, "bytes": self.bytes, "tried": [list(t) for t in self.tried],
                "method": self.method, "kernel_page_kb": self.kernel_page_kb,
                "anon_huge_kb": self.anon_huge_kb, "rss_kb": self.rss_kb,
                "locked_kb": self.locked_kb, "mlock": self.mlock}

    @property
    def page_size(self) -> str:
        """The page size actually backing the arena, as read from smaps."""
        if self.kernel_page_kb and self.kernel_page_kb >= 1024 * 1024:
            return "1G"
        if self.kernel_page_kb and self.kernel_page_kb >= 2048:
            return "2M"
        if self.anon_huge_kb and self.rss_kb and self.anon_huge_kb >= self.rss_kb // 2:
            return "2M (THP)"
        return f"{self.kernel_page_kb or 4}K"


class Region:
    """A mapping kept alive for as long as the engine that uses it."""

    def __init__(self, mm: mmap.mmap, offset: int, size: int, report: MemoryReport):
        self.mm = mm
        self._anchor = ctypes.c_char.from_buffer(mm)     # pins the mapping: mmap.close() fails
        self.base = ctypes.addressof(self._anchor)
        self.addr = self.base + offset
        self.size = size
        self.report = report


def smaps_entry(addr: int, smaps_path: str = "/proc/self/smaps") -> dict:
    """The smaps fields (kB) of the mapping that contains `addr`."""
    out: dict = {}
    try:
        with open(smaps_path) as f:
            inside = False
            for line in f:
                head = line.split()
                if head and "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
                    lo, hi = (int(x, 16) for x in head[0].split("-"))
                    if inside:
                        break
                    inside = lo <= addr < hi
                elif inside and ":" in line:
                    k, v = line.split(":", 1)
                    parts = v.split()
                    if parts and parts[0].isdigit():
                        out[k.strip()] = int(parts[0])
    except OSError:
        pass
    return out


def _plan(asked: str) -> list:
    return {"1g": ["hugetlb-1g", "hugetlb-2m", "thp", "normal"],
            "2m": ["hugetlb-2m", "thp", "normal"], "auto": ["hugetlb-2m", "thp", "normal"],
            "thp": ["thp", "normal"], "none": ["normal"]}[asked]


def available_bytes(root: str = "/") -> int | None:
    """Memory this process can still fault in without the OOM killer: MemAvailable from
    /proc/meminfo, capped by the room left under a cgroup v2 memory.max (a container's limit,
    which MemAvailable does not see); None when neither is readable."""
    avail = None
    try:
        with open(os.path.join(root, "proc/meminfo")) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open(os.path.join(root, "sys/fs/cgroup/memory.max")) as f:
            lim = f.read().strip()
        with open(os.path.join(root, "sys/fs/cgroup/memory.current")) as f:
            cur = int(f.read().strip())
        if lim != "max":
            room = max(int(lim) - cur, 0)
            avail = room if avail is None else min(avail, room)
    except (OSError, ValueError):
        pass
    return avail


def allocate(nbytes: int, huge_pages: str = "auto", lock: bool = True) -> Region:
    """A zeroed, 64-byte-aligned region of at least nbytes, backed as well as the host allows."""
    nbytes = max(int(nbytes), 64)
    rep = MemoryReport(huge_pages, nbytes)
    region = None
    for method in _plan(huge_pages):
        try:
            if method.startswith("hugetlb"):
                page = GB1 if method == "hugetlb-1g" else MB2
                size = -(-nbytes // page) * page
                flags = mmap.MAP_PRIVATE | MAP_HUGETLB | (MAP_HUGE_1GB if page == GB1 else MAP_HUGE_2MB)
                mm = mmap.mmap(-1, size, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
                region = Region(mm, 0, size, rep)
            elif method == "thp":
                # THP only backs 2 MB-aligned 2 MB extents: over-map by 2 MB, use an aligned start
                size = -(-nbytes // MB2) * MB2
                mm = mmap.mmap(-1, size + MB2, flags=mmap.MAP_PRIVATE,
                               prot=mmap.PROT_READ | mmap.PROT_WRITE)
                anchor = ctypes.addressof(ctypes.c_char.from_buffer(mm))
                off = (-anchor) % MB2
                mm.madvise(MADV_HUGEPAGE, off, size)
                region = Region(mm, off, size, rep)
            else:
                size = -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE
                mm = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE,
                               prot=mmap.PROT_READ | mmap.PROT_WRITE)
                region = Region(mm, 0, size, rep)
        except (OSError, ValueError) as exc:
            code = getattr(exc, "errno", None)
            rep.tried.append([method, f"{errno.errorcode.get(code, code)}: {exc}"])
            continue
        rep.tried.append([method, "ok"])
        rep.method = method
        break
    if region is None:
        raise MemoryError(f"cannot map {nbytes} bytes: {rep.tried}")
    if not rep.method.startswith("hugetlb"):
        # a hugetlb mapping is reserved from its pool when mapped (it failed above if short);
        # ordinary and THP pages are only promised: faulting in more than the host has left
        # (engine.n_symbols up to 4M asks for GBs) got the process OOM-killed, no message
        avail = available_bytes()
        if avail is not None and region.size > avail:
            size = region.size
            del region          # nothing was touched yet: unmapped with its last reference
            raise MemoryError(f"the engine needs {size} bytes (weights arena + per-symbol "
                              f"state) but only {avail} are available (MemAvailable, or the "
                              f"cgroup's memory.max): lower engine.n_symbols")
    # fault every page in now, not on the first tick
    ctypes.memset(region.addr, 0, region.size)
    if lock:
        err = _mlock(region.addr, region.size)
        if err == 0:
            rep.mlock = "ok"
        elif err in (errno.EPERM, errno.ENOMEM):
            _, why = read_privileges().memory_lock(region.size)
            rep.mlock = f"{errno.errorcode.get(err, err)}: {why}; fix: {MEMLOCK_FIX}"
        else:
            rep.mlock = f"{errno.errorcode.get(err, err)}"
    rep.addr = region.addr
    return region
