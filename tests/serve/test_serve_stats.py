"""Serving figures: Server.stats(), the clients' published copy, latency records and their
snapshot, the `fastpath serve --stats` line, the placement report a client reads."""
import mmap
import struct
import threading

import numpy as np
import pytest

import fastpath
from fastpath import InputError
from fastpath._build import DEMO_MODEL
from fastpath._serve import Client, Worker, _LatRing, segment_path
from fastpath.serving.server import Server, _stats_line
from helpers.serving import cfg, deadline, raw_zero, ticks, uname


# ------------------------------------------------------------------ served vs local engine
def test_stage_times_off_is_honoured_by_the_server():
    """Regression: the server timed every stage although [engine] stage_times = false."""
    config = cfg()
    config["engine"]["stage_times"] = False
    raw = raw_zero()
    local = fastpath.Engine(DEMO_MODEL, config=config).step(raw, 0, 100)
    assert local.latency.feature_ns == -1
    name = uname()
    with fastpath.serve(name, None, config), fastpath.connect(name) as c:
        r = c.step(raw, 0, 100)
    lat = r.latency
    assert (lat.feature_ns, lat.cache_ns, lat.infer_ns) == (-1, -1, -1)
    assert lat.total_ns > 0
    assert (r.signal, r.confidence) == (local.signal, local.confidence)


# ------------------------------------------------------------------ --stats figures
def _pcts(col):
    p50, p99 = np.percentile(col, [50, 99])
    return f"{p50:.0f}/{p99:.0f}"


def test_stats_line_reports_no_latency_for_an_interval_of_refused_ticks_only():
    """Regression: a --stats second of refused ticks only reported earlier seconds'
    percentiles."""
    name = uname()
    raw = np.zeros(256, np.float32)
    with fastpath.serve(name, config=cfg()) as srv, fastpath.connect(name, timeout=5) as c, \
            deadline(60):
        for i in range(5):
            c.step(raw, 0, 1_000_000 * (i + 1))
        line, prev = _stats_line(srv, {}, 1.0)
        lat = srv.latency_records()
        assert len(lat) == 5
        assert f"total p50/p99 {_pcts(lat[:, 3])} ns" in line
        for _ in range(3):
            with pytest.raises(InputError, match="earlier than"):
                c.step(raw, 0, 1)
        line, prev = _stats_line(srv, prev, 1.0)
        assert "errors 3" in line
        assert "p50/p99" not in line, line
        # one served, two refused: the one served tick's record alone
        c.step(raw, 0, 10_000_000)
        for _ in range(2):
            with pytest.raises(InputError):
                c.step(raw, 0, 1)
        line, prev = _stats_line(srv, prev, 1.0)
        last = srv.latency_records()[-1:]
        assert f"total p50/p99 {_pcts(last[:, 3])} ns" in line, line
        # the previous read fell between the loop's update of served and of errors (served
        # has a batch's two refusals, errors not yet): this second answered nothing
        torn = dict(prev, errors=prev["errors"] - 2)
        line, _ = _stats_line(srv, torn, 1.0)
        assert "p50/p99" not in line, line


def test_stats_line_leaves_out_stages_that_are_not_timed():
    """Regression: --stats printed untimed stages (stage_times = false) as 'feature p50/p99 0/0
    ns'."""
    name = uname()
    raw = np.zeros(256, np.float32)
    with fastpath.serve(name, config=cfg(engine={"stage_times": False})) as srv, \
            fastpath.connect(name, timeout=5) as c, deadline(60):
        for i in range(4):
            c.step(raw, i, 1_000_000)
        line, _ = _stats_line(srv, {}, 1.0)
        lat = srv.latency_records()
    assert "feature p50" not in line and "cache p50" not in line, line
    assert f"total p50/p99 {_pcts(lat[:, 3])} ns" in line
    assert f"wait p50/p99 {_pcts(lat[:, 4])} ns" in line


def test_queue_depth_is_never_read_as_negative():
    """Regression: a tail read past the head made the queue depth read as 2^64 - 1."""
    name = uname()
    with fastpath.serve(name, config=cfg()) as srv, fastpath.connect(name) as c, deadline(60):
        c.step(np.zeros(c.raw_len, np.float32), 0, 100)
        slot = srv.stats()["clients"][0]["slot"]
        with open(segment_path(name), "r+b") as f:
            mm = mmap.mmap(f.fileno(), 0)
        try:
            # fp_seg_header: magic, version, header_bytes, raw_len, n_symbols, slots,
            # max_clients, req_slot_bytes, rep_slot_bytes, client_region_bytes
            header_bytes, = struct.unpack_from("<I", mm, 12)
            region, = struct.unpack_from("<Q", mm, 40)
            ctl = header_bytes + slot * region
            head, = struct.unpack_from("<Q", mm, ctl)            # req_head.v
            tail, = struct.unpack_from("<Q", mm, ctl + 64)       # req_tail.v
            assert head == tail == 1
            struct.pack_into("<Q", mm, ctl, 0)                   # a head read before the tail
            st = srv.stats()
            struct.pack_into("<Q", mm, ctl, head)
        finally:
            mm.close()
        assert st["queue_depth"] == 0, st["queue_depth"]
        assert st["clients"][0]["queued"] == 0


def test_rejected_full_is_said_to_be_counted_by_the_clients():
    """rejected_full, the one count only clients can make, stays in the segment, and the docs
    say so."""
    for doc in (Server.stats.__doc__, Worker.stats.__doc__):
        assert "rejected_full" in doc and "counted by the clients" in doc, doc
    assert "forgeable" in Client.server_stats.__doc__


def test_a_slots_served_count_starts_again_with_its_next_client():
    """Each slot's served count is the loop's, from 0 again for the slot's next client."""
    name = uname()
    raw = np.zeros(256, np.float32)
    with fastpath.serve(name, None, cfg(ring_slots=4, max_clients=1)) as srv:
        with fastpath.connect(name, timeout=5) as c:
            for _ in range(3):
                c.step(raw, 1)
            assert [d["served"] for d in srv.stats()["clients"]] == [3]
        with fastpath.connect(name, timeout=5) as c:
            for _ in range(2):
                c.step(raw, 1)
            st = srv.stats()
            assert [d["served"] for d in st["clients"]] == [2], st
            assert st["served"] == 5, st


def test_placement_report_reaches_clients(model):
    name = uname()
    with fastpath.serve(name, model, cfg(place=True)) as srv, fastpath.connect(name) as c:
        rep = c.placement
        assert rep == srv.placement
        assert "core" in rep and "policy_granted" in rep and "placed" in rep


def test_latency_snapshot_leaves_out_a_record_being_written():
    """A latency snapshot copies a record whole or leaves it out, never half old, half new."""
    ring = _LatRing(8)
    ring.write(5)
    ring.begin_only(999)          # the writer is inside record 5: its first field changed
    snap = ring.snapshot()
    assert snap.shape == (5, 5)
    assert (snap == np.arange(5, dtype=np.uint32)[:, None]).all()
    ring.write(20)                # lapped: only the last 8 ticks, oldest first
    np.testing.assert_array_equal(ring.snapshot()[:, 0], np.arange(17, 25))


def test_latency_snapshot_is_consistent_under_a_running_writer():
    """A snapshot taken while another thread writes holds no row mixing two ticks, in tick
    order."""
    ring = _LatRing(64)
    writer = threading.Thread(target=ring.write, args=(20_000_000,))
    writer.start()
    snaps = 0
    with deadline(60):
        while writer.is_alive() or snaps == 0:
            s = ring.snapshot()
            assert (s == s[:, :1]).all(), "a row mixes two ticks"
            assert (np.diff(s[:, 0].astype(np.int64)) > 0).all()
            snaps += 1
        writer.join()
    assert ring.count == 20_000_000 and snaps > 1


def test_server_keeps_latency_records_of_served_ticks(model):
    name = uname()
    raws = ticks(50, model.feature_spec.raw_len)
    with fastpath.serve(name, model, cfg()) as srv, fastpath.connect(name) as c:
        got = [c.step(raws[i], i % 3, 1000 * (i + 1)) for i in range(50)]
        lat = srv.latency_records()
    assert lat.shape == (50, 5) and lat.dtype == np.uint32
    np.testing.assert_array_equal(lat[:, 3], [r.latency.total_ns for r in got])
    np.testing.assert_array_equal(lat[:, 4], [r.latency.wait_ns for r in got])
