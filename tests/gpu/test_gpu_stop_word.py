"""The persistent protocol's stop request is the top bit of the request word (req_seq), the
one word the kernel polls over PCIe; the slot's `stop` field is the host's own record. The CPU
device loop (fastpath.gpu._protocol.CpuDevice) polls the same way as the kernel."""
import threading

import numpy as np

from fastpath.gpu import _protocol as P

STOP_BIT = np.uint64(1) << np.uint64(63)


def _slot(n_in=4, n_out=3):
    buf = P.aligned_buffer(P.slot_bytes(n_in, n_out))
    return buf, P.Slot.on_buffer(buf, n_in, n_out)


def _device(n_in=4, n_out=3):
    rng = np.random.default_rng(5)
    ws = [rng.standard_normal((n_out, n_in)).astype(np.float32)]
    return P.CpuDevice(ws, [np.zeros(n_out, np.float32)], ["identity"], "scalar")


def test_stop_sets_the_request_words_top_bit_and_sends_nothing_after():
    buf, slot = _slot()
    slot.stop()
    word = buf[:8].view(np.uint64)
    assert word[0] & STOP_BIT and int(word[0] & ~STOP_BIT) == 0
    assert slot.state["req_seq"] == 0 and slot.state["stop"] == 1
    assert slot.request(np.ones(4, np.float32), np.empty(3, np.float32), 10**6)[0] == P.STOPPED
    assert int(word[0] & ~STOP_BIT) == 0


def test_device_loop_returns_on_the_stop_bit_alone():
    """The device loop polled a separate stop word besides req_seq on every spin."""
    buf, slot = _slot()
    dev = _device()
    t = threading.Thread(target=dev.serve, args=(slot,), daemon=True)
    t.start()
    try:
        assert slot.wait_ready(P.READY_RUNNING, 5 * 10**9) == P.OK
        out = np.empty(3, np.float32)
        for i in range(3):
            assert slot.request(np.full(4, i, np.float32), out, 5 * 10**9)[:2] == (P.OK, i + 1)
        # only the request word's bit, as a host that never touches the stop field would
        word = buf[:8].view(np.uint64)
        word[0] |= STOP_BIT
        assert slot.wait_ready(P.READY_EXITED, 5 * 10**9) == P.OK
        assert slot.state["stop"] == 0 and slot.state["req_seq"] == 3
    finally:
        slot.stop()
        t.join(5)
    assert not t.is_alive()
