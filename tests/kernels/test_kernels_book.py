"""The live book's level kernels of every kernel set against numpy and the scalar twins: the
check of an update's ten levels a side (book_ok) and the mask of the levels that moved
(book_diff), on generated books and on books spoiled at every level, every field and every
kind of bad value (the vector kernels load ten levels as overlapping vectors: a level only one
of the loads sees must still count)."""
import numpy as np
import pytest

from fastpath import _kernels as K
from fastpath import lob
from fastpath.errors import InputError

SIDES = ("bid_px", "bid_sz", "ask_px", "ask_sz")
BAD = (np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, -1.0, -5e-324)


def _ok_ref(bp, bs, ap, az):
    """numpy's reading of the checks: finite prices > 0, finite sizes >= 0, bids not rising
    and asks not falling from level to level"""
    with np.errstate(invalid="ignore"):
        ok = np.ones(len(bp), bool)
        for x, strict in ((bp, True), (ap, True), (bs, False), (az, False)):
            ok &= np.isfinite(x).all(1) & ((x > 0) if strict else (x >= 0)).all(1)
        ok &= (bp[:, 1:] <= bp[:, :-1]).all(1) & (ap[:, 1:] >= ap[:, :-1]).all(1)
    return ok


@pytest.fixture(scope="module")
def books():
    bs = lob.generate_stream(400, 2, seed=21)
    return {s: np.array(getattr(bs, s), np.float64) for s in SIDES}


def _spoiled(books):
    """one row per (side, level, bad value), each a generated book with that one field bad,
    plus each side's levels i - 1 and i swapped (out of order where they differ)"""
    rows = {s: [] for s in SIDES}
    for side in SIDES:
        for level in range(10):
            for k, v in enumerate(BAD):
                for s in SIDES:
                    rows[s].append(books[s][(level * len(BAD) + k) % len(books[s])].copy())
                rows[side][-1][level] = v
            if level:
                for s in SIDES:
                    rows[s].append(books[s][level].copy())
                r = rows[side][-1]
                r[level - 1], r[level] = r[level], r[level - 1]
    return {s: np.array(v) for s, v in rows.items()}


def test_book_ok_matches_numpy_on_good_and_spoiled_books(isa, books):
    for case in (books, _spoiled(books)):
        args = [case[s] for s in SIDES]
        want = _ok_ref(*args)
        got = K.kernel_book_ok(isa, *args)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got, K.kernel_book_ok("scalar", *args))
    assert _ok_ref(*[books[s] for s in SIDES]).all()
    assert not _ok_ref(*[_spoiled(books)[s] for s in SIDES]).all()


def test_book_ok_equal_levels_and_extremes_pass(isa):
    """A flat book (every level at one price, zero sizes) and prices at the ends of the finite
    doubles pass: only the strict conditions (a price of 0, a level out of order) fail."""
    flat = [np.full((1, 10), v) for v in (100.0, 0.0, 100.0, 0.0)]
    assert K.kernel_book_ok(isa, *flat).all()
    wide = [np.full((1, 10), 5e-324), np.full((1, 10), 1.7976931348623157e308),
            np.full((1, 10), 1.7976931348623157e308), np.full((1, 10), 5e-324)]
    assert K.kernel_book_ok(isa, *wide).all()


def test_book_diff_matches_numpy(isa, books):
    rng = np.random.default_rng(7)
    n = 600
    x = [books[s][rng.integers(0, len(books[s]), n)] for s in SIDES]
    old = np.concatenate(x, axis=1).copy()
    # every row moves a random set of levels; some by nothing (-0.0 for 0.0 is no move)
    moved = rng.random((n, 40)) < 0.15
    old[moved] += rng.choice([0.01, -1.0, 1e-9, np.nan], size=moved.sum())
    old[:5] = np.concatenate(x, axis=1)[:5]
    x[1][5:10, :] = np.where(x[1][5:10, :] == 0, -0.0, x[1][5:10, :])
    cat = np.concatenate(x, axis=1)
    with np.errstate(invalid="ignore"):
        bits = (cat != old).astype(np.uint64)
    want = (bits << np.arange(40, dtype=np.uint64)).sum(axis=1, dtype=np.uint64)
    got = K.kernel_book_diff(isa, *x, old)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, K.kernel_book_diff("scalar", *x, old))
    assert (want[:5] == 0).all() and (want[5:] != 0).any()


def test_book_diff_each_bit_is_its_own_level(isa):
    """one moved field at a time sets exactly its bit, at every level of every array"""
    x = [np.tile(np.arange(10.0) + 1 + 10 * a, (40, 1)) for a in range(4)]
    old = np.tile(np.arange(40.0) + 1, (40, 1))
    for j in range(40):
        old[j, j] += 0.5
    np.testing.assert_array_equal(K.kernel_book_diff(isa, *x, old),
                                  np.uint64(1) << np.arange(40, dtype=np.uint64))


def test_book_kernel_shims_refuse_bad_shapes():
    with pytest.raises(InputError, match=r"bid_px must be float64 rows of 10 levels"):
        K.kernel_book_ok("scalar", np.zeros((2, 9)), *[np.zeros((2, 10))] * 3)
    with pytest.raises(InputError, match=r"old \(k, 40\)"):
        K.kernel_book_diff("scalar", *[np.zeros((2, 10))] * 4, np.zeros((2, 39)))


def _bits_equal(got, want, what):
    bad = np.argwhere(got.view(np.uint64) != want.view(np.uint64))
    assert not len(bad), f"{what}: {len(bad)} differ, first at {tuple(bad[0])}: " \
                         f"{got[tuple(bad[0])]!r} vs {want[tuple(bad[0])]!r}"


def test_book_prices_bit_exact_with_numpy(isa, books):
    bp, ap = books["bid_px"], books["ask_px"]
    for tick in (0.01, 0.25, 1e-8, 3.0):
        mid = 0.5 * (bp[0, 0] + ap[0, 0])
        got = K.kernel_book_prices(isa, bp, ap, mid, tick)
        want = np.full_like(got, np.nan)
        want[:, :10] = (bp - mid) / tick
        want[:, 10:20] = (ap - mid) / tick
        want[:, 60] = (ap[:, 0] - bp[:, 0]) / tick
        want[:, 84:93] = (bp[:, :-1] - bp[:, 1:]) / tick
        want[:, 93:102] = (ap[:, 1:] - ap[:, :-1]) / tick
        _bits_equal(got, want, f"{isa} tick {tick}")
        _bits_equal(got, K.kernel_book_prices("scalar", bp, ap, mid, tick), f"{isa} vs scalar")


def test_book_imbalance_bit_exact_with_numpy(isa, books):
    b, a = books["bid_sz"].copy(), books["ask_sz"].copy()
    # empty levels on one side, on both (0 and -0), and a cumulative depth's size of values
    b[:40:3, 2], a[:40:3, 2] = 0.0, 0.0
    b[1:40:3, 7], a[1:40:3, 7] = -0.0, 0.0
    a[2:40:3, 9] = 0.0
    b[40:80], a[40:80] = np.cumsum(b[40:80], axis=1), np.cumsum(a[40:80], axis=1)
    got = K.kernel_book_imbalance(isa, b, a)
    tot = b + a
    with np.errstate(invalid="ignore", divide="ignore"):
        want = np.where(tot > 0, (b - a) / tot, 0.0)
    _bits_equal(got, want, isa)
    _bits_equal(got, K.kernel_book_imbalance("scalar", b, a), f"{isa} vs scalar")
    assert (got[:40:3, 2].view(np.uint64) == 0).all() and (got[1:40:3, 7].view(np.uint64) == 0).all()
