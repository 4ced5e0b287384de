"""The cosine threshold's 2^-50 slack (an exact repeat hits at threshold 1) is applied by the C
plan, so Python callers and C callers of the cache decide alike."""

import os
import shutil
import subprocess

import numpy as np
import pytest

from fastpath import _kernels as K


F32 = np.float32


@pytest.mark.parametrize("t", [1.0, -1.0])
def test_cos_threshold_slack_is_the_plans(isa, t):
    """Defect guarded: the 2^-50 slack that lets an exact repeat (cosine exactly 1; at -1 a
    key's opposite) pass a threshold of +-1 was applied only by the Python side, so the kernel
    entry point given the threshold as is missed one exact repeat in four; the plan slackens it."""
    rng = np.random.default_rng(5)
    misses = 0
    for _ in range(64):
        c = rng.standard_normal(24).astype(F32)
        f = c if t > 0 else -c
        misses += K.kernel_cache_decide(isa, f, c, t, 1e-6 if t > 0 else 1.0) != "hit"
    assert misses == 0


_PLAN_C = r"""
#include <stdio.h>
#include "fp_cache.h"
int main(void) {
    const double ts[] = {1.0, -1.0, 0.999999, 0.5, 0.0};
    for (int i = 0; i < 5; i++) {
        fp_cache_policy p = {0};
        p.cos_threshold = ts[i];
        p.norm_tol = 0.01;
        p.enabled = 1;
        fp_cache_plan pl;
        fp_cache_plan_init(&pl, &p, 24);
        printf("%a\n", pl.pol.cos_threshold);
    }
    return 0;
}
"""


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH")
def test_the_c_plan_holds_the_slackened_threshold(tmp_path):
    """A C caller of the cache (fp_cache_plan_init, fp_cache_lookup) gets the slack from the
    plan itself: the threshold the double path decides on is t - |t| 2^-50."""
    csrc = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "csrc")
    if not os.path.exists(os.path.join(csrc, "fp_cache.h")):
        pytest.skip("no csrc/ beside the tests")
    src = tmp_path / "plan.c"
    src.write_text(_PLAN_C)
    exe = tmp_path / "plan"
    subprocess.run(["cc", "-std=c99", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{csrc}",
                    f"-I{os.path.join(csrc, 'kernels')}", str(src), "-o", str(exe), "-lm"],
                   check=True, timeout=120)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True, timeout=30)
    got = [float.fromhex(v) for v in out.stdout.split()]
    want = [t - abs(t) * 2.0 ** -50 for t in (1.0, -1.0, 0.999999, 0.5, 0.0)]
    assert got == want
