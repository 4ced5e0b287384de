"""The host reader on a fake 2-node host (files in a temp dir): cpulists and the topology.
"""

from fastpath.control.host import format_cpulist, parse_cpulist, read_topology

from helpers.host import make_host


def test_cpulists_parse_and_format():
    assert parse_cpulist("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpulist("0-7:2") == [0, 2, 4, 6]
    assert parse_cpulist("") == [] and parse_cpulist(None) == []
    assert format_cpulist([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"


def test_topology_of_the_fake_host(tmp_path):
    """CPUs, SMT siblings, NUMA nodes, isolated cores and the GPU's node read from /sys and
    /proc."""
    t = read_topology(make_host(tmp_path))
    assert t.cpus == list(range(8))
    assert t.siblings[3] == [7] and t.siblings[4] == [0]
    assert t.nodes == {0: [0, 1, 4, 5], 1: [2, 3, 6, 7]}
    assert t.isolated == [3, 7] and t.nohz_full == [3, 7] and t.rcu_nocbs == [3, 7]
    assert len(t.gpus) == 1 and t.gpus[0].numa_node == 1 and t.gpus[0].local_cpus == [2, 3, 6, 7]
    assert t.node_of(6) == 1
