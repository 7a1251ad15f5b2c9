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

CLASSES = [  # first match wins; names as seen on the H200 (torch 2.11, cuDNN, CuTeDSL, Triton)
    ("full attention (FFPA)", r"ffpa"),
    ("sliding attention (flash-attn-4)", r"flash_attncute|FlashAttention\w*Sm\d+"),
    ("flex attention", r"flex_attention"),
    ("sdpa attention", r"native_sdpa|fmha_cutlass|PyTorchMemEffAttention|pytorch_flash|efficient_attention"),
    ("matmul (projections, MLP, LM head)", r"gemm|nvjet|xmma|cublas"),
    ("optimizer (AdamW)", r"multi_tensor_apply|adam"),
    ("loss (log-softmax, NLL)", r"log_softmax|nll_loss|cross_entropy"),
    ("norms / rotary / softcap / elementwise", r"elementwise|vectorized|reduce|norm|index|copy|cat|fill|triton_"),
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
    return from_profiler(prof)


def from_profiler(prof) -> dict:
    """GPU ms per class and per kernel of a finished ``torch.profiler.profile``; with CPU
    activity also the host side: self ms and calls per op and CUDA runtime call (the
    profiler slows the host: compare these with each other, not with an unprofiled step)."""
    per_kernel = defaultdict(float)
    ops = defaultdict(lambda: [0, 0.0])
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            per_kernel[evt.name] += evt.device_time / 1e3 if hasattr(evt, "device_time") else evt.cuda_time / 1e3
        else:
            entry = ops[re.sub(r" at 0x[0-9a-f]+", "", evt.name)[:120]]
            entry[0] += 1
            entry[1] += evt.self_cpu_time_total / 1e3
    ranked = sorted(per_kernel.items(), key=lambda kv: -kv[1])
    kernels = [{"kernel": k[:200], "ms": v} for k, v in ranked]
    host = {"host_ops_self_ms": [{"op": k, "calls": n, "ms": round(t, 3)}
                                 for k, (n, t) in sorted(ops.items(), key=lambda kv: -kv[1][1])[:60]]} if ops else {}
    return {**split(kernels), "kernels_ms": kernels, **host}


def split(kernels: list[dict]) -> dict:
    """GPU ms and % per class from ``[{"kernel": name, "ms": t}, ...]`` (also re-run by report.py)."""
    per_class = defaultdict(float)
    for k in kernels:
        per_class[classify(k["kernel"])] += k["ms"]
    total = sum(per_class.values())
    ordered = sorted(per_class.items(), key=lambda kv: -kv[1])
    return {"total_gpu_ms": total, "split_ms": dict(ordered), "split_pct": {c: 100 * v / total for c, v in ordered}}
