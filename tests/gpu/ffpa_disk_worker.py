"""One process of test_ffpa_kernels_from_disk_match_a_fresh_compile_bit_for_bit:
FFPA dense and varlen forward+backward, outputs saved to argv[1], disk counts printed."""
import json
import sys

import torch

import ffpa_patch  # noqa: F401
from ffpa_patch.kernels import ffpa, ffpa_disk

assert ffpa.import_error() is None
torch.manual_seed(0)
results = {}
q, k, v = (torch.randn(2, 1024, h, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True) for h in (8, 1, 1))
out = ffpa.dense(q, k, v, 0.05)
out.backward(torch.randn_like(out))
results["dense"] = [out, q.grad, k.grad, v.grad]
flat = [t.detach().reshape(2048, *t.shape[2:]).requires_grad_() for t in (q, k, v)]
cu = torch.tensor([0, 700, 2048], device="cuda", dtype=torch.int32)
out = ffpa.varlen(*flat, cu, 1348, 0.05)
out.backward(torch.randn_like(out))
results["varlen"] = [out] + [t.grad for t in flat]
torch.save({name: [t.detach().cpu() for t in ts] for name, ts in results.items()}, sys.argv[1])
print(json.dumps(ffpa_disk.counts()))
