"""The repeat-KV fix on a real tiny Gemma4 (head_dim-512 full layers, GQA) per Transformers version."""
import pytest
import torch

import ffpa_patch
import tiny
from ffpa_patch.patches.sdpa_repeat_kv import _bug_present
from ffpa_patch.wrapping import is_ours


@pytest.fixture
def sdpa_calls(monkeypatch):
    """Record (head_dim, enable_gqa) of every torch SDPA call (a spy: the real function runs)."""
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, *args, **kwargs):
        calls.append((q.shape[-1], bool(kwargs.get("enable_gqa", False))))
        return real(q, k, v, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    return calls


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("kv_heads", [1, 2, 4])  # 1 alone would hide a missing repeat: it broadcasts
def test_fix_removes_enable_gqa_at_head_dim_512_and_keeps_logits(sdpa_calls, kv_heads):
    from transformers.integrations import sdpa_attention

    ffpa_patch.revert()
    model = tiny.causal_lm("dense31b", attn="eager", num_attention_heads=8, num_global_key_value_heads=kv_heads)
    ids = torch.randint(0, 128, (1, 24))
    reference = _logits(model, ids)
    model.set_attn_implementation("sdpa")
    buggy = _bug_present(sdpa_attention)

    stock = _logits(model, ids)
    stock_gqa512 = [c for c in sdpa_calls if c == (512, True)]
    assert bool(stock_gqa512) is buggy  # 5.5-5.12 call SDPA with enable_gqa at D=512; 5.13+ do not
    sdpa_calls.clear()

    try:
        st = ffpa_patch.apply(targets=["sdpa_repeat_kv"])
        row = next(p for p in st.patches if p["name"] == "sdpa_repeat_kv")
        assert row["state"] == ("applied" if buggy else "not needed")
        fixed = _logits(model, ids)
    finally:
        ffpa_patch.revert()
    assert any(c[0] == 512 for c in sdpa_calls)
    assert (512, True) not in sdpa_calls
    torch.testing.assert_close(fixed, reference, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(stock, reference, atol=2e-5, rtol=1e-4)


def test_fix_reaches_registry_entry_and_module_attribute():
    from transformers.integrations import sdpa_attention
    from transformers.modeling_utils import AttentionInterface

    ffpa_patch.revert()
    original = sdpa_attention.sdpa_attention_forward
    try:
        ffpa_patch.apply(targets=["sdpa_repeat_kv"])
        entry = AttentionInterface._global_mapping["sdpa"]
        assert (sdpa_attention.sdpa_attention_forward is not original) is _bug_present(sdpa_attention)
        assert (entry is not original) is _bug_present(sdpa_attention)
        if _bug_present(sdpa_attention):  # the registry holds a plain function (torch.compile traces it)
            assert is_ours(entry) and is_ours(sdpa_attention.sdpa_attention_forward)
            assert type(entry).__name__ == "function" and entry.__wrapped__ is original
    finally:
        ffpa_patch.revert()
    assert sdpa_attention.sdpa_attention_forward is original
    assert AttentionInterface._global_mapping["sdpa"] is original


def test_an_earlier_wrapper_on_sdpa_still_runs_for_the_fixed_call(monkeypatch, sdpa_calls):
    """e.g. an fp32-upcast override installed before ffpa_patch: the fix must not bypass it."""
    from transformers.integrations import sdpa_attention
    from transformers.modeling_utils import AttentionInterface

    ffpa_patch.revert()
    if not _bug_present(sdpa_attention):
        pytest.skip("the fix is not needed on this Transformers (5.13+)")
    stock, seen = sdpa_attention.sdpa_attention_forward, []

    def earlier(module, query, key, value, attention_mask, **kwargs):
        seen.append((key.shape[-1], key.shape[1] == query.shape[1], attention_mask is None))
        out, w = stock(module, query.float(), key.float(), value.float(), attention_mask, **kwargs)
        return out.to(query.dtype), w

    monkeypatch.setattr(sdpa_attention, "sdpa_attention_forward", earlier)
    monkeypatch.setitem(AttentionInterface._global_mapping, "sdpa", earlier)
    model = tiny.causal_lm("dense31b", attn="eager", num_attention_heads=8, num_global_key_value_heads=2)
    ids = torch.randint(0, 128, (1, 24))
    reference = _logits(model, ids)
    model.set_attn_implementation("sdpa")
    try:
        ffpa_patch.apply(targets=["sdpa_repeat_kv"])
        fixed = _logits(model, ids)
    finally:
        ffpa_patch.revert()
    assert (512, True, True) in seen  # the head_dim-512 call reached it, K/V repeated, mask-free
    assert (512, True) not in sdpa_calls
    torch.testing.assert_close(fixed, reference, atol=2e-5, rtol=1e-4)


def test_a_compiled_model_on_the_fixed_sdpa_has_no_graph_breaks_and_matches_eager():
    """On 5.5-5.12 the registry entry was a wrapt object, which Dynamo cannot guard
    ("FuncDefaultsGuardAccessor: Not a function": torch.compile raised an AssertionError)."""
    from torch._dynamo.utils import counters
    from transformers.integrations import sdpa_attention

    ffpa_patch.revert()
    if not _bug_present(sdpa_attention):
        pytest.skip("the fix is not needed on this Transformers (5.13+)")
    model = tiny.causal_lm("dense31b", attn="sdpa", num_attention_heads=8, num_global_key_value_heads=2)
    ids = torch.randint(0, 128, (1, 24))
    try:
        ffpa_patch.apply(targets=["sdpa_repeat_kv"])
        eager = _logits(model, ids)
        torch._dynamo.reset()
        counters.clear()
        compiled = _logits(torch.compile(model, backend="aot_eager"), ids)
    finally:
        ffpa_patch.revert()
        torch._dynamo.reset()
    assert dict(counters["graph_break"]) == {}
    torch.testing.assert_close(compiled, eager, atol=2e-5, rtol=1e-4)
