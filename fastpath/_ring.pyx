# cython: language_level=3
"""The serving segment's shared helpers: its path under /dev/shm from a server name, and the
stats a worker reports and a client reads from its header (fastpath/_ring.pxd declares the
segment's C layout for both sides)."""
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t

from fastpath.errors import InputError


def segment_path(name):
    """The file under /dev/shm that holds the segment for `name`."""
    cdef char buf[512]
    b = _name_bytes(name)
    fp_seg_path(b, buf, sizeof(buf))
    return buf.decode()


def _name_bytes(name):
    try:
        b = name.encode() if isinstance(name, str) else None
    except UnicodeEncodeError:
        # a shell argument with a byte that is not UTF-8 arrives as a lone surrogate: it
        # raised UnicodeEncodeError from here, out of `fastpath serve` as a traceback
        raise InputError(f"server name must be UTF-8 text (it names a file under /dev/shm), "
                         f"got {name!r}") from None
    if b is None or not name or "/" in name or len(b) > 200 or "\0" in name:
        raise InputError(f"server name must be a non-empty str of at most 200 bytes without '/', "
                         f"got {name!r}")
    return b


cdef object _state_name(uint32_t st):
    """fp_seg_header.state as a name. Bounded: the field is in the live header, which any
    process mapping the segment can overwrite, and a tuple indexed by it without a check
    (Cython's boundscheck is off) read past the tuple: one store of 7 segfaulted stats()."""
    if st <= FP_SRV_STOPPED:
        return ("starting", "running", "stopping", "stopped")[st]
    return f"unknown ({st})"


cdef object _pages_name(uint32_t seg_flags):
    return ("hugetlb" if seg_flags == FP_SEG_HUGE_TLB else
            "thp" if seg_flags == FP_SEG_HUGE_THP else "normal")


cdef void _read_published(fp_seg_header *h, const fp_seg_layout *L,
                          fp_worker_stats *S) noexcept nogil:
    """The counts the loop publishes in the header for clients (fp_worker.c publish), read
    back into S."""
    S.state = fp_atomic_load_u32(&h.state)
    S.served = fp_atomic_load_u64(&h.served)
    S.errors = fp_atomic_load_u64(&h.errors)
    S.clients_reaped = fp_atomic_load_u64(&h.clients_reaped)
    S.busy_ns = fp_atomic_load_u64(&h.busy_ns)
    S.idle_polls = fp_atomic_load_u64(&h.idle_polls)
    S.heartbeat_ns = <int64_t>fp_atomic_load_u64(&h.heartbeat_ns)
    cdef uint32_t i
    for i in range(L.max_clients):
        S.client_served[i] = fp_atomic_load_u64(&h.clients[i].served)


cdef dict _header_stats(fp_seg_header *h, const fp_seg_layout *L, const fp_worker_stats *own):
    # own: the worker's counts in its process's memory (the server's stats()), or NULL: the
    # copy the worker published in the header (a client's server_stats(); any process that
    # maps the segment can overwrite it), read into a local copy first.
    # every value read into C locals first, the Python objects built after: building them
    # allocates, and what a gc pass runs then (a finalizer, a gc callback, a signal handler
    # one lets run) may close the client or the worker and unmap h: the next read segfaulted.
    # Addresses and counts come from L, the layout as checked (fp_seg_layout), not from h's
    # fields, which any process mapping the segment can overwrite
    cdef uint32_t n = 0, i, st
    cdef int32_t pid[FP_SEG_MAX_CLIENTS]
    cdef uint32_t slot[FP_SEG_MAX_CLIENTS]
    cdef uint64_t served[FP_SEG_MAX_CLIENTS]
    cdef uint64_t queued[FP_SEG_MAX_CLIENTS]
    cdef uint64_t depth = 0
    cdef uint64_t *cur
    cdef uint64_t head, tail
    cdef uint32_t m = L.max_clients
    cdef fp_worker_stats pub
    if own == NULL:
        _read_published(h, L, &pub)
        own = &pub
    for i in range(m):
        st = fp_atomic_load_u32(&h.clients[i].state)
        if st != FP_CL_ACTIVE:
            continue
        slot[n] = i
        pid[n] = h.clients[i].pid
        served[n] = fp_atomic_load_u64(&own.client_served[i])
        # queue depth: requests published and not yet taken. The worker's tail first, then
        # the client's head: read the other way round, a request published and taken
        # between the two reads put the tail past the head, and the unsigned difference
        # read as 2**64 - 1 requests queued (a slot freed between the reads does too: no
        # fewer than none)
        cur = <uint64_t *>fp_lay_ctl(L, i)
        tail = fp_atomic_load_u64(&cur[8])
        head = fp_atomic_load_u64(&cur[0])
        # and no more than a ring holds: both cursors are in the client's region, and a client
        # (a buggy C producer) storing req_head = 2^62 showed 2^62 requests queued
        queued[n] = min(head - tail, <uint64_t>L.slots) if head > tail else 0
        depth += queued[n]
        n += 1
    cdef uint32_t state = fp_atomic_load_u32(&own.state)
    cdef uint64_t h_served = fp_atomic_load_u64(&own.served)
    cdef uint64_t h_errors = fp_atomic_load_u64(&own.errors)
    cdef uint64_t h_reaped = fp_atomic_load_u64(&own.clients_reaped)
    cdef uint64_t h_busy = fp_atomic_load_u64(&own.busy_ns)
    cdef uint64_t h_idle = fp_atomic_load_u64(&own.idle_polls)
    cdef int64_t age = fp_ring_now_ns() - <int64_t>fp_atomic_load_u64(
        <const uint64_t *>&own.heartbeat_ns)
    # counted by the clients (only they see their rings full), in the segment either way
    cdef uint64_t h_rejected = fp_atomic_load_u64(&h.rejected_full)
    cdef int32_t server_pid = h.server_pid
    cdef uint32_t slots = L.slots, on_full = h.on_full, seg_flags = h.seg_flags
    # from here on, h is not read
    clients = []
    for i in range(n):
        clients.append({"slot": slot[i], "pid": pid[i], "served": served[i],
                        "queued": queued[i]})
    return {"state": _state_name(state),
            "served": int(h_served), "errors": int(h_errors),
            "rejected_full": int(h_rejected), "clients_reaped": int(h_reaped),
            "busy_ns": int(h_busy), "idle_polls": int(h_idle),
            "queue_depth": int(depth), "clients": clients,
            "heartbeat_age_ns": int(age),
            "server_pid": server_pid, "slots": slots, "on_full":
                "reject" if on_full == FP_ON_FULL_REJECT else "spin",
            "segment_pages": _pages_name(seg_flags)}
