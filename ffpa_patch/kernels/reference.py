"""fp32 reference attention with the kernels' semantics (the CPU test seam).

Bottom-right causal alignment (query r sees keys <= r + Nkv - Nq), native GQA,
optional sliding window; outputs are cast back to the input dtype.
"""
from __future__ import annotations

import torch


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, window: int | None = None) -> torch.Tensor:
    """Dense ``[B, S, H, D]`` causal attention in fp32."""
    qf, kf, vf = (t.float().transpose(1, 2) for t in (q, k, v))
    rep = qf.shape[1] // kf.shape[1]
    kf, vf = kf.repeat_interleave(rep, dim=1), vf.repeat_interleave(rep, dim=1)
    n_q, n_k = qf.shape[2], kf.shape[2]
    i = torch.arange(n_q, device=q.device)[:, None] + (n_k - n_q)
    j = torch.arange(n_k, device=q.device)[None, :]
    allowed = j <= i
    if window is not None:
        allowed &= (i - j) < window
    scores = (qf @ kf.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~allowed, float("-inf"))
    out = torch.softmax(scores, dim=-1) @ vf
    return out.transpose(1, 2).to(q.dtype)


def varlen(q, k, v, cu_seqlens: torch.Tensor, scale: float, window: int | None = None) -> torch.Tensor:
    """Packed ``[T, H, D]`` causal attention, one sequence per cu_seqlens interval."""
    bounds = cu_seqlens.tolist()
    outs = [attention(q[None, a:b], k[None, a:b], v[None, a:b], scale, window)[0] for a, b in zip(bounds, bounds[1:])]
    return torch.cat(outs, dim=0)


class ReferenceKernels:
    """Drop-in for ``CuteKernels``: any device, any float dtype, any head_dim."""

    name = "reference"

    def full_unsupported(self, device, dtype, head_dim):
        return None

    def sliding_unsupported(self, device, dtype, head_dim):
        return None

    def full_dense(self, q, k, v, scale):
        return attention(q, k, v, scale)

    def full_varlen(self, q, k, v, cu_seqlens, max_seqlen, scale):
        return varlen(q, k, v, cu_seqlens, scale)

    def sliding_dense(self, q, k, v, scale, window):
        return attention(q, k, v, scale, window)

    def sliding_varlen(self, q, k, v, cu_seqlens, max_seqlen, scale, window):
        return varlen(q, k, v, cu_seqlens, scale, window)
