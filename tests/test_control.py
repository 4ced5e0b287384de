"""The control plane on a fake 2-node host (files in a temp dir) and, where it can be, for real."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from fastpath import ConfigError, Engine
from fastpath.control import doctor
from fastpath.control.host import Host, format_cpulist, parse_cpulist, read_topology
from fastpath.control.memory import allocate, smaps_entry
from fastpath.control.placement import apply, choose_core, place
from helpers.builders import windowed_model
from helpers.host import FAKE, make_host  # noqa: F401

for c in range(8):
    FAKE[f"sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list"] = f"{c % 4},{c % 4 + 4}"
    FAKE[f"sys/devices/system/cpu/cpu{c}/cpufreq/scaling_governor"] = "powersave"
    for k, (name, lat) in enumerate((("POLL", 0), ("C1", 2), ("C6", 133))):
        FAKE[f"sys/devices/system/cpu/cpu{c}/cpuidle/state{k}/name"] = name
        FAKE[f"sys/devices/system/cpu/cpu{c}/cpuidle/state{k}/latency"] = str(lat)
        FAKE[f"sys/devices/system/cpu/cpu{c}/cpuidle/state{k}/disable"] = "0"


def test_cpulists():
    assert parse_cpulist("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpulist("0-7:2") == [0, 2, 4, 6]
    assert parse_cpulist("") == [] and parse_cpulist(None) == []
    assert format_cpulist([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"


def test_topology(tmp_path):
    t = read_topology(make_host(tmp_path))
    assert t.cpus == list(range(8))
    assert t.siblings[3] == [7] and t.siblings[4] == [0]
    assert t.nodes == {0: [0, 1, 4, 5], 1: [2, 3, 6, 7]}
    assert t.isolated == [3, 7] and t.nohz_full == [3, 7] and t.rcu_nocbs == [3, 7]
    assert len(t.gpus) == 1 and t.gpus[0].numa_node == 1 and t.gpus[0].local_cpus == [2, 3, 6, 7]
    assert t.node_of(6) == 1


def test_gpu_node_and_isolation_preferred(tmp_path):
    t = read_topology(make_host(tmp_path))
    rep = choose_core(t, use_gpu=True, busy={})
    assert rep.core in (3, 7) and rep.numa_node == 1 and rep.gpu_numa_node == 1
    assert any("isolated" in r for r in rep.reasons)


def test_busy_sibling_avoided(tmp_path):
    t = read_topology(make_host(tmp_path))
    # 7 busy: 7 is out, and 3 (its sibling) too; next best on the GPU node: 2 or 6
    rep = choose_core(t, use_gpu=True, busy={7: 0.9})
    assert rep.core in (2, 6)
    assert any("SMT sibling busy, avoided: 3" in r for r in rep.reasons)
    assert any("busy (> 25%), avoided: 7" in r for r in rep.reasons)


def test_without_gpu_isolated_core_on_any_node(tmp_path):
    t = read_topology(make_host(tmp_path))
    assert choose_core(t, use_gpu=False, busy={}).core in (3, 7)
    # isolation gone: not CPU 0, highest idle core
    t2 = read_topology(make_host(tmp_path / "b", **{"sys/devices/system/cpu/isolated": "",
                                                   "sys/devices/system/cpu/nohz_full": "",
                                                   "proc/cmdline": "quiet"}))
    rep = choose_core(t2, busy={5: 0.5, 6: 0.1})
    assert rep.core == 7 and rep.core != 0
    rep = choose_core(t2, busy={c: 0.9 for c in range(1, 8)})
    assert rep.core == 0 and rep.warnings


def test_explicit_core(tmp_path):
    t = read_topology(make_host(tmp_path))
    rep = choose_core(t, core=1, use_gpu=True)
    assert rep.core == 1 and any("NUMA node 0 but the GPU is on node 1" in w for w in rep.warnings)
    with pytest.raises(ConfigError, match="placement.core = 12 is not an online CPU"):
        choose_core(t, core=12)


def test_priority_rules():
    from fastpath.control.placement import check_priority
    check_priority("fifo", 80, False)
    with pytest.raises(ConfigError, match="priority 81 > 80 refused"):
        check_priority("fifo", 81, False)
    check_priority("fifo", 90, True)
    with pytest.raises(ConfigError, match="must be 0 with policy 'other'"):
        check_priority("other", 5, False)


def _by_name(res):
    return {c["name"]: c for c in res["checks"]}


def test_doctor_on_badly_tuned_host(tmp_path):
    host = make_host(tmp_path)
    res = doctor.run_checks(host, policy="fifo", use_gpu=True, busy={7: 0.8})
    c = _by_name(res)
    names = {"cpu_governor", "isolcpus", "nohz_full", "rcu_nocbs", "transparent_hugepages",
             "hugetlb_pool", "sched_rt_runtime", "swap", "clocksource", "rlimit_rtprio",
             "rlimit_memlock", "irqbalance", "irqs_on_core", "smt_sibling", "gpu_numa", "cstates"}
    assert names <= set(c)
    core = res["core"]
    assert core == 6                              # node 1; 7 busy, 3 has 7 as sibling
    assert c["cpu_governor"]["status"] == "fail" and "frequency-set -g performance" in c["cpu_governor"]["fix"]
    assert c["isolcpus"]["status"] == "warn" and f"isolcpus={core}" in c["isolcpus"]["fix"]
    assert c["transparent_hugepages"]["status"] == "warn" and "madvise" in c["transparent_hugepages"]["fix"]
    assert c["hugetlb_pool"]["status"] == "warn" and "nr_hugepages" in c["hugetlb_pool"]["fix"]
    # the stock kernel's RT throttling is a trade-off, not a failure: warn, say what -1 costs
    rt = c["sched_rt_runtime"]
    assert rt["status"] == "warn" and "=-1" in rt["fix"] and f"isolcpus={core}" in rt["fix"]
    assert "50 ms every 1000 ms" in rt["detail"] and "isolated core" in rt["detail"]
    assert c["swap"]["status"] == "warn" and "swapoff" in c["swap"]["fix"]
    assert c["clocksource"]["status"] == "fail" and "clocksource=tsc" in c["clocksource"]["fix"]
    assert c["irqbalance"]["status"] == "warn"
    assert c["smt_sibling"]["status"] == "warn"        # 6's sibling 2 idle but not isolated
    assert c["gpu_numa"]["status"] == "pass"
    assert c["cstates"]["status"] == "warn" and "C6 (133 us)" in c["cstates"]["detail"]
    assert res["failed"] == 2                     # governor, clocksource
    # the chosen core's sibling busy: a failure
    c = _by_name(doctor.run_checks(host, core=3, busy={7: 0.8}))
    assert c["smt_sibling"]["status"] == "fail" and "cpu7/online" in c["smt_sibling"]["fix"]
    # with every node-1 core ruled out, placement leaves the GPU's node and says so
    rep = choose_core(read_topology(host), use_gpu=True, busy={7: 0.8, 2: 0.9})
    assert rep.core == 5 and any("NOT on the GPU's node" in r for r in rep.reasons)
    assert any("PCIe trips cross nodes" in w for w in rep.warnings)


def test_rt_throttling_off_needs_an_isolated_core(tmp_path):
    host = make_host(tmp_path, **{"proc/sys/kernel/sched_rt_runtime_us": "-1"})
    c = _by_name(doctor.run_checks(host, core=3, policy="fifo"))        # 3 is isolated
    assert c["sched_rt_runtime"]["status"] == "pass"
    c = _by_name(doctor.run_checks(host, core=1, policy="fifo"))        # 1 is not
    assert c["sched_rt_runtime"]["status"] == "warn" and "not isolated" in c["sched_rt_runtime"]["detail"]
    assert "sched_rt_runtime_us=950000" in c["sched_rt_runtime"]["fix"]
    # SCHED_OTHER is never throttled: nothing to warn about
    c = _by_name(doctor.run_checks(make_host(tmp_path / "o"), core=1, policy="other", priority=0))
    assert c["sched_rt_runtime"]["status"] == "pass"


# /proc/self/status and /proc/self/limits of a process, as a fake tree sees them
ALL_CAPS = (1 << 41) - 1
NO_NICE = ALL_CAPS & ~(1 << 23)                # a default container: root without CAP_SYS_NICE
NO_NICE_NO_IPC = NO_NICE & ~(1 << 14)


def _proc_self(uid: int, capeff: int, rtprio="0", memlock="65536") -> dict:
    return {
        "proc/self/status": f"Name:\tpython3\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"
                            f"CapInh:\t0000000000000000\nCapPrm:\t{capeff:016x}\n"
                            f"CapEff:\t{capeff:016x}\nCapBnd:\t{capeff:016x}\n",
        "proc/self/limits": "Limit                     Soft Limit           Hard Limit           Units     \n"
                            f"Max locked memory         {memlock:<21}{memlock:<21}bytes     \n"
                            f"Max realtime priority     {rtprio:<21}{rtprio:<21}\n",
    }


def test_root_without_cap_sys_nice_is_not_told_pass(tmp_path):
    """uid 0 in a default container: no CAP_SYS_NICE, RLIMIT_RTPRIO 0. SCHED_FIFO will be refused,
    so the check warns and names the capability to add (the uid used to say PASS)."""
    host = make_host(tmp_path, **_proc_self(0, NO_NICE_NO_IPC))
    c = _by_name(doctor.run_checks(host, core=3, policy="fifo", priority=50))
    rt, ml = c["rlimit_rtprio"], c["rlimit_memlock"]
    assert rt["status"] == "warn", rt
    assert "root (uid 0) without CAP_SYS_NICE" in rt["detail"] and "RLIMIT_RTPRIO is 0" in rt["detail"]
    assert "--cap-add SYS_NICE" in rt["fix"] and "rtprio 50" in rt["fix"]
    assert ml["status"] == "warn" and "without CAP_IPC_LOCK" in ml["detail"], ml
    assert "65536 B" in ml["detail"] and "--cap-add IPC_LOCK" in ml["fix"]


def test_privileges_granted_by_capability_or_rlimit(tmp_path):
    # CAP_SYS_NICE and CAP_IPC_LOCK held: pass whatever the rlimits say
    c = _by_name(doctor.run_checks(make_host(tmp_path / "a", **_proc_self(0, ALL_CAPS)), core=3))
    assert c["rlimit_rtprio"]["status"] == "pass" and "CAP_SYS_NICE" in c["rlimit_rtprio"]["detail"]
    assert c["rlimit_memlock"]["status"] == "pass" and "CAP_IPC_LOCK" in c["rlimit_memlock"]["detail"]
    # an ordinary user with no capability but limits.conf rtprio 60 and memlock unlimited
    host = make_host(tmp_path / "b", **_proc_self(1000, 0, rtprio="60", memlock="unlimited"))
    c = _by_name(doctor.run_checks(host, core=3, priority=50))
    assert c["rlimit_rtprio"]["status"] == "pass" and "RLIMIT_RTPRIO 60" in c["rlimit_rtprio"]["detail"]
    assert c["rlimit_memlock"]["status"] == "pass" and "unlimited" in c["rlimit_memlock"]["detail"]
    # ... but rtprio 60 does not cover priority 70, and 64 KiB does not cover an 8 MiB arena
    host = make_host(tmp_path / "c", **_proc_self(1000, 0, rtprio="60"))
    c = _by_name(doctor.run_checks(host, core=3, priority=70))
    assert c["rlimit_rtprio"]["status"] == "warn" and "uid 1000" in c["rlimit_rtprio"]["detail"]
    assert c["rlimit_memlock"]["status"] == "warn"


def test_privileges_read_from_this_process():
    from fastpath.control.placement import CAP_SYS_NICE, read_privileges
    p = read_privileges()
    with open("/proc/self/status") as f:
        eff = next(int(line.split()[1], 16) for line in f if line.startswith("CapEff:"))
    assert p.cap_eff == eff and p.has(CAP_SYS_NICE) == bool(eff >> CAP_SYS_NICE & 1)
    import resource
    assert p.rtprio == resource.getrlimit(resource.RLIMIT_RTPRIO)[0]
    assert p.memlock == resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]


def test_doctor_irqs_and_gpu_mismatch(tmp_path):
    host = make_host(tmp_path)
    c = _by_name(doctor.run_checks(host, core=3, use_gpu=True))
    assert c["irqs_on_core"]["status"] == "warn" and "eth0-rx-0" in c["irqs_on_core"]["detail"]
    assert c["isolcpus"]["status"] == "pass" and c["smt_sibling"]["status"] == "pass"  # 7: idle, isolated
    c = _by_name(doctor.run_checks(host, core=1, use_gpu=True))
    assert c["gpu_numa"]["status"] == "fail" and "2-3,6-7" in c["gpu_numa"]["fix"]
    assert c["irqs_on_core"]["status"] == "pass"


def test_doctor_on_well_tuned_host(tmp_path):
    good = {f"sys/devices/system/cpu/cpu{c}/cpufreq/scaling_governor": "performance" for c in range(8)}
    good.update({f"sys/devices/system/cpu/cpu{c}/cpuidle/state2/disable": "1" for c in range(8)})
    good.update({
        "sys/kernel/mm/transparent_hugepage/enabled": "always [madvise] never",
        "sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages": "64",
        "sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages": "64",
        "sys/devices/system/clocksource/clocksource0/current_clocksource": "tsc",
        "proc/sys/kernel/sched_rt_runtime_us": "-1",
        "proc/swaps": "Filename Type Size Used Priority",
        "proc/4242/comm": "sshd",
    })
    res = doctor.run_checks(make_host(tmp_path, **good), core=7)
    c = _by_name(res)
    for name in ("cpu_governor", "isolcpus", "nohz_full", "rcu_nocbs", "transparent_hugepages",
                 "hugetlb_pool", "sched_rt_runtime", "swap", "clocksource", "irqbalance",
                 "irqs_on_core", "cstates"):
        assert c[name]["status"] == "pass", (name, c[name])
    assert res["failed"] == 0


def test_doctor_on_this_machine_cli():
    """Real host: every check printed with a verdict; --json parses and lists the same checks."""
    cmd = [sys.executable, "-m", "fastpath.cli", "doctor"]
    cwd = os.path.dirname(os.path.dirname(os.path.abspath(__import__("fastpath").__file__)))
    text = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=cwd)
    js = subprocess.run(cmd + ["--json", "--jitter", "0.05"], capture_output=True, text=True,
                        timeout=60, cwd=cwd)
    data = json.loads(js.stdout)
    assert len(data["checks"]) >= 16
    for c in data["checks"]:
        assert c["status"] in ("pass", "warn", "fail")
        assert f"[{c['status'].upper()}] {c['name']}" in text.stdout
    assert text.returncode == (1 if data["failed"] else 0)
    assert data["jitter"]["reads"] > 0 and data["jitter"]["cpu"] == data["core"]


def _place_in_subprocess(policy, priority, drop_root=False):
    """place() for real in a fresh process (optionally as nobody); its report."""
    code = textwrap.dedent(f"""
        import json, os, resource
        import fastpath, fastpath.control.config, fastpath.control.placement  # before dropping root
        if {drop_root!r} and os.geteuid() == 0:
            resource.setrlimit(resource.RLIMIT_RTPRIO, (0, 0))
            os.setgid(65534); os.setuid(65534)          # nobody: no CAP_SYS_NICE
        from fastpath.control.placement import place
        rep = place({{"placement": {{"policy": {policy!r}, "priority": {priority}}}}})
        print(json.dumps(rep.to_dict()))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd="/")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_affinity_applied_for_real():
    rep = _place_in_subprocess("other", 0)
    assert rep["affinity_applied"] and rep["affinity_now"] == [rep["core"]]
    assert rep["policy_granted"] == "SCHED_OTHER"


def test_fifo_refused_without_privilege_for_real():
    """An unprivileged process asks for SCHED_FIFO 50: refused, keeps running, and says why."""
    rep = _place_in_subprocess("fifo", 50, drop_root=True)
    if rep["policy_granted"] == "SCHED_FIFO":
        pytest.skip("this process may use SCHED_FIFO even unprivileged")
    assert rep["policy_granted"] == "SCHED_OTHER" and "RLIMIT_RTPRIO" in rep["sched_refused"]


def _run_without_cap(cap: str, code: str, shell_prefix: str = "") -> dict:
    """`code` in a python run as root with `cap` dropped by capsh (a default container's
    situation); its last stdout line as JSON. Skips where that cannot be arranged."""
    import shutil
    capsh = shutil.which("capsh") or next((p for p in ("/usr/sbin/capsh", "/sbin/capsh")
                                           if os.path.exists(p)), None)
    if capsh is None:
        pytest.skip(f"capsh (libcap2-bin) not installed: cannot drop {cap}")
    if os.geteuid() != 0:
        pytest.skip(f"needs root: the case under test is uid 0 without {cap}")
    out = subprocess.run([capsh, f"--drop={cap}", "--", "-c", shell_prefix + 'exec "$0" -c "$1"',
                          sys.executable, code], capture_output=True, text=True, timeout=60, cwd="/")
    if out.returncode != 0 and "Traceback" not in out.stderr:
        pytest.skip(f"capsh could not drop {cap} here: {out.stderr.strip()[:200]}")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def test_mlock_refusal_names_the_missing_capability_for_real():
    code = textwrap.dedent("""
        import json
        from fastpath.control.memory import allocate
        print(json.dumps(allocate(3 << 20, "none", lock=True).report.to_dict()))
    """)
    rep = _run_without_cap("cap_ipc_lock", code, shell_prefix="ulimit -l 64 && ")
    assert rep["mlock"].startswith(("EPERM", "ENOMEM")), rep
    assert "root (uid 0) without CAP_IPC_LOCK" in rep["mlock"] and "65536 B" in rep["mlock"]
    assert "--cap-add IPC_LOCK" in rep["mlock"]


def test_fifo_refused_for_root_without_cap_sys_nice_for_real():
    """root with CAP_SYS_NICE dropped (capsh), as in a default container: doctor warns, place()
    is refused by the kernel, and both say the capability is what is missing."""
    import resource
    if resource.getrlimit(resource.RLIMIT_RTPRIO)[0] >= 50:
        pytest.skip("RLIMIT_RTPRIO >= 50 here: SCHED_FIFO 50 is allowed without the capability")
    code = textwrap.dedent("""
        import json
        from fastpath.control import doctor
        from fastpath.control.placement import place
        chk = {c["name"]: c for c in doctor.run_checks(core=0, policy="fifo", priority=50)["checks"]}
        rep = place({"placement": {"policy": "fifo", "priority": 50}})
        print(json.dumps({"check": chk["rlimit_rtprio"], "rep": rep.to_dict()}))
    """)
    res = _run_without_cap("cap_sys_nice", code)
    assert res["check"]["status"] == "warn", res["check"]
    assert "root (uid 0) without CAP_SYS_NICE" in res["check"]["detail"]
    rep = res["rep"]
    assert rep["policy_granted"] == "SCHED_OTHER"
    assert rep["privileges"]["cap_sys_nice"] is False and rep["privileges"]["uid"] == 0
    assert "without CAP_SYS_NICE" in rep["sched_refused"] and "--cap-add SYS_NICE" in rep["sched_refused"]


def test_fifo_granted_when_privileged():
    if os.geteuid() != 0:
        pytest.skip("needs root or CAP_SYS_NICE")
    rep = _place_in_subprocess("fifo", 10)
    assert rep["policy_granted"] == "SCHED_FIFO" and rep["priority_granted"] == 10
    assert rep["sched_refused"] is None


# -------------------------------------------------------------------------- memory
@pytest.mark.parametrize("mode", ["auto", "thp", "none"])
def test_arena_backing_read_back(mode):
    r = allocate(3 << 20, mode, lock=True)
    rep = r.report
    assert r.addr % 64 == 0 and r.size >= 3 << 20
    assert rep.tried[-1][1] == "ok" and rep.method in ("hugetlb-2m", "thp", "normal")
    sm = smaps_entry(r.addr)
    assert sm.get("KernelPageSize") == rep.kernel_page_kb      # read back, not assumed
    if mode == "none":
        assert rep.method == "normal" and rep.page_size.endswith("K")
    if os.geteuid() == 0:
        assert rep.mlock == "ok"


def test_engine_arena_from_control_plane():
    m = windowed_model(np.random.default_rng(0))
    a = Engine(m, config={"engine": {"n_symbols": 64}, "memory": {"huge_pages": "none"}})
    b = Engine(m, config={"engine": {"n_symbols": 64}, "memory": {"huge_pages": "thp", "mlock": False}})
    assert a.memory.method == "normal" and b.memory.method in ("thp", "normal")
    x = np.random.default_rng(1).standard_normal((50, m.raw_len)).astype(np.float32)
    s = np.arange(50) % 64
    np.testing.assert_array_equal(a.step_batch(x, s).signal, b.step_batch(x, s).signal)


@pytest.mark.parametrize("cfg,key", [
    ({"placement": {"core": -1}}, "placement.core"),
    ({"placement": {"core": "fast"}}, "placement.core"),
    ({"placement": {"core": 1.0}}, "placement.core"),
    ({"placement": {"core": True}}, "placement.core"),
    ({"placement": {"policy": "deadline"}}, "placement.policy"),
    ({"placement": {"priority": 100}}, "placement.priority"),
    ({"placement": {"priority": 85}}, "placement.priority"),
    ({"placement": {"priority": 0}}, "placement.priority"),
    ({"placement": {"policy": "other", "priority": 5}}, "placement.priority"),
    ({"placement": {"allow_priority_above_80": "yes"}}, "placement.allow_priority_above_80"),
    ({"placement": {"cpu": 3}}, "placement.cpu"),
    ({"memory": {"huge_pages": "4k"}}, "memory.huge_pages"),
    ({"memory": {"huge_pages": True}}, "memory.huge_pages"),
    ({"memory": {"mlock": "on"}}, "memory.mlock"),
    ({"memory": {"lock": True}}, "memory.lock"),
])
def test_control_config_errors_name_the_key(cfg, key):
    from fastpath.control.config import load_config
    with pytest.raises(ConfigError) as exc:
        load_config(cfg)
    assert key in str(exc.value)
