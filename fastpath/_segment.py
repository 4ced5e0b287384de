"""The serving segment's file: on huge pages where the host allows, ordinary pages otherwise,
and a report of what was tried and why each refusal happened.

Design: clients find a segment by one path, /dev/shm/fastpath.<name> (fp_ring.h), whatever
backs it, and map whatever the server made. Huge pages that two processes can share come
from a hugetlbfs mount (a file there, with pages from the hugetlb pool) or from tmpfs with
shmem transparent huge pages; a segment in hugetlbfs is reached through a symlink at the
usual path, so a C client's open() follows it without knowing. The order tried follows
[memory] huge_pages (fastpath.config: 1g, 2m, thp, normal). What actually backs the
mapping is read back from /proc/self/smaps by the caller once the pages are touched.
"""
from __future__ import annotations

import errno
import mmap
import os
import stat
import time

SHM_DIR = "/dev/shm"
THP_SHMEM = "/sys/kernel/mm/transparent_hugepage/shmem_enabled"
MB2 = 2 << 20
GB1 = 1 << 30
PLANS = {"1g": ["hugetlb-1g", "hugetlb-2m", "thp", "normal"],
         "2m": ["hugetlb-2m", "thp", "normal"], "auto": ["hugetlb-2m", "thp", "normal"],
         "thp": ["thp", "normal"], "none": ["normal"]}


def _default_huge_kb() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("Hugepagesize:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 2048


def hugetlbfs_mounts(mounts: str = "/proc/mounts") -> dict:
    """{page size in bytes: mount point} of the hugetlbfs mounts this process may write to."""
    out: dict = {}
    try:
        with open(mounts) as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split()
        if len(parts) < 4 or parts[2] != "hugetlbfs":
            continue
        page = _default_huge_kb() << 10
        for opt in parts[3].split(","):
            if opt.startswith("pagesize="):
                v = opt.split("=", 1)[1].upper()
                mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(v[-1:], 1)
                try:
                    page = int(v.rstrip("KMG")) * mult
                except ValueError:
                    continue
        mnt = parts[1].replace("\\040", " ")
        if os.access(mnt, os.W_OK | os.X_OK):
            out.setdefault(page, mnt)
    return out


def shmem_thp_mode(path: str = THP_SHMEM) -> str:
    """The bracketed choice of shmem_enabled ("never", "advise", ...), or "absent"."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return "absent"
    for word in text.split():
        if word.startswith("["):
            return word.strip("[]")
    return "absent"


def _round(n: int, page: int) -> int:
    return -(-n // page) * page


def create(path: str, size: int, mode: int, huge_pages: str = "auto"):
    """Create the segment file at `path` (exclusive) of at least `size` bytes.

    Returns (fd, map_bytes, method, tried): fd open read-write, the file's size (rounded up
    to the page size of the method), the method that made it ("hugetlb-2m", "hugetlb-1g",
    "thp" or "normal") and [[method, "ok" or why not], ...]. For "thp" the caller madvises
    the mapping (MADV_HUGEPAGE). Raises OSError when not even an ordinary file can be made.
    """
    tried: list = []
    mounts = None
    for method in PLANS[huge_pages]:
        if method.startswith("hugetlb"):
            page = GB1 if method == "hugetlb-1g" else MB2
            if mounts is None:
                mounts = hugetlbfs_mounts()
            mnt = mounts.get(page)
            if mnt is None:
                tried.append([method, f"no writable hugetlbfs mount with {page >> 20} MB pages "
                                      f"(e.g. mount -t hugetlbfs -o pagesize="
                                      f"{'1G' if page == GB1 else '2M'} none /dev/hugepages)"])
                continue
            real = os.path.join(mnt, os.path.basename(path))
            n = _round(size, page)
            try:
                fd = _open_excl(real, mode)
            except OSError as exc:
                tried.append([method, f"{real}: {_why(exc)}"])
                continue
            try:
                os.ftruncate(fd, n)
                # the pool is checked when pages are reserved, at mmap, not at ftruncate:
                # reserve them now so a short pool is a refusal here, not a SIGBUS later
                probe = mmap.mmap(fd, n, flags=mmap.MAP_SHARED,
                                  prot=mmap.PROT_READ | mmap.PROT_WRITE)
                probe.close()
                os.symlink(real, path)
            except BaseException as exc:
                # a Ctrl-C while the pool's pages are reserved (a 1 GB page takes a while)
                # left the file in hugetlbfs, holding those pages, until someone removed it
                os.close(fd)
                _unlink(real)
                if not isinstance(exc, OSError):
                    raise
                tried.append([method, f"{_why(exc)} (hugetlb pool: "
                                      f"{_pool_line(page)})"])
                continue
            tried.append([method, "ok"])
            return fd, n, method, tried
        if method == "thp":
            thp = shmem_thp_mode()
            if thp in ("never", "deny", "absent"):
                tried.append([method, f"shmem transparent huge pages are off ({THP_SHMEM} = "
                                      f"{thp}; 'advise' allows them)"])
                continue
            fd = _open_excl(path, mode)
            try:
                os.ftruncate(fd, _round(size, MB2))
                _reserve(fd, _round(size, MB2), path, allocate=False)
            except BaseException:       # KeyboardInterrupt too: no half-made file is left
                os.close(fd)
                _unlink(path)
                raise
            tried.append([method, "ok"])
            return fd, _round(size, MB2), method, tried
        fd = _open_excl(path, mode)
        n = _round(size, os.sysconf("SC_PAGE_SIZE"))
        try:
            os.ftruncate(fd, n)
            _reserve(fd, n, path, allocate=True)
        except BaseException:           # KeyboardInterrupt too: no half-made file is left
            os.close(fd)
            _unlink(path)
            raise
        tried.append([method, "ok"])
        return fd, n, method, tried
    raise OSError(errno.ENOMEM, f"no backing for the segment: {tried}")


def _pool_line(page: int) -> str:
    base = f"/sys/kernel/mm/hugepages/hugepages-{page >> 10}kB/"
    try:
        with open(base + "nr_hugepages") as f:
            total = f.read().strip()
        with open(base + "free_hugepages") as f:
            free = f.read().strip()
        return f"{free} free of {total} {page >> 20} MB pages"
    except OSError:
        return "no pool for this page size"


def _why(exc: OSError) -> str:
    return f"{errno.errorcode.get(exc.errno, exc.errno)}: {exc.strerror}"


def _open_excl(p: str, mode: int) -> int:
    fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        os.fchmod(fd, mode)          # exactly the mode asked, whatever the umask
    except BaseException:
        # a Ctrl-C right after the open (or a refused chmod): the empty file stayed, taken
        # for a segment another server was making for the next 10 s, and the fd leaked
        os.close(fd)
        _unlink(p)
        raise
    return fd


def _unlink(p: str) -> None:
    try:
        os.unlink(p)
    except FileNotFoundError:
        pass


def remove(path: str, ident: tuple | None = None) -> None:
    """Remove the segment at `path`: the file, or the symlink and the hugetlbfs file it
    points at (a dangling link from a crashed run included). With ident (st_dev, st_ino of
    the file its server made), only while `path` still leads to that file: a server that
    replaced it owns the name now."""
    if ident is not None:
        try:
            st = os.stat(path)
        except OSError:
            return
        if (st.st_dev, st.st_ino) != tuple(ident):
            return
    if os.path.islink(path):
        target = _segment_link_target(path)
        if target is not None:
            _unlink(target)
    _unlink(path)


# how long a segment file whose header is not written yet counts as one a server is making:
# past this it is a crashed start's leftover (making one takes milliseconds, a few seconds
# for the largest the config allows)
INIT_GRACE_S = 10.0


def initializing(path: str, grace_s: float = INIT_GRACE_S) -> bool:
    """Is the file at `path` a segment another server is making (created, its header not
    written yet: the magic is stored last) rather than a crashed run's leftover? Yes while
    its magic is still zero and it was created or sized in the last grace_s seconds."""
    try:
        # non-blocking: a FIFO planted under the name (/dev/shm is writable by all) would
        # hold a plain open until some writer came
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return False
        head = os.pread(fd, 8, 0)
    except OSError:
        return False
    finally:
        os.close(fd)
    return head.count(0) == len(head) and time.time() - st.st_mtime < grace_s


def hugetlbfs_points(mounts: str = "/proc/mounts") -> set:
    """Every hugetlbfs mount point (writable or not)."""
    try:
        with open(mounts) as f:
            lines = f.read().splitlines()
    except OSError:
        return set()
    return {p[1].replace("\\040", " ") for p in (ln.split() for ln in lines)
            if len(p) >= 3 and p[2] == "hugetlbfs"}


def _segment_link_target(path: str) -> str | None:
    """The hugetlbfs file the symlink at `path` leads to when it is one create() makes (an
    absolute link to a file of the same name at the top of a hugetlbfs mount), else None.
    /dev/shm is writable by every user: a link planted there under a segment's name made a
    server (often root) delete whatever it pointed at, and a relative link was resolved
    against the server's working directory."""
    try:
        target = os.readlink(path)
    except OSError:
        return None
    if not os.path.isabs(target) or os.path.basename(target) != os.path.basename(path):
        return None
    # the mounts create() puts segments in, and any other hugetlbfs mount (one may have
    # become read-only or been shadowed since the segment was made)
    mounts = set(hugetlbfs_mounts().values()) | hugetlbfs_points()
    if os.path.dirname(os.path.normpath(target)) not in mounts:
        return None
    return target


def mapped_by(pid: int, path: str, maps: str | None = None) -> bool | None:
    """Does process `pid` map the file at `path` (followed through a symlink)? None when
    that cannot be told (its maps unreadable: another user's process, /proc hidden)."""
    try:
        st = os.stat(path)
        with open(maps or f"/proc/{pid}/maps") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}"
    for line in lines:
        f = line.split(None, 5)
        # start-end perms offset dev inode [path]
        if len(f) >= 5 and f[4] == str(st.st_ino) and f[3].lower() == dev:
            return True
    return False


def _reserve(fd: int, n: int, path: str, allocate: bool) -> None:
    """Make sure the file's n bytes exist before anyone touches them. tmpfs files are sparse:
    a segment larger than what /dev/shm has left (64 MB in a default docker container) would
    be created, and the first touch of a page past the limit kills the server with SIGBUS.
    allocate: reserve the pages now (fallocate); else (shmem THP, where fallocate would get
    small pages before the mapping is madvised) only check the free space."""
    d = os.path.dirname(path) or "."

    def refuse(code: int, why: str):
        return OSError(code, f"cannot reserve {n} bytes for the segment {path} ({why}): lower "
                             f"serve.ring_slots or serve.max_clients, or give {d} more room "
                             f"(docker: --shm-size)")
    try:
        vfs = os.statvfs(d)
    except OSError:
        vfs = None
    if vfs is not None and vfs.f_blocks and vfs.f_bavail * vfs.f_frsize < n:
        raise refuse(errno.ENOSPC, f"{d} has {vfs.f_bavail * vfs.f_frsize} bytes free of "
                                   f"{vfs.f_blocks * vfs.f_frsize}")
    if not allocate:
        return
    try:
        os.posix_fallocate(fd, 0, n)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):
            return              # a file system without fallocate: nothing to reserve ahead
        raise refuse(exc.errno, _why(exc)) from None


def backing(smaps: dict, method: str) -> dict:
    """What /proc/self/smaps says backs the mapping: page size, and for shmem THP how much
    of it sits in huge pages."""
    page_kb = smaps.get("KernelPageSize")
    pmd_kb = smaps.get("ShmemPmdMapped", 0) or smaps.get("FilePmdMapped", 0)
    rss = smaps.get("Rss")
    if page_kb and page_kb >= 2048:
        pages = f"{page_kb >> 10}M" if page_kb < 1 << 20 else f"{page_kb >> 20}G"
    elif pmd_kb and rss and pmd_kb >= rss // 2:
        pages = "2M (THP)"
    else:
        pages = f"{page_kb or 4}K"
    return {"kernel_page_kb": page_kb, "huge_pmd_kb": pmd_kb, "rss_kb": rss, "pages": pages,
            "method": method}
