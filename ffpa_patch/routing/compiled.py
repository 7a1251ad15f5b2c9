"""Fused attention inside a compiled graph, as opaque custom ops (no graph break).

Reading a mask's structure (dense, varlen, other) is data-dependent, which Dynamo
cannot trace, and flash-attn-4's launcher is not traceable either.
``ffpa_patch::fused_attention`` runs the mask analysis and the kernel eagerly at
run time, exactly as the eager route would (FFPA for full layers, flash-attn-4
for sliding ones, dense or varlen; FlexAttention where the eager route would take
it; else SDPA with the mask), while Dynamo and AOTAutograd see only its shape
(fake) implementation. Its backward is a second op that recomputes the forward
under autograd: one more kernel forward per layer and step (~1% of a step at
8k), instead of exposing the varlen kernels' saved state to the graph.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Optional

import torch

from .. import kernels
from ..kernels import flex
from . import masks, stats
from .decide import FA4, FFPA, FLEX, Route, refine

REASON_PREFIX = "torch.compile op: "
# The backward op recomputes under autograd; a custom op's body runs with autograd's
# dispatch keys excluded, and only these (private) torch APIs re-include them.
AVAILABLE = all(hasattr(torch._C, n) for n in (
    "_ForceDispatchKeyGuard", "_dispatch_tls_local_include_set", "_dispatch_tls_local_exclude_set"))


@contextmanager
def _autograd_inside_op():
    exclude = torch._C._dispatch_tls_local_exclude_set().remove(torch._C.DispatchKey.AutogradFunctionality)
    with torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), exclude), torch.enable_grad():
        yield


def _forward(query, key, value, mask, scale: float, window: Optional[int], flex_ok: bool, record: bool) -> torch.Tensor:
    """A full layer when ``window`` is None, else a sliding one; ``flex_ok`` as in ``CallFacts``."""
    from .attention import run_fused  # routing/attention imports this module

    layer, kernel = ("full", FFPA) if window is None else ("sliding", FA4)
    if mask is None:
        layout, route = None, Route(kernel, "dense causal")
    else:
        layout = masks.analyse(mask, query.shape[0], window)
        route = refine(Route(kernel, "masked"), layout.kind, flex_ok and layout.allowed is not None)
    if record:
        stats.record(layer, route.kernel, REASON_PREFIX + route.reason)
    active = kernels.active()
    if route.kernel == FLEX:
        block_mask = flex.block_mask(layout, query.shape[0], query.shape[2], key.shape[2], window, query.device)
        return active.flex(query, key, value, block_mask, scale).contiguous()
    if route.fused:
        return run_fused(active, kernel, query, key, value, scale, window, layout).contiguous()
    rep = query.shape[1] // key.shape[1]  # the mask carries the window: SDPA as the repeat-KV fix would run it
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key.repeat_interleave(rep, 1), value.repeat_interleave(rep, 1), attn_mask=mask, scale=scale
    )
    return out.transpose(1, 2).contiguous()


@torch.library.custom_op("ffpa_patch::fused_attention", mutates_args=())
def fused_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Optional[torch.Tensor],
                    scale: float, window: Optional[int], flex_ok: bool) -> torch.Tensor:
    """``[B, H, S, D]`` q/k/v and a 4-D bool mask (or None: aligned causal) -> ``[B, S, H, D]`` (contiguous)."""
    with torch.no_grad():
        return _forward(query, key, value, mask, scale, window, flex_ok, record=True)


@fused_attention.register_fake
def _(query, key, value, mask, scale, window, flex_ok):
    b, h, s, _ = query.shape
    return query.new_empty(b, s, h, value.shape[-1])


@torch.library.custom_op("ffpa_patch::fused_attention_backward", mutates_args=())
def fused_attention_backward(grad: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             mask: Optional[torch.Tensor], scale: float, window: Optional[int],
                             flex_ok: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    with _autograd_inside_op():
        q, k, v = (t.detach().requires_grad_() for t in (query, key, value))
        out = _forward(q, k, v, mask, scale, window, flex_ok, record=False)
        grads = torch.autograd.grad(out, (q, k, v), grad)
    return tuple(g.contiguous() for g in grads)


@fused_attention_backward.register_fake
def _(grad, query, key, value, mask, scale, window, flex_ok):
    return tuple(torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (query, key, value))


def _setup_context(ctx, inputs, output):
    query, key, value, mask, scale, window, flex_ok = inputs
    ctx.save_for_backward(query, key, value, mask)
    ctx.scale, ctx.window, ctx.flex_ok = scale, window, flex_ok


def _backward(ctx, grad):
    query, key, value, mask = ctx.saved_tensors
    dq, dk, dv = torch.ops.ffpa_patch.fused_attention_backward(
        grad, query, key, value, mask, ctx.scale, ctx.window, ctx.flex_ok)
    return dq, dk, dv, None, None, None, None


fused_attention.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("ffpa_patch::materialize", mutates_args=())
def materialize(mask: torch.Tensor) -> torch.Tensor:
    """A copy Inductor cannot fuse away. FlexAttention's lowering needs the tensors its
    mask function reads to be real buffers, and a mask computed in the graph (Transformers'
    ``sdpa_mask``) is otherwise a pointwise expression ("All the buffers in the score and
    mask subgraph should be in kernel_group.args.input_buffers")."""
    return mask.clone()


@materialize.register_fake
def _(mask):
    return torch.empty_like(mask)
