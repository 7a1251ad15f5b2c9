"""Each fallback reason: triggered for real, the reason recorded, the result still correct."""
import pytest
import torch

import ffpa_patch
import tiny
from ffpa_patch.routing import stats
from ffpa_patch.routing.masks import CausalMask
from ffpa_patch import FFPAFallbackError
from ffpa_patch.routing.attention import route_attention


def reasons(layer="full"):
    return {r["reason"] for r in stats.snapshot() if r["layer"] == layer and r["kernel"] != "ffpa"}


def full_attention_module(model):
    return next(l.self_attn for l in model.model.layers if not l.self_attn.is_sliding)


def test_kernel_unavailable_on_cpu_falls_back_to_sdpa_with_reason(patched):
    model = tiny.causal_lm("dense31b", attn="eager")
    ids = torch.randint(0, 128, (2, 16))
    ref = model(ids).logits
    model.set_attn_implementation("ffpa")
    out = model(ids).logits  # the real kernel set: CPU tensors are not eligible
    torch.testing.assert_close(out, ref, atol=5e-5, rtol=1e-4)
    assert any("FFPA needs CUDA" in r for r in reasons())


def test_strict_raises_naming_the_reason(patched):
    ffpa_patch.apply(strict=True)
    model = tiny.causal_lm("dense31b", attn="ffpa")
    with pytest.raises(FFPAFallbackError, match="FFPA needs CUDA"):
        model(torch.randint(0, 128, (1, 8)))


def test_decode_and_chunked_prefill_use_sdpa_and_match_full_forward(patched, reference_kernels):
    model = tiny.causal_lm("dense31b", attn="eager", use_cache=True)
    ids = torch.randint(0, 128, (1, 20))
    ref = model(ids, use_cache=False).logits
    model.set_attn_implementation("ffpa")
    first = model(ids[:, :12], use_cache=True)
    chunk = model(ids[:, 12:19], past_key_values=first.past_key_values, use_cache=True)
    step = model(ids[:, 19:], past_key_values=chunk.past_key_values, use_cache=True)
    torch.testing.assert_close(first.logits, ref[:, :12], atol=5e-5, rtol=1e-4)
    torch.testing.assert_close(chunk.logits, ref[:, 12:19], atol=5e-5, rtol=1e-4)
    torch.testing.assert_close(step.logits, ref[:, 19:], atol=5e-5, rtol=1e-4)
    assert {"decode (q_len == 1)", "q_len != kv_len (cache or chunked prefill)"} <= reasons()
    assert stats.total("full", "ffpa") == 1  # only the first (prefill) call ran FFPA


def test_a_mask_of_no_known_structure_goes_to_sdpa_with_mask(patched, reference_kernels):
    model = tiny.causal_lm("dense31b", attn="eager")
    attn = full_attention_module(model)
    torch.manual_seed(0)
    q = torch.randn(1, 4, 16, 512)
    k = torch.randn(1, 1, 16, 512)
    mask = torch.ones(16, 16, dtype=torch.bool).tril()
    mask[4, 9] = True  # one later key, outside any block
    mask = mask[None, None]
    out, _ = route_attention(attn, q, k, k, mask, backend="ffpa", scaling=1.0)
    from transformers.models.gemma4.modeling_gemma4 import eager_attention_forward

    additive = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    ref, _ = eager_attention_forward(attn, q, k, k, additive, scaling=1.0)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
    assert any("not causal+padding" in r for r in reasons())


def test_softcap_goes_to_eager_with_softcap(patched, reference_kernels):
    model = tiny.causal_lm("dense31b", attn="eager")
    attn = full_attention_module(model)
    q, k = torch.randn(1, 4, 8, 512), torch.randn(1, 1, 8, 512)
    out, _ = route_attention(attn, q, k, k, CausalMask(), backend="ffpa", scaling=1.0, softcap=5.0)
    from transformers.models.gemma4.modeling_gemma4 import eager_attention_forward

    causal = torch.zeros(8, 8).masked_fill(~torch.ones(8, 8, dtype=torch.bool).tril(), torch.finfo(torch.float32).min)
    ref, _ = eager_attention_forward(attn, q, k, k, causal[None, None], scaling=1.0, softcap=5.0)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
    assert any("softcap" in r for r in {x["reason"] for x in stats.snapshot()})


def test_sliding_layer_without_a_mask_falls_back_with_its_window(patched, reference_kernels):
    # the "ffpa" mask function leaves a plain sliding window to the kernels (a CausalMask); a fallback must build it
    model = tiny.causal_lm("dense31b", attn="eager")
    attn = next(l.self_attn for l in model.model.layers if l.self_attn.is_sliding)
    window = attn.sliding_window
    q, k = torch.randn(1, 4, 2 * window, 32), torch.randn(1, 2, 2 * window, 32)
    out, _ = route_attention(attn, q, k, k, CausalMask(window), backend="ffpa", scaling=1.0, sliding_window=window, softcap=5.0)
    from transformers.models.gemma4.modeling_gemma4 import eager_attention_forward

    i, j = torch.arange(2 * window)[:, None], torch.arange(2 * window)[None, :]
    allowed = (j <= i) & (i - j < window)
    additive = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
    ref, _ = eager_attention_forward(attn, q, k, k, additive[None, None], scaling=1.0, softcap=5.0)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
    assert reasons("sliding") == {"attention softcap (no fused kernel here supports it)"}


def test_bidirectional_module_is_not_sent_to_causal_kernels(patched, reference_kernels):
    model = tiny.causal_lm("dense31b", attn="eager")
    attn = full_attention_module(model)
    attn.is_causal = False
    q, k = torch.randn(1, 4, 8, 512), torch.randn(1, 1, 8, 512)
    out, _ = route_attention(attn, q, k, k, None, backend="ffpa", scaling=1.0)  # stock's bidirectional "no mask"
    ref = torch.nn.functional.scaled_dot_product_attention(q, k.repeat(1, 4, 1, 1), k.repeat(1, 4, 1, 1), scale=1.0)
    torch.testing.assert_close(out, ref.transpose(1, 2), atol=1e-5, rtol=1e-4)
    assert any("bidirectional" in r for r in reasons())


def test_training_dropout_falls_back(patched, reference_kernels):
    model = tiny.causal_lm("dense31b", attn="ffpa", attention_dropout=0.5).train()
    out = model(torch.randint(0, 128, (1, 8))).logits
    assert torch.isfinite(out).all()
    assert "attention dropout > 0" in reasons()
    model.eval()
    stats.reset()
    model(torch.randint(0, 128, (1, 8)))
    assert stats.total("full", "ffpa") == 1  # eval: no dropout, FFPA again


def test_kv_shared_tail_slice_matches_eager(patched, reference_kernels):
    # Transformers 5.23+ slice KV-shared layers' queries to logits_to_keep for custom backends.
    model = tiny.causal_lm("e2b", attn="eager")
    ids = torch.randint(0, 128, (1, 16))
    ref = model(ids).logits
    model.set_attn_implementation("ffpa")
    out = model(ids, logits_to_keep=3).logits
    torch.testing.assert_close(out, ref[:, -3:], atol=5e-5, rtol=1e-4)


def test_context_parallel_fails_fast_on_ffpa_backend_and_dropin_defers_to_the_ring(patched, reference_kernels, tmp_path):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel

    # a file store, not a TCP port: tox envs may run side by side
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        model = tiny.causal_lm("dense31b", attn="eager")
        attn = full_attention_module(model)
        q, k = torch.randn(1, 4, 8, 512), torch.randn(1, 1, 8, 512)
        with context_parallel(mesh, buffers=[torch.randn(1, 8)], buffer_seq_dims=[1]):
            with pytest.raises(ffpa_patch.FFPAFallbackError, match="context parallelism.*cp_full_attn_backend: ffpa"):
                route_attention(attn, q, k, k, None, backend="ffpa", scaling=1.0)
            stats.reset()
            try:  # handed to SDPA, i.e. to torch's CP ring, which has no CPU kernel
                route_attention(attn, q, k, k, None, backend="sdpa", scaling=1.0)
            except NotImplementedError as exc:
                assert "sharding strategy" in str(exc)
            assert any("context parallel" in r for r in reasons())
        out, _ = route_attention(attn, q, k, k, CausalMask(), backend="ffpa", scaling=1.0)  # CP off again: FFPA
        assert stats.total("full", "ffpa") == 1
    finally:
        dist.destroy_process_group()
