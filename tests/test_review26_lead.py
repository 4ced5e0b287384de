"""Session 26 (lead): small trust fixes.

- A Ctrl-C while the serve segment was made (its pages reserved: a hugetlb pool probe, a
  fallocate) left the file behind, in hugetlbfs holding the pool's pages.

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


# -- the serve segment's file on Ctrl-C while it is made ----------------------------------

import os  # noqa: E402

import pytest  # noqa: E402

from fastpath.serving import segment  # noqa: E402


def _interrupt(*_a, **_k):
    raise KeyboardInterrupt


@pytest.mark.parametrize("huge", ["none", "thp"])
def test_ctrl_c_while_the_segment_is_reserved_leaves_no_file(tmp_path, monkeypatch, huge):
    path = str(tmp_path / "fastpath.seg")
    monkeypatch.setattr(segment, "shmem_thp_mode", lambda path=None: "advise")
    monkeypatch.setattr(segment, "_reserve", _interrupt)
    with pytest.raises(KeyboardInterrupt):
        segment.create(path, 1 << 20, 0o600, huge)
    assert os.listdir(tmp_path) == []


def test_ctrl_c_while_a_hugetlbfs_segment_is_made_leaves_no_file(tmp_path, monkeypatch):
    """The file in the hugetlbfs mount holds the pool's pages: left behind, it kept them."""
    mnt = tmp_path / "hugepages"
    mnt.mkdir()
    monkeypatch.setattr(segment, "hugetlbfs_mounts", lambda: {segment.MB2: str(mnt)})
    monkeypatch.setattr(os, "symlink", _interrupt)
    path = str(tmp_path / "fastpath.seg")
    with pytest.raises(KeyboardInterrupt):
        segment.create(path, 1 << 20, 0o600, "2m")
    assert os.listdir(mnt) == [] and not os.path.lexists(path)
