"""Odd input that must give stock's numbers (or run where stock runs): soft masks, inference
tensors edited in place, mask-less q_len < kv_len fallbacks, batches with no real token."""
import pytest
import torch

import tiny
from ffpa_patch.routing import masks, stats
from ffpa_patch.routing.attention import route_attention


def full_attention(model):
    return next(l.self_attn for l in model.model.layers if not l.self_attn.is_sliding)


def expand(kv, heads):
    return kv.repeat_interleave(heads // kv.shape[1], dim=1)


def sdpa(q, k, mask, scale=1.0):
    """Stock's arithmetic: [B, H, S, D] in, [B, S, H, D] out."""
    out = torch.nn.functional.scaled_dot_product_attention(q, expand(k, q.shape[1]), expand(k, q.shape[1]),
                                                           attn_mask=mask, scale=scale)
    return out.transpose(1, 2)


def padding_mask(s=16, pad=4):
    """Additive [1, 1, S, S]: causal, the first ``pad`` keys masked with the dtype's min."""
    allowed = torch.ones(s, s, dtype=torch.bool).tril()
    allowed[:, :pad] = False
    allowed[range(pad), range(pad)] = True  # padding rows see themselves (no empty row)
    return torch.zeros(s, s).masked_fill(~allowed, torch.finfo(torch.float32).min)[None, None]


@pytest.mark.parametrize("bias", ["penalty", "alibi"])
def test_a_soft_additive_mask_reaches_sdpa_as_given(bias, patched, reference_kernels):
    attn = full_attention(tiny.causal_lm("dense31b"))
    torch.manual_seed(0)
    q, k = torch.randn(1, 4, 16, 512), torch.randn(1, 1, 16, 512)
    mask = padding_mask()
    if bias == "penalty":  # a finite penalty on the keys after the padding: read as more padding before
        mask[..., 4:7] = torch.where(mask[..., 4:7] == 0, -1.0, mask[..., 4:7])
    else:
        i, j = torch.arange(16)[:, None], torch.arange(16)[None, :]
        mask = mask + (-0.5 * (i - j).clamp_min(0)).float()[None, None]
    out, _ = route_attention(attn, q, k, k, mask, backend="ffpa", scaling=1.0)
    torch.testing.assert_close(out, sdpa(q, k, mask), atol=1e-5, rtol=1e-4)
    assert stats.total("full", "ffpa") == 0
    assert masks.read(mask, 1, None).kind == "other"
    assert masks.read(padding_mask(), 1, None).kind == "varlen"  # the hard mask still is


def test_an_inference_mask_edited_in_place_is_read_again(patched, reference_kernels):
    attn = full_attention(tiny.causal_lm("dense31b"))
    torch.manual_seed(0)
    # logits ~N(0, 1) (scaling is 1.0): a saturated softmax would compare rounding noise
    q, k = torch.randn(1, 4, 16, 512) * 512**-0.25, torch.randn(1, 1, 16, 512) * 512**-0.25
    with torch.inference_mode():
        mask = padding_mask(pad=2)
        route_attention(attn, q, k, k, mask, backend="ffpa", scaling=1.0)
        mask.copy_(padding_mask(pad=6))  # a reused buffer, the next batch's padding
        out, _ = route_attention(attn, q, k, k, mask, backend="ffpa", scaling=1.0)
        want = sdpa(q, k, mask)
    real = slice(6, None)  # padded query rows are not compared: kernels leave them zero
    torch.testing.assert_close(out[:, real], want[:, real], atol=1e-5, rtol=1e-4)
    assert stats.total("full", "ffpa") == 2


@pytest.mark.parametrize("layer", ["full", "sliding"])
def test_a_mask_less_fallback_with_fewer_queries_than_keys_is_bottom_right_causal(layer, patched):
    """No seam: on CPU the kernels cannot run, so this is the fallback of a call the kernels
    would have taken (the "ffpa" backend, a CausalMask, q_len < kv_len: KV-shared layers
    whose queries Transformers 5.23+ sliced to logits_to_keep)."""
    model = tiny.causal_lm("dense31b")
    attn = next(l.self_attn for l in model.model.layers if l.self_attn.is_sliding == (layer == "sliding"))
    d, hk, window = (32, 2, attn.sliding_window) if layer == "sliding" else (512, 1, None)
    torch.manual_seed(0)
    q, k = torch.randn(1, 4, 5, d), torch.randn(1, hk, 12, d)
    out, _ = route_attention(attn, q, k, k, masks.CausalMask(window)[:, :, -5:, :], backend="ffpa", scaling=1.0,
                             sliding_window=window)
    i, j = torch.arange(5)[:, None] + 7, torch.arange(12)[None, :]
    allowed = (j <= i) & ((i - j < window) if window else True)
    torch.testing.assert_close(out, sdpa(q, k, allowed[None, None]), atol=1e-5, rtol=1e-4)
    assert any("needs CUDA" in r["reason"] for r in stats.snapshot()), stats.snapshot()


@pytest.mark.parametrize("attn", ["ffpa", "sdpa"])  # sdpa: the drop-in path
def test_batches_with_no_real_token_run_as_stock(attn, patched, reference_kernels):
    import ffpa_patch

    model = tiny.causal_lm("dense31b", attn=attn)
    ids = torch.randint(0, 128, (2, 8))
    cases = {"all padding": torch.zeros(2, 8, dtype=torch.long),
             "one empty row": torch.tensor([[0] * 8, [0, 0] + [1] * 6]),
             "batch 0": torch.zeros(0, 8, dtype=torch.long)}
    for name, mask in cases.items():
        batch = ids[: mask.shape[0]]
        ffpa_patch.revert()
        model.set_attn_implementation("sdpa")
        try:
            stock = model(batch, attention_mask=mask).logits
        except RuntimeError as exc:  # batch 0: stock Gemma4 cannot reshape it either
            stock = exc
        ffpa_patch.apply()
        model.set_attn_implementation(attn)
        if isinstance(stock, Exception):
            with pytest.raises(type(stock), match="reshape"):
                model(batch, attention_mask=mask)
            continue
        ours = model(batch, attention_mask=mask).logits
        real = mask.bool()
        assert ours.shape == stock.shape, name
        torch.testing.assert_close(ours[real], stock[real], atol=1e-4, rtol=1e-4, msg=name)
        if name == "all padding":
            torch.testing.assert_close(ours, stock, equal_nan=True, msg=name)
