"""Core placement: the choice of core on a fake 2-node host (the GPU's node, isolated cores, busy
siblings, an explicit core), the priority rules, and affinity and SCHED_FIFO applied for real
in a fresh process.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from fastpath import ConfigError
from fastpath.control.host import read_topology
from fastpath.control.placement import choose_core

from helpers.host import make_host


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


def test_fifo_granted_when_privileged():
    if os.geteuid() != 0:
        pytest.skip("needs root or CAP_SYS_NICE")
    rep = _place_in_subprocess("fifo", 10)
    assert rep["policy_granted"] == "SCHED_FIFO" and rep["priority_granted"] == 10
    assert rep["sched_refused"] is None
