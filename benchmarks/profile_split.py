"""Where one training step's GPU time goes, from torch.profiler kernel names.

Kernels are classed by name; GEMMs cannot be told apart by name, so the
attention projections, the MLP and the LM head share "matmul" (in the 31B-shaped
slice the MLP holds ~80% of the matmul FLOPs: 3 x 5376 x 21504 per token and layer
against ~1.5 x 5376 x 8192 for q/k/v/o).
"""
from __future__ import annotations

import re
from collections import defaultdict

import torch

CLASSES = [  # first match wins
    ("full attention (FFPA)", r"ffpa|cute_fmha|_fwd_cute|_bwd_cute"),
    ("sliding attention (flash-attn-4)", r"flash|fmha|FlashAttention"),
    ("flex attention", r"triton_tem_fused|flex_attention|triton_.*flex"),
    ("sdpa attention", r"efficient_attention|fmha_cutlass|flash_fwd|flash_bwd|cudnn|attention"),
    ("matmul (projections, MLP, LM head)", r"gemm|nvjet|xmma|cutlass|sm90_|sm100_|ampere_|cublas"),
    ("optimizer (AdamW)", r"multi_tensor_apply|foreach|adam"),
    ("loss (softcap, log-softmax, NLL)", r"log_softmax|nll_loss|cross_entropy|tanh"),
    ("norms / rotary / elementwise", r"elementwise|vectorized|reduce|norm|unrolled|index|copy|cat|fill|triton_"),
]


def classify(name: str) -> str:
    for label, pattern in CLASSES:
        if re.search(pattern, name, re.IGNORECASE):
            return label
    return "other"


def profile_step(step) -> dict:
    """Run ``step()`` once under the profiler; GPU ms per class and per kernel."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    per_class, per_kernel = defaultdict(float), defaultdict(float)
    for evt in prof.events():
        if evt.device_type != torch.autograd.DeviceType.CUDA:
            continue
        ms = evt.device_time / 1e3 if hasattr(evt, "device_time") else evt.cuda_time / 1e3
        per_kernel[evt.name] += ms
        per_class[classify(evt.name)] += ms
    total = sum(per_class.values())
    ranked = sorted(per_kernel.items(), key=lambda kv: -kv[1])
    return {
        "total_gpu_ms": total,
        "split_ms": dict(sorted(per_class.items(), key=lambda kv: -kv[1])),
        "split_pct": {k: 100 * v / total for k, v in sorted(per_class.items(), key=lambda kv: -kv[1])},
        "kernels_ms": [{"kernel": k[:200], "ms": v, "class": classify(k)} for k, v in ranked],
    }
