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
from . import execute, policy
from .decide import PLAIN, TENSOR, Route

# The backward op recomputes under autograd; a custom op's body runs with autograd's
# dispatch keys excluded, and only these (private) torch APIs re-include them.
AVAILABLE = all(hasattr(torch._C, n) for n in (
    "_ForceDispatchKeyGuard", "_dispatch_tls_local_include_set", "_dispatch_tls_local_exclude_set"))


@contextmanager
def _autograd_inside_op():
    exclude = torch._C._dispatch_tls_local_exclude_set().remove(torch._C.DispatchKey.AutogradFunctionality)
    with torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), exclude), torch.enable_grad():
        yield


def _forward(query, key, value, mask, scale: float, window: Optional[int], kernel: str, layer_idx: int,
             is_sliding: bool, flex_ok: bool, deterministic: bool, record: bool) -> torch.Tensor:
    route, layout = execute.finish(Route(kernel, "dense causal"), mask, PLAIN if mask is None else TENSOR,
                                   query.shape[0], window, layer_idx, flex_ok)
    if record:
        policy.account("sliding" if is_sliding else "full", query.shape[-1], Route(route.kernel, policy.IN_OP + route.reason))
    if route.fused:
        return execute.run(kernels.active(), route, layout, query, key, value, scale, window, deterministic).contiguous()
    stand_in = hf.StandIn(query.shape[1], key.shape[1], layer_idx, window)
    out, _ = execute.fallback(route, stand_in, query, key, value, mask, {"dropout": 0.0, "scaling": scale, "sliding_window": window})
    return out.contiguous()


@torch.library.custom_op("ffpa_patch::fused_attention", mutates_args=())
def fused_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Optional[torch.Tensor],
                    scale: float, window: Optional[int], kernel: str, layer_idx: int, is_sliding: bool,
                    flex_ok: bool, deterministic: bool) -> torch.Tensor:
    """``[B, H, S, D]`` q/k/v and a 4-D mask (or None: causal + window, bottom-right) -> ``[B, S, H, D]`` (contiguous)."""
    with torch.no_grad():
        return _forward(query, key, value, mask, scale, window, kernel, layer_idx, is_sliding, flex_ok, deterministic, record=True)


@fused_attention.register_fake
def _(query, key, value, mask, scale, window, kernel, layer_idx, is_sliding, flex_ok, deterministic):
    b, h, s, _ = query.shape
    return query.new_empty(b, s, h, value.shape[-1])


@torch.library.custom_op("ffpa_patch::fused_attention_backward", mutates_args=())
def fused_attention_backward(grad: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             mask: Optional[torch.Tensor], scale: float, window: Optional[int], kernel: str,
                             layer_idx: int, is_sliding: bool, flex_ok: bool,
                             deterministic: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    with _autograd_inside_op():
        q, k, v = (t.detach().requires_grad_() for t in (query, key, value))
        out = _forward(q, k, v, mask, scale, window, kernel, layer_idx, is_sliding, flex_ok, deterministic, record=False)
        grads = torch.autograd.grad(out, (q, k, v), grad)
    return tuple(g.contiguous() for g in grads)


@fused_attention_backward.register_fake
def _(grad, query, key, value, mask, scale, window, kernel, layer_idx, is_sliding, flex_ok, deterministic):
    return tuple(torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (query, key, value))


def _setup_context(ctx, inputs, output):
    query, key, value, mask, *rest = inputs
    ctx.save_for_backward(query, key, value, mask)
    ctx.args = rest


def _backward(ctx, grad):
    query, key, value, mask = ctx.saved_tensors
    dq, dk, dv = torch.ops.ffpa_patch.fused_attention_backward(grad, query, key, value, mask, *ctx.args)
    return (dq, dk, dv) + (None,) * (1 + len(ctx.args))  # no gradient for the mask and the settings


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
