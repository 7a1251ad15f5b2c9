"""The production kernel set: ffpa-attn (full layers), flash-attn-4, then FlexAttention (sliding layers)."""
from __future__ import annotations

from . import ALWAYS, FA4, FFPA, FLAG, FLEX, NEVER, Kernel, KernelSet, switched_off


def kernel_set(fa4: bool = True) -> KernelSet:
    """``fa4=False`` leaves flash-attn-4 unused, so sliding layers take FlexAttention
    (benchmarks and gpu tests compare the two this way)."""
    from . import fa4 as fa4_kernels
    from . import ffpa, flex

    sliding = Kernel(FA4, fa4_kernels.unsupported, dense=fa4_kernels.dense, varlen=fa4_kernels.varlen, repeatable=FLAG,
                     **_merging(fa4_kernels))
    if not fa4:
        sliding = switched_off(sliding, "flash-attn-4 switched off (kernel_set(fa4=False))")
    return KernelSet("cutedsl", (
        Kernel(FFPA, ffpa.unsupported, dense=ffpa.dense, varlen=ffpa.varlen, traceable=True, repeatable=ALWAYS,
               saved_ops=ffpa.forward_ops, **_merging(ffpa)),
        sliding,
        Kernel(FLEX, flex.unsupported, block=flex.attention, traceable=True, repeatable=NEVER),
    ))


def _merging(module) -> dict:
    """A kernel module's log-sum-exp entry points (image blocks, kernels/blocks.py)."""
    return {name: getattr(module, name) for name in ("dense_lse", "varlen_lse", "dense_bwd", "varlen_bwd")}
