"""Run a decided route: read the mask where the route needs it, then the fused kernel (dense,
varlen, or FlexAttention with a BlockMask) or the one fallback: the current global "sdpa"
entry (or eager attention, for a softcap) with the mask as stock would have it.

No policy and no compile checks here: the eager path and the compiled op both call these.
"""
from __future__ import annotations

import torch

from .. import hf
from ..kernels import blocks
from ..kernels.layout import Layout
from ..names import Mask, Shape
from . import masks
from .decide import EAGER, SEQUENCE_PARALLEL, Route, refine


def finish(route: Route, mask, mask_kind: Mask, batch: int, window: int | None, layer_idx: int,
           mask_offer) -> tuple[Route, Layout | None]:
    """A fused route with a 4-D mask, refined once the mask's structure is read (under Ulysses SP,
    the layout read from the gathered positions)."""
    if route.fused and mask_kind == Mask.SEQUENCE_PARALLEL:
        refined = refine(route, mask.layout.kind)
        return refined._replace(reason=f"{SEQUENCE_PARALLEL}: {refined.reason}"), mask.layout
    if not route.fused or mask_kind != Mask.TENSOR:
        return route, None
    layout = masks.analyse(mask, batch, window, layer_idx)
    return refine(route, layout.kind, mask_offer if layout.allowed is not None else None, route.impl.merges), layout


def run(route: Route, layout: Layout | None, query, key, value, scale: float,
        window: int | None, deterministic: bool) -> torch.Tensor:
    """``[B, H, S, D]`` q/k/v (as Transformers hands them) -> ``[B, S, H, D]``, on the route's kernel."""
    kernel = route.impl
    if kernel.block is not None:  # a kernel that takes any mask builds it from the layout itself
        return kernel.block(query, key, value, layout, scale, window)
    # [B, S, H, D]: views of Gemma 4's own storage (contiguous: no copy); a caller that made q/k/v contiguous
    # as [B, H, S, D] (DeepSpeed's Ulysses exchange does) gets one copy, so every kernel reads the layout it was built for
    q, k, v = (t.transpose(1, 2).contiguous() for t in (query, key, value))
    if layout is not None and layout.kind == Shape.BLOCKS:
        return blocks.attention(kernel, q, k, v, layout, scale, window, deterministic)
    if layout is None or layout.kind == Shape.DENSE:
        return kernel.dense(q, k, v, scale, window, deterministic)
    batch, seq = q.shape[:2]
    packed = [t.reshape(batch * seq, *t.shape[2:]).index_select(0, layout.indices) for t in (q, k, v)]
    out = kernel.varlen(*packed, layout.cu_seqlens, layout.max_seqlen, scale, window, deterministic)
    # rows that are padding stay zero, as in Transformers' own flash-attention path (README, Guarantees)
    full = out.new_zeros(batch * seq, *out.shape[1:]).index_copy(0, layout.indices, out)
    return full.view(batch, seq, *out.shape[1:])


def fallback(route: Route, module, query, key, value, mask, kwargs: dict, is_causal: bool = True, sdpa=None):
    """Stock's computation: ``sdpa`` (None: the "sdpa" entry beneath the drop-in, which must not
    route the call a second time) or eager, for a softcap, with the mask as stock would have
    built it, and the call's own keyword arguments."""
    q_len, kv_len = query.shape[2], key.shape[2]
    mask = masks.for_fallback(mask, q_len, kv_len, query.device)
    if route.kernel == EAGER:
        if mask is None and is_causal and q_len > 1:
            mask = masks.causal(q_len, kv_len, query.device)  # eager applies only the mask it is given
        return hf.eager_attention(module)(module, query, key, value, masks.to_additive(mask, query.dtype), **kwargs)
    if sdpa is None:
        from ..patches.gemma4_dropin import sdpa_beneath

        sdpa = sdpa_beneath()
    return sdpa(module, query, key, value, mask, **kwargs)


SECOND_ORDER = (
    "ffpa_patch: second-order gradients (create_graph=True, e.g. a gradient penalty) through a fused "
    "attention kernel (FFPA, flash-attn-4, FlexAttention) are not supported: their backward is not "
    "differentiable, so the result would silently lack attention's share. Run these steps on stock "
    "attention: keep the model on \"sdpa\" inside torch.nn.attention.sdpa_kernel(SDPBackend.MATH) "
    "(ffpa_patch then stays out of the way), or use attn_implementation=\"eager\"."
)


class _FirstOrderOnly(torch.autograd.Function):
    """Identity whose backward refuses to build a graph (create_graph=True runs backward with grad on)."""

    @staticmethod
    def forward(ctx, out):
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad):
        if torch.is_grad_enabled():
            raise RuntimeError(SECOND_ORDER)
        return grad


def first_order_only(out: torch.Tensor) -> torch.Tensor:
    return _FirstOrderOnly.apply(out) if out.requires_grad else out
