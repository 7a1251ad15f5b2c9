"""Masked full layers inside a compiled graph, as opaque custom ops (no graph break).

Reading a mask's structure (dense, varlen, other) is data-dependent, which Dynamo
cannot trace. ``ffpa_patch::full_masked_attention`` runs the analysis and the FFPA
kernel eagerly at run time, while Dynamo and AOTAutograd see only its shape
(fake) implementation. Its backward is a second op that recomputes the forward
under autograd: one more FFPA forward per full layer and step (~1% of a step at
8k), instead of exposing the varlen kernels' saved state to the graph. Masks
FFPA cannot express go to SDPA with repeated K/V inside the op, as the
repeat-KV fix would.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

from .. import kernels
from . import masks, stats
from .decide import FFPA, Route, refine

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


def _forward(query, key, value, mask, scale: float, record: bool) -> torch.Tensor:
    from .attention import run_fused  # routing/attention imports this module

    layout = masks.analyse(mask, query.shape[0], None)
    route = refine(Route(FFPA, "masked"), layout.kind)
    if record:
        stats.record("full", route.kernel, REASON_PREFIX + route.reason)
    if route.fused:
        return run_fused(kernels.active(), FFPA, query, key, value, scale, None, layout).contiguous()
    rep = query.shape[1] // key.shape[1]
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key.repeat_interleave(rep, 1), value.repeat_interleave(rep, 1), attn_mask=mask, scale=scale
    )
    return out.transpose(1, 2).contiguous()


@torch.library.custom_op("ffpa_patch::full_masked_attention", mutates_args=())
def full_masked_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
                          scale: float) -> torch.Tensor:
    """``[B, H, S, D]`` q/k/v and a 4-D mask -> ``[B, S, H, D]`` (contiguous)."""
    with torch.no_grad():
        return _forward(query, key, value, mask, scale, record=True)


@full_masked_attention.register_fake
def _(query, key, value, mask, scale):
    b, h, s, _ = query.shape
    return query.new_empty(b, s, h, value.shape[-1])


@torch.library.custom_op("ffpa_patch::full_masked_attention_backward", mutates_args=())
def full_masked_attention_backward(grad: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                   mask: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    with _autograd_inside_op():
        q, k, v = (t.detach().requires_grad_() for t in (query, key, value))
        out = _forward(q, k, v, mask, scale, record=False)
        grads = torch.autograd.grad(out, (q, k, v), grad)
    return tuple(g.contiguous() for g in grads)


@full_masked_attention_backward.register_fake
def _(grad, query, key, value, mask, scale):
    return tuple(torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (query, key, value))


def _setup_context(ctx, inputs, output):
    query, key, value, mask, scale = inputs
    ctx.save_for_backward(query, key, value, mask)
    ctx.scale = scale


def _backward(ctx, grad):
    query, key, value, mask = ctx.saved_tensors
    dq, dk, dv = torch.ops.ffpa_patch.full_masked_attention_backward(grad, query, key, value, mask, ctx.scale)
    return dq, dk, dv, None, None


full_masked_attention.register_autograd(_backward, setup_context=_setup_context)


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
