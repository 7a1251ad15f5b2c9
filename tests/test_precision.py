"""Which precision reaches the fused kernels, through the strict seam (it refuses fp32 as the GPU does).

Trainer's ``bf16=True`` is autocast over fp32 weights: Gemma4's q/k arrive fp32, v bf16.
Stock SDPA casts to bf16 there; the shim must too, or every layer falls back.
"""
import pytest
import torch

import tiny
from ffpa_patch.kernels import reference
from ffpa_patch.routing import stats
from ffpa_patch.routing.attention import route_attention
from ffpa_patch.routing.masks import CausalMask

CAST = "autocast: q/k/v cast to bfloat16"


def Layer(sliding: bool):
    """A real Gemma4 text attention layer of a tiny model (sliding window 8)."""
    model = tiny.causal_lm("dense31b")
    return next(l.self_attn for l in model.model.layers if l.self_attn.is_sliding == sliding)


def plain(sliding: bool) -> CausalMask:
    """What the "ffpa" mask function hands an unpadded batch's layers."""
    return CausalMask(8 if sliding else None)


def qkv(head_dim, dtypes=(torch.float32, torch.float32, torch.bfloat16), heads=(4, 1), s=16):
    g = torch.Generator().manual_seed(0)
    shapes = [(2, heads[0], s, head_dim), (2, heads[1], s, head_dim), (2, heads[1], s, head_dim)]
    return [torch.randn(*shape, generator=g).to(d).requires_grad_() for shape, d in zip(shapes, dtypes)]


@pytest.mark.parametrize("sliding", [False, True])
def test_autocast_casts_like_sdpa_and_grads_reach_fp32_inputs(sliding, patched, strict_kernels):
    q, k, v = qkv(32 if sliding else 512)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = route_attention(Layer(sliding), q, k, v, plain(sliding), backend="ffpa", scaling=0.1)
    kernel = "fa4" if sliding else "ffpa"
    assert [(r["kernel"], r["reason"]) for r in stats.snapshot()] == [(kernel, f"dense causal; {CAST}")]
    assert out.dtype == torch.bfloat16  # what SDPA returns under autocast
    want = reference.attention(*(t.detach().bfloat16().transpose(1, 2) for t in (q, k, v)), 0.1, 8 if sliding else None)
    torch.testing.assert_close(out, want, atol=0, rtol=0)
    out.float().square().sum().backward()
    assert (q.grad.dtype, k.grad.dtype, v.grad.dtype) == (torch.float32, torch.float32, torch.bfloat16)
    assert all(t.grad.abs().sum() > 0 for t in (q, k, v))


def test_fp32_outside_autocast_falls_back_as_on_the_gpu(patched, strict_kernels):
    q, k, v = qkv(512, dtypes=(torch.float32,) * 3)
    route_attention(Layer(False), q, k, v, plain(False), backend="ffpa", scaling=0.1)
    assert [(r["kernel"], r["reason"]) for r in stats.snapshot()] == [("sdpa", "dtype torch.float32 (FFPA needs fp16/bf16)")]


def test_mixed_dtypes_outside_autocast_are_not_guessed(patched, strict_kernels):
    q, k, v = qkv(512)
    with pytest.raises(RuntimeError):  # stock SDPA's own error: the fallback is exactly stock
        route_attention(Layer(False), q, k, v, plain(False), backend="ffpa", scaling=0.1)
    assert stats.snapshot()[0]["reason"] == "mixed q/k/v dtypes float32/float32/bfloat16 outside autocast"


def test_autocast_to_fp32_is_not_a_cast_to_half(patched, strict_kernels):
    q, k, v = qkv(512, dtypes=(torch.float32,) * 3)
    with torch.autocast("cpu", dtype=torch.float32, enabled=True):
        route_attention(Layer(False), q, k, v, plain(False), backend="ffpa", scaling=0.1)
    assert stats.snapshot()[0]["kernel"] == "sdpa"


def test_seam_refuses_what_the_kernels_refuse():
    k = reference.kernel_set()
    full, sliding = k.by_name("ffpa"), k.by_name("fa4")
    assert full.unsupported("cpu", torch.float32, 512) == "dtype torch.float32 (FFPA needs fp16/bf16)"
    assert full.unsupported("cpu", torch.bfloat16, 256) == "head_dim 256 not in 320..512 on sm90"
    assert full.unsupported("cpu", torch.bfloat16, 512) is None
    assert sliding.unsupported("cpu", torch.float16, 512) == "head_dim 512 not in 1..256 on sm90"
    assert sliding.unsupported("cpu", torch.float32, 128) == "dtype torch.float32 (flash-attn-4 needs fp16/bf16)"
    q = torch.zeros(1, 8, 2, 512, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="share fp16/bf16"):
        full.dense(q, q.float(), q, 0.1)
    with pytest.raises(ValueError, match="contiguous"):
        full.dense(q, q.transpose(1, 3).contiguous().transpose(1, 3), q, 0.1)
    packed = q[0]
    with pytest.raises(TypeError, match="int32"):
        full.varlen(packed, packed, packed, torch.tensor([0, 8]), 8, 0.1)


def _q_proj_grads(model, ids, kw, autocast: torch.dtype | None):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
        logits = model(ids, **kw).logits
        loss = logits.float().logsumexp(-1).mean()
    loss.backward()
    return logits, [layer.self_attn.q_proj.weight.grad for layer in model.model.layers]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind", ["text", "packed"])
def test_fp32_model_under_autocast_runs_every_layer_fused(kind, dtype, patched, strict_kernels):
    """Every layer fused under autocast (Trainer's bf16=True or fp16=True), stock's output
    dtype, fp32 gradients, and each layer's q_proj gradient as close to the fp32 model's as
    stock SDPA's under the same autocast."""
    from test_model_routes import batch, n_layers

    ids, kw, _ = batch(kind)
    _, want = _q_proj_grads(tiny.causal_lm("dense31b", attn="eager"), ids, kw, autocast=None)
    model = tiny.causal_lm("dense31b", attn="sdpa")  # fp32 weights, as Trainer(bf16=True) keeps them
    stock, stock_grads = _q_proj_grads(model, ids, kw, autocast=dtype)
    stats.reset()
    model.set_attn_implementation("ffpa")
    logits, grads = _q_proj_grads(model, ids, kw, autocast=dtype)
    assert logits.dtype == stock.dtype
    rows = stats.snapshot()
    cast = f"autocast: q/k/v cast to {str(dtype).removeprefix('torch.')}"
    assert all(r["kernel"] in ("ffpa", "fa4") and r["reason"].endswith(cast) for r in rows), rows
    assert stats.total("full", "ffpa") == n_layers(model, "full")
    assert all(p.grad.dtype == torch.float32 for p in model.parameters() if p.grad is not None)
    assert tiny.relative_error(logits, stock) < 0.05  # bf16 rounding: ~0.012 here; a wrong mask is far off
    for got, floor, fp32 in zip(grads, stock_grads, want):
        assert tiny.relative_error(got, fp32) <= 1.25 * tiny.relative_error(floor, fp32) + 5e-3


def test_bf16_model_runs_fused_without_a_cast(patched, strict_kernels):
    from test_model_routes import batch

    ids, kw, _ = batch("left_pad")
    model = tiny.causal_lm("dense31b", attn="ffpa").bfloat16()
    model(ids, **kw)
    rows = stats.snapshot()
    assert rows and all(r["kernel"] in ("ffpa", "fa4") and "autocast" not in r["reason"] for r in rows), rows
