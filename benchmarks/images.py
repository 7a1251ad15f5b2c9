"""Image batches through the text side of Gemma 4's multimodal model, against the same model on text.

The model is ``Gemma4ForConditionalGeneration`` (``--model 31b``: the 31B's text shapes,
``use_bidirectional_attention="vision"`` as released) or the 12B's
``Gemma4UnifiedForConditionalGeneration`` (``--model 12b``), bf16, AdamW; by default a 6-layer
slice with vocab 4096, or ``--layers 60 --vocab 32768 --lora --ckpt`` for full depth as
full_model.py trains it. A batch holds ``--images`` blocks of ``--image-tokens`` soft tokens per row
at positions that move every step (``mm_token_type_ids`` as the processor makes them). Without
``--pixels`` the image tokens are plain embeddings (the text layers' masks are what is measured);
with it each image is 2520 patches of random pixels (a 60x42 grid, what the processor makes of a
960x672 image: 280 soft tokens) through the vision tower (the 31B: Transformers' default
``Gemma4VisionConfig``, 16 layers; the 12B: its encoder-free embedder). ``--text`` gives the
same model a text-only batch. One row per process (``--append``).

Backends: ``sdpa-stock`` (ffpa_patch reverted), ``ffpa`` (attn_implementation="ffpa"),
``sdpa-dropin`` (the model left on "sdpa"), ``ffpa-flex`` ("ffpa" with flash-attn-4 switched off:
sliding layers on FlexAttention, as before image blocks reached flash-attn-4, and as NeMo-Automodel
routes them), ``floor`` (attention replaced by a free stand-in, benchmarks/full_model.py's).

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
#: released as "vision" (image blocks attend both ways); E2B/E4B keep a causal mask
VISION_BLOCKS = ("31b", "26b-a4b", "12b")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def build(model: str, layers: int, attn: str, tiny: bool = False, vocab: int = 4096, tower: bool = False):
    """The multimodal model around the released text config (benchmarks/models.py)."""
    from benchmarks.models import UNIFIED, text_config

    text = text_config(model, vocab=vocab, layers=layers, tiny=tiny)
    text.use_bidirectional_attention = "vision" if model in VISION_BLOCKS else None
    text.pad_token_id = 0
    hidden = text.hidden_size
    tokens = dict(image_token_id=IMAGE_TOKEN, boi_token_id=4001, eoi_token_id=4002, video_token_id=4003,
                  boa_token_id=4005, eoa_token_index=4006)
    if model in UNIFIED:
        from transformers.models.gemma4_unified import configuration_gemma4_unified as c
        from transformers.models.gemma4_unified import modeling_gemma4_unified as m

        vision = c.Gemma4UnifiedVisionConfig(output_proj_dims=hidden) if tower and not tiny else \
            c.Gemma4UnifiedVisionConfig(patch_size=2, pooling_kernel_size=1, mm_embed_dim=hidden, mm_posemb_size=32,
                                        output_proj_dims=hidden)
        cfg = c.Gemma4UnifiedConfig(text_config=text.to_dict(), vision_config=vision.to_dict(), audio_config=None, **tokens)
        cls = m.Gemma4UnifiedForConditionalGeneration
    else:
        from transformers import Gemma4Config, Gemma4ForConditionalGeneration
        from transformers.models.gemma4.configuration_gemma4 import Gemma4VisionConfig

        small = dict(hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                     head_dim=16)
        vision = Gemma4VisionConfig(**({} if tower and not tiny else small))
        cfg = Gemma4Config(text_config=text.to_dict(), vision_config=vision.to_dict(), audio_config=None,
                           audio_token_id=4004, **tokens)
        cls = Gemma4ForConditionalGeneration
    cfg._attn_implementation = attn
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # built in bf16: the 31B at full depth does not fit 80 GB in fp32
    try:
        with torch.device(DEVICE):
            model = cls(cfg).to(torch.bfloat16)
    finally:
        torch.set_default_dtype(default)
    model.set_attn_implementation(attn)
    return model


def pixels(model, images: int):
    """What the image processor hands the model for ``images`` 960x672 images: 280 soft tokens each, as
    60x42 patches pooled 3x3 by the 31B's tower, or 20x14 merged patches for the 12B's embedder."""
    vision = model.config.vision_config
    if hasattr(vision, "model_patch_size"):  # gemma4_unified: one merged (pooled) patch per soft token
        grid, patch = (20, 14), vision.model_patch_size
    else:
        grid, patch = (60, 42), vision.patch_size
    xs, ys = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="xy")
    positions = torch.stack([xs.flatten(), ys.flatten()], -1)
    values = torch.rand(images, grid[0] * grid[1], 3 * patch * patch)
    return {"pixel_values": values.to(DEVICE, torch.bfloat16), "image_position_ids": positions.expand(images, -1, -1).to(DEVICE)}


def batch(step: int, seq: int, images: int, image_tokens: int, text: bool, model=None):
    """Token ids with ``images`` blocks at positions that move with ``step`` (evenly spread, jittered)."""
    g = torch.Generator().manual_seed(step)
    ids = torch.randint(1, 3999, (1, seq), generator=g)
    if not text:
        span = seq // images
        for n in range(images):
            start = n * span + int(torch.randint(0, max(span - image_tokens, 1), (1,), generator=g))
            ids[0, start:start + image_tokens] = IMAGE_TOKEN
    ids = ids.to(DEVICE)
    kw = {"mm_token_type_ids": (ids == IMAGE_TOKEN).long(), "labels": ids.masked_fill(ids == IMAGE_TOKEN, -100)}
    if model is not None and not text:  # real pixels through the tower
        kw.update(pixels(model, images))
    return ids, kw


def run(a) -> dict:
    from ffpa_patch.kernels import cute, flex, use

    ffpa_patch.revert()
    if a.backend == "floor":
        from benchmarks.full_model import setup

        setup("floor")  # registers "ffpa_floor"
    elif a.backend != "sdpa-stock":
        ffpa_patch.apply()
    ffpa_patch.reset_stats()
    sync = torch.cuda.synchronize if DEVICE == "cuda" else (lambda: None)
    attn = {"sdpa-stock": "sdpa", "sdpa-dropin": "sdpa", "ffpa": "ffpa", "ffpa-flex": "ffpa", "floor": "ffpa_floor"}[a.backend]
    with use(cute.kernel_set(fa4=a.backend != "ffpa-flex")):
        model = base = build(a.model, a.layers, attn, a.tiny, a.vocab, a.pixels).train()
        if a.lora:  # the text attention only (the vision tower has q/k/v/o projections too)
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj)"))
        if a.ckpt:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5, foreach=True)
        times, losses = [], []
        for step in range(a.steps):
            ids, kw = batch(step, a.seq, a.images, a.image_tokens, a.text, base if a.pixels else None)
            sync()
            t0 = time.perf_counter()
            loss = model(ids, **kw).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync()
            times.append(time.perf_counter() - t0)
            losses.append(loss.item())
    return dict(model=a.model, backend=a.backend, text_only=a.text, seq=a.seq, layers=a.layers, vocab=a.vocab, lora=a.lora,
                ckpt=a.ckpt, pixels=a.pixels, images=0 if a.text else a.images,
                image_tokens=a.image_tokens, step_s=statistics.median(times[1:]), first_step_s=times[0], step_times_s=times,
                tokens_per_s=a.seq / statistics.median(times[1:]), losses=losses,
                peak_gib=torch.cuda.max_memory_allocated() / 2**30 if DEVICE == "cuda" else None,
                flex_compiles=flex.compiles(), routes=ffpa_patch.stats(), env=env_info() if DEVICE == "cuda" else None,
                command="python benchmarks/images.py " + " ".join(sys.argv[1:]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=["31b", "26b-a4b", "e4b", "e2b", "12b"], default="31b")
    ap.add_argument("--backend", choices=["sdpa-stock", "ffpa", "sdpa-dropin", "ffpa-flex", "floor"], required=True)
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--images", type=int, default=4)
    ap.add_argument("--image-tokens", type=int, default=280)
    ap.add_argument("--steps", type=int, default=12, help="images move every step; the first is the build/JIT step")
    ap.add_argument("--text", action="store_true", help="a text-only batch (the speed-up image batches should keep)")
    ap.add_argument("--pixels", action="store_true", help="real pixel inputs through the vision tower")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--lora", action="store_true", help="PEFT LoRA r=16 on the text attention's q/k/v/o, base frozen")
    ap.add_argument("--ckpt", action="store_true", help="non-reentrant gradient checkpointing")
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
