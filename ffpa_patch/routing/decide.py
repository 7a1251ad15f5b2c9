"""Which kernel one attention call takes, as pure functions of facts: the one decision path.

``decide`` routes a call before anyone looks inside its mask; ``refine`` finishes a fused
route once the mask's structure is known; ``in_graph`` says how a route runs inside a
compiled graph. Kept free of tensors so every branch is tested without a model, and so
the same reasons appear in ``stats()``, ``status()`` and strict-mode errors.
"""
from __future__ import annotations

from dataclasses import dataclass

FFPA, FA4, FLEX, SDPA, EAGER, REFUSE = "ffpa", "fa4", "flex", "sdpa", "eager", "refuse"
FUSED = (FFPA, FA4, FLEX)
BACKEND_FFPA, BACKEND_SDPA = "ffpa", "sdpa"  # the registered backend; the drop-in on a model left on "sdpa"

#: what arrives as the mask (routing/masks.py tells them apart)
NONE, PLAIN, TENSOR, OPAQUE = "none", "plain causal", "tensor", "opaque"

DECODE = "decode (q_len == 1)"
CP_REASON = "torch context parallel active (its ring runs SDPA)"
CP_MESSAGE = (
    'ffpa_patch: attn_implementation="ffpa" cannot run under torch context parallelism (its ring '
    "shards the sequence behind SDPA). Keep the model on \"sdpa\" for CP, or use NeMo-Automodel's "
    "ring CP with text_config.cp_full_attn_backend: ffpa (ffpa_patch's nemo_moe_ring patch covers 0.6.x MoE)."
)
MISSING_MASK = (
    'ffpa_patch: a Gemma4 layer on attn_implementation="ffpa" got no attention mask: the "ffpa" mask '
    "function did not run for this forward (ffpa_patch was reverted or re-applied while it ran, or the "
    "caller passed attention_mask=None to the attention function itself), so its padding is unknown. "
    "Run the forward again with ffpa_patch applied throughout."
)


@dataclass(frozen=True)
class Route:
    kernel: str
    reason: str
    chosen: bool = False  # the call's or the user's own choice (decode, CP, sdpa_kernel), not a missed chance

    @property
    def fused(self) -> bool:
        return self.kernel in FUSED

    def noted(self, *notes: str | None) -> Route:
        """The route with notes (an autocast cast, deterministic mode) added to its reason."""
        extra = "; ".join(n for n in notes if n)
        return Route(self.kernel, f"{self.reason}; {extra}", self.chosen) if extra else self


@dataclass(frozen=True)
class CallFacts:
    backend: str  # BACKEND_FFPA or BACKEND_SDPA (the drop-in)
    is_sliding: bool
    is_causal: bool
    head_dim: int
    q_len: int
    kv_len: int
    mask: str  # masks.kind_of: NONE, PLAIN, TENSOR or OPAQUE
    dropout: float
    scaling: float | None
    softcap: float | None
    kernel_problem: str | None  # why the layer's kernel (FFPA full, flash-attn-4 sliding) refuses, or None
    flex_problem: str | None  # why FlexAttention refuses, or None
    mask_note: str | None = None  # why an OPAQUE mask is handed over as given
    context_parallel: bool = False
    sdpa_pinned: str | None = None  # the SDPA backends a user's sdpa_kernel(...) leaves on, or None

    @property
    def flex_ok(self) -> bool:
        """FlexAttention serves sliding layers on the "ffpa" backend only: it compiles, which a
        user who left the model on "sdpa" did not ask for."""
        return self.is_sliding and self.backend == BACKEND_FFPA and self.flex_problem is None


def decide(f: CallFacts) -> Route:
    """Route before looking inside the mask; ``refine`` finishes the job for TENSOR masks."""
    if f.context_parallel:
        if f.backend == BACKEND_FFPA:
            return Route(REFUSE, CP_MESSAGE)
        return Route(SDPA, CP_REASON, chosen=True)
    if f.is_causal and f.mask == NONE and f.backend == BACKEND_FFPA:
        return Route(REFUSE, MISSING_MASK)
    if f.softcap:
        return Route(EAGER, "attention softcap (no fused kernel here supports it)")
    if f.q_len == 1:
        return Route(SDPA, DECODE, chosen=True)
    if not f.is_causal:
        return Route(SDPA, "bidirectional attention (module.is_causal is False)")
    if f.backend == BACKEND_SDPA and f.sdpa_pinned:
        return Route(SDPA, f"sdpa_kernel() pins SDPA to {f.sdpa_pinned}", chosen=True)
    if f.dropout:
        return Route(SDPA, "attention dropout > 0")
    if f.scaling is None:
        return Route(SDPA, "no explicit softmax scale")
    if f.mask == OPAQUE:
        return Route(SDPA, f.mask_note or "mask handed over as given")
    if f.q_len > f.kv_len:
        return Route(SDPA, "q_len > kv_len")
    if f.q_len != f.kv_len and f.mask != PLAIN:
        # Only the "ffpa" mask function's CausalMask says bottom-right causal (KV-shared layers
        # sliced to logits_to_keep), which the kernels implement; a None from stock's sdpa_mask
        # means SDPA's top-left is_causal, and a tensor here comes with a cache.
        return Route(SDPA, "q_len != kv_len (cache or chunked prefill)")
    if not f.kernel_problem:
        kernel = FA4 if f.is_sliding else FFPA
    elif f.flex_ok:
        kernel = FLEX  # sliding layer without flash-attn-4
    elif f.is_sliding and f.backend == BACKEND_SDPA:
        return Route(SDPA, f"drop-in path: sliding layers use flash-attn-4 only ({f.kernel_problem})")
    elif f.is_sliding:
        return Route(SDPA, f"{f.kernel_problem}; {f.flex_problem}")
    else:
        return Route(SDPA, f.kernel_problem)
    return Route(kernel, "masked (to analyse)" if f.mask == TENSOR else "dense causal")


def refine(route: Route, layout_kind: str, flex_takes_it: bool = False) -> Route:
    """Finish a fused route once the mask's structure is known; ``flex_takes_it``: FlexAttention
    may take a mask the fused kernels cannot express (a bool 4-D mask, ``CallFacts.flex_ok``)."""
    if layout_kind == "dense":
        return Route(route.kernel, "dense causal (mask is plain causal)")
    if layout_kind == "varlen":
        return Route(route.kernel, "varlen (padding/packing)")
    if flex_takes_it:
        return Route(FLEX, "mask is not causal+padding/packing (e.g. bidirectional image blocks): BlockMask")
    return Route(SDPA, "mask is not causal+padding/packing (e.g. bidirectional image blocks)")


# -- inside a compiled graph ------------------------------------------------------------------
DIRECT, OP, EAGER_REGION = "direct", "op", "eager region"
AS_GIVEN = "FlexAttention with the mask as given"


def in_graph(route: Route, f: CallFacts, traceable: bool, op_available: bool, bool_mask: bool) -> tuple[str, Route]:
    """How ``route`` runs while Dynamo traces, and the route it then is:
    - DIRECT: traced as in eager (fallbacks; traceable kernels that need no look inside the
      mask; FlexAttention, which takes a bool mask exactly as given);
    - OP: the opaque custom op reads the mask and runs the kernel at run time (masks are data,
      and flash-attn-4's launcher is not traceable);
    - EAGER_REGION: one graph break, the eager path (a torch without the op's private APIs)."""
    if not route.fused:
        return DIRECT, route
    if route.kernel == FLEX and f.mask == TENSOR and bool_mask:
        return DIRECT, Route(FLEX, AS_GIVEN)
    if f.mask != TENSOR and traceable:
        return DIRECT, route
    if op_available:
        return OP, route
    if f.flex_ok and (f.mask != TENSOR or bool_mask):
        return DIRECT, Route(FLEX, AS_GIVEN + " (this torch has no custom-op autograd)")
    return EAGER_REGION, route


def strict_violation(is_sliding: bool, head_dim: int, route: Route) -> bool:
    """Strict mode raises for a head_dim > 256 full layer that did not run a fused kernel,
    unless the route was the call's or the user's own choice."""
    return not is_sliding and head_dim > 256 and not route.fused and not route.chosen and route.kernel != REFUSE
