"""Session 26 (lead): small trust fixes.

- `fastpath doctor`'s mlock check said the arena was "mapped in 1 GB pages" for
  huge_pages = "1g" on a host with no 1 GB page free, where it counted (and the engine maps)
  2 MB-rounded lengths; and "2 MB pages" where the host may grant base pages only.
"""
from fastpath.control import doctor, memory
from fastpath.control.host import Host
from fastpath.control.placement import Privileges, UNLIMITED

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
