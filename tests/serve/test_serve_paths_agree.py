"""The serving client answers bit for bit as Engine.step of the same model and config, and its
counters and latency records survive stop()."""


import numpy as np
import pytest

import fastpath
from fastpath import Engine, InputError
from helpers.paths import (assert_same, cfg, F, good_rows, make_model, make_stream, N_SYM, outcome,
                           run_ticks, SERVE, unique_name)


@pytest.mark.parametrize("kind", ["acts", "deep16", "w17", "clf3_softmax", "clf2_logistic2",
                                  "regression", "int8", "trees_clf3"])
@pytest.mark.parametrize("with_ts", [True, False])
def test_served_answers_equal_in_process_step(kind, with_ts):
    m = make_model(kind)
    raws, syms, ts, bad = make_stream(4)
    # finite ticks the server's engine refuses (features overflow): its state stays as is
    raws[[20, 41, 77]] = F(3.4e38)
    bad[[20, 41, 77]] = True
    t = ts if with_ts else None
    c = {"engine": {"n_symbols": 2 * N_SYM}, "serve": SERVE}
    eng = Engine(m, config=c)
    want = run_ticks(eng.step, raws, syms, t)
    name = unique_name()
    with fastpath.serve(name, m, c) as srv, fastpath.connect(name) as cl:
        got = run_ticks(cl.step, raws, syms, t)
        # submit / poll: the same answers in order
        cl2 = fastpath.connect(name)
        seqs = []
        with pytest.raises(InputError):
            cl2.submit(raws[8], 0)          # a NaN: refused before it is sent
        R, S, T = good_rows(raws, syms, ts, bad)
        for i in range(len(R)):
            seqs.append(cl2.submit(R[i], int(S[i]) + N_SYM,
                                   None if t is None else int(T[i])))
        polled = []
        while len(polled) < len(seqs):
            polled += cl2.poll()
        cl2.close()
        st = srv.stats()
    assert_same(got, want, "served step")
    assert [s for s, _ in polled] == seqs
    # symbols shifted by N_SYM: the same stream on fresh slots answers the same
    assert_same([outcome(r) for _, r in polled], [o for o in want if o != "refused"],
                "served submit/poll")
    assert st["served"] == 2 * int((~bad).sum()) + 3 and st["errors"] == 3


@pytest.mark.parametrize("t", [np.int64(2), np.float32(0.5), np.float64(1.0)])
def test_connect_takes_numpy_numbers_of_seconds(t):
    """Defect guarded: fastpath.connect refused a numpy number of seconds in range with "timeout
    must be a number of seconds in [0, 3600], got 2"."""
    m = make_model("w3")
    name = unique_name()
    raw = make_stream(17, n=1, nan_every=0)[0][0]
    with fastpath.serve(name, m, {"engine": {"n_symbols": 4}, "serve": SERVE}):
        with fastpath.connect(name, timeout=t, stall_timeout=t) as c:
            assert c.stall_timeout == pytest.approx(float(t))
            assert outcome(c.step(raw, 1, 5)) == outcome(Engine(m, config=cfg()).step(raw, 1, 5))
    for bad in (np.bool_(True), True, np.float64("nan"), np.int64(3601)):
        with pytest.raises(InputError, match="timeout must be a number of seconds"):
            fastpath.connect(name, timeout=bad)


def test_server_counters_and_records_after_stop():
    """Defect guarded: Server.stats() and latency_records() after stop() raised AttributeError;
    they answer the figures the stop left, and a second stop is a no-op."""
    m = make_model("w3")
    raws, syms, ts, bad = make_stream(20, n=30, nan_every=0)
    name = unique_name()
    srv = fastpath.serve(name, m, {"engine": {"n_symbols": 8}, "serve": SERVE})
    with fastpath.connect(name) as c:
        run_ticks(c.step, raws, syms, ts)
    live = srv.latency_records()
    srv.stop()
    st = srv.stats()
    assert st["served"] == 30 == srv.final_stats["served"] and st["errors"] == 0
    st["served"] = -1                   # a copy: final_stats stays as the stop left it
    assert srv.stats()["served"] == 30
    lat = srv.latency_records()
    assert lat.shape == (30, 5) and np.array_equal(lat, live)
    srv.stop()                          # a second stop is a no-op
    assert srv.stats()["served"] == 30
