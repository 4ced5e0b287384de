"""Session 32 review of the serving loop: what a client can write into its own slots must not
reach the server's engine state, which every client shares.

- The worker stepped the engine on the request slot itself (fp_step(e, q->raw, ...)), and
  fp_step reads a tick twice: the features, whose pass checks that raw is finite, then the
  window commit, which stores raw's windowed fields into the symbol's rolling window. A client
  that changed its raw values after publishing them (a buggy C producer reusing its slot) had
  a value the check never saw committed: one NaN so committed made the engine refuse every
  later tick of that symbol, every client's, for good ("features overflowed to NaN/Inf").
  The worker now copies each request into its own buffer first and checks and steps the copy.
"""
import shutil
import subprocess

import numpy as np
import pytest

import fastpath
from fastpath import InputError
from test_serve import cfg, deadline, uname

# A client that, after publishing each request, flips one windowed raw field of it between
# NaN and 0 until the answer comes; after each tick served, an honest tick of the same symbol
# must still be served. Exit 3: the honest tick was refused (the symbol is poisoned).
C_FLIP_AFTER_PUBLISH = r"""
#include "fp_ring.h"
#include <math.h>
#include <stdlib.h>
static int wait_rep(fp_client *c, fp_rep *rep, volatile float *flip) {
    for (long i = 0;; i++) {
        if (flip) {
            flip[0] = NAN;
            flip[0] = 0.0f;
        }
        if (fp_client_poll(c, rep))
            return 0;
        if ((i & 0xfffff) == 0 && fp_seg_server_check(c->h, fp_ring_now_ns(), 2000000000LL))
            return -1;
    }
}
int main(int argc, char **argv) {
    fp_seg s;
    fp_client c;
    fp_rep rep;
    uint64_t seq;
    static float raw[1 << 12];
    long ok = 0, refused = 0, tries;
    int field;
    if (argc != 4 || fp_seg_attach(argv[1], &s) != FP_RING_OK || fp_client_open(&s, &c) != FP_RING_OK)
        return 2;
    field = atoi(argv[2]);
    tries = atol(argv[3]);
    for (long t = 0; t < tries; t++) {
        if (fp_client_try_submit(&c, raw, 1, -1, &seq) != FP_RING_OK)
            return 4;
        fp_req *r = fp_lay_req(&c.L, c.ctl, seq - 1);
        if (wait_rep(&c, &rep, (volatile float *)&r->raw[field]))
            return 5;
        r->raw[field] = 0.0f;
        if (rep.err) {
            refused++;          /* the worker saw the NaN: refused, nothing applied */
            continue;
        }
        ok++;
        if (fp_client_try_submit(&c, raw, 1, -1, &seq) != FP_RING_OK)
            return 4;
        if (wait_rep(&c, &rep, NULL))
            return 5;
        if (rep.err) {
            printf("poisoned after %ld tries (%ld served, %ld refused): honest tick error %d\n",
                   t + 1, ok, refused, (int)rep.err);
            return 3;
        }
    }
    printf("%ld served, %ld refused\n", ok, refused);
    fp_client_close(&c);
    return 0;
}
"""


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH")
def test_raw_changed_after_publishing_does_not_poison_the_symbol_for_other_clients(tmp_path):
    src, exe = tmp_path / "flip.c", tmp_path / "flip"
    src.write_text(C_FLIP_AFTER_PUBLISH)
    subprocess.run(["cc", "-std=c99", "-O2", "-Wall", "-Wextra", "-Werror",
                    f"-I{fastpath.get_include()}", str(src), "-o", str(exe), "-lm"], check=True,
                   timeout=60)
    name = uname()
    with fastpath.serve(name, None, cfg(ring_slots=4, max_clients=2)) as srv:
        field = int(srv._worker.model.feature_spec.w_idx[0])     # a windowed field: 40
        r = subprocess.run([str(exe), name, str(field), "20000"], capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
        # another client's honest ticks of that symbol are served, as by a fresh engine
        raw = np.zeros(256, np.float32)
        with deadline(60), fastpath.connect(name, timeout=5) as c:
            for _ in range(3):
                try:
                    c.step(raw, 1)
                except InputError as exc:     # pragma: no cover - the defect
                    pytest.fail(f"an honest tick of the attacked symbol was refused: {exc}")
