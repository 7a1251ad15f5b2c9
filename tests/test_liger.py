"""liger-kernel's Gemma4 patches and ffpa_patch together, on CPU: patch state only.

Liger's norms and MLP are Triton kernels, which need a GPU, so the training step is the
GPU test's (tests/gpu/test_gpu.py); here each order runs in its own process (liger has no
revert) through the same worker, without the step."""
import os
import sys

import pytest

pytest.importorskip("liger_kernel.transformers")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu"))
from liger_worker import run  # noqa: E402


@pytest.mark.parametrize("order", ["liger-first", "ffpa-first"])
def test_liger_and_ffpa_patch_keep_each_others_patches_and_revert_takes_back_only_ffpas(order):
    got = run(order, "cpu")
    assert {"ffpa_backend", "gemma4_dropin"} <= set(got["applied_with_liger"])
    assert got["dropin_mapping_with_liger"]  # the drop-in's routing mapping is in place beside liger's classes
    assert got["norms"] and all(n.startswith("Liger") for n in got["norms"])
    assert got["mlps"] and all(m.startswith("Liger") for m in got["mlps"])
    assert got["mapping_restored"] and not got["ffpa_registered_after_revert"] and got["liger_kept_after_revert"]
