"""Image batches through the text side of Gemma 4's multimodal model, against the same model on text.

The model is ``Gemma4ForConditionalGeneration`` (``--model 31b``: a 6-layer slice of the 31B's
text shapes, ``use_bidirectional_attention="vision"`` as released) or the 12B's
``Gemma4UnifiedForConditionalGeneration`` (``--model 12b``), vocab 4096, bf16, AdamW. A batch
holds ``--images`` blocks of ``--image-tokens`` soft tokens per row at positions that move every
step (``mm_token_type_ids`` as the processor makes them; no pixels: the text layers' masks are
what is measured, and the 31B's vision tower is the same work on every row). ``--text`` gives
the same model a text-only batch. One row per process (``--append``).

Backends: ``sdpa-stock`` (ffpa_patch reverted), ``ffpa`` (attn_implementation="ffpa"),
``sdpa-dropin`` (the model left on "sdpa"), ``ffpa-flex`` ("ffpa" with flash-attn-4 switched off:
sliding layers on FlexAttention, as before image blocks reached flash-attn-4).

    python benchmarks/images.py --model 31b --backend ffpa --seq 8192 --out results/x/images.json --append
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import ffpa_patch  # noqa: E402
from benchmarks.common import env_info, write  # noqa: E402

IMAGE_TOKEN = 4000
SHAPES = {  # the released text shapes (benchmarks/models.py), 5 sliding : 1 full
    "31b": dict(hidden_size=5376, intermediate_size=21504, num_attention_heads=32, num_key_value_heads=16,
                num_global_key_value_heads=4, attention_k_eq_v=True, sliding_window=1024),
    "12b": dict(hidden_size=3840, intermediate_size=15360, num_attention_heads=16, num_key_value_heads=8,
                num_global_key_value_heads=1, attention_k_eq_v=True, sliding_window=1024),
}


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TINY = dict(hidden_size=64, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, num_global_key_value_heads=1,
            sliding_window=64)


def build(model: str, layers: int, attn: str, tiny: bool = False):
    shape = dict(SHAPES[model], **(TINY if tiny else {}))
    common = dict(vocab_size=4096, num_hidden_layers=layers, head_dim=32 if tiny else 256, global_head_dim=512,
                  final_logit_softcapping=30.0, tie_word_embeddings=True, use_cache=False,
                  use_bidirectional_attention="vision", pad_token_id=0,
                  layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(layers)], **shape)
    tokens = dict(image_token_id=IMAGE_TOKEN, boi_token_id=4001, eoi_token_id=4002, video_token_id=4003,
                  boa_token_id=4005, eoa_token_index=4006)
    if model == "12b":
        from transformers.models.gemma4_unified import configuration_gemma4_unified as c
        from transformers.models.gemma4_unified import modeling_gemma4_unified as m

        vision = c.Gemma4UnifiedVisionConfig(patch_size=2, pooling_kernel_size=1, mm_embed_dim=32, mm_posemb_size=16,
                                             output_proj_dims=common["hidden_size"])
        cfg = c.Gemma4UnifiedConfig(text_config=c.Gemma4UnifiedTextConfig(**common).to_dict(), vision_config=vision.to_dict(),
                                    audio_config=None, **tokens)
        cls = m.Gemma4UnifiedForConditionalGeneration
    else:
        from transformers import Gemma4Config, Gemma4ForConditionalGeneration, Gemma4TextConfig
        from transformers.models.gemma4.configuration_gemma4 import Gemma4VisionConfig

        text = Gemma4TextConfig(hidden_size_per_layer_input=0, vocab_size_per_layer_input=4096, **common)
        vision = Gemma4VisionConfig(hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                    num_key_value_heads=2, head_dim=16)
        cfg = Gemma4Config(text_config=text.to_dict(), vision_config=vision.to_dict(), audio_config=None,
                           audio_token_id=4004, **tokens)
        cls = Gemma4ForConditionalGeneration
    cfg._attn_implementation = attn
    torch.manual_seed(0)
    with torch.device(DEVICE):
        model = cls(cfg).to(torch.bfloat16)
    model.set_attn_implementation(attn)
    return model


def batch(step: int, seq: int, images: int, image_tokens: int, text: bool):
    """Token ids with ``images`` blocks at positions that move with ``step`` (evenly spread, jittered)."""
    g = torch.Generator().manual_seed(step)
    ids = torch.randint(1, 3999, (1, seq), generator=g)
    if not text:
        span = seq // images
        for n in range(images):
            start = n * span + int(torch.randint(0, max(span - image_tokens, 1), (1,), generator=g))
            ids[0, start:start + image_tokens] = IMAGE_TOKEN
    ids = ids.to(DEVICE)
    return ids, {"mm_token_type_ids": (ids == IMAGE_TOKEN).long(), "labels": ids.masked_fill(ids == IMAGE_TOKEN, -100)}


def run(a) -> dict:
    from ffpa_patch.kernels import cute, flex, use

    ffpa_patch.revert()
    if a.backend != "sdpa-stock":
        ffpa_patch.apply()
    ffpa_patch.reset_stats()
    sync = torch.cuda.synchronize if DEVICE == "cuda" else (lambda: None)
    attn = {"sdpa-stock": "sdpa", "sdpa-dropin": "sdpa", "ffpa": "ffpa", "ffpa-flex": "ffpa"}[a.backend]
    with use(cute.kernel_set(fa4=a.backend != "ffpa-flex")):
        model = build(a.model, a.layers, attn, a.tiny).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
        times, losses = [], []
        for step in range(a.steps):
            ids, kw = batch(step, a.seq, a.images, a.image_tokens, a.text)
            sync()
            t0 = time.perf_counter()
            loss = model(ids, **kw).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync()
            times.append(time.perf_counter() - t0)
            losses.append(loss.item())
    return dict(model=a.model, backend=a.backend, text_only=a.text, seq=a.seq, layers=a.layers, images=0 if a.text else a.images,
                image_tokens=a.image_tokens, step_s=statistics.median(times[1:]), first_step_s=times[0], step_times_s=times,
                tokens_per_s=a.seq / statistics.median(times[1:]), losses=losses,
                peak_gib=torch.cuda.max_memory_allocated() / 2**30 if DEVICE == "cuda" else None,
                flex_compiles=flex.compiles(), routes=ffpa_patch.stats(), env=env_info() if DEVICE == "cuda" else None,
                command="python benchmarks/images.py " + " ".join(sys.argv[1:]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=sorted(SHAPES), default="31b")
    ap.add_argument("--backend", choices=["sdpa-stock", "ffpa", "sdpa-dropin", "ffpa-flex"], required=True)
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--images", type=int, default=4)
    ap.add_argument("--image-tokens", type=int, default=280)
    ap.add_argument("--steps", type=int, default=12, help="images move every step; the first is the build/JIT step")
    ap.add_argument("--text", action="store_true", help="a text-only batch (the speed-up image batches should keep)")
    ap.add_argument("--tiny", action="store_true", help="narrow layers on this machine's device: a check of the script")
    ap.add_argument("--out", required=True)
    ap.add_argument("--append", action="store_true")
    a = ap.parse_args()
    row = run(a)
    print({k: v for k, v in row.items() if k not in ("routes", "env", "step_times_s", "losses")})
    rows = []
    if a.append and os.path.exists(a.out):
        import json

        rows = json.load(open(a.out))["rows"]
    write(a.out, {"rows": rows + [row]})


if __name__ == "__main__":
    main()
