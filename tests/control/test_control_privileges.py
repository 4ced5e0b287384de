"""Privileges read from the kernel, not the uid: capabilities and rlimits on a fake /proc, this
process's own, and root without CAP_SYS_NICE or CAP_IPC_LOCK (capsh) refused with the missing
capability named.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from fastpath.control import doctor

from helpers.host import make_host


def _by_name(res):
    return {c["name"]: c for c in res["checks"]}


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
