"""The production kernel set: the catalog's rows (ffpa-attn for full layers, flash-attn-4 then
FlexAttention for sliding ones), each loaded from its module."""
from __future__ import annotations

from . import CATALOG, KernelSet, load, switched_off


def kernel_set(fa4: bool = True) -> KernelSet:
    """``fa4=False`` leaves flash-attn-4 unused, so sliding layers take FlexAttention
    (benchmarks and gpu tests compare the two this way)."""
    kernels = tuple(load(info) for info in CATALOG)
    if not fa4:
        kernels = tuple(switched_off(k, "flash-attn-4 switched off (kernel_set(fa4=False))") if k.info.package == "flash-attn-4"
                        else k for k in kernels)
    return KernelSet("cutedsl", kernels)
