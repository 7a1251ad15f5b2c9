"""Which kernel one attention call takes, as a pure function of facts.

Kept free of tensors so every branch is tested without a model, and so the same
reasons appear in ``stats()``, ``status()`` and strict-mode errors.
"""
from __future__ import annotations

from dataclasses import dataclass

FFPA, FA4, FLEX, SDPA, EAGER = "ffpa", "fa4", "flex", "sdpa", "eager"
FUSED = (FFPA, FA4, FLEX)

# Reasons that are by design rather than a missed opportunity (strict mode ignores them).
DECODE = "decode (q_len == 1)"
CP_REASON = "torch context parallel active (its ring runs SDPA)"


@dataclass(frozen=True)
class Route:
    kernel: str
    reason: str

    @property
    def fused(self) -> bool:
        return self.kernel in FUSED


@dataclass(frozen=True)
class CallFacts:
    backend: str  # "ffpa" (the registered backend) or "sdpa" (drop-in on a stock model)
    is_sliding: bool
    is_causal: bool
    head_dim: int
    q_len: int
    kv_len: int
    mask_given: bool
    dropout: float
    scaling: float | None
    softcap: float | None
    kernel_problem: str | None  # why the layer kind's kernel (FFPA full, flash-attn-4 sliding) can't run, or None
    flex_problem: str | None  # why FlexAttention can't run, or None

    @property
    def flex_ok(self) -> bool:
        """FlexAttention serves sliding layers on the "ffpa" backend only: it compiles, which a
        user who left the model on "sdpa" did not ask for."""
        return self.is_sliding and self.backend == FFPA and self.flex_problem is None


def decide(f: CallFacts) -> Route:
    """Route before looking inside the mask; ``refine`` finishes the job for masked calls."""
    if f.softcap:
        return Route(EAGER, "attention softcap (no fused kernel here supports it)")
    if f.q_len == 1:
        return Route(SDPA, DECODE)
    if not f.is_causal:
        return Route(SDPA, "bidirectional attention (module.is_causal is False)")
    if f.dropout:
        return Route(SDPA, "attention dropout > 0")
    if f.scaling is None:
        return Route(SDPA, "no explicit softmax scale")
    if f.q_len != f.kv_len and (f.mask_given or f.backend == SDPA):
        # Only the "ffpa" backend's mask-less q<kv calls (KV-shared layers sliced to
        # logits_to_keep) mean bottom-right causal, which the kernels implement.
        return Route(SDPA, "q_len != kv_len (cache or chunked prefill)")
    if f.q_len > f.kv_len:
        return Route(SDPA, "q_len > kv_len")
    if not f.kernel_problem:
        kernel = FA4 if f.is_sliding else FFPA
    elif f.flex_ok:
        kernel = FLEX  # sliding layer without flash-attn-4
    elif f.is_sliding and f.backend == SDPA:
        return Route(SDPA, f"drop-in path: sliding layers use flash-attn-4 only ({f.kernel_problem})")
    elif f.is_sliding:
        return Route(SDPA, f"{f.kernel_problem}; {f.flex_problem}")
    else:
        return Route(SDPA, f.kernel_problem)
    return Route(kernel, "masked (to analyse)" if f.mask_given else "dense causal")


def refine(route: Route, layout_kind: str, flex_ok: bool = False) -> Route:
    """Finish a fused route once the mask's structure is known; ``flex_ok``: FlexAttention
    may take a mask the fused kernels cannot express (a bool 4-D mask, a sliding layer)."""
    if layout_kind == "dense":
        return Route(route.kernel, "dense causal (mask is plain causal)")
    if layout_kind == "varlen":
        return Route(route.kernel, "varlen (padding/packing)")
    if flex_ok:
        return Route(FLEX, "mask is not causal+padding/packing (e.g. bidirectional image blocks): BlockMask")
    return Route(SDPA, "mask is not causal+padding/packing (e.g. bidirectional image blocks)")


def should_have_run_ffpa(is_sliding: bool, head_dim: int, route: Route) -> bool:
    """A strict-mode failure: a head_dim > 256 full layer that fell back for a reason other than decode."""
    return not is_sliding and head_dim > 256 and not route.fused and route.reason not in (DECODE, CP_REASON)
