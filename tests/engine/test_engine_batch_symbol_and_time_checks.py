"""Engine.step_batch's checks of its symbols and timestamps: only the batch's own symbols are
read, refusals come in row order, any integer dtype is read by value, the first bad timestamp
row is named.
"""

import os

import pytest

import fastpath


DEMO = os.path.join(os.path.dirname(fastpath.__file__), "data", "demo.fpm")


def test_step_batch_checks_only_its_own_symbols_and_keeps_the_order_of_refusals(isa):
    # fp_batch_check read every symbol's last tick on each call (O(n_symbols) slot reads:
    # 57 us a call at 65,536 symbols whatever the batch); it now reads the batch's own. The
    # refusals must come in row order as before, and a symbol's time from earlier calls holds.
    import numpy as np
    from fastpath.errors import InputError
    e = fastpath.Engine(DEMO, config={"engine": {"n_symbols": 65536, "simd": isa}})
    raws = np.ones((4, 256), np.float32)
    e.step_batch(raws[:2], np.array([7, 65535]), np.array([100, 200]))
    bad = raws.copy()
    bad[1, 3] = np.nan
    with pytest.raises(InputError, match=r"row 1.*non-finite|non-finite.*row 1"):
        # row 2 goes back in time for symbol 65535: the NaN row before it is the refusal
        e.step_batch(bad, np.array([7, 7, 65535, 3]), np.array([300, 400, 150, 600]))
    with pytest.raises(InputError, match=r"symbol 1000000 out of range"):
        e.step_batch(raws, np.array([10**6, 7, 7, 3]), np.array([300, 400, 500, 600]))
    # earlier than symbol 65535's tick of the first call: refused at its row
    with pytest.raises(InputError, match=r"row 2: ts_ns 150 is earlier than the last tick of symbol 65535"):
        e.step_batch(raws, np.array([7, 3, 65535, 3]), np.array([300, 300, 150, 400]))
    # within the batch: symbol 3 goes back at row 2
    with pytest.raises(InputError, match=r"row 2: ts_ns 250 is earlier than the last tick of symbol 3"):
        e.step_batch(raws, np.array([3, 7, 3, 9]), np.array([300, 300, 250, 400]))
    assert e.stats()["ticks"] == 2
    r = e.step_batch(raws, np.array([3, 7, 3, 65535]), np.array([300, 300, 300, 201]))
    assert len(r.signal) == 4 and e.stats()["ticks"] == 6


@pytest.mark.parametrize("dt", [">u8", ">i8", "<u8", ">u4", ">i2", "u1"])
def test_step_batch_reads_symbols_and_times_of_any_integer_dtype_by_value(dt):
    # the fast argument check viewed uint64 arrays as int64 without making them native first:
    # a big-endian uint64 symbol 1 read as 2**56 (out of range), and the error path then found
    # no bad row in the original array (IndexError)
    import numpy as np
    e = fastpath.Engine(DEMO, config={"engine": {"n_symbols": 8}})
    ref = fastpath.Engine(DEMO, config={"engine": {"n_symbols": 8}})
    raws = np.ones((3, 256), np.float32) + np.arange(3, dtype=np.float32)[:, None]
    got = e.step_batch(raws, np.array([1, 2, 1]).astype(dt), np.array([5, 6, 7]).astype(dt))
    want = ref.step_batch(raws, np.array([1, 2, 1], np.int32), np.array([5, 6, 7], np.int64))
    assert got.signal.tobytes() == want.signal.tobytes()
    from fastpath.errors import InputError
    with pytest.raises(InputError, match="symbol 9 out of range"):
        e.step_batch(raws, np.array([1, 9, 1]).astype(dt), np.array([8, 9, 10]).astype(dt))


def test_step_batch_names_the_first_bad_timestamp_row():
    # the ts check named the row of the smallest (or, past int64, the largest) value, where
    # every other refusal of a batch names the first bad row
    import numpy as np
    from fastpath.errors import InputError
    e = fastpath.Engine(DEMO, config={"engine": {"n_symbols": 8}})
    r = np.ones((3, 256), np.float32)
    with pytest.raises(InputError, match=r"ts_ns must be >= 0, row 1 is -1$"):
        e.step_batch(r, np.array([0, 1, 2], np.int32), np.array([5, -1, -9]))
    with pytest.raises(InputError, match=r"ts_ns row 1 is 9223372036854775809, which does not fit"):
        e.step_batch(r, np.array([0, 1, 2], np.int32),
                     np.array([5, 2**63 + 1, 2**64 - 1], np.uint64))
    assert e.stats()["ticks"] == 0
