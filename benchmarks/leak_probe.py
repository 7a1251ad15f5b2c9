"""What stays allocated on the GPU after one patched e2e run (the +5.5 GiB of a second model).

python benchmarks/leak_probe.py  -> GiB still allocated, and the largest live CUDA tensors
with their first referrers (on the H200: 6.1 GiB, the dead model's MLP weights).
"""
import gc
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import e2e  # noqa: E402


def main():
    e2e.run("sdpa-dropin", 4096, 6, 2, 1, False, None)
    gc.collect()
    torch.cuda.synchronize()
    print("allocated after the run: %.2f GiB" % (torch.cuda.memory_allocated() / 2**30))
    live = sorted((o for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.is_cuda),
                  key=lambda t: -t.untyped_storage().nbytes())
    for t in live[:8]:
        owners = [type(r).__name__ for r in gc.get_referrers(t)[:4]]
        print(tuple(t.shape), t.dtype, t.untyped_storage().nbytes() >> 20, "MiB, referrers:", owners)


if __name__ == "__main__":
    main()
