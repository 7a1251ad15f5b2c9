"""fp32 reference attention with the kernels' semantics (the CPU test seam).

Bottom-right causal alignment (query r sees keys <= r + Nkv - Nq), native GQA,
optional sliding window; outputs are cast back to the input dtype.
"""
from __future__ import annotations

import torch


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, window: int | None = None) -> torch.Tensor:
    """Dense ``[B, S, H, D]`` causal attention in fp32."""
    n_q, n_k = q.shape[1], k.shape[1]
    i = torch.arange(n_q, device=q.device)[:, None] + (n_k - n_q)
    j = torch.arange(n_k, device=q.device)[None, :]
    allowed = j <= i
    if window is not None:
        allowed &= (i - j) < window
    return masked(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), allowed, scale)


def masked(q, k, v, allowed: torch.Tensor, scale: float) -> torch.Tensor:
    """``[B, H, S, D]`` q/k/v, a bool mask broadcastable to ``[B, H, Sq, Skv]`` -> ``[B, S, H, D]``.
    Rows that see no key give zeros (FlexAttention's convention)."""
    qf, kf, vf = (t.float() for t in (q, k, v))
    rep = qf.shape[1] // kf.shape[1]
    kf, vf = kf.repeat_interleave(rep, dim=1), vf.repeat_interleave(rep, dim=1)
    scores = ((qf @ kf.transpose(-1, -2)) * scale).masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return (probs @ vf).transpose(1, 2).to(q.dtype)


def flex(query, key, value, block_mask, scale: float) -> torch.Tensor:
    """What FlexAttention computes for ``block_mask``: its mask_mod evaluated at every position."""
    from torch.nn.attention.flex_attention import create_mask

    b, h, n_q, _ = query.shape
    allowed = create_mask(block_mask.mask_mod, b, h, n_q, key.shape[2], device=query.device)
    return masked(query, key, value, allowed, scale)


def varlen(q, k, v, cu_seqlens: torch.Tensor, scale: float, window: int | None = None) -> torch.Tensor:
    """Packed ``[T, H, D]`` causal attention, one sequence per cu_seqlens interval."""
    bounds = cu_seqlens.tolist()
    outs = [attention(q[None, a:b], k[None, a:b], v[None, a:b], scale, window)[0] for a, b in zip(bounds, bounds[1:])]
    return torch.cat(outs, dim=0)


class ReferenceKernels:
    """Drop-in for ``CuteKernels``: any device, any float dtype, any head_dim.

    ``fa4=False`` plays a machine without flash-attn-4, so sliding layers take FlexAttention.
    """

    name = "reference"

    def __init__(self, fa4: bool = True):
        self.fa4 = fa4

    def full_unsupported(self, device, dtype, head_dim):
        return None

    def sliding_unsupported(self, device, dtype, head_dim):
        return None if self.fa4 else "flash-attn-4 not installed (reference kernels, fa4=False)"

    def flex_unsupported(self, device, dtype, head_dim):
        return None

    def flex(self, query, key, value, block_mask, scale):
        return flex(query, key, value, block_mask, scale)

    def full_dense(self, q, k, v, scale):
        return attention(q, k, v, scale)

    def full_varlen(self, q, k, v, cu_seqlens, max_seqlen, scale):
        return varlen(q, k, v, cu_seqlens, scale)

    def sliding_dense(self, q, k, v, scale, window):
        return attention(q, k, v, scale, window)

    def sliding_varlen(self, q, k, v, cu_seqlens, max_seqlen, scale, window):
        return varlen(q, k, v, cu_seqlens, scale, window)
