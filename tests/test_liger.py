"""liger-kernel's Gemma4 patches and ffpa_patch together, on CPU: patch state only.

Liger's norms and MLP are Triton kernels, which need a GPU, so the training step is the
GPU test's (tests/gpu/test_gpu.py); here each order runs in its own process (liger has no
revert) through the same worker, without the step."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("liger_kernel.transformers")

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu", "liger_worker.py")


@pytest.mark.parametrize("order", ["liger-first", "ffpa-first"])
def test_liger_and_ffpa_patch_keep_each_others_patches_and_revert_takes_back_only_ffpas(order):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    done = subprocess.run([sys.executable, WORKER, order, "cpu"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert {"ffpa_backend", "gemma4_dropin"} <= set(got["applied_with_liger"])
    assert got["dropin_mapping_with_liger"]  # the drop-in's routing mapping is in place beside liger's classes
    assert got["norms"] and all(n.startswith("Liger") for n in got["norms"])
    assert got["mlps"] and all(m.startswith("Liger") for m in got["mlps"])
    assert got["mapping_restored"] and not got["ffpa_registered_after_revert"] and got["liger_kept_after_revert"]
