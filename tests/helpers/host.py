"""A fake Linux host (a /sys and /proc tree in a temp dir) for the control plane's tests."""
import textwrap

from fastpath.control.host import Host


# 8 CPUs, SMT pairs (0,4) (1,5) (2,6) (3,7); node 0 = 0,1,4,5; node 1 = 2,3,6,7;
# an NVIDIA GPU on node 1; CPUs 3 and 7 isolated; a host that is badly tuned in every way.
FAKE = {
    "sys/devices/system/cpu/online": "0-7",
    "sys/devices/system/cpu/isolated": "3,7",
    "sys/devices/system/cpu/nohz_full": "3,7",
    "sys/devices/system/node/online": "0-1",
    "sys/devices/system/node/node0/cpulist": "0-1,4-5",
    "sys/devices/system/node/node1/cpulist": "2-3,6-7",
    "sys/bus/pci/devices/0000:81:00.0/class": "0x030200",
    "sys/bus/pci/devices/0000:81:00.0/vendor": "0x10de",
    "sys/bus/pci/devices/0000:81:00.0/numa_node": "1",
    "sys/bus/pci/devices/0000:81:00.0/local_cpulist": "2-3,6-7",
    "sys/bus/pci/devices/0000:00:1f.0/class": "0x060100",
    "sys/bus/pci/devices/0000:00:1f.0/vendor": "0x8086",
    "sys/kernel/mm/transparent_hugepage/enabled": "always madvise [never]",
    "sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages": "0",
    "sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages": "0",
    "sys/devices/system/clocksource/clocksource0/current_clocksource": "hpet",
    "sys/devices/system/clocksource/clocksource0/available_clocksource": "tsc hpet acpi_pm",
    "proc/cmdline": "BOOT_IMAGE=/vmlinuz root=/dev/sda1 isolcpus=domain,managed_irq,3,7 "
                    "nohz_full=3,7 rcu_nocbs=3,7 quiet",
    "proc/sys/kernel/sched_rt_runtime_us": "950000",
    "proc/sys/kernel/sched_rt_period_us": "1000000",
    "proc/sys/vm/swappiness": "60",
    "proc/swaps": "Filename Type Size Used Priority\n/swapfile file 2097148 0 -2",
    "proc/meminfo": "MemTotal: 32000000 kB\nHugePages_Total: 0\nHugePages_Free: 0\n",
    "proc/4242/comm": "irqbalance",
    "proc/1/comm": "systemd",
    "proc/interrupts": textwrap.dedent("""\
                   CPU0       CPU1       CPU2       CPU3       CPU4       CPU5       CPU6       CPU7
          0:         10          0          0          0          0          0          0          0   IO-APIC   2-edge      timer
         24:          0          0          0       5000          0          0          0          0   PCI-MSI 1-edge      eth0-rx-0
         25:          0          0       9000          0          0          0          0          0   PCI-MSI 2-edge      nvme0q1
        NMI:          0          0          0          0          0          0          0          0   Non-maskable interrupts
        """),
    "proc/irq/24/smp_affinity_list": "3",
    "proc/irq/25/smp_affinity_list": "2",
}

# per-CPU files: SMT siblings, a power-saving governor, and C-states with their exit latencies
for c in range(8):
    FAKE[f"sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list"] = f"{c % 4},{c % 4 + 4}"
    FAKE[f"sys/devices/system/cpu/cpu{c}/cpufreq/scaling_governor"] = "powersave"
    for k, (name, lat) in enumerate((("POLL", 0), ("C1", 2), ("C6", 133))):
        FAKE[f"sys/devices/system/cpu/cpu{c}/cpuidle/state{k}/name"] = name
        FAKE[f"sys/devices/system/cpu/cpu{c}/cpuidle/state{k}/latency"] = str(lat)
        FAKE[f"sys/devices/system/cpu/cpu{c}/cpuidle/state{k}/disable"] = "0"


def make_host(tmp_path, **override):
    files = dict(FAKE)
    files.update(override)
    for rel, text in files.items():
        if text is None:
            continue
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return Host(str(tmp_path))
