"""flash-attn-4 (CuTeDSL FlashAttention) for the sliding-window layers.

Transformers' ``sliding_window`` W lets a query see itself and W-1 keys
before it, which is flash-attn's ``window_size=(W - 1, 0)``.
"""
from __future__ import annotations

import functools

import torch

from . import disk_cache, import_problem, refusal
from .catalog import FA4


@functools.lru_cache(maxsize=1)
def import_error() -> str | None:
    with disk_cache.for_flash_attn_4():
        return import_problem("flash_attn.cute", "flash-attn-4", attr="flash_attn_func")


unsupported = refusal(FA4, import_error)  # what its catalog row declares (sm90/sm100, D <= 256)


def _window(window: int | None) -> tuple:
    return (window - 1, 0) if window is not None else (None, None)


def dense(q, k, v, scale: float, window: int | None, deterministic: bool = False):
    from flash_attn.cute import flash_attn_func

    out, _ = flash_attn_func(q, k, v, softmax_scale=scale, causal=True, window_size=_window(window),
                             deterministic=deterministic)
    return out


def varlen(q, k, v, cu_seqlens, max_seqlen: int, scale: float, window: int | None, deterministic: bool = False):
    from flash_attn.cute import flash_attn_varlen_func

    out, _ = flash_attn_varlen_func(
        q, k, v, cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens, max_seqlen_q=max_seqlen,
        max_seqlen_k=max_seqlen, softmax_scale=scale, causal=True, window_size=_window(window),
        deterministic=deterministic,
    )
    return out


# -- with the log-sum-exp (kernels/blocks.py merges image blocks by it): forward without autograd,
#    and the backward from a given out/lse (flash-attn-4's own backward entry, the one its autograd
#    Function calls; the same signature in 4.0.0b36 and b40).
def dense_lse(q, k, v, scale: float, window: int | None = None):
    from flash_attn.cute import flash_attn_func

    with torch.no_grad():
        return flash_attn_func(q, k, v, softmax_scale=scale, causal=True, window_size=_window(window), return_lse=True)


def varlen_lse(q, k, v, cu_seqlens, max_seqlen: int, scale: float, window: int | None = None):
    from flash_attn.cute import flash_attn_varlen_func

    with torch.no_grad():
        return flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens, max_seqlen_q=max_seqlen,
                                      max_seqlen_k=max_seqlen, softmax_scale=scale, causal=True,
                                      window_size=_window(window), return_lse=True)


def dense_bwd(dout, q, k, v, out, lse, scale: float, window: int | None = None, deterministic: bool = False):
    from flash_attn.cute.interface import _flash_attn_bwd

    left, right = _window(window)
    return _flash_attn_bwd(q, k, v, out, dout, lse, scale, True, 0.0, window_size_left=left, window_size_right=right,
                           deterministic=deterministic)[:3]


def varlen_bwd(dout, q, k, v, out, lse, cu_seqlens, max_seqlen: int, scale: float, window: int | None = None,
               deterministic: bool = False):
    from flash_attn.cute.interface import _flash_attn_bwd

    left, right = _window(window)
    return _flash_attn_bwd(q, k, v, out, dout, lse, scale, True, 0.0, window_size_left=left, window_size_right=right,
                           cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens, max_seqlen_q=max_seqlen,
                           max_seqlen_k=max_seqlen, deterministic=deterministic)[:3]
