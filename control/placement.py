"""Where the thread that calls step() runs, and with which scheduling policy.

Design: a decision is data first (PlacementReport: what was asked, what each rule did, the
core chosen and why), applied second, and the application reads back what the kernel
granted. Core choice, in order: an explicit core from config; else isolated cores first;
on the GPU's NUMA node when a GPU is used (a PCIe trip across nodes costs 0.5-1 us more);
never a core that is busy or whose SMT sibling is busy; CPU 0 last (it takes the
housekeeping and most IRQs). Real-time priority above 80 is refused unless allowed: it
starves the kernel threads (RCU callbacks, ksoftirqd) the network stack needs.
What the process may do is asked of the kernel (effective capabilities and rlimits), never
inferred from the uid: root in a default container has no CAP_SYS_NICE.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

from fastpath.control.config import load_config
from fastpath.control.host import Host, Topology, format_cpulist, read_topology, sample_busy
from fastpath._privileges import (CAP_IPC_LOCK, CAP_SYS_NICE, MEMLOCK_FIX, RT_FIX, UNLIMITED,
                                  Privileges, _limit, read_privileges)
from fastpath.config import POLICIES, check_priority
from fastpath.errors import ConfigError

# the privilege reading lives beside the engine (fastpath._privileges); re-exported here
__all__ = ["BUSY", "POLICIES", "RT_THROTTLE_NOTE", "PlacementReport", "apply", "check_priority",
           "choose_core", "place", "CAP_IPC_LOCK", "CAP_SYS_NICE", "MEMLOCK_FIX", "RT_FIX",
           "UNLIMITED", "Privileges", "_limit", "read_privileges"]

BUSY = 0.25        # a CPU busier than this fraction is "busy"

RT_THROTTLE_NOTE = ("RT throttling is the kernel's safety valve: a SCHED_FIFO/RR thread that never "
                    "sleeps is stopped for {off} ms every {period} ms so other tasks can run. "
                    "kernel.sched_rt_runtime_us=-1 removes that stall, but then a spinning "
                    "real-time thread can hold its core forever (kworkers and ksoftirqd bound "
                    "there starve): only do it when the step() thread has an isolated core "
                    "(isolcpus= nohz_full=)")


@dataclass
class PlacementReport:
    asked: dict
    core: int | None = None
    reasons: list = field(default_factory=list)
    candidates: list = field(default_factory=list)
    numa_node: int | None = None
    gpu_numa_node: int | None = None
    affinity_applied: bool = False
    affinity_now: list = field(default_factory=list)
    policy_asked: str = "other"
    priority_asked: int = 0
    policy_granted: str = "SCHED_OTHER"
    priority_granted: int = 0
    sched_refused: str | None = None
    privileges: dict = field(default_factory=dict)
    warnings: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    def lines(self) -> list:
        out = [f"core {self.core} (NUMA node {self.numa_node})" if self.core is not None
               else "core: none chosen"]
        out += [f"  - {r}" for r in self.reasons]
        out.append(f"scheduling: asked {self.policy_asked} {self.priority_asked}, granted "
                   f"{self.policy_granted} {self.priority_granted}"
                   + (f" (refused: {self.sched_refused})" if self.sched_refused else ""))
        out += [f"warning: {w}" for w in self.warnings]
        return out


def choose_core(topo: Topology, core="auto", use_gpu: bool = False, busy: dict | None = None,
                allowed: list | None = None) -> PlacementReport:
    """Pick the core for the step() thread; every rule that narrowed the choice is recorded."""
    rep = PlacementReport(asked={"core": core, "use_gpu": use_gpu})
    busy = busy or {}
    allowed = sorted(set(allowed if allowed is not None else topo.cpus) & set(topo.cpus))
    if not allowed:
        raise ConfigError(f"placement: no online CPU is allowed for this process "
                          f"(online {format_cpulist(topo.cpus)})")
    gpu_node = None
    if use_gpu and topo.gpus:
        gpu_node = topo.gpus[0].numa_node
        rep.gpu_numa_node = gpu_node
    if core != "auto":
        if not isinstance(core, int) or isinstance(core, bool) or core not in allowed:
            raise ConfigError(f"placement.core = {core!r} is not an online CPU this process may use "
                              f"(allowed: {format_cpulist(allowed)})")
        rep.core = core
        rep.reasons.append(f"core {core} set in the config")
        if gpu_node is not None and topo.node_of(core) != gpu_node:
            rep.warnings.append(f"core {core} is on NUMA node {topo.node_of(core)} but the GPU is on "
                                f"node {gpu_node}: each PCIe trip crosses the interconnect "
                                f"(+0.5-1 us)")
        if busy.get(core, 0) > BUSY:
            rep.warnings.append(f"core {core} is busy ({100 * busy[core]:.0f}%)")
        rep.numa_node = topo.node_of(core)
        return rep
    iso = set(topo.isolated) | set(topo.nohz_full)
    local = set()
    if gpu_node is not None:
        local = set(topo.gpus[0].local_cpus) or set(topo.nodes.get(gpu_node, []))

    def is_busy(c):
        return busy.get(c, 0.0) > BUSY

    def sib_busy(c):
        return any(is_busy(s) for s in topo.siblings.get(c, []))

    # lexicographic preference: idle core, idle SMT sibling, on the GPU's node, isolated,
    # not CPU 0, no SMT sibling at all, least busy, highest number
    def key(c):
        return (is_busy(c), sib_busy(c), bool(local) and c not in local, c not in iso, c == 0,
                len(topo.siblings.get(c, [])) > 0, busy.get(c, 0.0), -c)

    rep.reasons.append(f"allowed CPUs: {format_cpulist(allowed)}")
    skipped = [c for c in allowed if is_busy(c)]
    if skipped:
        rep.reasons.append(f"busy (> {int(BUSY * 100)}%), avoided: {format_cpulist(skipped)}")
    skipped = [c for c in allowed if not is_busy(c) and sib_busy(c)]
    if skipped:
        rep.reasons.append(f"SMT sibling busy, avoided: {format_cpulist(skipped)}")
    if gpu_node is not None:
        rep.reasons.append(f"GPU {topo.gpus[0].pci} on NUMA node {gpu_node}, its CPUs: "
                           f"{format_cpulist(local) or 'unknown'}")
    rep.reasons.append(f"isolated (isolcpus/nohz_full): {format_cpulist(iso) or 'none'}")
    ranked = sorted(allowed, key=key)
    rep.candidates = ranked[:8]
    c = rep.core = ranked[0]
    why = []
    why.append("busy" if is_busy(c) else "idle")
    if topo.siblings.get(c):
        why.append("SMT sibling busy" if sib_busy(c) else "SMT sibling idle")
    if local:
        why.append("on the GPU's node" if c in local else "NOT on the GPU's node")
    why.append("isolated" if c in iso else "not isolated")
    rep.reasons.append(f"chose {c}: {', '.join(why)}")
    if is_busy(c) or sib_busy(c):
        rep.warnings.append(f"every allowed core is busy or has a busy SMT sibling; {c} is the "
                            f"least bad")
    if local and c not in local:
        rep.warnings.append(f"no usable core on the GPU's node {gpu_node}: PCIe trips cross nodes")
    rep.numa_node = topo.node_of(c)
    return rep


def apply(rep: PlacementReport, policy: str = "fifo", priority: int = 50,
          allow_above_80: bool = False, host: Host | None = None) -> PlacementReport:
    """Pin the calling thread to rep.core and ask for the scheduling policy; record what the
    kernel granted. A refused real-time policy leaves SCHED_OTHER and says why."""
    check_priority(policy, priority, allow_above_80)
    host = host or Host()
    rep.policy_asked, rep.priority_asked = policy, priority
    if rep.core is not None:
        try:
            os.sched_setaffinity(0, {rep.core})
            rep.affinity_applied = True
        except OSError as exc:
            rep.warnings.append(f"sched_setaffinity({rep.core}) refused: {exc.strerror}")
    rep.affinity_now = sorted(os.sched_getaffinity(0))
    if policy != "other":
        priv = read_privileges(host)
        ok, why = priv.realtime(priority)
        rep.privileges = {"uid": priv.uid, "cap_sys_nice": priv.has(CAP_SYS_NICE),
                          "rlimit_rtprio": priv.rtprio, "realtime_allowed": ok, "why": why}
        try:
            os.sched_setscheduler(0, POLICIES[policy], os.sched_param(priority))
        except PermissionError:
            if ok:
                # the capability is there and the kernel still said no: the RT budget of the
                # cgroup (cpu.rt_runtime_us, CONFIG_RT_GROUP_SCHED) is the usual cause
                rep.sched_refused = (f"EPERM although {why}: the cgroup likely has no real-time "
                                     f"budget (cpu.rt_runtime_us = 0); running under SCHED_OTHER. "
                                     f"Fix: give the cgroup RT runtime, or run it in the root cgroup")
            else:
                rep.sched_refused = (f"{why}; running under SCHED_OTHER. Fix: "
                                     + RT_FIX.format(p=priority))
        except OSError as exc:
            rep.sched_refused = f"sched_setscheduler failed: {exc.strerror}; running under SCHED_OTHER"
        rt = host.read_int("/proc/sys/kernel/sched_rt_runtime_us")
        period = host.read_int("/proc/sys/kernel/sched_rt_period_us") or 1_000_000
        if rt is not None and rt >= 0 and not rep.sched_refused:
            rep.warnings.append(f"sched_rt_runtime_us = {rt} of {period}: "
                                + RT_THROTTLE_NOTE.format(off=(period - rt) // 1000,
                                                          period=period // 1000))
    pol = os.sched_getscheduler(0)
    rep.policy_granted = {v: f"SCHED_{k.upper()}" for k, v in POLICIES.items()}.get(pol, str(pol))
    rep.priority_granted = os.sched_getparam(0).sched_priority
    return rep


def place(cfg=None, use_gpu: bool = False, host: Host | None = None, busy: dict | None = None,
          apply_now: bool = True) -> PlacementReport:
    """Choose (and by default apply) the placement in `cfg` (EngineConfig, dict or TOML path)
    for the calling thread."""
    c = load_config(cfg).placement
    host = host or Host()
    topo = read_topology(host)
    if busy is None:
        busy = sample_busy(host, 0.1)
    allowed = sorted(os.sched_getaffinity(0)) if host.root == "/" else None
    rep = choose_core(topo, c.core, use_gpu, busy, allowed)
    if apply_now:
        apply(rep, c.policy, c.priority, c.allow_priority_above_80, host)
    else:
        check_priority(c.policy, c.priority, c.allow_priority_above_80)
        rep.policy_asked, rep.priority_asked = c.policy, c.priority
    return rep
