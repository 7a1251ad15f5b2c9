"""Fused attention inside a compiled graph, as an opaque custom op (no graph break).

Reading a mask's structure (dense, varlen, other) is data-dependent, which Dynamo
cannot trace, and flash-attn-4's launcher is not traceable either. The route's kernel
is decided while tracing (routing/attention.py); ``ffpa_patch::fused_attention`` then
reads the mask at run time and runs what the eager path would (``execute.finish`` ->
``policy.account`` -> ``execute.run``, or the global "sdpa" entry when the mask turns out
to be something the kernels cannot express), while Dynamo and AOTAutograd see only its
shape (fake) implementation. Its backward is a second op that recomputes the forward
under autograd: one more kernel forward per layer and step (~1% of a step at 8k),
instead of exposing the varlen kernels' saved state to the graph.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Optional

import torch

from .. import hf, kernels
from ..kernels import Offer
from ..names import Mask
from . import execute, policy
from .decide import DENSE_CAUSAL, Route

# The backward op recomputes under autograd; a custom op's body runs with autograd's
# dispatch keys excluded, and only these (private) torch APIs re-include them.
AVAILABLE = all(hasattr(torch._C, n) for n in (
    "_ForceDispatchKeyGuard", "_dispatch_tls_local_include_set", "_dispatch_tls_local_exclude_set"))


@contextmanager
def _autograd_inside_op():
    exclude = torch._C._dispatch_tls_local_exclude_set().remove(torch._C.DispatchKey.AutogradFunctionality)
    with torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), exclude), torch.enable_grad():
        yield


def _forward(query, key, value, mask, scale: float, window: Optional[int], kernel: str, mask_kernel: Optional[str],
             layer_idx: int, deterministic: bool, cast_note: str, record: bool) -> torch.Tensor:
    active = kernels.active()  # the op's boundary carries names (strings): looked up here, once
    chosen = active.by_name(kernel)
    mask_offer = None if mask_kernel is None else Offer(mask_kernel, None, True, impl=active.by_name(mask_kernel))
    route, layout = execute.finish(Route(kernel, DENSE_CAUSAL, impl=chosen), mask, Mask.PLAIN if mask is None else Mask.TENSOR,
                                   query.shape[0], window, layer_idx, mask_offer)
    if record:
        repeatable = route.impl.repeatable if route.fused else None
        noted = route.noted(cast_note or None, policy.determinism_note(repeatable, deterministic))
        policy.account(chosen.info.serves, query.shape[-1], noted, where=policy.IN_OP, layer_idx=layer_idx)
    if route.fused:
        return execute.run(route, layout, query, key, value, scale, window, deterministic).contiguous()
    stand_in = hf.StandIn(query.shape[1], key.shape[1], layer_idx, window)
    out, _ = execute.fallback(route, stand_in, query, key, value, mask, {"dropout": 0.0, "scaling": scale, "sliding_window": window})
    return out.contiguous()


@torch.library.custom_op("ffpa_patch::fused_attention", mutates_args=())
def fused_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Optional[torch.Tensor],
                    scale: float, window: Optional[int], kernel: str, mask_kernel: Optional[str], layer_idx: int,
                    deterministic: bool, cast_note: str) -> torch.Tensor:
    """``[B, H, S, D]`` q/k/v and a 4-D mask (or None: causal + window, bottom-right) -> ``[B, S, H, D]``
    (contiguous); ``kernel``: the route decided while tracing, ``mask_kernel``: the table kernel for
    masks it cannot express; ``cast_note``: the autocast note of the traced route."""
    with torch.no_grad():
        return _forward(query, key, value, mask, scale, window, kernel, mask_kernel, layer_idx, deterministic, cast_note,
                        record=True)


@fused_attention.register_fake
def _(query, key, value, mask, *settings):
    b, h, s, _ = query.shape
    return query.new_empty(b, s, h, value.shape[-1])


@torch.library.custom_op("ffpa_patch::fused_attention_backward", mutates_args=())
def fused_attention_backward(grad: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             mask: Optional[torch.Tensor], scale: float, window: Optional[int], kernel: str,
                             mask_kernel: Optional[str], layer_idx: int, deterministic: bool,
                             cast_note: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    with _autograd_inside_op():
        q, k, v = (t.detach().requires_grad_() for t in (query, key, value))
        out = _forward(q, k, v, mask, scale, window, kernel, mask_kernel, layer_idx, deterministic, cast_note, record=False)
        grads = torch.autograd.grad(out, (q, k, v), grad)
    return tuple(g.contiguous() for g in grads)


@fused_attention_backward.register_fake
def _(grad, query, key, value, mask, *settings):
    return tuple(torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (query, key, value))


def _setup_context(ctx, inputs, output):
    query, key, value, mask, *settings = inputs
    ctx.save_for_backward(query, key, value, mask)
    ctx.settings = settings


def _backward(ctx, grad):
    query, key, value, mask = ctx.saved_tensors
    dq, dk, dv = torch.ops.ffpa_patch.fused_attention_backward(grad, query, key, value, mask, *ctx.settings)
    return (dq, dk, dv) + (None,) * (1 + len(ctx.settings))  # no gradient for the mask and the settings


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
