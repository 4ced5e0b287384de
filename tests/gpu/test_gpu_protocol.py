"""The persistent GPU path's protocol (csrc/fp_gpu.c) with a CPU thread playing the device.

The device loop here (fastpath.gpu._protocol.CpuDevice) answers the slot exactly as the
persistent kernel does, with the CPU MLP kernels; so ordering, sequence numbers, deadlines,
stop and the non-finite status are checked where no GPU exists. No assertion is on time:
deadlines are only asserted to end the wait, not how fast.
"""

import threading
import time

import numpy as np
import pytest

from fastpath.errors import InputError
from fastpath.gpu import _protocol as P

from helpers.builders import ACTS


def _layers(rng, dims, acts=None):
    acts = acts or ["relu"] * (len(dims) - 2) + ["identity"]
    ws = [rng.standard_normal((dims[i + 1], dims[i])).astype(np.float32) / np.sqrt(dims[i])
          for i in range(len(dims) - 1)]
    bs = [rng.standard_normal(dims[i + 1]).astype(np.float32) * 0.1 for i in range(len(dims) - 1)]
    return ws, bs, acts


def _ref(ws, bs, acts, x):
    f = {"identity": lambda v: v, "relu": lambda v: np.maximum(v, 0), "tanh": np.tanh,
         "sigmoid": lambda v: 1 / (1 + np.exp(-v))}
    h = x.astype(np.float64)
    for w, b, a in zip(ws, bs, acts):
        h = f[a](w.astype(np.float64) @ h + b)
    return h


class Served:
    """A slot and a CPU thread serving it; stop() joins the thread with a deadline."""

    def __init__(self, dev, slot, **kw):
        self.slot = slot
        self.answers = None
        self.t = threading.Thread(target=self._run, args=(dev, kw), daemon=True)
        self.t.start()
        assert slot.wait_ready(P.READY_RUNNING, 5 * 10**9) == P.OK

    def _run(self, dev, kw):
        self.answers = dev.serve(self.slot, **kw)

    def stop(self):
        self.slot.stop()
        assert self.slot.wait_ready(P.READY_EXITED, 5 * 10**9) == P.OK
        self.t.join(5)
        assert not self.t.is_alive()


def test_slot_layout_and_its_checks():
    """Sequence numbers on their own cache lines, arrays line-aligned after the 3-line header;
    a slot on unaligned or too little memory is refused."""
    assert P.HDR_BYTES == 3 * P.LINE
    assert P.slot_bytes(1, 1) == P.HDR_BYTES + 2 * P.LINE
    assert P.slot_bytes(16, 2) == P.HDR_BYTES + P.LINE + P.LINE
    assert P.slot_bytes(17, 2) == P.HDR_BYTES + 2 * P.LINE + P.LINE
    with pytest.raises(InputError):
        P.slot_bytes(0, 2)
    buf = P.aligned_buffer(P.slot_bytes(4, 2) + 64)
    with pytest.raises(InputError, match="aligned"):
        P.Slot(buf, buf.ctypes.data + 4, 4, 2)
    with pytest.raises(InputError, match="bytes"):
        P.Slot(buf[:64], buf.ctypes.data, 4, 2)


@pytest.mark.parametrize("act", ACTS)
def test_many_requests_match_cpu(isa, act):
    rng = np.random.default_rng(1)
    dims = [37, 24, 9, 2]
    ws, bs, acts = _layers(rng, dims, [act, act, "identity"])
    dev = P.CpuDevice(ws, bs, acts, isa)
    slot = P.Slot.on_buffer(P.aligned_buffer(P.slot_bytes(37, 2)), 37, 2)
    s = Served(dev, slot)
    out = np.empty(2, np.float32)
    try:
        for i in range(100):
            x = rng.standard_normal(37).astype(np.float32)
            rc, seq, dev_ns, wait_ns = slot.request(x, out, 5 * 10**9)
            assert rc == P.OK and seq == i + 1
            np.testing.assert_allclose(out, _ref(ws, bs, acts, x), rtol=1e-5, atol=1e-5)
    finally:
        s.stop()
    assert s.answers == 100
    st = slot.state
    assert st["req_seq"] == st["resp_seq"] == 100 and st["ready"] == P.READY_EXITED


def test_silent_device_times_out_then_stop_refuses(isa):
    rng = np.random.default_rng(2)
    ws, bs, acts = _layers(rng, [8, 4, 2])
    dev = P.CpuDevice(ws, bs, acts, isa)
    slot = P.Slot.on_buffer(P.aligned_buffer(P.slot_bytes(8, 2)), 8, 2)
    s = Served(dev, slot, max_answers=3)
    x = np.ones(8, np.float32)
    out = np.empty(2, np.float32)
    try:
        for _ in range(3):
            assert slot.request(x, out, 5 * 10**9)[0] == P.OK
        # the "kernel" hangs: the wait ends at the deadline with TIMEOUT, not never
        rc, seq, _, wait_ns = slot.request(x, out, 2 * 10**6)
        assert rc == P.TIMEOUT and seq == 4 and wait_ns >= 2 * 10**6
    finally:
        s.stop()
    assert s.answers == 3
    # a stopped slot sends nothing
    before = slot.state["req_seq"]
    assert slot.request(x, out, 10**6)[0] == P.STOPPED
    assert slot.state["req_seq"] == before


def test_no_device_at_all_times_out():
    slot = P.Slot.on_buffer(P.aligned_buffer(P.slot_bytes(4, 2)), 4, 2)
    assert slot.wait_ready(P.READY_RUNNING, 10**6) == P.TIMEOUT
    rc = slot.request(np.zeros(4, np.float32), np.empty(2, np.float32), 10**6)[0]
    assert rc == P.TIMEOUT


def test_late_answer_is_skipped(isa):
    # a slow device answers a request after its deadline: the next request must wait for its
    # own sequence number, not take the late answer to the previous features
    rng = np.random.default_rng(3)
    ws, bs, acts = _layers(rng, [6, 2])
    dev = P.CpuDevice(ws, bs, acts, isa)
    out = np.empty(2, np.float32)
    x1 = np.full(6, 1.0, np.float32)
    x2 = np.full(6, -3.0, np.float32)
    late = 0
    # the scenario needs the device thread to take x1 before x2 is published; on a loaded
    # host it may not be scheduled in time (then x2 supersedes x1 and one answer is given),
    # so try a few times: every attempt must answer x2 correctly, one must have been late
    for attempt in range(6):
        slot = P.Slot.on_buffer(P.aligned_buffer(P.slot_bytes(6, 2)), 6, 2)
        s = Served(dev, slot, delay_ns=50 * 10**6 * (attempt + 1))
        try:
            assert slot.request(x1, out, 10**5)[0] == P.TIMEOUT
            time.sleep(0.01 * (attempt + 1))   # the device takes x1 and is still computing it
            rc, seq, _, _ = slot.request(x2, out, 5 * 10**9)
            assert rc == P.OK and seq == 2
            np.testing.assert_allclose(out, _ref(ws, bs, acts, x2), rtol=1e-5, atol=1e-5)
        finally:
            s.stop()
        assert s.answers in (1, 2)
        if s.answers == 2:
            late += 1
            break
    assert late == 1, "the device never took the first request before the second: no late answer seen"


def test_nonfinite_is_reported(isa):
    rng = np.random.default_rng(4)
    ws, bs, acts = _layers(rng, [5, 3, 2], ["relu", "identity"])
    ws[0][:] = 3e38            # any x > 0 overflows the first layer; relu alone would hide it
    dev = P.CpuDevice(ws, bs, acts, isa)
    slot = P.Slot.on_buffer(P.aligned_buffer(P.slot_bytes(5, 2)), 5, 2)
    s = Served(dev, slot)
    out = np.empty(2, np.float32)
    try:
        assert slot.request(np.ones(5, np.float32), out, 5 * 10**9)[0] == P.NONFINITE
        # a finite tick afterwards is answered normally: the status is per request
        assert slot.request(np.zeros(5, np.float32), out, 5 * 10**9)[0] == P.OK
        np.testing.assert_allclose(out, _ref(ws, bs, acts, np.zeros(5)), rtol=1e-5, atol=1e-5)
    finally:
        s.stop()


def test_request_checks_arrays():
    slot = P.Slot.on_buffer(P.aligned_buffer(P.slot_bytes(4, 2)), 4, 2)
    with pytest.raises(InputError, match="float32"):
        slot.request(np.zeros(4), np.empty(2, np.float32), 10)
    with pytest.raises(InputError, match="2 values"):
        slot.request(np.zeros(4, np.float32), np.empty(3, np.float32), 10)
    with pytest.raises(InputError, match="timeout"):
        slot.request(np.zeros(4, np.float32), np.empty(2, np.float32), -1)
    assert slot.state["req_seq"] == 0


def _served(rng, **kw):
    ws = [rng.standard_normal((3, 4)).astype(np.float32)]
    bs = [np.zeros(3, np.float32)]
    dev = P.CpuDevice(ws, bs, ["identity"], "scalar")
    slot = P.Slot.on_buffer(P.aligned_buffer(P.slot_bytes(4, 3)), 4, 3)
    t = threading.Thread(target=dev.serve, args=(slot,), kwargs=kw, daemon=True)
    t.start()
    assert slot.wait_ready(P.READY_RUNNING, 5 * 10**9) == P.OK
    return dev, slot, t


def test_request_to_a_device_loop_that_returned_is_stopped_not_a_wait():
    """A request to a device loop that had returned waited out its deadline and came back
    TIMEOUT."""
    dev, slot, t = _served(np.random.default_rng(10), idle_timeout_ns=10**6)
    assert slot.wait_ready(P.READY_EXITED, 5 * 10**9) == P.OK
    t.join(5)
    out = np.empty(3, np.float32)
    rc, seq, _, _ = slot.request(np.ones(4, np.float32), out, 3 * 10**9)
    assert rc == P.STOPPED and seq == 1


def test_device_loop_returning_while_a_request_waits_ends_the_wait():
    """A request waiting on a device loop that returns ends STOPPED once the loop exits, not at its
    deadline."""
    # request() keeps the GIL: no Python thread can call stop() while it waits, so the loop's
    # own exit is what is staged here
    dev, slot, t = _served(np.random.default_rng(11), max_answers=0, idle_timeout_ns=2 * 10**8)
    rc = slot.request(np.ones(4, np.float32), np.empty(3, np.float32), 5 * 10**9)[0]
    t.join(5)
    assert rc == P.STOPPED and not t.is_alive()
    assert slot.state["ready"] == P.READY_EXITED


def test_answers_still_arrive_after_the_exit_check():
    """The device loop's exit check does not turn answered requests into STOPPED."""
    # many requests, the device slow enough that the host polls (and looks at `ready`) while it
    # computes
    rng = np.random.default_rng(12)
    dev, slot, t = _served(rng, delay_ns=20_000)
    out = np.empty(3, np.float32)
    for i in range(200):
        x = rng.standard_normal(4).astype(np.float32)
        rc, seq, _, _ = slot.request(x, out, 5 * 10**9)
        assert rc == P.OK and seq == i + 1
    slot.stop()
    t.join(5)


def test_slot_over_existing_memory_must_match_its_widths():
    """Slot(init=False) checked x / out against the widths given, while C copied the slot's own
    widths."""
    buf = P.aligned_buffer(P.slot_bytes(4, 3))
    P.Slot.on_buffer(buf, 4, 3)
    with pytest.raises(InputError, match=r"set up for 4 -> 3, not 2 -> 1"):
        P.Slot(buf, buf.ctypes.data, 2, 1, init=False)
    s = P.Slot(buf, buf.ctypes.data, 4, 3, init=False)
    assert s.n_in == 4


def test_request_with_the_longest_timeout_waits_for_the_answer():
    """A timeout near INT64_MAX wrapped the deadline negative and the request came back TIMEOUT at
    once."""
    rng = np.random.default_rng(9)
    W = [rng.standard_normal((3, 4)).astype(np.float32)]
    b = [np.zeros(3, np.float32)]
    dev = P.CpuDevice(W, b, ["identity"])
    buf = P.aligned_buffer(P.slot_bytes(4, 3))
    slot = P.Slot.on_buffer(buf, 4, 3)
    t = threading.Thread(target=dev.serve, args=(slot, 2**62, 20_000_000, 10**10))
    t.start()
    try:
        assert slot.wait_ready(P.READY_RUNNING, 10**10) == P.OK
        out = np.zeros(3, np.float32)
        x = np.arange(4, dtype=np.float32)
        rc, seq, _, _ = slot.request(x, out, 2**63 - 1)
        assert rc == P.OK and seq == 1
        np.testing.assert_allclose(out, W[0] @ x, rtol=1e-6)
    finally:
        slot.stop()
        t.join()


def test_wait_ready_with_the_longest_timeout_waits_for_the_device():
    buf = P.aligned_buffer(P.slot_bytes(4, 3))
    slot = P.Slot.on_buffer(buf, 4, 3)
    dev = P.CpuDevice([np.ones((3, 4), np.float32)], [np.zeros(3, np.float32)], ["identity"])
    # the device comes up 50 ms after the wait began (wait_ready releases the GIL)
    starter = threading.Timer(0.05, dev.serve, args=(slot, 2**62, 0, 10**10))
    starter.start()
    try:
        assert slot.wait_ready(P.READY_RUNNING, 2**63 - 1) == P.OK
    finally:
        slot.stop()
        starter.join()
    assert slot.state["ready"] == P.READY_EXITED
