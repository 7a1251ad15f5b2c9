"""Released Gemma4 models at full depth (random weights), trained as single-GPU users train them.

One row per process (``--append`` collects them): a backend, a model (benchmarks/models.py:
the released configurations and where they come from), a recipe, a length. Rows:
- ``sdpa-stock``: ffpa_patch reverted, Transformers' SDPA (5.13+: repeat-K/V at head_dim 512);
- ``flex-stock``: ffpa_patch reverted, Transformers' flex_attention (its failure is recorded);
- ``nemo``: NeMo-Automodel's routing: FFPA full layers, FlexAttention sliding layers
  (ffpa_patch with flash-attn-4 switched off in the kernel table);
- ``ffpa``: ffpa_patch (FFPA full layers, flash-attn-4 sliding layers); ``ffpa-liger``: with
  liger-kernel's Gemma4 patches too;
- ``floor``: attention replaced by a free stand-in that keeps every projection (the output is
  the queries): what no attention kernel can beat.

Recipes: ``lora`` (PEFT r=16 on q/k/v/o, base frozen) or ``full`` (every weight), with
``--ckpt plain|selective|none`` gradient checkpointing, bf16 weights, AdamW, batch 1.

MFU counts model FLOPs against the card's dense bf16 peak (989 TF/s, H100/H200 SXM):
matmuls 2 FLOPs per weight per token forward, and backward 2 more (LoRA: input gradients
only) or 4 more (full: input and weight gradients); MoE experts at top_k/num_experts;
attention forward 4·Hq·D per (query, key) pair it attends (causal: half the square; sliding:
the window), backward 2.5 times that; recomputation from checkpointing is not counted.

    python benchmarks/full_model.py --model 31b --seq 8192 --vocab 32768 --backends ffpa \\
        --out benchmarks/results/<run>/full_model.json --append
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from benchmarks.common import env_info, write  # noqa: E402
from benchmarks.models import RELEASED, text_config  # noqa: E402

PEAK_TFLOPS = 989.0  # dense bf16, H100/H200 SXM datasheet
BACKENDS = ("sdpa-stock", "flex-stock", "nemo", "ffpa", "ffpa-liger", "floor")


def floor_attention(module, query, key, value, attention_mask, **kwargs):
    """Free attention: [B, H, S, D] queries out as [B, S, H, D], with k/v kept in the graph."""
    out = query.transpose(1, 2) + (key.mean() + value.mean()) * 0
    return out, None


def setup(backend: str):
    import ffpa_patch

    ffpa_patch.revert()
    if backend == "floor":
        from transformers.masking_utils import AttentionMaskInterface
        from transformers.modeling_utils import AttentionInterface

        AttentionInterface.register("ffpa_floor", floor_attention)
        AttentionMaskInterface.register("ffpa_floor", lambda *a, **k: None)
        return "ffpa_floor"
    if backend.endswith("-stock"):
        return backend.removesuffix("-stock").replace("flex", "flex_attention")
    ffpa_patch.apply()
    if backend == "ffpa-liger":
        from liger_kernel.transformers import apply_liger_kernel_to_gemma4_text

        apply_liger_kernel_to_gemma4_text()  # (gemma4 classes only: the 12B keeps Transformers' own)
    return "ffpa"


def model_flops(model, config, tokens: int, seq: int, recipe: str) -> float:
    """Model FLOPs of one training step (module docstring)."""
    matmul = 0
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and "lora_" not in name:
            matmul += module.weight.numel()
        if type(module).__name__.endswith("Experts"):
            params = sum(p.numel() for p in module.parameters(recurse=False))
            matmul += params * config.top_k_experts / config.num_experts
    matmul += config.vocab_size * config.hidden_size  # the tied lm_head
    per_weight = 2 + (2 if recipe == "lora" else 4)
    flops = per_weight * matmul * tokens
    attn = 0
    for layer_type in config.layer_types:
        sliding = layer_type == "sliding_attention"
        d = 256 if sliding else 512
        pairs = seq * min(seq, config.sliding_window) if sliding else seq * seq / 2
        attn += 4 * config.num_attention_heads * d * pairs * (tokens / seq)
    return flops + 3.5 * attn


def run(a) -> dict:
    if a.kernel_cache:
        os.environ["FFPA_PATCH_KERNEL_CACHE"] = a.kernel_cache
    from transformers import AutoModelForCausalLM

    from ffpa_patch import kernels

    attn = setup(a.backend)
    cfg = text_config(a.model, vocab=a.vocab, layers=a.layers, tiny=a.tiny)
    cfg._attn_implementation = attn
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # made in bf16: a 31B model in fp32 would not fit
    try:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(cfg)  # Gemma4ForCausalLM, or Gemma4UnifiedForCausalLM (12B)
    finally:
        torch.set_default_dtype(previous)
    model.config._attn_implementation = attn
    if a.recipe == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    if a.ckpt != "none":
        kwargs = {"use_reentrant": False}
        if a.ckpt == "selective":
            from ffpa_patch import checkpointing

            kwargs["context_fn"] = checkpointing.context_fn
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-5, foreach=True)
    ids = torch.randint(0, cfg.vocab_size, (1, a.seq), device=device, generator=torch.Generator(device).manual_seed(1))
    extra = {}
    if a.backend == "flex-stock":
        from ffpa_patch.kernels import flex

        extra["kernel_options"] = flex.SMALL_TILES
    kernel_set = None
    if a.backend == "nemo":
        from ffpa_patch.kernels import cute

        kernel_set = cute.kernel_set(fa4=False)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    with kernels.use(kernel_set) if kernel_set is not None else _nothing():
        for _ in range(a.steps):
            sync()
            t0 = time.perf_counter()
            loss = model(ids, labels=ids, **extra).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync()
            times.append(time.perf_counter() - t0)
            losses.append(loss.item())
    import ffpa_patch

    step = statistics.median(times[1:]) if len(times) > 1 else times[0]
    flops = model_flops(model, cfg, a.seq, a.seq, a.recipe)
    return dict(model=a.model, backend=a.backend, recipe=a.recipe, ckpt=a.ckpt, seq=a.seq, vocab=cfg.vocab_size,
                layers=cfg.num_hidden_layers, tokens_per_s=a.seq / step, step_s=step, first_step_s=times[0],
                step_times_s=times, losses=losses, kernel_cache=os.environ.get("FFPA_PATCH_KERNEL_CACHE", "default"),
                peak_gib=torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None,
                model_tflop_per_step=flops / 1e12, mfu=flops / step / (PEAK_TFLOPS * 1e12),
                trainable_params=sum(p.numel() for p in trainable), routes=ffpa_patch.stats())


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(RELEASED), required=True)
    ap.add_argument("--backend", choices=BACKENDS, required=True)
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--recipe", choices=["lora", "full"], default="lora")
    ap.add_argument("--ckpt", choices=["plain", "selective", "none"], default="plain")
    ap.add_argument("--vocab", type=int, default=None, help="replace the released 262144 (31B: 32768 fits an 80 GB card with stock)")
    ap.add_argument("--layers", type=int, default=None, help="fewer layers than released (checks only)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--tiny", action="store_true", help="narrow layers, same structure: a CPU check of the script")
    ap.add_argument("--kernel-cache", default=None, help="FFPA_PATCH_KERNEL_CACHE for this row (an empty folder: a cold first step)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--append", action="store_true")
    a = ap.parse_args()
    rows = []
    if a.append and os.path.exists(a.out):
        with open(a.out) as f:
            rows = json.load(f)["rows"]
    try:
        row = run(a)
    except Exception as exc:  # out of memory, or a backend that cannot run the model: recorded with its recipe
        row = dict(model=a.model, backend=a.backend, recipe=a.recipe, ckpt=a.ckpt, seq=a.seq, vocab=a.vocab,
                   error=f"{type(exc).__name__}: {exc}"[:400])
    row["command"] = " ".join(["python", "benchmarks/full_model.py", *sys.argv[1:]])
    row["env"] = env_info() if torch.cuda.is_available() else {"device": "cpu", "torch": torch.__version__}
    rows.append(row)
    print({k: v for k, v in row.items() if k not in ("routes", "env", "step_times_s", "losses")}, flush=True)
    write(a.out, {"rows": rows})


if __name__ == "__main__":
    main()
