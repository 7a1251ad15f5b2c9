"""The released Gemma4 text configurations, for benchmarks at full depth with random weights.

The Hub's config.json files were not reachable from the machines these benchmarks were
written on; every value below agrees across these public copies of them:
- T-CONV: huggingface/transformers, src/transformers/models/gemma4/convert_gemma4_weights.py,
  ``_VARIANTS`` (the official conversion script; fields it leaves out take the defaults of
  ``Gemma4TextConfig``, T-CFG, configuration_gemma4.py);
- MT-HF: AI-Hypercomputer/maxtext, src/maxtext/checkpoint_conversion/utils/hf_model_configs.py
  (``gemma4_{31b,26b,e4b,e2b}_dict``, transformers_version 5.5.0.dev0);
- LAYR: Layr-Labs/mlxfast-gemma4-26b-a4b-engine, fixtures/gemma4_26b_a4b_config.json (a full
  config.json of a 4-bit re-save of gemma-4-26B-A4B-it; quantization leaves text_config alone);
- SWIFT: VincentGourbin/gemma-4-swift-mlx, Tests/Gemma4SwiftTests/ConfigurationTests.swift.
Shared by all four (T-CFG defaults, MT-HF): vocab 262144, head_dim 256, global_head_dim 512,
final_logit_softcapping 30, tied embeddings, rope sliding {default, 1e4} / full
{proportional, 1e6, partial 0.25}, gelu_pytorch_tanh, rms_norm_eps 1e-6.

The 12B is Transformers' ``gemma4_unified`` (its own classes, from Transformers 5.10), with the
same shared values. Its text config (google/gemma-4-12B and -12B-it, transformers_version
5.10.0.dev0) as quoted in these public copies:
- TT: tenstorrent/tt-xla issue #5255 (bring-up notes citing config.json: 48 layers = 40 sliding +
  8 full, sliding_window 1024, vocab 262144, max_position_embeddings 262144);
- PAZ: oarriaga/paz pull request #439 (8 KV heads at head_dim 256 on sliding layers, 1 at 512 on
  global ones, the global layers' values taken from their keys: attention_k_eq_v);
- CFG12: a full config.json of gemma-4-12B-it in a public agent transcript (found by its
  ``"model_type": "gemma4_unified_text"``): hidden 3840, intermediate 15360, 16 heads,
  num_key_value_heads 8, num_global_key_value_heads 1, no KV sharing, no per-layer inputs,
  use_double_wide_mlp false, use_bidirectional_attention "vision"; also sglang #27261 and vLLM
  #44429 (FACTS) for the 16:1 global GQA.
"""
from __future__ import annotations

PERIOD = {"31b": 6, "26b-a4b": 6, "e4b": 6, "e2b": 5, "12b": 6}  # sliding:full 5:1, E2B 4:1 (T-CONV layer types)
#: models that are Transformers' gemma4_unified (their own config and model classes)
UNIFIED = ("12b",)

RELEASED = {
    # T-CONV, MT-HF, SWIFT
    "31b": dict(hidden_size=5376, intermediate_size=21504, num_hidden_layers=60, num_attention_heads=32,
                num_key_value_heads=16, num_global_key_value_heads=4, attention_k_eq_v=True, sliding_window=1024,
                num_kv_shared_layers=0, hidden_size_per_layer_input=0),
    # T-CONV, LAYR, MT-HF, SWIFT
    "26b-a4b": dict(hidden_size=2816, intermediate_size=2112, num_hidden_layers=30, num_attention_heads=16,
                    num_key_value_heads=8, num_global_key_value_heads=2, attention_k_eq_v=True, sliding_window=1024,
                    num_kv_shared_layers=0, hidden_size_per_layer_input=0, enable_moe_block=True, num_experts=128,
                    top_k_experts=8, moe_intermediate_size=704),
    # T-CONV, MT-HF, SWIFT
    "e4b": dict(hidden_size=2560, intermediate_size=10240, num_hidden_layers=42, num_attention_heads=8,
                num_key_value_heads=2, num_global_key_value_heads=None, attention_k_eq_v=False, sliding_window=512,
                num_kv_shared_layers=18, hidden_size_per_layer_input=256),
    # T-CONV, MT-HF, SWIFT
    "e2b": dict(hidden_size=1536, intermediate_size=6144, num_hidden_layers=35, num_attention_heads=8,
                num_key_value_heads=1, num_global_key_value_heads=None, attention_k_eq_v=False, sliding_window=512,
                num_kv_shared_layers=20, hidden_size_per_layer_input=256, use_double_wide_mlp=True),
    # TT, PAZ, CFG12 (gemma4_unified)
    "12b": dict(hidden_size=3840, intermediate_size=15360, num_hidden_layers=48, num_attention_heads=16,
                num_key_value_heads=8, num_global_key_value_heads=1, attention_k_eq_v=True, sliding_window=1024,
                num_kv_shared_layers=0, use_bidirectional_attention="vision"),
}

#: a CPU-sized stand-in with the same structure, so the script is checked before GPU time is spent
TINY = dict(hidden_size=64, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1, sliding_window=16,
            moe_intermediate_size=16, num_experts=4, top_k_experts=2, hidden_size_per_layer_input=16)


def text_config(model: str, vocab: int | None = None, layers: int | None = None, tiny: bool = False):
    if model in UNIFIED:
        from transformers.models.gemma4_unified.configuration_gemma4_unified import Gemma4UnifiedTextConfig as Config
    else:
        from transformers import Gemma4TextConfig as Config

    spec = dict(RELEASED[model])
    if tiny:
        spec.update({k: v for k, v in TINY.items() if k in spec and spec[k]})
        if spec.get("num_global_key_value_heads"):
            spec["num_global_key_value_heads"] = 1
    n = layers or spec["num_hidden_layers"]
    spec["num_hidden_layers"] = n
    spec["num_kv_shared_layers"] = min(spec["num_kv_shared_layers"], max(n - 2, 0))
    period = PERIOD[model]
    vocab = vocab or 262144
    if model not in UNIFIED:
        spec["vocab_size_per_layer_input"] = vocab
    return Config(
        vocab_size=vocab, head_dim=256, global_head_dim=512,
        final_logit_softcapping=30.0, tie_word_embeddings=True, use_cache=False, attention_dropout=0.0,
        layer_types=["full_attention" if (i + 1) % period == 0 else "sliding_attention" for i in range(n)], **spec)
