"""Which kernel one attention call takes, as pure functions of facts: the one decision path.

``decide`` routes a call before anyone looks inside its mask; ``refine`` finishes a fused
route once the mask's structure is known; ``in_graph`` says how a route runs inside a
compiled graph. The kernels are whatever the kernel table offers for the layer, in its order
(``CallFacts.offers``): a route names a table kernel or a ``Fallback``, never a kernel of its
own choosing. Kept free of tensors so every branch is tested without a model, and so the
same reasons appear in ``stats()``, ``status()`` and strict-mode errors.
"""
from __future__ import annotations

from typing import NamedTuple

from ..names import Backend, Fallback, InGraph, Mask, Shape

SDPA, EAGER, REFUSE = Fallback.SDPA, Fallback.EAGER, Fallback.REFUSE

DECODE = "decode (q_len == 1)"
DENSE_CAUSAL = "dense causal"
TO_ANALYSE = "masked (to analyse)"
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


class Route(NamedTuple):  # (a tuple: made several times per attention call)
    kernel: str  # a table kernel's name, or a Fallback
    reason: str
    chosen: bool = False  # the call's or the user's own choice (decode, CP, sdpa_kernel), not a missed chance
    impl: object = None  # the table's Kernel when ``kernel`` names one: dispatch runs it without a lookup

    @property
    def fused(self) -> bool:
        """A kernel of the table (anything but a Fallback)."""
        return self.kernel not in (SDPA, EAGER, REFUSE)

    def noted(self, *notes: str | None) -> Route:
        """The route with notes (an autocast cast, deterministic mode) added to its reason."""
        extra = "; ".join(n for n in notes if n)
        return self._replace(reason=f"{self.reason}; {extra}") if extra else self


class CallFacts(NamedTuple):
    backend: Backend
    is_sliding: bool
    is_causal: bool
    head_dim: int
    q_len: int
    kv_len: int
    mask: Mask
    dropout: float
    scaling: float | None
    softcap: float | None
    offers: tuple = ()  # kernels.Offer per table kernel serving this layer, in the table's order
    mask_note: str | None = None  # why an OPAQUE mask is handed over as given; why a SEQUENCE_PARALLEL call refuses
    context_parallel: bool = False
    sdpa_pinned: str | None = None  # the SDPA backends a user's sdpa_kernel(...) leaves on, or None

    @property
    def mask_offer(self):
        """The first kernel's offer that takes this call with any mask (FlexAttention), or None."""
        for offer in self.offers:
            if offer.any_mask and offer.problem is None:
                return offer
        return None

    @property
    def mask_kernel(self) -> str | None:
        """That kernel's name (what crosses the custom op's boundary), or None."""
        offer = self.mask_offer
        return None if offer is None else offer.kernel


def decide(f: CallFacts) -> Route:
    """Route before looking inside the mask; ``refine`` finishes the job for TENSOR masks."""
    if f.context_parallel:
        if f.backend == Backend.FFPA:
            return Route(REFUSE, CP_MESSAGE)
        return Route(SDPA, CP_REASON, chosen=True)
    if f.is_causal and f.mask == Mask.NONE and f.backend == Backend.FFPA:
        return Route(REFUSE, MISSING_MASK)
    if f.mask == Mask.SEQUENCE_PARALLEL and f.mask_note:  # the gathered sequence's layout cannot be known exactly
        return Route(REFUSE, f.mask_note)
    if f.softcap:
        return Route(EAGER, "attention softcap (no fused kernel here supports it)")
    if f.q_len == 1:
        return Route(SDPA, DECODE, chosen=True)
    if not f.is_causal:
        return Route(SDPA, "bidirectional attention (module.is_causal is False)")
    if f.backend == Backend.SDPA and f.sdpa_pinned:
        return Route(SDPA, f"sdpa_kernel() pins SDPA to {f.sdpa_pinned}", chosen=True)
    if f.dropout:
        return Route(SDPA, "attention dropout > 0")
    if f.scaling is None:
        return Route(SDPA, "no explicit softmax scale")
    if f.mask == Mask.OPAQUE:
        return Route(SDPA, f.mask_note or "mask handed over as given")
    if f.q_len > f.kv_len:
        return Route(SDPA, "q_len > kv_len")
    if f.q_len != f.kv_len and f.mask != Mask.PLAIN:
        # Only the "ffpa" mask function's CausalMask says bottom-right causal (KV-shared layers
        # sliced to logits_to_keep), which the kernels implement; a None from stock's sdpa_mask
        # means SDPA's top-left is_causal, and a tensor here comes with a cache.
        return Route(SDPA, "q_len != kv_len (cache or chunked prefill)")
    for offer in f.offers:
        if offer.problem is None:
            return Route(offer.kernel, TO_ANALYSE if f.mask in (Mask.TENSOR, Mask.SEQUENCE_PARALLEL) else DENSE_CAUSAL,
                         impl=offer.impl)
    # the refusal of the first candidate on this machine (a candidate added behind it does not rewrite the
    # reasons of its layer kind; one that is not installed says so in status, and lets the next one explain)
    present = [o for o in f.offers if not o.absent] or f.offers
    return Route(SDPA, present[0].problem if present else "no kernel in the table serves this layer")


BLOCKS_REASON = "causal + bidirectional image blocks (in-block keys merged by log-sum-exp)"
SEQUENCE_PARALLEL = "Ulysses sequence parallel, whole sequence on this rank's heads"


def refine(route: Route, shape: Shape, mask_offer=None, merges: bool = False) -> Route:
    """Finish a fused route once the mask's structure is known; ``mask_offer``: the offer of the table
    kernel that takes a mask the others cannot express (a bool 4-D mask, ``CallFacts.mask_offer``);
    ``merges``: the route's kernel takes bidirectional blocks (``Kernel.merges``)."""
    if shape == Shape.DENSE:
        return route._replace(reason="dense causal (mask is plain causal)")
    if shape == Shape.VARLEN:
        return route._replace(reason="varlen (padding/packing)")
    if shape == Shape.BLOCKS and merges:
        return route._replace(reason=BLOCKS_REASON)
    if mask_offer is not None:
        return Route(mask_offer.kernel, "mask is not causal+padding/packing (e.g. bidirectional image blocks): BlockMask",
                     impl=mask_offer.impl)
    return Route(SDPA, "mask is not causal+padding/packing (e.g. bidirectional image blocks)")


# -- inside a compiled graph ------------------------------------------------------------------
AS_GIVEN = "the mask as given"


def in_graph(route: Route, f: CallFacts, traceable: bool, any_mask: bool, op_available: bool,
             bool_mask: bool) -> tuple[InGraph, Route]:
    """How ``route`` runs while Dynamo traces, and the route it then is (``traceable`` and
    ``any_mask`` describe the route's kernel):
    - DIRECT: traced as in eager (fallbacks; traceable kernels that need no look inside the
      mask; a kernel that takes any mask, given a bool mask exactly as it is);
    - OP: the opaque custom op reads the mask and runs the kernel at run time (masks are data,
      and flash-attn-4's launcher is not traceable);
    - EAGER_REGION: one graph break, the eager path (a torch without the op's private APIs)."""
    if not route.fused:
        return InGraph.DIRECT, route
    if any_mask and f.mask == Mask.TENSOR and bool_mask:
        return InGraph.DIRECT, route._replace(reason=AS_GIVEN)
    if f.mask != Mask.TENSOR and traceable:
        return InGraph.DIRECT, route
    if op_available:
        return InGraph.OP, route
    if f.mask_offer is not None and (f.mask != Mask.TENSOR or bool_mask):
        return InGraph.DIRECT, Route(f.mask_kernel, AS_GIVEN + " (this torch has no custom-op autograd)", impl=f.mask_offer.impl)
    return InGraph.EAGER_REGION, route


def strict_violation(is_sliding: bool, head_dim: int, route: Route, counts_as_fused: bool | None = None) -> bool:
    """Strict mode raises for a head_dim > 256 full layer that did not run a fused kernel (a table
    kernel whose catalog row says it does not count as one, ``counts_as_fused=False``, included),
    unless the route was the call's or the user's own choice."""
    fused = route.fused if counts_as_fused is None else counts_as_fused
    return not is_sliding and head_dim > 256 and not fused and not route.chosen and route.kernel != REFUSE
