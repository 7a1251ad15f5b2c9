"""The attention function behind the "ffpa" backend and the Gemma 4 drop-in.

One way through for every call: read the call's facts -> route it (decide; then, in eager
code, read the mask and refine; while Dynamo traces, ``in_graph``) -> account for it once
(stats, the first-forward line, strict) -> dispatch it once (a table kernel, the custom op,
or the fallback). A module that is not Gemma 4 text attention (another model put on "ffpa",
a vision tower) gets exactly what stock "sdpa" gives it.
"""
from __future__ import annotations

import sys
from typing import Any, NamedTuple

import torch

from .. import hf, kernels
from ..errors import FFPAFallbackError
from ..kernels import Offer
from ..kernels.layout import Layout
from ..names import Backend, InGraph, Layer, Mask, Shape
from . import announce, compiled, execute, masks, policy, precision
from .decide import REFUSE, SDPA, CallFacts, Route, decide, in_graph

_CP_MODULE = "torch.distributed.tensor.experimental._context_parallel._attention"
IN_OP_ROUTE = "custom op (the mask is read at run time)"


def context_parallel_active(query: torch.Tensor) -> bool:
    """torch CP is on: SDPA is monkey-patched by its dispatcher, or q/k/v are DTensors."""
    cp = sys.modules.get(_CP_MODULE)
    if cp is not None and torch.nn.functional.scaled_dot_product_attention in getattr(cp, "_replaced_functions", {}):
        return True
    return type(query).__name__ == "DTensor"


class Call(NamedTuple):
    """One attention call as routing carries it from reading to dispatch."""

    module: Any
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    mask: Any
    kwargs: dict  # dropout, scaling, sliding_window, softcap, ...: reach a fallback exactly as given
    backend: Backend
    compiling: bool
    kind: Layer
    facts: CallFacts | None = None  # None: not Gemma 4 text attention
    layer: hf.LayerFacts | None = None
    family: hf.Family | None = None
    precision: precision.Precision | None = None
    deterministic: bool = False
    window: int | None = None  # the window the kernels apply (the mask function's, else the config's)
    sdpa: Any = None  # what a fallback calls: the "sdpa" entry beneath the drop-in


def route_attention(module, query, key, value, attention_mask, *, backend: str, sdpa=None, **kwargs):
    """Transformers' attention signature: q/k/v ``[B, H, S, D]``; returns ``([B, S, H, D], weights)``.
    ``sdpa``: the function a fallback calls (None: the "sdpa" entry beneath the drop-in)."""
    if type(attention_mask) is masks.SequenceParallel and torch.compiler.is_compiling():
        # its layout is read from the gathered positions, data-dependent: one graph break, the eager path
        return _route_eagerly(module, query, key, value, attention_mask, backend=backend, sdpa=sdpa, **kwargs)
    call = read(module, query, key, value, attention_mask, backend, kwargs, sdpa)
    route, how, layout = choose(call)
    if how != InGraph.EAGER_REGION:  # the eager region counts the call itself
        _account(call, route)
    return dispatch(call, route, how, layout)


def read(module, query, key, value, mask, backend: str, kwargs: dict, sdpa=None) -> Call:
    compiling = torch.compiler.is_compiling()
    family = hf.family_of(module)
    if family is None:
        return Call(module, query, key, value, mask, kwargs, backend, compiling, Layer.OTHER, sdpa=sdpa)
    layer = hf.layer(module)
    kind = Layer.SLIDING if layer.is_sliding else Layer.FULL
    if type(mask) is masks.SequenceParallel:  # DeepSpeed's exchange ran: the positions are the whole sequence's
        mask = masks.over_positions(kwargs.get("position_ids"), query.shape[0], key.shape[2],
                                    hf.configured_window(module) if layer.is_sliding else None)
    call_precision = precision.of_call(query, key, value)  # autocast: the dtype SDPA would have run in
    deterministic = policy.deterministic()
    mask_kind, mask_note = masks.kind_of(mask)
    head_dim = query.shape[-1]
    active = kernels.active()
    if call_precision.problem:  # q/k/v dtypes that no kernel takes
        offers = tuple(Offer(k.name, call_precision.problem, k.info.any_mask, impl=k) for k in active.serving(kind))
    elif compiling:
        offers = active.offers(kind, backend, query.device, call_precision.dtype, head_dim, deterministic)
    else:
        offers = active.cached_offers(kind, backend, query.device, call_precision.dtype, head_dim, deterministic)
    facts = CallFacts(  # positional, in CallFacts' field order (keywords cost twice as much, on every call)
        backend, layer.is_sliding, layer.is_causal, head_dim, query.shape[2], key.shape[2], mask_kind,
        kwargs.get("dropout", 0.0), kwargs.get("scaling"), kwargs.get("softcap"), offers, mask_note,
        context_parallel_active(query), policy.sdpa_pinned() if backend == Backend.SDPA else None)
    window = mask.window if mask_kind in (Mask.PLAIN, Mask.SEQUENCE_PARALLEL) else hf.configured_window(module) if layer.is_sliding else None
    return Call(module, query, key, value, mask, kwargs, backend, compiling, kind, facts, layer, family,
                call_precision, deterministic, window, sdpa)


def choose(call: Call) -> tuple[Route, InGraph, Layout | None]:
    """The route, how it runs (in eager code always DIRECT) and the mask's layout where it was read."""
    if call.facts is None:
        return Route(SDPA, f"{type(call.module).__name__} is not Gemma4 text attention: stock sdpa, stock mask"), InGraph.DIRECT, None
    facts = call.facts
    route = decide(facts)
    if not route.fused:
        return route, InGraph.DIRECT, None
    if call.compiling:
        kernel = route.impl
        bool_mask = isinstance(call.mask, torch.Tensor) and call.mask.dtype == torch.bool
        how, route = in_graph(route, facts, kernel.traceable, kernel.info.any_mask, compiled.AVAILABLE, bool_mask)
        layout = None
        if how == InGraph.DIRECT and facts.mask == Mask.TENSOR:  # the bool mask as given, a real buffer for Inductor
            layout = Layout(Shape.OTHER, allowed=torch.ops.ffpa_patch.materialize(call.mask))
        elif how == InGraph.OP:
            route = route._replace(reason=IN_OP_ROUTE)
        return _noted(call, route), how, layout
    route, layout = execute.finish(route, call.mask, facts.mask, call.query.shape[0], call.window,
                                   call.layer.layer_idx, facts.mask_offer)
    if route.fused and (call.precision.cast or call.deterministic):
        route = _noted(call, route)
    return route, InGraph.DIRECT, layout


def _noted(call: Call, route: Route) -> Route:
    return route.noted(call.precision.note(), policy.determinism_note(route.impl.repeatable, call.deterministic))


def _account(call: Call, route: Route) -> None:
    where = policy.TRACED if call.compiling else policy.EAGER_CALL
    if call.layer is None:
        policy.account(call.kind, call.query.shape[-1], route, where=where)
        return
    announce_as = None
    if not call.compiling:
        config = hf.config_of(call.module)
        if announce.pending(config):
            announce_as = (config, hf.is_last_layer(call.module), call.backend, call.family.label)
    policy.account(call.kind, call.facts.head_dim, route, where=where, layer_idx=call.layer.layer_idx, announce_as=announce_as)


def dispatch(call: Call, route: Route, how: InGraph, layout: Layout | None):
    if route.kernel == REFUSE:
        raise FFPAFallbackError(route.reason)
    if not route.fused:
        is_causal = call.layer.is_causal if call.layer is not None else True
        return execute.fallback(route, call.module, call.query, call.key, call.value, call.mask, call.kwargs, is_causal,
                                call.sdpa)
    if how == InGraph.EAGER_REGION:  # e.g. a float mask without the op: one graph break
        return _route_eagerly(call.module, call.query, call.key, call.value, call.mask, backend=call.backend,
                              sdpa=call.sdpa, **call.kwargs)
    q, k, v = precision.cast(call.precision, call.query, call.key, call.value)
    scale = call.kwargs["scaling"]
    if how == InGraph.OP:
        mask = call.mask if call.facts.mask == Mask.TENSOR else None  # None: causal (+ window), bottom-right
        out = torch.ops.ffpa_patch.fused_attention(q, k, v, mask, scale, call.window, route.kernel, call.facts.mask_kernel,
                                                   call.layer.layer_idx, call.deterministic, call.precision.note() or "")
        return out, None
    out = execute.run(route, layout, q, k, v, scale, call.window, call.deterministic)
    return (out if call.compiling else execute.first_order_only(out)), None


@torch.compiler.disable
def _route_eagerly(*args, **kwargs):
    return route_attention(*args, **kwargs)
