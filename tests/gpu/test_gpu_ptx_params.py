"""Each kernel's PTX .entry parameter list (nvcc -ptx of csrc/cuda/fp_mlp.cu) matches the
pycuda prepare() format the backend launches it with: count and size of every argument.
A launch packing the wrong argument count or sizes is undefined on a device."""
import os

import pytest

from helpers import ptx_params as X
from helpers.cuda_emu import CSRC, CU

BACKEND = os.path.join(os.path.dirname(CSRC), "fastpath", "gpu", "_backend.py")

PTX_SAMPLE = """
.visible .entry k2(
\t.param .u64 k2_param_0,
\t.param .u64 .ptr .global .align 4 k2_param_1,
\t.param .align 8 .b8 k2_param_2[16]
)
"""


@pytest.mark.skipif(X.nvcc() is None, reason="nvcc not installed")
def test_ptx_entries_match_the_backends_prepare_formats():
    sizes = X.entry_params(X.ptx(CU, CSRC))
    formats = X.prepare_formats(open(BACKEND).read())
    assert {"fp_mlp_batch", "fp_mlp_persistent"} <= set(sizes)
    assert {"fp_mlp_batch", "fp_mlp_persistent"} <= set(formats)
    assert X.mismatches(sizes, formats) == []


def test_the_check_reports_a_count_or_size_that_disagrees():
    sizes = X.entry_params(PTX_SAMPLE)
    assert sizes == {"k2": [8, 8, 16]}
    assert X.mismatches({"k": [8, 8, 4, 4, 8]}, {"k": "PPiiP"}) == []
    assert X.mismatches({"k": [8, 8, 4, 4, 8]}, {"k": "PPiP"})        # one argument missing
    assert X.mismatches({"k": [8, 8, 4, 4, 8]}, {"k": "PPPiP"})       # a pointer for an int
    assert X.mismatches({}, {"k": "P"})                               # no such kernel


def test_prepare_formats_pairs_each_kernel_with_its_format():
    src = ('class A:\n    def __init__(self, m):\n        self.f = m.get_function("k1")\n'
           '        self.f.prepare("PPiiP")\n'
           'class B:\n    def __init__(self, m):\n        self.f = m.get_function("k2")\n'
           '        self.f.prepare("P" * 10)\n')
    assert X.prepare_formats(src) == {"k1": "PPiiP", "k2": "P" * 10}
