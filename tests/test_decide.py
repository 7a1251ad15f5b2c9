"""The pure route decision, branch by branch: eager, refine and in-graph alike."""
import pytest

from ffpa_patch.kernels import Offer
from ffpa_patch.names import InGraph, Mask, Shape
from ffpa_patch.routing.decide import MISSING_MASK, CallFacts, Route, decide, in_graph, refine, strict_violation

DIRECT, EAGER_REGION, OP = InGraph.DIRECT, InGraph.EAGER_REGION, InGraph.OP
NONE, OPAQUE, PLAIN, TENSOR = Mask.NONE, Mask.OPAQUE, Mask.PLAIN, Mask.TENSOR
BASE = dict(backend="ffpa", is_sliding=False, is_causal=True, head_dim=512, q_len=8, kv_len=8,
            mask=PLAIN, dropout=0.0, scaling=1.0, softcap=None)


def facts(kernel_problem=None, flex_problem=None, **kw):
    """The production table's offers: FFPA for full layers; flash-attn-4 then FlexAttention
    (which the drop-in never takes) for sliding layers."""
    kw = {**BASE, **kw}
    if kw["is_sliding"]:
        if kw["backend"] == "sdpa":
            flex_problem = "flex: not on the drop-in path"
        offers = (Offer("fa4", kernel_problem, False), Offer("flex", flex_problem, True))
    else:
        offers = (Offer("ffpa", kernel_problem, False),)
    return CallFacts(**kw, offers=offers)


def route(**kw):
    return decide(facts(**kw))


@pytest.mark.parametrize("change, kernel, needle", [
    ({}, "ffpa", "dense causal"),
    ({"is_sliding": True, "head_dim": 256}, "fa4", "dense causal"),
    ({"mask": TENSOR}, "ffpa", "masked"),
    ({"softcap": 30.0}, "eager", "softcap"),
    ({"q_len": 1}, "sdpa", "decode"),
    ({"is_causal": False}, "sdpa", "bidirectional"),
    ({"is_causal": False, "mask": NONE}, "sdpa", "bidirectional"),  # stock's bidirectional "no mask needed"
    ({"backend": "sdpa", "is_sliding": True}, "fa4", "dense causal"),
    ({"backend": "sdpa", "mask": NONE}, "ffpa", "dense causal"),  # drop-in: stock sdpa_mask's "use is_causal"
    ({"is_sliding": True, "kernel_problem": "no fa4"}, "flex", "dense causal"),
    ({"is_sliding": True, "kernel_problem": "no fa4", "mask": TENSOR}, "flex", "masked"),
    ({"is_sliding": True, "kernel_problem": "no fa4", "flex_problem": "device cpu"}, "sdpa", "no fa4"),
    ({"backend": "sdpa", "is_sliding": True, "kernel_problem": "no fa4"}, "sdpa", "no fa4"),
    ({"flex_problem": None, "kernel_problem": "device cpu"}, "sdpa", "device cpu"),  # full layers never take flex
    ({"dropout": 0.1}, "sdpa", "dropout"),
    ({"scaling": None}, "sdpa", "scale"),
    ({"q_len": 4, "mask": TENSOR}, "sdpa", "q_len != kv_len"),
    ({"q_len": 4, "backend": "sdpa", "mask": NONE}, "sdpa", "q_len != kv_len"),  # SDPA's top-left is_causal
    ({"q_len": 4}, "ffpa", "dense causal"),  # a CausalMask: tail-sliced queries, bottom-right
    ({"q_len": 9}, "sdpa", "q_len > kv_len"),
    ({"kernel_problem": "device cpu"}, "sdpa", "device cpu"),
    ({"mask": OPAQUE, "mask_note": "mask requires grad"}, "sdpa", "requires grad"),
    ({"backend": "sdpa", "sdpa_pinned": "math"}, "sdpa", "sdpa_kernel() pins SDPA to math"),
    ({"sdpa_pinned": "math"}, "ffpa", "dense causal"),  # the "ffpa" backend is the user's explicit choice
    ({"backend": "sdpa", "context_parallel": True}, "sdpa", "context parallel"),
    ({"context_parallel": True}, "refuse", "context parallelism"),
    ({"mask": NONE}, "refuse", MISSING_MASK),
    ({"mask": NONE, "softcap": 5.0}, "refuse", MISSING_MASK),  # no fallback guesses the padding either
])
def test_decide(change, kernel, needle):
    r = route(**change)
    assert r.kernel == kernel and needle in r.reason


def test_a_fallback_reason_is_the_preferred_kernels_and_a_candidate_behind_it_does_not_rewrite_it():
    one = CallFacts(**{**BASE, "is_sliding": True}, offers=(Offer("fa4", "dtype fp32", False),))
    two = one._replace(offers=(*one.offers, Offer("second", "needs sm100", False)))
    assert decide(one) == decide(two) == Route("sdpa", "dtype fp32")
    gone = one._replace(offers=(Offer("fa4", "flash-attn-4 not installed", False, absent=True), Offer("flex", "device cpu", True)))
    assert decide(gone) == Route("sdpa", "device cpu")  # a candidate not installed lets the next one explain


def test_refine():
    assert refine(Route("ffpa", "masked"), Shape.DENSE).kernel == "ffpa"
    assert "varlen" in refine(Route("fa4", "masked"), Shape.VARLEN).reason
    assert refine(Route("ffpa", "masked"), Shape.OTHER).kernel == "sdpa"
    assert refine(Route("fa4", "masked"), Shape.OTHER).kernel == "sdpa"
    assert refine(Route("fa4", "masked"), Shape.OTHER, mask_offer=Offer("flex", None, True)).kernel == "flex"
    assert refine(Route("flex", "masked"), Shape.VARLEN).kernel == "flex"


def test_flex_only_for_sliding_layers_on_the_ffpa_backend():
    assert facts(is_sliding=True).mask_kernel == "flex"
    assert facts(is_sliding=True, backend="sdpa").mask_kernel is None
    assert facts(is_sliding=True, flex_problem="no").mask_kernel is None
    assert facts().mask_kernel is None


def test_the_table_names_the_kernel_in_its_order():
    """decide takes the first offer that accepts the call, whatever its name; a second
    full-layer candidate serves when the first refuses."""
    two = (Offer("full_sm100", "not sm100", False), Offer("ffpa2", None, False))
    assert decide(CallFacts(**BASE, offers=two)) == Route("ffpa2", "dense causal")
    first = (Offer("mine", None, False), Offer("ffpa", None, False))
    assert decide(CallFacts(**BASE, offers=first)).kernel == "mine"
    none = (Offer("a", "no a", False), Offer("b", "no b", False))
    assert decide(CallFacts(**BASE, offers=none)) == Route("sdpa", "no a")  # the preferred kernel's refusal
    assert decide(CallFacts(**BASE)).reason == "no kernel in the table serves this layer"


@pytest.mark.parametrize("route_, change, traceable, op, bool_mask, mode, kernel", [
    (Route("sdpa", "x"), {}, False, True, True, DIRECT, "sdpa"),  # fallbacks trace as in eager
    (Route("ffpa", "dense causal"), {}, True, True, False, DIRECT, "ffpa"),  # a CausalMask: nothing to read
    (Route("ffpa", "masked"), {"mask": TENSOR}, True, True, True, OP, "ffpa"),  # a mask is data: the op reads it
    (Route("fa4", "dense causal"), {"is_sliding": True}, False, True, False, OP, "fa4"),  # fa4 does not trace
    (Route("flex", "masked"), {"is_sliding": True, "mask": TENSOR}, True, True, True, DIRECT, "flex"),  # takes it as given
    (Route("flex", "masked"), {"is_sliding": True, "mask": TENSOR}, True, True, False, OP, "flex"),  # a float mask
    (Route("fa4", "masked"), {"is_sliding": True, "mask": TENSOR}, False, False, True, DIRECT, "flex"),  # no op
    (Route("ffpa", "masked"), {"mask": TENSOR}, True, False, False, EAGER_REGION, "ffpa"),
])
def test_in_graph(route_, change, traceable, op, bool_mask, mode, kernel):
    got_mode, got = in_graph(route_, facts(**change), traceable, route_.kernel == "flex", op, bool_mask)
    assert (got_mode, got.kernel) == (mode, kernel)


def test_strict_only_flags_missed_full_layers():
    assert strict_violation(False, 512, Route("sdpa", "device cpu"))
    assert not strict_violation(False, 512, route(q_len=1))  # decode: the call's own nature
    assert not strict_violation(False, 512, route(backend="sdpa", sdpa_pinned="math"))  # the user's choice
    assert not strict_violation(True, 256, Route("sdpa", "x"))
    assert not strict_violation(False, 512, Route("ffpa", "dense causal"))


def test_the_chosen_kernel_travels_with_the_route():
    """decide hands dispatch the Kernel it chose (no lookup by name after choose), through refine too."""
    full, flex = object(), object()
    route = decide(CallFacts(**{**BASE, "mask": TENSOR}, offers=(Offer("ffpa", None, False, impl=full),)))
    assert route.impl is full and refine(route, Shape.VARLEN).impl is full
    assert refine(route, Shape.OTHER, mask_offer=Offer("flex", None, True, impl=flex)).impl is flex
    assert route.noted("cast").impl is full
