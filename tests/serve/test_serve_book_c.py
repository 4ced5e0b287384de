"""C producers of book updates, compiled here with cc against fastpath/include/fp_ring.h: a feed
handler's book updates (tests/c/book_client.c) answered as an in-process Engine.step_book
answers them, refusals carried as code, field and level; a request kind the worker does not
know refused; and a client of another segment version refusing the segment."""
import os
import shutil
import struct
import subprocess

import numpy as np
import pytest

import fastpath
from fastpath import InputError, ServeError, lob
from fastpath._build import DEMO_MODEL
from helpers.book_serving import ANSWER, counted, local_engine, tick_sizes, write_updates
from helpers.serving import TESTS_DIR, cfg, compile_producer, uname

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH")

HEADER = os.path.join(fastpath.get_include(), "fp_ring.h")
# fp_rep error codes and fp_ring.h's FP_REP_BOOK_* refusals
REP_ERR_PARAM, REP_ERR_BOOK, REP_ERR_BAD_REQUEST = -6, -9, -100
BOOK_PRICE, BOOK_CROSSED, BOOK_NOTICK = 1, 4, 7
ASK_PX = 2
VERSION_OFF = 8                 # fp_seg_header.version (u32 after the u64 magic)


def _cc(tmp_path, src, name, include=None):
    return compile_producer(str(tmp_path), name, src, include=include)


def _run_book_client(tmp_path, name, bs):
    exe = _cc(tmp_path, os.path.join(TESTS_DIR, "c", "book_client.c"), "book_client")
    write_updates(tmp_path / "in.bin", bs)
    out = subprocess.run([str(exe), name, "check", str(tmp_path / "in.bin"), str(len(bs)),
                          str(tmp_path / "out.bin")], timeout=120, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return np.fromfile(tmp_path / "out.bin", ANSWER)


def test_c_feed_handler_book_updates_match_in_process(tmp_path):
    bs = lob.generate_stream(1_500, 3, seed=21)
    # two bad updates on the way: a crossed book, and a NaN at ask level 7
    cross, nan = 400, 900
    bs.bid_px[cross] += bs.ask_px[cross, 0] - bs.bid_px[cross, 0] + 0.01
    bs.ask_px[nan, 6] = np.nan
    ticks = tick_sizes(bs)
    eng = local_engine(fastpath.simd(), ticks)
    want = []
    for i in range(len(bs)):
        try:
            r = eng.step_book(int(bs.symbols[i]), bs.bid_px[i], bs.bid_sz[i], bs.ask_px[i],
                              bs.ask_sz[i], int(bs.ts_ns[i]), float(bs.trade_vol[i]),
                              int(bs.trade_cnt[i]), float(bs.last_trade_sz[i]))
            want.append((r.signal, r.confidence, 0, int(r.cached)))
        except InputError:
            want.append((0.0, 0.0, REP_ERR_BOOK, 0))
    name = uname()
    with fastpath.serve(name, DEMO_MODEL, cfg(), tick_sizes=ticks) as srv:
        got = _run_book_client(tmp_path, name, bs)
        st = counted(srv, len(bs), 2)
    assert st["served"] == len(bs) and st["errors"] == 2
    want = np.array(want)
    np.testing.assert_array_equal(got["signal"], want[:, 0].astype(np.float32))
    np.testing.assert_array_equal(got["confidence"], want[:, 1].astype(np.float32))
    np.testing.assert_array_equal(got["err"], want[:, 2])
    np.testing.assert_array_equal(got["cached"], want[:, 3])
    assert (got["reason"][cross], got["aux"][cross]) == (BOOK_CROSSED, 0)
    assert (got["reason"][nan], got["aux"][nan]) == (BOOK_PRICE, ASK_PX * 256 + 6)
    ok = got["err"] == 0
    # an answered update's aux is its book stage in ns (saturated at 65534)
    assert (got["aux"][ok] <= 65534).all() and (got["reason"][~ok] > 0).all()


def test_c_book_update_for_a_symbol_without_tick_size_refused(tmp_path):
    bs = lob.generate_stream(50, 1, seed=3)
    name = uname()
    with fastpath.serve(name, DEMO_MODEL, cfg(), tick_sizes={1: 0.01}) as srv:
        got = _run_book_client(tmp_path, name, bs)
        assert counted(srv, len(bs), len(bs))["errors"] == len(bs)
    assert (got["err"] == REP_ERR_BOOK).all() and (got["reason"] == BOOK_NOTICK).all()


def test_c_book_update_to_a_model_over_another_vector_refused(tmp_path, model):
    """A book request reaches a server whose model reads 40 raw values: refused (FP_REP_ERR_PARAM),
    its slot big enough for the update whatever raw_len is."""
    bs = lob.generate_stream(20, 1, seed=3)
    name = uname()
    with fastpath.serve(name, model, cfg(), tick_sizes={0: 0.01}) as srv:
        got = _run_book_client(tmp_path, name, bs)
        with open(srv.path, "rb") as f:
            head = f.read(64)
    # fp_seg_header: raw_len (u32 at 16), req_slot_bytes (u32 at 32)
    (raw_len,), (req_slot,) = struct.unpack_from("<I", head, 16), struct.unpack_from("<I", head, 32)
    assert raw_len == model.raw_len < 80
    assert req_slot == 64 + 320             # the header line, then 4 x 10 doubles
    assert (got["err"] == REP_ERR_PARAM).all()


C_UNKNOWN_KIND = r"""
#include "fp_ring.h"
int main(int argc, char **argv) {
    fp_seg s;
    fp_client c;
    fp_rep rep;
    static float raw[1 << 12];
    uint64_t seq;
    (void)argc;
    if (fp_seg_attach(argv[1], &s) != FP_RING_OK || fp_client_open(&s, &c) != FP_RING_OK)
        return 3;
    fp_req *r;
    if (fp_client_next_slot(&c, &r) != FP_RING_OK)
        return 4;
    fp_client_publish(&c, r, 7, 0, -1, &seq);         /* a kind no worker knows */
    while (!fp_client_poll(&c, &rep)) {}
    printf("%d\n", rep.err);
    if (fp_client_try_submit(&c, raw, 0, -1, &seq) != FP_RING_OK)
        return 4;
    while (!fp_client_poll(&c, &rep)) {}
    printf("%d\n", rep.err);
    fp_client_close(&c);
    fp_seg_detach(&s);
    return 0;
}
"""


def test_unknown_request_kind_refused_and_the_ring_serves_on(tmp_path):
    src = tmp_path / "kind.c"
    src.write_text(C_UNKNOWN_KIND)
    exe = _cc(tmp_path, src, "kind")
    name = uname()
    with fastpath.serve(name, DEMO_MODEL, cfg()) as srv:
        out = subprocess.run([str(exe), name], capture_output=True, text=True, timeout=60)
        assert counted(srv, 2, 1)["errors"] == 1
    assert out.returncode == 0 and out.stdout.split() == [str(REP_ERR_BAD_REQUEST), "0"]


C_ATTACH = r"""
#include "fp_ring.h"
int main(int argc, char **argv) {
    fp_seg s;
    (void)argc;
    int rc = fp_seg_attach(argv[1], &s);
    printf("%d %u\n", rc, (unsigned)FP_SEG_VERSION);
    if (rc == FP_RING_OK)
        fp_seg_detach(&s);
    return 0;
}
"""


def test_client_of_the_previous_version_refuses_the_segment(tmp_path):
    """A C client built against the fp_ring.h before request kinds (version 2) does not
    attach to a segment of this version (its requests would carry no kind); one built
    against this header does."""
    old = tmp_path / "old"
    old.mkdir()
    text = open(HEADER).read()
    assert "#define FP_SEG_VERSION 3u" in text
    (old / "fp_ring.h").write_text(text.replace("#define FP_SEG_VERSION 3u",
                                                "#define FP_SEG_VERSION 2u"))
    src = tmp_path / "attach.c"
    src.write_text(C_ATTACH)
    exe_old, exe_new = _cc(tmp_path, src, "attach_old", old), _cc(tmp_path, src, "attach_new")
    name = uname()
    with fastpath.serve(name, DEMO_MODEL, cfg()):
        got_old = subprocess.run([str(exe_old), name], capture_output=True, text=True,
                                 timeout=60).stdout.split()
        got_new = subprocess.run([str(exe_new), name], capture_output=True, text=True,
                                 timeout=60).stdout.split()
    assert got_old == ["-3", "2"]           # FP_RING_ERR_MAGIC: not this version
    assert got_new == ["0", "3"]


def test_python_client_refuses_a_segment_of_another_version():
    name = uname()
    with fastpath.serve(name, DEMO_MODEL, cfg()) as srv:
        with open(srv.path, "r+b") as f:
            f.seek(VERSION_OFF)
            f.write(struct.pack("<I", 2))
            f.flush()
            try:
                with pytest.raises(ServeError, match=r"segment version 2; this fastpath "
                                                     r"speaks version 3"):
                    fastpath.connect(name, timeout=0.05)
            finally:
                f.seek(VERSION_OFF)
                f.write(struct.pack("<I", 3))
