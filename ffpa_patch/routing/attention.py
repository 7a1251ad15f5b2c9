"""The attention function behind the "ffpa" backend and the Gemma4 drop-in.

Reads top to bottom: facts -> decide -> (mask analysis) -> kernel or fallback
-> stats. Fallbacks call whatever the global "sdpa" registry entry holds at
call time (so the repeat-KV fix applies where installed), with the mask
exactly as Transformers built it.
"""
from __future__ import annotations

import sys

import torch

from .. import kernels, runtime
from ..kernels import flex
from . import decide as decide_mod
from . import announce, compiled, masks, precision, stats
from .decide import CP_REASON, EAGER, FA4, FFPA, FLEX, CallFacts, Route
from ..runtime import FFPAFallbackError  # noqa: F401  (raised here; importable from here as before)


_CP_MODULE = "torch.distributed.tensor.experimental._context_parallel._attention"
CP_MESSAGE = (
    'ffpa_patch: attn_implementation="ffpa" cannot run under torch context parallelism (its ring '
    "shards the sequence behind SDPA). Keep the model on \"sdpa\" for CP, or use NeMo-Automodel's "
    "ring CP with text_config.cp_full_attn_backend: ffpa (ffpa_patch's nemo_moe_ring patch covers 0.6.x MoE)."
)


def context_parallel_active(query: torch.Tensor) -> bool:
    """torch CP is on: SDPA is monkey-patched by its dispatcher, or q/k/v are DTensors."""
    cp = sys.modules.get(_CP_MODULE)
    if cp is not None and torch.nn.functional.scaled_dot_product_attention in getattr(cp, "_replaced_functions", {}):
        return True
    return type(query).__name__ == "DTensor"


def _sdpa():
    from transformers.modeling_utils import AttentionInterface

    return AttentionInterface._global_mapping["sdpa"]


def route_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    backend: str,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs,
):
    """Transformers' attention signature: q/k/v ``[B, H, S, D]``; returns ``([B, S, H, D], None)``."""
    if context_parallel_active(query):
        if backend == "ffpa":
            raise RuntimeError(CP_MESSAGE)
        _account(module, backend, bool(getattr(module, "is_sliding", False)), query.shape[-1], Route("sdpa", CP_REASON))
        return _sdpa()(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, sliding_window=sliding_window, **kwargs)
    active = kernels.active()
    is_sliding = bool(getattr(module, "is_sliding", False))
    head_dim = query.shape[-1]
    supported = active.sliding_unsupported if is_sliding else active.full_unsupported
    run = precision.of_call(query, key, value)  # autocast: the dtype SDPA would have run in
    facts = CallFacts(
        backend=backend,
        is_sliding=is_sliding,
        is_causal=bool(getattr(module, "is_causal", True)),
        head_dim=head_dim,
        q_len=query.shape[2],
        kv_len=key.shape[2],
        mask_given=attention_mask is not None,
        dropout=dropout,
        scaling=scaling,
        softcap=softcap,
        kernel_problem=run.problem or supported(query.device, run.dtype, head_dim),
        flex_problem=(run.problem or active.flex_unsupported(query.device, run.dtype, head_dim)) if is_sliding else None,
    )
    route = decide_mod.decide(facts)
    window = (sliding_window or getattr(module, "sliding_window", None)) if is_sliding else None
    layout = None
    if route.fused and torch.compiler.is_compiling():
        # Reading a mask's structure is data-dependent (a graph break per layer), and
        # flash-attn-4's launcher is not traceable. Inside a graph, masked full layers and
        # flash-attn-4 sliding layers run in an opaque custom op that routes at run time as
        # below (routing/compiled.py); without the op sliding layers take FlexAttention with
        # the mask as given.
        bool_mask = attention_mask is None or masks.is_bool_4d(attention_mask)
        in_op = (route.kernel == FA4 and window is not None) or (route.kernel == FFPA and attention_mask is not None)
        if in_op and bool_mask and compiled.AVAILABLE:
            q, k, v = precision.cast(run, query, key, value)
            return torch.ops.ffpa_patch.fused_attention(q, k, v, attention_mask, scaling, window, facts.flex_ok), None
        if is_sliding and facts.flex_problem is None and bool_mask:
            route = Route(FLEX, "torch.compile: FlexAttention with the mask as given")
            layout = None if attention_mask is None else masks.Layout(
                "other", allowed=torch.ops.ffpa_patch.materialize(attention_mask))
        elif attention_mask is not None:  # e.g. an additive float mask: one graph break
            return _route_eagerly(module, query, key, value, attention_mask, backend=backend, dropout=dropout,
                                  scaling=scaling, sliding_window=sliding_window, softcap=softcap, **kwargs)
    elif route.fused and attention_mask is not None:
        layout = masks.analyse(attention_mask, query.shape[0], window)
        route = decide_mod.refine(route, layout.kind, facts.flex_ok and layout.allowed is not None)
    if route.fused:  # fallbacks get q/k/v as they came: SDPA and eager cast under autocast themselves
        route = Route(route.kernel, run.note(route.reason))
        query, key, value = precision.cast(run, query, key, value)
    _account(module, backend, is_sliding, head_dim, route)
    if not route.fused and attention_mask is None and (
        (window is not None and facts.kv_len > window) or (facts.is_causal and 1 < facts.q_len < facts.kv_len)
    ):
        # A missing mask means bottom-right causal (the kernels' semantics): the "ffpa" mask
        # function left a plain sliding window to the kernels (patches/attention_backend.py),
        # or fewer queries than keys (KV-shared layers, logits_to_keep). SDPA's is_causal
        # would align top-left, so the fallback gets the mask spelled out.
        attention_mask = masks.causal(facts.q_len, facts.kv_len, query.device, window)

    if route.kernel == FLEX:
        mask = flex.block_mask(layout, query.shape[0], facts.q_len, facts.kv_len, window, query.device)
        return active.flex(query, key, value, mask, scaling), None
    if route.fused:
        return run_fused(active, route.kernel, query, key, value, scaling, window, layout), None
    if route.kernel == EAGER:
        from transformers.models.gemma4.modeling_gemma4 import eager_attention_forward

        if attention_mask is None and facts.is_causal and facts.q_len > 1:
            attention_mask = masks.causal(facts.q_len, facts.kv_len, query.device)
        mask = masks.to_additive(attention_mask, query.dtype)
        return eager_attention_forward(
            module, query, key, value, mask, dropout=dropout, scaling=scaling, softcap=softcap, **kwargs
        )
    return _sdpa()(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, sliding_window=sliding_window, **kwargs)


@torch.compiler.disable
def _route_eagerly(*args, **kwargs):
    return route_attention(*args, **kwargs)


def _account(module, backend: str, is_sliding: bool, head_dim: int, route: Route) -> None:
    if torch.compiler.is_compiling():
        return
    layer = "sliding" if is_sliding else "full"
    stats.record(layer, route.kernel, route.reason)
    announce.note(module, backend, layer, route.kernel, route.reason)
    if runtime.strict and decide_mod.should_have_run_ffpa(is_sliding, head_dim, route):
        raise FFPAFallbackError(
            f"ffpa_patch strict mode: a head_dim={head_dim} full-attention layer fell back to "
            f"{route.kernel}: {route.reason}"
        )


def run_fused(active, kernel, query, key, value, scale, window, layout):
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # [B, S, H, D] views
    if layout is None or layout.kind == "dense":
        if kernel == FFPA:
            return active.full_dense(q, k, v, scale)
        return active.sliding_dense(q, k, v, scale, window)
    batch, seq = q.shape[:2]
    packed = [t.reshape(batch * seq, *t.shape[2:]).index_select(0, layout.indices) for t in (q, k, v)]
    if kernel == FFPA:
        out = active.full_varlen(*packed, layout.cu_seqlens, layout.max_seqlen, scale)
    else:
        out = active.sliding_varlen(*packed, layout.cu_seqlens, layout.max_seqlen, scale, window)
    full = out.new_zeros(batch * seq, *out.shape[1:]).index_copy(0, layout.indices, out)
    return full.view(batch, seq, *out.shape[1:])
