"""The production kernels: ffpa-attn (full layers), flash-attn-4 (sliding layers), FlexAttention."""
from __future__ import annotations

from . import fa4, ffpa, flex


class CuteKernels:
    """``fa4=False`` leaves flash-attn-4 unused, so sliding layers take FlexAttention
    (benchmarks and gpu tests compare the two through the seam)."""

    name = "cutedsl"

    def __init__(self, fa4: bool = True):
        self.fa4 = fa4

    def full_unsupported(self, device, dtype, head_dim):
        return ffpa.unsupported(device, dtype, head_dim)

    def full_dense(self, q, k, v, scale):
        return ffpa.dense(q, k, v, scale)

    def full_varlen(self, q, k, v, cu_seqlens, max_seqlen, scale):
        return ffpa.varlen(q, k, v, cu_seqlens, max_seqlen, scale)

    def sliding_unsupported(self, device, dtype, head_dim):
        if not self.fa4:
            return "flash-attn-4 switched off (CuteKernels(fa4=False))"
        return fa4.unsupported(device, dtype, head_dim)

    def sliding_dense(self, q, k, v, scale, window):
        return fa4.dense(q, k, v, scale, window)

    def sliding_varlen(self, q, k, v, cu_seqlens, max_seqlen, scale, window):
        return fa4.varlen(q, k, v, cu_seqlens, max_seqlen, scale, window)

    def flex_unsupported(self, device, dtype, head_dim):
        return flex.unsupported(device, dtype, head_dim)

    def flex(self, query, key, value, block_mask, scale):
        return flex.attention(query, key, value, block_mask, scale)
