"""Tiny Gemma4 text models (random weights, CPU) shaped like the real families."""
from __future__ import annotations

import pytest
import torch

FAMILIES = {
    # 31B-like: k_eq_v full layers, GQA 4:1 on full layers, 5 sliding : 1 full
    "dense31b": dict(num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2, num_global_key_value_heads=1,
                     attention_k_eq_v=True, sliding_window=8),
    # E2B-like: KV sharing across the last layers, MQA
    "e2b": dict(num_hidden_layers=5, num_attention_heads=2, num_key_value_heads=1, num_global_key_value_heads=1,
                attention_k_eq_v=False, sliding_window=8, num_kv_shared_layers=2),
    # 26B-A4B-like MoE
    "moe": dict(num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2, num_global_key_value_heads=1,
                attention_k_eq_v=True, sliding_window=8, enable_moe_block=True, num_experts=4, top_k_experts=2,
                moe_intermediate_size=32),
    # 12B-like (gemma4_unified: its own classes): k_eq_v full layers, 16:1 GQA on full layers (4:1 here), 5:1
    "unified12b": dict(num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2, num_global_key_value_heads=1,
                       attention_k_eq_v=True, sliding_window=8),
}
#: families whose model is Transformers' gemma4_unified (the 12B), present from Transformers 5.10
UNIFIED = ("unified12b",)
TEXT_FAMILIES = tuple(FAMILIES)


def has_unified() -> bool:
    import importlib.util

    return importlib.util.find_spec("transformers.models.gemma4_unified") is not None


def family_param(family: str):
    """A pytest param for ``family`` that skips where this Transformers lacks its classes."""
    marks = [pytest.mark.skipif(not has_unified(), reason="this Transformers has no gemma4_unified (5.10+)")] \
        if family in UNIFIED else []
    return pytest.param(family, marks=marks, id=family)


def families(*names: str) -> list:
    return [family_param(f) for f in (names or TEXT_FAMILIES)]


def text_config(family: str = "dense31b", attn: str = "eager", **overrides):
    if family in UNIFIED:
        from transformers.models.gemma4_unified.configuration_gemma4_unified import Gemma4UnifiedTextConfig as Config
    else:
        from transformers import Gemma4TextConfig as Config

    spec = dict(FAMILIES[family])
    n_layers = spec["num_hidden_layers"]
    period = 6 if family != "e2b" else 5
    layer_types = ["full_attention" if (i + 1) % period == 0 else "sliding_attention" for i in range(n_layers)]
    if family == "e2b":
        layer_types = ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention", "full_attention"]
    kw = dict(
        vocab_size=128, hidden_size=64, intermediate_size=64, head_dim=32, global_head_dim=512,
        final_logit_softcapping=30.0, tie_word_embeddings=True, use_cache=False, layer_types=layer_types,
        attention_dropout=0.0,
    )
    if family not in UNIFIED:  # (gemma4_unified has no per-layer inputs; it keeps the 12B's "vision" default)
        kw.update(hidden_size_per_layer_input=0, vocab_size_per_layer_input=128)
    kw.update(spec)
    kw.update(overrides)
    cfg = Config(**kw)
    cfg._attn_implementation = attn
    return cfg


def causal_lm(family: str = "dense31b", attn: str = "eager", seed: int = 0, tempered: bool = True, **overrides):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(text_config(family, attn, **overrides)).float().eval()
    return temper(model) if tempered else model


def temper(model):
    """Scale every text attention's q_norm/k_norm weights to head_dim**-0.25, so attention
    logits are ~N(0, 1), as trained Gemma4 checkpoints keep them.

    Gemma4 attends with scaling 1.0 on RMS-normed q and k, and those norms start at weight 1:
    a random model's logits then have a standard deviation of sqrt(head_dim) (16-23), every
    softmax is saturated, and its gradients are rounding noise. In bf16 the q_proj gradient's
    error against fp32 was 1.1-1.6 for every implementation, stock SDPA included, so a
    backward that returned zeros (error 1.0) would have passed a comparison with stock.
    Tempered, it is ~0.03 in bf16 and ~0.007 in fp16 (CPU, stock SDPA, tests/gpu/grad_probe.py's setup).
    """
    with torch.no_grad():
        for module in model.modules():
            if type(module).__name__.endswith("TextAttention"):
                for name in ("q_norm", "k_norm"):  # KV-shared layers have no k_norm
                    norm = getattr(module, name, None)
                    if norm is not None:
                        norm.weight.fill_(module.head_dim ** -0.25)
    return model


IMAGE_TOKEN = 120


def vision_lm(family: str = "dense31b", attn: str = "eager", seed: int = 0):
    """A tiny Gemma4ForConditionalGeneration with a vision tower and bidirectional image blocks
    (``use_bidirectional_attention="vision"``, as 31B and 26B-A4B ship); for a ``UNIFIED`` family a
    Gemma4UnifiedForConditionalGeneration (the 12B: an encoder-free patch embedder, no tower)."""
    if family in UNIFIED:
        return _unified_vision_lm(family, attn, seed)
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration
    from transformers.models.gemma4.configuration_gemma4 import Gemma4VisionConfig

    text = text_config(family, attn, use_bidirectional_attention="vision", pad_token_id=0)
    vision = Gemma4VisionConfig(hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                num_key_value_heads=2, head_dim=16)
    cfg = Gemma4Config(text_config=text.to_dict(), vision_config=vision.to_dict(), audio_config=None,
                       image_token_id=IMAGE_TOKEN, boi_token_id=121, eoi_token_id=122, video_token_id=123,
                       audio_token_id=124, boa_token_id=125, eoa_token_index=126)
    cfg._attn_implementation = attn
    torch.manual_seed(seed)
    return temper(Gemma4ForConditionalGeneration(cfg).float().eval())


def _unified_vision_lm(family: str, attn: str, seed: int):
    from transformers.models.gemma4_unified import modeling_gemma4_unified as m
    from transformers.models.gemma4_unified.configuration_gemma4_unified import (Gemma4UnifiedConfig,
                                                                                 Gemma4UnifiedVisionConfig)

    text = text_config(family, attn, use_bidirectional_attention="vision", pad_token_id=0)
    vision = Gemma4UnifiedVisionConfig(patch_size=2, pooling_kernel_size=1, mm_embed_dim=text.hidden_size, mm_posemb_size=32,
                                       output_proj_dims=text.hidden_size)
    cfg = Gemma4UnifiedConfig(text_config=text.to_dict(), vision_config=vision.to_dict(), audio_config=None,
                              image_token_id=IMAGE_TOKEN, boi_token_id=121, eoi_token_id=122, video_token_id=123,
                              boa_token_id=125, eoa_token_index=126)
    cfg._attn_implementation = attn
    torch.manual_seed(seed)
    return temper(m.Gemma4UnifiedForConditionalGeneration(cfg).float().eval())


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``|actual - expected| / |expected|`` over the whole tensor, in fp32."""
    actual, expected = actual.float(), expected.float()
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    return float((actual - expected).norm() / expected.norm().clamp_min(1e-12))
