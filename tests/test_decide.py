"""The pure route decision, branch by branch."""
import pytest

from ffpa_patch.routing.decide import CallFacts, Route, decide, refine, should_have_run_ffpa

BASE = dict(backend="ffpa", is_sliding=False, is_causal=True, head_dim=512, q_len=8, kv_len=8,
            mask_given=False, dropout=0.0, scaling=1.0, softcap=None, kernel_problem=None,
            flex_problem=None)


def route(**kw):
    return decide(CallFacts(**{**BASE, **kw}))


@pytest.mark.parametrize("change, kernel, needle", [
    ({}, "ffpa", "dense causal"),
    ({"is_sliding": True, "head_dim": 256}, "fa4", "dense causal"),
    ({"mask_given": True}, "ffpa", "masked"),
    ({"softcap": 30.0}, "eager", "softcap"),
    ({"q_len": 1}, "sdpa", "decode"),
    ({"is_causal": False}, "sdpa", "bidirectional"),
    ({"backend": "sdpa", "is_sliding": True}, "fa4", "dense causal"),
    ({"is_sliding": True, "kernel_problem": "no fa4"}, "flex", "dense causal"),
    ({"is_sliding": True, "kernel_problem": "no fa4", "mask_given": True}, "flex", "masked"),
    ({"is_sliding": True, "kernel_problem": "no fa4", "flex_problem": "device cpu"}, "sdpa", "no fa4; device cpu"),
    ({"backend": "sdpa", "is_sliding": True, "kernel_problem": "no fa4"}, "sdpa", "flash-attn-4 only (no fa4)"),
    ({"flex_problem": None, "kernel_problem": "device cpu"}, "sdpa", "device cpu"),  # full layers never take flex
    ({"dropout": 0.1}, "sdpa", "dropout"),
    ({"scaling": None}, "sdpa", "scale"),
    ({"q_len": 4, "mask_given": True}, "sdpa", "q_len != kv_len"),
    ({"q_len": 4, "backend": "sdpa"}, "sdpa", "q_len != kv_len"),
    ({"q_len": 4}, "ffpa", "dense causal"),  # ffpa backend, no mask: tail-sliced queries
    ({"q_len": 9}, "sdpa", "q_len > kv_len"),
    ({"kernel_problem": "device cpu"}, "sdpa", "device cpu"),
])
def test_decide(change, kernel, needle):
    r = route(**change)
    assert r.kernel == kernel and needle in r.reason


def test_refine():
    assert refine(Route("ffpa", "masked"), "dense").kernel == "ffpa"
    assert "varlen" in refine(Route("fa4", "masked"), "varlen").reason
    assert refine(Route("ffpa", "masked"), "other").kernel == "sdpa"
    assert refine(Route("fa4", "masked"), "other").kernel == "sdpa"
    assert refine(Route("fa4", "masked"), "other", flex_ok=True).kernel == "flex"
    assert refine(Route("flex", "masked"), "varlen").kernel == "flex"


def test_flex_only_for_sliding_layers_on_the_ffpa_backend():
    sliding = CallFacts(**{**BASE, "is_sliding": True})
    assert sliding.flex_ok
    assert not CallFacts(**{**BASE, "is_sliding": True, "backend": "sdpa"}).flex_ok
    assert not CallFacts(**{**BASE, "is_sliding": True, "flex_problem": "no"}).flex_ok
    assert not CallFacts(**BASE).flex_ok


def test_strict_only_flags_missed_full_layers():
    assert should_have_run_ffpa(False, 512, Route("sdpa", "device cpu"))
    assert not should_have_run_ffpa(False, 512, Route("sdpa", "decode (q_len == 1)"))
    assert not should_have_run_ffpa(True, 256, Route("sdpa", "x"))
    assert not should_have_run_ffpa(False, 512, Route("ffpa", "dense causal"))
