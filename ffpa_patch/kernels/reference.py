"""fp32 reference attention with the kernels' semantics and refusals (the CPU test seam).

Bottom-right causal alignment (query r sees keys <= r + Nkv - Nq), native GQA,
optional sliding window; outputs are cast back to the input dtype.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from . import ALWAYS, FA4, FFPA, FLAG, FLEX, NEVER, Kernel, KernelSet, switched_off


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


def flex(query, key, value, layout, scale: float, window: int | None) -> torch.Tensor:
    """What FlexAttention computes for ``layout``: the BlockMask the real kernel would build
    (kernels/flex.py), its mask_mod evaluated at every position."""
    from torch.nn.attention.flex_attention import create_mask

    from . import flex as flex_kernel

    b, h, n_q, _ = query.shape
    block_mask = flex_kernel.block_mask(layout, b, n_q, key.shape[2], window, query.device)
    allowed = create_mask(block_mask.mask_mod, b, h, n_q, key.shape[2], device=query.device)
    return masked(query, key, value, allowed, scale)


def varlen(q, k, v, cu_seqlens: torch.Tensor, scale: float, window: int | None = None) -> torch.Tensor:
    """Packed ``[T, H, D]`` causal attention, one sequence per cu_seqlens interval."""
    bounds = cu_seqlens.tolist()
    outs = [attention(q[None, a:b], k[None, a:b], v[None, a:b], scale, window)[0] for a, b in zip(bounds, bounds[1:])]
    return torch.cat(outs, dim=0)


HALF = (torch.float16, torch.bfloat16)  # what FFPA and flash-attn-4 take


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


@dataclass(frozen=True)
class ReferenceSet(KernelSet):
    """A KernelSet whose kernels also record each call: (kernel, entry point, deterministic)."""

    calls: list = field(default_factory=list, compare=False)


def kernel_set(fa4: bool = True, fp32: bool = False, rename: dict | None = None) -> ReferenceSet:
    """Drop-in for ``cute.kernel_set()`` on any device, refusing what its kernels refuse.

    Full layers take what FFPA takes on sm90 (fp16/bf16, 320 <= head_dim <= 512),
    sliding layers what flash-attn-4 takes (fp16/bf16, head_dim <= 256), FlexAttention
    fp16/bf16/fp32; the device is the one thing not checked (CPU is the point). Each
    declares the same traceability and backward repeatability as the kernel it stands for.
    ``fa4=False`` plays a machine without flash-attn-4, so sliding layers take FlexAttention.
    ``fp32=True`` also takes fp32 q/k/v (and only that): whole-model tests compare an fp32
    model against fp32 eager to 1e-4, which half precision cannot (bf16 logits of the tiny
    test models are ~1% off fp32). Everything that tests which dtype routes where uses
    the default, which refuses fp32 as the GPU does. ``rename`` (e.g. ``{"ffpa": "full512"}``)
    gives kernels other names: routing must take whatever the table names.
    """
    dtypes = (*HALF, torch.float32) if fp32 else HALF
    calls: list = []

    def full_unsupported(device, dtype, head_dim):
        if dtype not in dtypes:
            return f"dtype {dtype} (FFPA needs fp16/bf16)"
        if not 320 <= head_dim <= 512:
            return f"head_dim {head_dim} not in 320..512 on sm90"
        return None

    def sliding_unsupported(device, dtype, head_dim):
        if dtype not in dtypes:
            return f"dtype {dtype} (flash-attn-4 needs fp16/bf16)"
        if head_dim > 256:
            return f"head_dim {head_dim} > 256"
        return None

    def flex_unsupported(device, dtype, head_dim):
        return None if dtype in (*HALF, torch.float32) else f"dtype {dtype}"

    def dense(name):
        def run(q, k, v, scale, window=None, deterministic=False):
            _refuse(q, k, v, dtypes=dtypes)
            calls.append((name, "dense", deterministic))
            return attention(q, k, v, scale, window)
        return run

    def packed(name):
        def run(q, k, v, cu_seqlens, max_seqlen, scale, window=None, deterministic=False):
            _refuse(q, k, v, cu_seqlens, dtypes=dtypes)
            calls.append((name, "varlen", deterministic))
            return varlen(q, k, v, cu_seqlens, scale, window)
        return run

    def block(query, key, value, layout, scale, window=None):
        if len({query.dtype, key.dtype, value.dtype}) != 1:
            raise TypeError("reference FlexAttention: q/k/v must share one dtype")
        calls.append((names["flex"], "block", False))
        return flex(query, key, value, layout, scale, window)

    infos = {"ffpa": FFPA, "fa4": FA4, "flex": FLEX}
    if rename:
        infos = {k: replace(info, name=rename[k]) if k in rename else info for k, info in infos.items()}
    names = {k: info.name for k, info in infos.items()}
    sliding = Kernel(infos["fa4"], sliding_unsupported, dense=dense(names["fa4"]), varlen=packed(names["fa4"]), repeatable=FLAG)
    if not fa4:
        sliding = switched_off(sliding, "flash-attn-4 not installed (reference kernels, fa4=False)")
    full = Kernel(infos["ffpa"], full_unsupported, dense=dense(names["ffpa"]), varlen=packed(names["ffpa"]), traceable=True,
                  repeatable=ALWAYS)
    return ReferenceSet("reference", (full, sliding, Kernel(infos["flex"], flex_unsupported, block=block, traceable=True,
                                                            repeatable=NEVER)), calls=calls)
