"""`fastpath doctor`: is this host ready to run the hot path, and what would fix it.

Design: each check reads the host through a Host (root path, so tests run on fake trees)
and returns a verdict (pass / warn / fail), what it saw, and the exact command or boot
parameter that fixes it. "fail" is kept for what breaks latency for sure or makes the engine
misbehave (the chosen core's SMT sibling busy, the clock not TSC); a kernel default that is a
trade-off (RT throttling) and what a VM, a laptop or a container cannot change is "warn".
Privileges are the kernel's answer (effective capabilities, rlimits), never the uid.
Nothing here changes the host.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from fastpath.control.config import read_toml
from fastpath.control.host import Host, Topology, format_cpulist, parse_cpulist, read_topology
from fastpath.control.memory import lock_plan as plan_of
from fastpath.control.placement import (MEMLOCK_FIX, RT_FIX, RT_THROTTLE_NOTE, Privileges,
                                        choose_core, read_privileges)
from fastpath.errors import ConfigError

PASS, WARN, FAIL = "pass", "warn", "fail"


@dataclass
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def _governor(host: Host, core: int) -> Check:
    g = host.read(f"/sys/devices/system/cpu/cpu{core}/cpufreq/scaling_governor")
    fix = f"sudo cpupower -c {core} frequency-set -g performance"
    if g is None:
        return Check("cpu_governor", WARN, f"cpufreq not exposed for CPU {core} (VM or fixed "
                     f"frequency); the host decides the clock", "set the performance profile in the "
                     "BIOS / hypervisor")
    if g == "performance":
        return Check("cpu_governor", PASS, f"CPU {core} governor is performance")
    return Check("cpu_governor", FAIL if g == "powersave" else WARN,
                 f"CPU {core} governor is {g}: the clock ramps up after each idle gap", fix)


def _isolation(host: Host, topo: Topology, core: int) -> list:
    boot = f"isolcpus={core} nohz_full={core} rcu_nocbs={core}"
    out = []
    for name, cpus, what in (("isolcpus", topo.isolated, "the scheduler still puts other tasks on it"),
                             ("nohz_full", topo.nohz_full, "the scheduler tick interrupts it (1-4 kHz)"),
                             ("rcu_nocbs", topo.rcu_nocbs, "RCU callbacks run on it")):
        if core in cpus:
            out.append(Check(name, PASS, f"CPU {core} is in {name}={format_cpulist(cpus)}"))
        else:
            out.append(Check(name, WARN, f"CPU {core} not in {name} "
                             f"({format_cpulist(cpus) or 'none'}): {what}",
                             f"boot parameters: {boot}"))
    return out


def _thp(host: Host) -> Check:
    t = host.read("/sys/kernel/mm/transparent_hugepage/enabled")
    if t is None:
        return Check("transparent_hugepages", WARN, "THP state not visible", "")
    mode = t[t.find("[") + 1:t.find("]")] if "[" in t else t
    fix = "echo madvise | sudo tee /sys/kernel/mm/transparent_hugepage/enabled"
    if mode == "madvise":
        return Check("transparent_hugepages", PASS, "THP madvise: the weights arena asks for it, "
                     "nothing else is compacted behind our back")
    if mode == "always":
        return Check("transparent_hugepages", WARN, "THP always: khugepaged compaction can stall "
                     "any process", fix)
    return Check("transparent_hugepages", WARN, f"THP {mode}: the arena gets 4 KB pages unless the "
                 f"hugetlb pool has free pages", fix)


def _hugetlb(host: Host, need_pages: int = 4, huge_pages: str = "auto",
             sizes: tuple = ()) -> Check:
    """sizes: the bytes of each mapping drawn from the pool (the engine's arena, the serve
    segment); each is rounded up to whole pages on its own."""
    # the pool the config draws on: none for "none" and "thp" (the check said "falls back"
    # for a config that never asks the pool), 1 GB pages first for "1g" (it counted 2 MB ones)
    if huge_pages in ("none", "thp"):
        return Check("hugetlb_pool", PASS, f"memory.huge_pages = {huge_pages}: the hugetlb "
                     f"pool is not used")
    if huge_pages == "1g":
        free1 = host.read_int("/sys/kernel/mm/hugepages/hugepages-1048576kB/free_hugepages")
        total1 = host.read_int("/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages")
        need1 = max(1, sum(-(-b // (1 << 30)) for b in sizes))
        if free1 is not None and free1 >= need1:
            return Check("hugetlb_pool", PASS, f"{free1} of {total1} 1 GB huge pages free")
        seen = "no 1 GB pool" if free1 is None else f"{free1} of {total1} 1 GB huge pages free"
        fall = _hugetlb(host, need_pages, "auto", sizes)
        return Check("hugetlb_pool", WARN, f"{seen} (memory.huge_pages = 1g needs {need1}); "
                     f"2 MB pages next: {fall.detail}",
                     "hugepagesz=1G hugepages=N on the boot line"
                     + (f"; {fall.fix}" if fall.fix else ""))
    free = host.read_int("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
    total = host.read_int("/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages")
    if free is None:
        mi = host.meminfo()
        free, total = mi.get("HugePages_Free"), mi.get("HugePages_Total")
    fix = f"sudo sysctl -w vm.nr_hugepages={max(need_pages, 16)} (or hugepages=N on the boot line)"
    if free is None:
        return Check("hugetlb_pool", WARN, "hugetlb pool not visible", fix)
    if free >= need_pages:
        return Check("hugetlb_pool", PASS, f"{free} of {total} 2 MB huge pages free")
    what = "the arena and the serve segment need" if len(sizes) > 1 else "the arena needs"
    return Check("hugetlb_pool", WARN, f"{free} of {total} 2 MB huge pages free ({what} "
                 f"{need_pages}); falls back to THP or 4 KB pages", fix)


def _rt_runtime(host: Host, policy: str, core: int, isolated: bool) -> Check:
    rt = host.read_int("/proc/sys/kernel/sched_rt_runtime_us")
    period = host.read_int("/proc/sys/kernel/sched_rt_period_us") or 1_000_000
    if policy == "other":
        return Check("sched_rt_runtime", PASS, f"sched_rt_runtime_us = {rt}: RT throttling does not "
                     f"apply to SCHED_OTHER")
    # what throttling costs as configured; when off or unknown, what the default (95%) would cost
    runtime = rt if rt is not None and rt >= 0 else period * 95 // 100
    note = RT_THROTTLE_NOTE.format(off=(period - runtime) // 1000, period=period // 1000)
    if rt is None:
        return Check("sched_rt_runtime", WARN, f"sched_rt_runtime_us not visible. {note}", "")
    if rt < 0:
        if isolated:
            return Check("sched_rt_runtime", PASS, f"RT throttling off (sched_rt_runtime_us = -1) "
                         f"and CPU {core} is isolated")
        return Check("sched_rt_runtime", WARN, f"RT throttling off (sched_rt_runtime_us = -1) but "
                     f"CPU {core} is not isolated: a spinning SCHED_{policy.upper()} thread there can "
                     f"hold the core forever and starve the kernel threads bound to it",
                     f"boot parameters: isolcpus={core} nohz_full={core}, or restore the valve: "
                     f"sudo sysctl -w kernel.sched_rt_runtime_us=950000")
    fix = (f"sudo sysctl -w kernel.sched_rt_runtime_us=-1 (with CPU {core} isolated)" if isolated else
           f"isolate CPU {core} first (isolcpus={core} nohz_full={core}), then sudo sysctl -w "
           f"kernel.sched_rt_runtime_us=-1")
    return Check("sched_rt_runtime", WARN, f"sched_rt_runtime_us = {rt} of {period}"
                 f"{' (the kernel default)' if rt == 950_000 else ''}: {note}", fix)


def _swap(host: Host) -> Check:
    lines = (host.read("/proc/swaps") or "").splitlines()[1:]
    swappiness = host.read_int("/proc/sys/vm/swappiness")
    if not lines:
        return Check("swap", PASS, "no swap")
    return Check("swap", WARN, f"{len(lines)} swap device(s), swappiness {swappiness}: pages not "
                 f"mlocked can be swapped out", "sudo swapoff -a (the arena itself is mlocked)")


def _clocksource(host: Host) -> Check:
    cs = host.read("/sys/devices/system/clocksource/clocksource0/current_clocksource")
    avail = host.read("/sys/devices/system/clocksource/clocksource0/available_clocksource") or ""
    fix = "boot parameters: clocksource=tsc tsc=reliable"
    if cs is None:
        return Check("clocksource", WARN, "clocksource not visible", fix)
    if cs == "tsc":
        return Check("clocksource", PASS, "clocksource tsc: clock_gettime stays in the vDSO")
    if cs == "kvm-clock":
        return Check("clocksource", WARN, f"clocksource kvm-clock (available: {avail}): fine in a VM, "
                     f"tsc is cheaper where the host allows it", fix)
    return Check("clocksource", FAIL, f"clocksource {cs} (available: {avail}): clock reads may "
                 f"trap to the kernel (~1 us)", fix)


def _privileges(priv: Privileges, policy: str, priority: int, plan: dict) -> list:
    out = []
    if policy == "other":
        out.append(Check("rlimit_rtprio", PASS, "no real-time policy asked"))
    else:
        ok, why = priv.realtime(priority)
        out.append(Check("rlimit_rtprio", PASS, f"SCHED_{policy.upper()} {priority} allowed: {why}")
                   if ok else
                   Check("rlimit_rtprio", WARN, f"SCHED_{policy.upper()} {priority} will be refused "
                         f"({why}): the engine runs under SCHED_OTHER", RT_FIX.format(p=priority)))
    out.append(_memlock(priv, plan))
    return out


def _memlock(priv: Privileges, plan: dict) -> Check:
    """Will mlock of what this config locks succeed: the engine's arena and state, plus the
    serve segment when serving (RLIMIT_MEMLOCK bounds the process's locked total)."""
    mb = 1 << 20
    eng = (f"engine arena + state {plan['engine']} B ({plan['engine_asked']} B for "
           f"{plan['n_symbols']} symbols, {_page_words(plan['huge_pages'], plan['one_gb'])})")
    seg = (f"serve segment {plan['segment_full']} B (serve.ring_slots {plan['ring_slots']} x "
           f"serve.max_clients {plan['max_clients']})")
    if not plan["mlock"]:
        return Check("rlimit_memlock", PASS, "memory.mlock = false: nothing is locked (the "
                     "arena's pages may be swapped out)")
    if plan["engine"] is None:
        return _memlock_unsized(priv, plan, seg)
    total = plan["total"]
    what = f"{eng} + {seg}" if plan["serve"] else eng
    more = "" if plan["serve"] else (f"; `fastpath serve` with this config also locks its "
                                     f"{seg}: {total + plan['segment_full']} B in all")
    ok, why = priv.memory_lock(total)
    if ok:
        if not plan["serve"] and not priv.memory_lock(total + plan["segment_full"])[0]:
            more += " (not allowed: raise the limit before serving)"
        return Check("rlimit_memlock", PASS, f"mlock of {total} B ({total / mb:.1f} MB) "
                     f"allowed: {what}; {why}{more}")
    kb = -(-total // 1024)
    return Check("rlimit_memlock", WARN, f"mlock of {total} B ({total / mb:.1f} MB) will fail "
                 f"({why}): {what}; those pages can be swapped out{more}",
                 f"allow at least {kb} KB locked (ulimit -l {kb}, or unlimited; "
                 f"'<user> - memlock {kb}' in /etc/security/limits.conf; systemd "
                 f"LimitMEMLOCK={total}; docker --ulimit memlock={total}), or {MEMLOCK_FIX}; "
                 f"or lock less: fewer engine.n_symbols, serve.ring_slots, serve.max_clients")


def _memlock_unsized(priv: Privileges, plan: dict, seg: str) -> Check:
    """The engine's size was not given (it is the engine's to compute, a layer above this
    one): "allowed" only when any size is, never on an assumed size."""
    ok, why = priv.memory_lock(1 << 62)
    if ok:
        return Check("rlimit_memlock", PASS, f"mlock allowed at any size: "
                     f"{why.split(' covers ')[0]}")
    why = why.rsplit(" (< ", 1)[0]
    part = (f"; the {seg} alone" if plan["serve"] else "")
    return Check("rlimit_memlock", WARN, f"cannot tell whether mlock will succeed ({why}): the "
                 f"engine's arena and state for {plan['n_symbols']} symbols were not sized "
                 f"(`fastpath doctor --config FILE` sizes them){part}",
                 MEMLOCK_FIX)


def _page_words(huge: str, one_gb: bool) -> str:
    """How the mapping's length was counted: 1 GB pages only where that pool has some free
    (memory.mapped_bytes), else 2 MB whatever backs it (hugetlb, THP, or base pages where
    the host grants neither: allocate() maps the 2 MB-rounded length all the same)."""
    if huge == "none":
        return "mapped in base pages"
    if huge == "1g" and one_gb:
        return "mapped in 1 GB pages"
    why = "; no 1 GB page free" if huge == "1g" else ""
    return f"mapped 2 MB-rounded{why}: huge pages where the host grants them"


def _serving_configured(config) -> bool:
    """A [serve] table in the config (a mapping, or a TOML file): this host will serve."""
    if isinstance(config, Mapping):
        return "serve" in config
    if isinstance(config, (str, os.PathLike)):
        # the config's own reader: a file load_config reads (a UTF-8 byte-order mark
        # included) is one whose [serve] table is seen here
        try:
            return "serve" in read_toml(os.fspath(config))
        except ConfigError:
            return False
    return False


def lock_plan(host: Host, config=None, serve: bool | None = None,
              arena_bytes: int | None = None, raw_len: int = 256) -> dict:
    """memory.lock_plan for this host (1 GB pages counted only when its pool has some free),
    with `serve` decided from the config when None and the segment's size kept for the
    note on serving."""
    free1g = host.read_int("/sys/kernel/mm/hugepages/hugepages-1048576kB/free_hugepages")
    serve = _serving_configured(config) if serve is None else bool(serve)
    # the note on serving needs the segment's size even when this host only steps
    p = plan_of(arena_bytes, config, True, raw_len, bool(free1g))
    p["segment_full"] = p["segment"]
    p["one_gb"] = bool(free1g)
    p["serve"] = serve
    p["segment"] = p["segment_full"] if serve else 0
    if p["mlock"] and p["engine"] is not None:
        p["total"] = p["engine"] + p["segment"]
    return p


def _irqs(host: Host, core: int) -> list:
    running = any((host.read(f"/proc/{p}/comm") or "") == "irqbalance"
                  for p in host.listdir("/proc") if p.isdigit())
    out = [Check("irqbalance", WARN if running else PASS,
                 "irqbalance is running: it may move device IRQs onto the hot core" if running
                 else "irqbalance not running",
                 "sudo systemctl disable --now irqbalance" if running else "")]
    text = host.read("/proc/interrupts")
    if text is None:
        out.append(Check("irqs_on_core", WARN, "/proc/interrupts not visible", ""))
        return out
    lines = text.splitlines()
    cols = [c for c in lines[0].split()] if lines else []
    name = f"CPU{core}"
    if name not in cols:
        out.append(Check("irqs_on_core", WARN, f"CPU {core} not in /proc/interrupts", ""))
        return out
    j = cols.index(name)
    hits = []
    for line in lines[1:]:
        f = line.split()
        if not f or not f[0].endswith(":") or not f[0][:-1].isdigit():
            continue
        try:
            n = int(f[1 + j])
        except (IndexError, ValueError):
            continue
        aff = parse_cpulist(host.read(f"/proc/irq/{f[0][:-1]}/smp_affinity_list"))
        if n > 0 and (not aff or core in aff):
            hits.append((f[0][:-1], n, " ".join(f[1 + len(cols):])[:40]))
    if not hits:
        out.append(Check("irqs_on_core", PASS, f"no device IRQ lands on CPU {core}"))
    else:
        names = ", ".join(f"{i} ({d or '?'}: {n})" for i, n, d in hits[:6])
        out.append(Check("irqs_on_core", WARN, f"{len(hits)} IRQ(s) have fired on CPU {core} and "
                         f"may again: {names}",
                         "for each IRQ: echo <other cpus> | sudo tee /proc/irq/<n>/smp_affinity_list "
                         "(or boot with irqaffinity=<other cpus>)"))
    return out


def _smt(host: Host, topo: Topology, core: int, busy: dict) -> Check:
    sib = topo.siblings.get(core, [])
    if not sib:
        return Check("smt_sibling", PASS, f"CPU {core} has no SMT sibling online")
    hot = [s for s in sib if busy.get(s, 0) > 0.25]
    fix = f"echo 0 | sudo tee /sys/devices/system/cpu/cpu{sib[0]}/online (or nosmt on the boot line)"
    if hot:
        return Check("smt_sibling", FAIL, f"CPU {core}'s SMT sibling {hot[0]} is busy "
                     f"({100 * busy[hot[0]]:.0f}%): it shares the core's execution units", fix)
    iso = [s for s in sib if s in topo.isolated]
    return Check("smt_sibling", PASS if iso else WARN,
                 f"SMT sibling {sib[0]} of CPU {core} is idle"
                 + (" and isolated" if iso else ", but not isolated: any task may land there"),
                 "" if iso else fix)


def _gpu_numa(topo: Topology, core: int, use_gpu: bool) -> Check:
    if not topo.gpus:
        if use_gpu:
            return Check("gpu_numa", FAIL, "no GPU found (checks for the GPU backend asked): "
                         "there is no device to place the engine near",
                         "run on a host with an NVIDIA GPU, or drop --gpu for the CPU backend")
        return Check("gpu_numa", PASS, "no GPU found: the CPU backend has no PCIe trip")
    g = topo.gpus[0]
    node = topo.node_of(core)
    if g.numa_node is None:
        return Check("gpu_numa", WARN, f"GPU {g.pci} reports no NUMA node", "")
    if node == g.numa_node:
        return Check("gpu_numa", PASS, f"CPU {core} and GPU {g.pci} are both on NUMA node {node}")
    local = format_cpulist(g.local_cpus or topo.nodes.get(g.numa_node, []))
    return Check("gpu_numa", FAIL if use_gpu else WARN,
                 f"CPU {core} is on node {node}, GPU {g.pci} on node {g.numa_node}: each PCIe trip "
                 f"crosses the interconnect (+0.5-1 us)", f"placement.core = one of {local}")


def _cstates(host: Host, core: int) -> Check:
    base = f"/sys/devices/system/cpu/cpu{core}/cpuidle"
    states = [d for d in host.listdir(base) if d.startswith("state")]
    if not states:
        mx = host.read("/sys/module/intel_idle/parameters/max_cstate")
        return Check("cstates", WARN if mx is None else PASS,
                     "cpuidle states not visible (VM: the host decides)" if mx is None
                     else f"intel_idle.max_cstate = {mx}",
                     "" if mx is not None else "BIOS: disable deep C-states")
    deep = []
    for st in states:
        name = host.read(f"{base}/{st}/name") or st
        lat = host.read_int(f"{base}/{st}/latency") or 0
        disabled = host.read_int(f"{base}/{st}/disable") == 1
        if lat > 10 and not disabled:
            deep.append(f"{name} ({lat} us)")
    if not deep:
        return Check("cstates", PASS, f"no idle state deeper than 10 us enabled on CPU {core}")
    return Check("cstates", WARN, f"CPU {core} may sleep in {', '.join(deep)}: waking costs that "
                 f"much on the first tick after a gap",
                 f"for s in {base}/state*/disable; do echo 1 | sudo tee $s; done "
                 f"(or processor.max_cstate=1 intel_idle.max_cstate=0 on the boot line)")


def run_checks(host: Host | None = None, core: int | None = None, policy: str = "fifo",
               priority: int = 50, use_gpu: bool = False, arena_bytes: int | None = None,
               topo: Topology | None = None, busy: dict | None = None, config=None,
               serve: bool | None = None, raw_len: int = 256,
               gpu_backend: tuple | None = None) -> dict:
    """Every check for the core the placement would choose (or `core`).

    The mlock check counts what `config` (None: defaults; a mapping, a TOML path or an
    EngineConfig) locks: the engine's arena and state, arena_bytes as the engine asks for it
    (its sizes are the engine's: fastpath.cli measures them; None: not known, and then the
    check never says "allowed" on a guess), mapped in the config's page size, plus the serve
    segment (raw_len-wide ticks) when `serve` (None: when the config has a [serve] table).
    gpu_backend: fastpath.gpu_status()'s (ok, why) on the running host, reported as the
    gpu_backend check (fastpath doctor --gpu passes it; None: no such check)."""
    host = host or Host()
    topo = topo or read_topology(host)
    busy = busy or {}
    affinity = sorted(os.sched_getaffinity(0)) if host.root == "/" else None
    rep = choose_core(topo, "auto" if core is None else core, use_gpu, busy,
                      affinity if core is None else None)
    # the report of a choice, not of an application (doctor changes nothing): what the
    # config asks, and no "granted" it never asked the kernel for. The report said policy
    # "other" 0 granted SCHED_OTHER 0 and an empty affinity whatever the config asked.
    rep.policy_asked, rep.priority_asked = policy, priority
    rep.policy_granted = rep.priority_granted = None
    rep.affinity_now = affinity
    c = rep.core
    checks = []
    if affinity is not None and c not in affinity:
        # a core named by --core or placement.core outside this process's CPU set (a cgroup
        # cpuset, taskset): every check below passed for it while the server, placed from the
        # same config, refuses it with a ConfigError
        checks.append(Check("cpu_allowed", FAIL, f"CPU {c} is not among the CPUs this process "
                            f"may run on ({format_cpulist(affinity)}: its cgroup cpuset or "
                            f"affinity): a server started like this refuses placement.core = {c}",
                            f"placement.core = one of {format_cpulist(affinity)}, or widen the "
                            f"CPU set (docker --cpuset-cpus, systemd AllowedCPUs=, taskset)"))
    checks.append(_governor(host, c))
    checks += _isolation(host, topo, c)
    isolated = c in topo.isolated or c in topo.nohz_full
    plan = lock_plan(host, config, serve, arena_bytes, raw_len)
    # the arena and the segment are two mappings, each rounded up to whole pages: their
    # summed bytes, rounded once, passed a pool one page short of what they take
    sizes = tuple(b for b in (plan["engine_asked"], plan["segment_asked"] if plan["serve"]
                              else 0) if b)
    checks += [_thp(host), _hugetlb(host, sum(-(-b // (2 << 20)) for b in sizes) or 4,
                                    plan["huge_pages"], sizes),
               _rt_runtime(host, policy, c, isolated), _swap(host), _clocksource(host)]
    checks += _privileges(read_privileges(host), policy, priority, plan)
    checks += _irqs(host, c)
    checks.append(_smt(host, topo, c, busy))
    checks.append(_gpu_numa(topo, c, use_gpu))
    if gpu_backend is not None:
        ok, why = gpu_backend
        checks.append(Check("gpu_backend", PASS if ok else FAIL,
                            f"fastpath.gpu: {why}",
                            "" if ok else "pip install 'fastpath[gpu]' on a host with the NVIDIA "
                                          "driver (pycuda needs libcuda)"))
    checks.append(_cstates(host, c))
    return {"core": c, "placement": rep.to_dict(), "checks": [x.to_dict() for x in checks],
            "failed": sum(x.status == FAIL for x in checks),
            "warned": sum(x.status == WARN for x in checks),
            "locked": {k: plan[k] for k in ("mlock", "serve", "engine", "segment", "total",
                                            "engine_asked", "segment_asked")}}
