"""Memory for the weights arena and the cache slots, seen from the control plane: the
allocation itself (huge pages where the host allows, locked, read back from smaps) lives in
fastpath._memory beside the engine and is re-exported here; lock_plan says beforehand what a
config will lock (the engine's arena and state, the serve segment), for `fastpath doctor`.
"""
from __future__ import annotations

import mmap

from fastpath._memory import (GB1, MADV_HUGEPAGE, MAP_HUGE_1GB, MAP_HUGE_2MB, MAP_HUGE_SHIFT,
                              MAP_HUGETLB, MB2, MemoryReport, Region, _mlock, _plan, allocate,
                              available_bytes, smaps_entry)
from fastpath.config import load_config

__all__ = ["GB1", "MADV_HUGEPAGE", "MAP_HUGE_1GB", "MAP_HUGE_2MB", "MAP_HUGE_SHIFT", "MAP_HUGETLB",
           "MB2", "MemoryReport", "Region", "_mlock", "_plan", "allocate", "available_bytes",
           "smaps_entry", "SEG_HEADER_BYTES", "serve_segment_bytes", "mapped_bytes", "lock_plan"]


# ------------------------------------------------------------- what a config will lock
# The serve segment's layout constants (fastpath/include/fp_ring.h): the header, a client's
# ring control block (4 cursors of one cache line), a request's fixed part and a reply slot.
SEG_HEADER_BYTES = 16384
_RING_CTL_BYTES = 256
_REQ_HEAD_BYTES = 64
_REP_BYTES = 64


def serve_segment_bytes(raw_len: int, ring_slots: int, max_clients: int) -> int:
    """fp_seg_bytes (csrc/fp_worker.c): the header, then per client its ring control block
    and ring_slots request slots (64 B + the raw tick, padded to 64 B) and reply slots."""
    req = (_REQ_HEAD_BYTES + 4 * int(raw_len) + 63) & ~63
    return SEG_HEADER_BYTES + int(max_clients) * (_RING_CTL_BYTES + int(ring_slots) * (req + _REP_BYTES))


def mapped_bytes(nbytes: int, huge_pages: str, one_gb_pages_free: bool = False) -> int:
    """The length allocate() (and the segment's create) maps and mlocks for nbytes: rounded
    to 2 MB whenever the plan starts with huge pages (a hugetlb-2m or THP mapping is 2 MB
    rounded whichever of them the host grants), to 1 GB for "1g" when that pool has pages,
    to the base page for "none"."""
    n = max(int(nbytes), 64)
    page = (GB1 if huge_pages == "1g" and one_gb_pages_free else
            mmap.PAGESIZE if huge_pages == "none" else MB2)
    return -(-n // page) * page


def lock_plan(engine_asked: int | None, config=None, serve: bool = False, raw_len: int = 256,
              one_gb_pages_free: bool = False) -> dict:
    """What a process running this config mlocks, in bytes: the engine's arena and state
    (engine_asked: what the engine asks allocate() for, fp_engine_sizes; sized by the engine
    layer above this one, None when not known) and with serve=True the `fastpath serve`
    segment ([serve] ring_slots x max_clients) beside the worker's engine; nothing when
    [memory] mlock is false. {"mlock", "engine", "segment", "total" (None when the engine's
    part is not known), "engine_asked", "segment_asked", "ring_slots", "max_clients",
    "n_symbols", "huge_pages"}"""
    cfg = load_config(config)
    mem = cfg.memory
    seg = serve_segment_bytes(raw_len, cfg.serve.ring_slots, cfg.serve.max_clients) if serve else 0
    eng_b = None if engine_asked is None else mapped_bytes(engine_asked, mem.huge_pages,
                                                           one_gb_pages_free)
    seg_b = mapped_bytes(seg, mem.huge_pages, one_gb_pages_free) if serve else 0
    locks = bool(mem.mlock)
    total = 0 if not locks else (None if eng_b is None else eng_b + seg_b)
    return {"mlock": locks, "engine": eng_b if locks else 0, "segment": seg_b if locks else 0,
            "total": total, "engine_asked": engine_asked, "segment_asked": seg,
            "ring_slots": cfg.serve.ring_slots, "max_clients": cfg.serve.max_clients,
            "n_symbols": cfg.n_symbols, "huge_pages": mem.huge_pages}
