"""Reading the host: every sysfs/procfs read goes through one Host object with a root path.

Design: the control plane never opens /sys or /proc directly; it asks a Host, whose root is
"/" on a real machine and a temp folder in tests, so a 2-node NUMA host with a GPU, isolated
cores or a powersave governor can be built as files and every decision checked against it.
Missing files are normal (VMs hide cpufreq, containers hide IRQs): reads return None and
the callers say "not visible" instead of guessing.
"""
from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field

from fastpath._ranges import parse_ranges


def parse_cpulist(text: str | None) -> list:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11], sorted, each CPU once; '0-7:2' steps by 2;
    '' or None -> []. Text that is not a cpulist is a ValueError saying which part is wrong."""
    if not text:
        return []
    return sorted(set(parse_ranges(text.strip(), "cpulist")))


def boot_cpulist(text: str | None, last: int, flags: bool = False) -> list:
    """A cpulist from the kernel command line, as the kernel reads it (lib/bitmap.c,
    bitmap_parselist): regions 'N', 'N-M' and 'N-M:U/G' (of each group of G CPUs from N to
    M, the first U: '0-7:2/4' is 0,1,4,5), "all" (any case) for every CPU, also with a
    pattern ('all:1/2'), and the letter N for the last CPU (`nohz_full=1-N`, kernels 5.13+);
    with flags, isolcpus' leading words (domain, nohz, managed_irq) are skipped. The kernel
    refuses the whole list when one region is malformed (a pattern without its '/G', a range
    that ends before it starts, U > G, G = 0) and then isolates nothing: such a list reads
    as no CPU here too, not an error, since the host booted with it and a doctor or a server
    must still run there."""
    n = r"\d+|N"
    region = re.compile(rf"(?:(?P<all>[aA][lL][lL])|(?P<a>{n})(?:-(?P<b>{n}))?)"
                        rf"(?::(?P<u>{n})/(?P<g>{n}))?", re.ASCII)

    def val(v: str) -> int:
        return last if v == "N" else int(v)
    out: set = set()
    # the kernel splits regions at commas and white space
    for p in re.split(r"[,\s]+", (text or "").strip()):
        if not p:
            continue
        if flags and p.replace("_", "").isalpha() and p != "N" and p.lower() != "all":
            continue
        m = region.fullmatch(p)
        if m is None:
            return []
        if m["all"]:
            lo, hi = 0, last
        else:
            lo = val(m["a"])
            hi = val(m["b"]) if m["b"] is not None else lo
        used, group = ((val(m["u"]), val(m["g"])) if m["u"] is not None
                       else (hi + 1, hi + 1))
        if lo > hi or group == 0 or used > group:
            return []
        if hi - lo > (1 << 20):
            return []           # no host has that many CPUs: a typo, not a list to build
        for g0 in range(lo, hi + 1, group):
            out.update(range(g0, min(g0 + used, hi + 1)))
    return sorted(out)


def format_cpulist(cpus) -> str:
    cpus = sorted(set(cpus))
    parts, i = [], 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        parts.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(parts)


class Host:
    """Files of one host under `root`."""

    def __init__(self, root: str = "/"):
        self.root = root

    def path(self, p: str) -> str:
        return os.path.join(self.root, p.lstrip("/"))

    def read(self, p: str) -> str | None:
        try:
            with open(self.path(p)) as f:
                return f.read().strip()
        except (OSError, UnicodeDecodeError):
            return None

    def read_int(self, p: str) -> int | None:
        v = self.read(p)
        try:
            return int(v) if v is not None else None
        except ValueError:
            return None

    def exists(self, p: str) -> bool:
        return os.path.exists(self.path(p))

    def listdir(self, p: str) -> list:
        try:
            return sorted(os.listdir(self.path(p)))
        except OSError:
            return []

    def cmdline(self) -> dict:
        """Kernel boot parameters: {'isolcpus': '2-3', 'quiet': ''}."""
        out = {}
        for tok in (self.read("/proc/cmdline") or "").split():
            if tok == "--":
                break               # what follows goes to init, not to the kernel
            k, _, v = tok.partition("=")
            out[k] = v
        return out

    def meminfo(self) -> dict:
        out = {}
        for line in (self.read("/proc/meminfo") or "").splitlines():
            k, _, v = line.partition(":")
            parts = v.split()
            if parts:
                try:
                    out[k.strip()] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
                except ValueError:
                    pass
        return out

    def cpu_times(self) -> dict:
        """/proc/stat per CPU: cpu -> (busy jiffies, total jiffies)."""
        out = {}
        for line in (self.read("/proc/stat") or "").splitlines():
            if line.startswith("cpu") and line[3:4].isdigit():
                f = line.split()
                # user nice system idle iowait irq softirq steal; guest and guest_nice (the
                # 9th and 10th) are already counted in user and nice: summed again, a CPU
                # running a VM a fifth of the time read as a third busy
                vals = [int(x) for x in f[1:9]]
                idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
                out[int(f[0][3:])] = (sum(vals) - idle, sum(vals))
        return out


@dataclass
class Gpu:
    pci: str
    vendor: str
    numa_node: int | None
    local_cpus: list


@dataclass
class Topology:
    cpus: list                      # online CPUs
    siblings: dict                  # cpu -> SMT siblings (without itself)
    nodes: dict                     # NUMA node -> cpus
    isolated: list                  # isolcpus (sysfs or boot line)
    nohz_full: list
    rcu_nocbs: list
    gpus: list = field(default_factory=list)

    def node_of(self, cpu: int) -> int | None:
        for n, cs in self.nodes.items():
            if cpu in cs:
                return n
        return None


def read_topology(host: Host) -> Topology:
    cpus = parse_cpulist(host.read("/sys/devices/system/cpu/online"))
    if not cpus:
        cpus = sorted(int(d[3:]) for d in host.listdir("/sys/devices/system/cpu")
                      if d.startswith("cpu") and d[3:].isdigit())
    if not cpus:
        # /sys hidden (some sandboxes and hardened containers): the CPUs this process may
        # run on are still known, and a placement among them beats refusing to place at all
        for line in (host.read("/proc/self/status") or "").splitlines():
            k, _, v = line.partition(":")
            if k == "Cpus_allowed_list":
                cpus = boot_cpulist(v.strip(), 0)
        if not cpus and host.root == "/":
            cpus = sorted(os.sched_getaffinity(0))
    siblings = {}
    for c in cpus:
        sib = parse_cpulist(host.read(f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list"))
        siblings[c] = [s for s in sib if s != c]
    nodes = {}
    for n in parse_cpulist(host.read("/sys/devices/system/node/online")):
        nodes[n] = parse_cpulist(host.read(f"/sys/devices/system/node/node{n}/cpulist"))
    if not nodes:
        nodes = {0: list(cpus)}
    cmd = host.cmdline()
    possible = parse_cpulist(host.read("/sys/devices/system/cpu/possible"))
    last = max(possible or cpus or [0])
    # isolcpus=[flag,...,]cpulist, flags such as domain, managed_irq, nohz
    iso_boot = boot_cpulist(cmd.get("isolcpus"), last, flags=True)
    isolated = sorted(set(parse_cpulist(host.read("/sys/devices/system/cpu/isolated")) + iso_boot))
    nohz = sorted(set(parse_cpulist(host.read("/sys/devices/system/cpu/nohz_full")) +
                      boot_cpulist(cmd.get("nohz_full"), last)))
    rcu = boot_cpulist(cmd.get("rcu_nocbs"), last)
    gpus = []
    for dev in host.listdir("/sys/bus/pci/devices"):
        base = f"/sys/bus/pci/devices/{dev}"
        cls = host.read(f"{base}/class") or ""
        vendor = host.read(f"{base}/vendor") or ""
        if cls.startswith(("0x0302", "0x0300")) and vendor in ("0x10de", "0x1002"):
            node = host.read_int(f"{base}/numa_node")
            gpus.append(Gpu(dev, vendor, node if node is not None and node >= 0 else None,
                            parse_cpulist(host.read(f"{base}/local_cpulist"))))
    return Topology(cpus, siblings, nodes, isolated, nohz, rcu, gpus)


def sample_busy(host: Host, interval_s: float = 0.2) -> dict:
    """Fraction of each CPU's time spent busy over `interval_s` (from /proc/stat)."""
    a = host.cpu_times()
    time.sleep(interval_s)
    b = host.cpu_times()
    out = {}
    for c in b:
        if c in a and b[c][1] > a[c][1]:
            out[c] = (b[c][0] - a[c][0]) / (b[c][1] - a[c][1])
    return out
