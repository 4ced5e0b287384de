"""fastpath doctor's checks on a fake host tuned badly and well (IRQs, RT throttling, the GPU's
node) and on this machine through the command line.
"""

import json
import os
import subprocess
import sys


from fastpath.control import doctor
from fastpath.control.host import read_topology
from fastpath.control.placement import choose_core

from helpers.host import make_host


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
