"""Host checks of the control plane: the kernel's boot CPU lists, `fastpath doctor`'s
isolation, placement, hugetlb pool and page checks, busy fractions, and `doctor --jitter`."""
import json
import os
import select
import signal
import subprocess
import sys
import time

import pytest

from fastpath import cli
from fastpath.control import doctor, memory
from fastpath.control.host import Host, boot_cpulist, format_cpulist, read_topology
from fastpath.control.memory import serve_segment_bytes
from fastpath.control.placement import Privileges, UNLIMITED, place
from fastpath.errors import ConfigError
from helpers.serving import PKG_ROOT, fork_child


def test_doctor_on_a_host_booted_with_all_and_n(tmp_path):
    """Regression: nohz_full=1-N and rcu_nocbs=all made doctor and placement die with a
    ValueError."""
    files = {
        "sys/devices/system/cpu/online": "0-3",
        "sys/devices/system/cpu/possible": "0-3",
        "proc/cmdline": "BOOT_IMAGE=/vmlinuz isolcpus=nohz,domain,2-N nohz_full=1-N "
                        "rcu_nocbs=all quiet -- isolcpus=0",
    }
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    host = Host(str(tmp_path))
    topo = read_topology(host)
    assert (topo.isolated, topo.nohz_full, topo.rcu_nocbs) == ([2, 3], [1, 2, 3], [0, 1, 2, 3])
    res = doctor.run_checks(host, core=3, topo=topo)
    by = {c["name"]: c for c in res["checks"]}
    assert by["isolcpus"]["status"] == by["nohz_full"]["status"] == "pass"
    assert by["rcu_nocbs"]["status"] == "pass"


def test_placement_and_doctor_on_a_host_with_sys_hidden(tmp_path):
    """Regression: with /sys hidden no CPU was online; the process's allowed CPUs now stand in."""
    p = tmp_path / "proc" / "self" / "status"
    p.parent.mkdir(parents=True)
    p.write_text("Name:\tpython\nCpus_allowed:\tf\nCpus_allowed_list:\t0-3\n")
    host = Host(str(tmp_path))
    assert read_topology(host).cpus == [0, 1, 2, 3]
    res = doctor.run_checks(host)
    assert res["core"] in (1, 2, 3)                   # CPU 0 last
    rep = place({"placement": {"policy": "other", "priority": 0}}, host=host, busy={},
                apply_now=False)
    assert rep.core == res["core"]


# ------------------------------------------------------------------ boot-line cpulists
@pytest.mark.parametrize("text,flags,want", [
    ("all", False, list(range(8))),
    ("1-N", False, list(range(1, 8))),
    ("N", False, [7]),
    ("domain,managed_irq,2-3", True, [2, 3]),
    ("nohz,domain,1-N", True, list(range(1, 8))),
    ("junk", False, []),
    # the kernel's own example (kernel-parameters: "cpu lists"): of each group of 25 CPUs
    # from 100 on, the first 2
    ("100-120:2/5", False, [100, 101, 105, 106, 110, 111, 115, 116, 120]),
    ("0-7:2/4", False, [0, 1, 4, 5]),
    ("domain,managed_irq,2-3,8-15:1/4", True, [2, 3, 8, 12]),
    ("all:1/2", False, [0, 2, 4, 6]),
    ("1-N:1/3", False, [1, 4, 7]),
    # a pattern without its group size: the kernel refuses the whole list (isolates
    # nothing), never a step
    ("0-7:2", False, []),
    ("2,0-7:2", False, []),
    ("0-7:5/4", False, []),              # more used than the group holds
    ("0-7:1/0", False, []),
    ("2, 3", False, [2, 3]),             # white space separates regions as commas do
])
def test_boot_cpulist_reads_what_the_kernel_reads(text, flags, want):
    """A boot CPU list (all, N, flags, group patterns) as the kernel reads it; what the
    kernel refuses isolates nothing."""
    assert boot_cpulist(text, 7 if max(want, default=0) < 8 else 127, flags) == want


def test_doctor_sees_isolation_written_with_a_group_pattern(tmp_path):
    """Regression: doctor missed CPUs in rcu_nocbs written with a group pattern (0-3:1/2)."""
    files = {"sys/devices/system/cpu/online": "0-3", "sys/devices/system/cpu/possible": "0-3",
             "proc/cmdline": "isolcpus=domain,0-3:1/2 nohz_full=0-3:1/2 rcu_nocbs=0-3:1/2"}
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    host = Host(str(tmp_path))
    topo = read_topology(host)
    assert topo.isolated == topo.nohz_full == topo.rcu_nocbs == [0, 2]
    res = doctor.run_checks(host, core=2, topo=topo)
    by = {c["name"]: c["status"] for c in res["checks"]}
    assert by["isolcpus"] == by["nohz_full"] == by["rcu_nocbs"] == "pass"
    res = doctor.run_checks(host, core=3, topo=topo)
    by = {c["name"]: c["status"] for c in res["checks"]}
    assert by["isolcpus"] == by["nohz_full"] == by["rcu_nocbs"] == "warn"


# ------------------------------------------------------------------ doctor --json
def test_doctor_placement_reports_what_was_asked_not_a_grant(tmp_path):
    """Regression: doctor's placement copied an unapplied report's defaults instead of what the
    config asked."""
    res = doctor.run_checks(None, None, "fifo", 50)
    pl = res["placement"]
    assert (pl["policy_asked"], pl["priority_asked"]) == ("fifo", 50)
    assert pl["policy_granted"] is None and pl["priority_granted"] is None
    assert pl["affinity_now"] == sorted(os.sched_getaffinity(0))
    assert pl["affinity_applied"] is False
    json.dumps(res)                     # what --json prints


def test_doctor_fails_a_core_outside_the_process_cpu_set():
    """Regression: doctor passed a placement.core outside the process's CPU set, which the
    server refuses."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("needs two CPUs to leave one out")

    def child():
        os.sched_setaffinity(0, {allowed[0]})
        out = {}
        res = doctor.run_checks(None, allowed[1], "other", 0)
        out["doctor"] = [c for c in res["checks"] if c["name"] == "cpu_allowed"]
        out["failed"] = res["failed"]
        try:
            place({"placement": {"core": allowed[1], "policy": "other", "priority": 0}},
                  apply_now=False, busy={})
            out["place"] = "accepted"
        except ConfigError as exc:
            out["place"] = f"ConfigError: {exc}"
        return json.dumps(out)
    out = json.loads(fork_child(child))
    assert out["place"].startswith("ConfigError")
    assert len(out["doctor"]) == 1 and out["doctor"][0]["status"] == "fail", out
    assert f"CPU {allowed[1]} is not among" in out["doctor"][0]["detail"]
    assert out["failed"] >= 1


def _fake_host(tmp_path, files):
    base = {"sys/devices/system/cpu/online": "0-1", "sys/devices/system/cpu/possible": "0-1"}
    for rel, text in {**base, **files}.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return Host(str(tmp_path))


@pytest.mark.parametrize("huge,pools,want", [
    # no pool at all, but the config never asks for one: nothing to warn about
    ("none", {}, "pass"),
    ("thp", {}, "pass"),
    # "1g" draws on the 1 GB pool: 16 free 2 MB pages do not make up for 0 of 0 1 GB ones
    ("1g", {"2048kB": (16, 16)}, "warn"),
    ("1g", {"1048576kB": (2, 2)}, "pass"),
    ("auto", {"2048kB": (16, 16)}, "pass"),
])
def test_doctor_hugetlb_pool_checks_the_pool_the_config_uses(tmp_path, huge, pools, want):
    files = {}
    for size, (free, total) in pools.items():
        files[f"sys/kernel/mm/hugepages/hugepages-{size}/free_hugepages"] = str(free)
        files[f"sys/kernel/mm/hugepages/hugepages-{size}/nr_hugepages"] = str(total)
    files["proc/meminfo"] = "MemTotal: 1000 kB\n"
    host = _fake_host(tmp_path, files)
    res = doctor.run_checks(host, core=1, policy="other", priority=0,
                            config={"memory": {"huge_pages": huge}}, arena_bytes=8 << 20)
    check = {c["name"]: c for c in res["checks"]}["hugetlb_pool"]
    assert check["status"] == want, check
    if huge == "1g":
        assert "1 GB" in check["detail"], check


# ------------------------------------------------------------------ doctor
def test_doctor_jitter_does_not_claim_a_core_it_could_not_pin_to(monkeypatch, capsys):
    """Regression: --jitter reported a core it could not pin to as the one it measured."""
    here = sorted(os.sched_getaffinity(0))

    def refuse(pid, cpus):
        raise OSError(22, "Invalid argument")
    monkeypatch.setattr(os, "sched_setaffinity", refuse)
    rc = cli.main(["doctor", "--core", str(here[0]), "--jitter", "0.02", "--json"])
    out = capsys.readouterr()
    assert rc in (0, 1), out.err
    j = json.loads(out.out)["jitter"]
    assert j["cpu"] is None
    assert j["ran_on"] == format_cpulist(here)
    assert f"cannot pin to CPU {here[0]}" in out.err
    rc = cli.main(["doctor", "--core", str(here[0]), "--jitter", "0.02"])
    assert f"not pinned to CPU {here[0]}" in capsys.readouterr().out


# ------------------------------------------------------------------ doctor's pool check
@pytest.mark.parametrize("huge,pools,want", [
    # a 3 MB arena and a 2.3 MB segment take 2 + 2 pages of 2 MB, not ceil(5.3 MB) = 3
    ("auto", {"2048kB": (3, 3)}, "warn"),
    ("auto", {"2048kB": (4, 4)}, "pass"),
    # and one 1 GB page each, not one for both
    ("1g", {"1048576kB": (1, 1), "2048kB": (0, 0)}, "warn"),
    ("1g", {"1048576kB": (2, 2)}, "pass"),
])
def test_doctor_hugetlb_pool_rounds_each_mapping_to_pages(tmp_path, huge, pools, want):
    """Regression: the hugetlb pool check rounded the arena and segment together, passing a
    pool one page short."""
    files = {"proc/meminfo": "MemTotal: 1000 kB\n", "sys/devices/system/cpu/online": "0-1",
             "sys/devices/system/cpu/possible": "0-1"}
    for size, (free, total) in pools.items():
        files[f"sys/kernel/mm/hugepages/hugepages-{size}/free_hugepages"] = str(free)
        files[f"sys/kernel/mm/hugepages/hugepages-{size}/nr_hugepages"] = str(total)
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    seg = serve_segment_bytes(256, 2048, 1)
    assert 2 << 20 < seg < 3 << 20
    res = doctor.run_checks(Host(str(tmp_path)), core=0, policy="other", priority=0,
                            config={"memory": {"huge_pages": huge},
                                    "serve": {"ring_slots": 2048, "max_clients": 1}},
                            arena_bytes=3 << 20, serve=True, raw_len=256)
    check = {c["name"]: c for c in res["checks"]}["hugetlb_pool"]
    assert check["status"] == want, check


# ------------------------------------------------------------------ host figures
def test_busy_fraction_does_not_count_guest_time_twice(tmp_path):
    """Regression: /proc/stat's guest columns were counted twice in a CPU's busy fraction."""
    stat = tmp_path / "proc" / "stat"
    stat.parent.mkdir(parents=True)
    host = Host(str(tmp_path))
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  0 0 0 0 0 0 0 0 0 0\ncpu0 0 0 0 0 0 0 0 0 0 0\n")
    a = host.cpu_times()
    stat.write_text("cpu  20 0 0 80 0 0 0 0 20 0\ncpu0 20 0 0 80 0 0 0 0 20 0\n")
    b = host.cpu_times()
    busy = (b[0][0] - a[0][0]) / (b[0][1] - a[0][1])
    assert busy == pytest.approx(0.20)


def _allowed_cpus(pid):
    with open(f"/proc/{pid}/status") as f:
        return [ln for ln in f if ln.startswith("Cpus_allowed_list")][0].split()[1]


def _wait_for_the_probe(p, limit_s=60.0):
    """Until `fastpath doctor --jitter` (process p) has begun its probe: it pins itself to
    the core it checked right before (its allowed CPUs change), or says on stderr that it
    cannot. On a host where neither can be seen, until limit_s has passed."""
    mine = _allowed_cpus(os.getpid())
    end = time.monotonic() + limit_s
    while time.monotonic() < end and p.poll() is None:
        if _allowed_cpus(p.pid) != mine:
            return
        if select.select([p.stderr], [], [], 0.01)[0]:
            line = p.stderr.readline()
            if "cannot pin" in line:
                return


def test_doctor_jitter_stops_on_ctrl_c(tmp_path):
    """Regression: Ctrl-C did nothing during the --jitter probe; it stops within a second and
    says so."""
    env = dict(os.environ, PYTHONPATH=PKG_ROOT)
    p = subprocess.Popen([sys.executable, "-m", "fastpath.cli", "doctor", "--jitter", "120"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=tmp_path,
                         text=True)
    try:
        _wait_for_the_probe(p)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)
    assert p.returncode == 130, err
    assert "fastpath doctor: interrupted" in err
    assert "Traceback" not in err


MB = 1 << 20


def _memlock(res):
    return next(c for c in res["checks"] if c["name"] == "rlimit_memlock")


def test_doctor_names_the_page_size_it_counted(monkeypatch):
    monkeypatch.setattr(doctor, "read_privileges",
                        lambda host=None: Privileges(1000, 0, 0, UNLIMITED))
    eb = 3 * MB + 5
    free1g = Host().read_int("/sys/kernel/mm/hugepages/hugepages-1048576kB/free_hugepages")
    for huge, words in (("none", "mapped in base pages"),
                        ("auto", "mapped 2 MB-rounded: huge pages where the host grants them"),
                        ("2m", "mapped 2 MB-rounded: huge pages where the host grants them")):
        res = doctor.run_checks(Host(), core=0, serve=False, arena_bytes=eb,
                                config={"memory": {"huge_pages": huge}})
        c = _memlock(res)
        assert words in c["detail"], (huge, c)
        assert res["locked"]["engine"] == memory.mapped_bytes(eb, huge)
    res = doctor.run_checks(Host(), core=0, serve=False, arena_bytes=eb,
                            config={"memory": {"huge_pages": "1g"}})
    c = _memlock(res)
    if free1g:
        assert "mapped in 1 GB pages" in c["detail"], c
        assert res["locked"]["engine"] == 1 << 30
    else:
        assert "mapped 2 MB-rounded; no 1 GB page free" in c["detail"], c
        assert "1 GB pages" not in c["detail"], c
        assert res["locked"]["engine"] == 4 * MB
