"""fp32 reference attention with the kernels' semantics and refusals (the CPU test seam).

Bottom-right causal alignment (query r sees keys <= r + Nkv - Nq), native GQA,
optional sliding window; outputs are cast back to the input dtype.
"""
from __future__ import annotations

import torch

from ..routing.precision import LOW_PRECISION


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
    with torch.autocast(q.device.type, enabled=False):  # a kernel's arithmetic ignores autocast
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


HALF = LOW_PRECISION  # what FFPA and flash-attn-4 take


def _refuse(q, k, v, cu_seqlens=None, dtypes=HALF) -> None:
    """Raise where the CuTeDSL kernels would: q/k/v of one half dtype, the head dim contiguous,
    int32 cu_seqlens. A CPU test must never pass a call the GPU would reject."""
    allowed, dtypes = dtypes, {t.dtype for t in (q, k, v)}
    if len(dtypes) != 1 or not dtypes <= set(allowed):
        raise TypeError(f"reference kernels (as FFPA / flash-attn-4): q/k/v must share fp16/bf16, got {dtypes}")
    if any(t.stride(-1) != 1 for t in (q, k, v)):
        raise ValueError("reference kernels (as FFPA / flash-attn-4): the head dim must be contiguous")
    if cu_seqlens is not None and cu_seqlens.dtype != torch.int32:
        raise TypeError(f"reference kernels (as FFPA / flash-attn-4): cu_seqlens must be int32, got {cu_seqlens.dtype}")


class ReferenceKernels:
    """Drop-in for ``CuteKernels`` on any device, refusing what they refuse.

    Full layers take what FFPA takes on sm90 (fp16/bf16, 320 <= head_dim <= 512),
    sliding layers what flash-attn-4 takes (fp16/bf16, head_dim <= 256), FlexAttention
    fp16/bf16/fp32; the device is the one thing not checked (CPU is the point).
    ``fa4=False`` plays a machine without flash-attn-4, so sliding layers take FlexAttention.
    ``fp32=True`` also takes fp32 q/k/v (and only that): whole-model tests compare an fp32
    model against fp32 eager to 1e-4, which half precision cannot (bf16 logits of the tiny
    test models are ~1% off fp32). Everything that tests which dtype routes where uses
    the default, which refuses fp32 as the GPU does.
    """

    name = "reference"

    def __init__(self, fa4: bool = True, fp32: bool = False):
        self.fa4 = fa4
        self.dtypes = (*HALF, torch.float32) if fp32 else HALF

    def full_unsupported(self, device, dtype, head_dim):
        if dtype not in self.dtypes:
            return f"dtype {dtype} (FFPA needs fp16/bf16)"
        if not 320 <= head_dim <= 512:
            return f"head_dim {head_dim} not in 320..512 on sm90"
        return None

    def sliding_unsupported(self, device, dtype, head_dim):
        if not self.fa4:
            return "flash-attn-4 not installed (reference kernels, fa4=False)"
        if dtype not in self.dtypes:
            return f"dtype {dtype} (flash-attn-4 needs fp16/bf16)"
        if head_dim > 256:
            return f"head_dim {head_dim} > 256"
        return None

    def flex_unsupported(self, device, dtype, head_dim):
        if dtype not in (*HALF, torch.float32):
            return f"dtype {dtype}"
        return None

    def flex(self, query, key, value, block_mask, scale):
        if len({query.dtype, key.dtype, value.dtype}) != 1:
            raise TypeError("reference FlexAttention: q/k/v must share one dtype")
        return flex(query, key, value, block_mask, scale)

    def full_dense(self, q, k, v, scale):
        _refuse(q, k, v, dtypes=self.dtypes)
        return attention(q, k, v, scale)

    def full_varlen(self, q, k, v, cu_seqlens, max_seqlen, scale):
        _refuse(q, k, v, cu_seqlens, dtypes=self.dtypes)
        return varlen(q, k, v, cu_seqlens, scale)

    def sliding_dense(self, q, k, v, scale, window):
        _refuse(q, k, v, dtypes=self.dtypes)
        return attention(q, k, v, scale, window)

    def sliding_varlen(self, q, k, v, cu_seqlens, max_seqlen, scale, window):
        _refuse(q, k, v, cu_seqlens, dtypes=self.dtypes)
        return varlen(q, k, v, cu_seqlens, scale, window)
