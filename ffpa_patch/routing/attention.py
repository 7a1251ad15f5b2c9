"""The attention function behind the "ffpa" backend and the Gemma4 drop-in.

Reads top to bottom: facts -> decide -> (inside a graph: in_graph) -> finish (the mask's
structure) -> policy (stats, strict) -> kernel or fallback. A module that is not Gemma4
text attention (another model put on "ffpa", a vision tower) gets exactly what stock "sdpa"
gives it.
"""
from __future__ import annotations

import sys

import torch

from .. import hf, kernels
from . import compiled, execute, masks, policy, precision
from .decide import (BACKEND_SDPA, DIRECT, EAGER_REGION, FLEX, PLAIN, REFUSE, SDPA, TENSOR, CallFacts, Route, decide,
                     in_graph)

_CP_MODULE = "torch.distributed.tensor.experimental._context_parallel._attention"


def context_parallel_active(query: torch.Tensor) -> bool:
    """torch CP is on: SDPA is monkey-patched by its dispatcher, or q/k/v are DTensors."""
    cp = sys.modules.get(_CP_MODULE)
    if cp is not None and torch.nn.functional.scaled_dot_product_attention in getattr(cp, "_replaced_functions", {}):
        return True
    return type(query).__name__ == "DTensor"


def route_attention(module, query, key, value, attention_mask, *, backend: str, **kwargs):
    """Transformers' attention signature: q/k/v ``[B, H, S, D]``; returns ``([B, S, H, D], weights)``.
    ``kwargs`` (dropout, scaling, sliding_window, softcap, ...) reach a fallback exactly as given."""
    compiling = torch.compiler.is_compiling()
    if not hf.is_text_attention(module):
        _account(compiling, module, backend, "other", query.shape[-1],
                 Route(SDPA, f"{type(module).__name__} is not Gemma4 text attention: stock sdpa, stock mask"), -1)
        return execute.fallback(Route(SDPA, ""), module, query, key, value, attention_mask, kwargs)
    layer = hf.layer(module)
    active = kernels.active()
    call = precision.of_call(query, key, value)  # autocast: the dtype SDPA would have run in
    deterministic = policy.deterministic()
    mask_kind, mask_note = masks.kind_of(attention_mask)
    head_dim = query.shape[-1]
    if call.problem:  # q/k/v dtypes that no kernel takes
        kernel_problem, flex_problem = call.problem, call.problem if layer.is_sliding else None
    else:
        kernel_problem, flex_problem = active.problems(layer.is_sliding, query.device, call.dtype, head_dim, deterministic)
    facts = CallFacts(
        backend=backend, is_sliding=layer.is_sliding, is_causal=layer.is_causal, head_dim=head_dim,
        q_len=query.shape[2], kv_len=key.shape[2], mask=mask_kind, mask_note=mask_note,
        dropout=kwargs.get("dropout", 0.0), scaling=kwargs.get("scaling"), softcap=kwargs.get("softcap"),
        kernel_problem=kernel_problem, flex_problem=flex_problem, context_parallel=context_parallel_active(query),
        sdpa_pinned=policy.sdpa_pinned() if backend == BACKEND_SDPA else None,
    )
    route = decide(facts)
    if route.kernel == REFUSE:
        raise RuntimeError(route.reason)
    kind = "sliding" if layer.is_sliding else "full"
    if not route.fused:
        _account(compiling, module, backend, kind, head_dim, route, layer.layer_idx)
        return execute.fallback(route, module, query, key, value, attention_mask, kwargs)
    window = attention_mask.window if mask_kind == PLAIN else hf.configured_window(module)
    if compiling:
        return _in_graph(active, facts, route, layer, module, query, key, value, attention_mask, window, call,
                         deterministic, kwargs)
    route, layout = execute.finish(route, attention_mask, mask_kind, query.shape[0], window, layer.layer_idx, facts.flex_ok)
    fused = route.fused
    if fused and (call.cast or deterministic):
        route = route.noted(call.note(), policy.determinism_note(active.by_name(route.kernel).repeatable, deterministic))
    _account(compiling, module, backend, kind, head_dim, route, layer.layer_idx)
    if not fused:
        return execute.fallback(route, module, query, key, value, attention_mask, kwargs)
    q, k, v = precision.cast(call, query, key, value)
    out = execute.run(active, route, layout, q, k, v, kwargs["scaling"], window, deterministic)
    return (execute.first_order_only(out) if out.requires_grad else out), None


def _account(compiling: bool, module, backend: str, kind: str, head_dim: int, route: Route, layer_idx: int) -> None:
    if compiling:
        policy.account_traced(kind, head_dim, route, layer_idx)
    else:
        policy.account(kind, head_dim, route, module=module if kind != "other" else None, backend=backend)


def _in_graph(active, facts: CallFacts, route: Route, layer, module, query, key, value, mask, window, call,
              deterministic: bool, kwargs: dict):
    """A fused route while Dynamo traces (routing/decide.py ``in_graph`` says how it runs)."""
    mode, route = in_graph(route, facts, active.by_name(route.kernel).traceable, compiled.AVAILABLE,
                           isinstance(mask, torch.Tensor) and mask.dtype == torch.bool)
    if mode == EAGER_REGION:  # e.g. a float mask without the op: one graph break
        return _route_eagerly(module, query, key, value, mask, backend=facts.backend, **kwargs)
    kind = "sliding" if layer.is_sliding else "full"
    q, k, v = precision.cast(call, query, key, value)
    scale = kwargs["scaling"]
    if mode == DIRECT:
        layout = None
        if route.kernel == FLEX and facts.mask == TENSOR:  # the bool mask as given, a real buffer for Inductor
            layout = masks.Layout("other", allowed=torch.ops.ffpa_patch.materialize(mask))
        route = route.noted(call.note(), policy.determinism_note(active.by_name(route.kernel).repeatable, deterministic))
        policy.account_traced(kind, facts.head_dim, route, layer.layer_idx)
        return execute.run(active, route, layout, q, k, v, scale, window, deterministic), None
    policy.account_traced(kind, facts.head_dim, Route(route.kernel, "custom op (the mask is read at run time)"), layer.layer_idx)
    tensor_mask = mask if facts.mask == TENSOR else None  # None: causal (+ window), bottom-right
    out = torch.ops.ffpa_patch.fused_attention(q, k, v, tensor_mask, scale, window, route.kernel, layer.layer_idx,
                                               layer.is_sliding, facts.flex_ok, deterministic)
    return out, None


@torch.compiler.disable
def _route_eagerly(*args, **kwargs):
    return route_attention(*args, **kwargs)

