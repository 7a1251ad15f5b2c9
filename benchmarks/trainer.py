"""Hugging Face Trainer as users run it, stock against the shim.

A small Gemma4 (6 layers: 5 sliding + 1 full, hidden 1536, head_dim 256/512, one global
KV head), random weights, documents of 128-2048 tokens. Per process one recipe:
backend (sdpa-stock: patch reverted; sdpa-dropin: patch on, model left on "sdpa";
ffpa: attn_implementation="ffpa"; no-attention: q passed through, no kernel and no mask,
patch reverted: the step no attention implementation can beat; no-kernel: q + k + v summed
per head group, so the k/v projections, norms and rotary and their backward still run, but
no attention kernel and no mask: the step minus what an attention kernel and its mask cost)
x precision (autocast: fp32 weights, bf16=True; bf16: bf16 weights) x collator (packing:
DataCollatorWithFlattening, 8 documents a step; padding: a padding collator, batch 4).
Reports the median step (first excluded), the first step, peak memory, losses, routes and
FlexAttention compiles.

python benchmarks/trainer.py --backend ffpa --precision autocast --collator packing --out benchmarks/results/trainer.json --append
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import ffpa_patch  # noqa: E402
from benchmarks.common import env_info  # noqa: E402


def config(attn):
    from transformers import Gemma4TextConfig

    cfg = Gemma4TextConfig(
        vocab_size=4096, hidden_size=1536, intermediate_size=6144, num_hidden_layers=6,
        num_attention_heads=8, num_key_value_heads=4, head_dim=256, global_head_dim=512,
        num_global_key_value_heads=1, attention_k_eq_v=True, sliding_window=1024,
        hidden_size_per_layer_input=0, vocab_size_per_layer_input=4096, final_logit_softcapping=30.0,
        tie_word_embeddings=True, use_cache=False, pad_token_id=0,
        layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(6)],
    )
    cfg._attn_implementation = attn
    return cfg


def documents(n, seed=0, shortest=128, longest=2048):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(shortest, longest + 1, (n,), generator=g).tolist()
    return [{"input_ids": torch.randint(1, 4096, (k,), generator=g).tolist()} for k in lengths]


def padding_collator(features):
    longest = max(len(f["input_ids"]) for f in features)
    ids = torch.zeros(len(features), longest, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, f in enumerate(features):
        ids[i, : len(f["input_ids"])] = torch.tensor(f["input_ids"])
        mask[i, : len(f["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def register_no_attention():
    """attn_implementation="no_attention": q passed through, k/v unused, no mask built. Not
    attention at all: it measures what the rest of the Trainer step costs, i.e. the floor
    under any attention kernel (how far the 3x target can be reached by attention alone)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register("no_attention", lambda module, q, k, v, mask, **kw: (q.transpose(1, 2), None))
    AttentionMaskInterface.register("no_attention", lambda *args, **kwargs: None)
    AttentionInterface.register("no_kernel", sum_per_head_group)
    AttentionMaskInterface.register("no_kernel", lambda *args, **kwargs: None)


def sum_per_head_group(module, q, k, v, mask, **kw):
    """attn_implementation="no_kernel": q + k + v of each query head's KV group, one
    elementwise kernel instead of attention, so gradients still reach k and v."""
    b, h, s, d = q.shape
    hk = k.shape[1]
    out = q.view(b, hk, h // hk, s, d) + (k + v)[:, :, None]
    return out.view(b, h, s, d).transpose(1, 2), None


def count_cutedsl_compiles():
    """{package: [compiles, seconds]} of cute.compile calls, wrapped when cutlass.cute is
    imported (so the import itself still lands in the first step, as for a user)."""
    import wrapt

    jit = {}

    def wrap(cute):
        compile_ = cute.compile

        def counted(*args, **kw):
            caller = sys._getframe(1).f_globals.get("__name__", "?").split(".")[0]
            t = time.perf_counter()
            try:
                return compile_(*args, **kw)
            finally:
                n, s = jit.get(caller, (0, 0.0))
                jit[caller] = [n + 1, round(s + time.perf_counter() - t, 2)]

        cute.compile = counted

    wrapt.register_post_import_hook(wrap, "cutlass.cute")
    return jit


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--backend", choices=["sdpa-stock", "sdpa-dropin", "ffpa", "no-attention", "no-kernel"], required=True)
    p.add_argument("--precision", choices=["autocast", "bf16"], required=True)
    p.add_argument("--collator", choices=["packing", "padding"], default="packing")
    p.add_argument("--sliding", choices=["fa4", "flex"], default="fa4", help="sliding-layer kernel of the shim")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--model", choices=["small", "slice31b"], default="small",
                   help="slice31b: benchmarks/e2e.py's 6-layer slice with Gemma4-31B layer shapes (long context)")
    p.add_argument("--doc-len", type=int, nargs=2, default=[128, 2048], metavar=("MIN", "MAX"))
    p.add_argument("--per-step", type=int, default=0, help="documents per step (default 8 packing, 4 padding)")
    p.add_argument("--ckpt", choices=["none", "plain", "selective"], default="none",
                   help="gradient_checkpointing through TrainingArguments (selective: ffpa_patch.checkpointing.context_fn)")
    p.add_argument("--profile-step", type=int, default=0, metavar="N",
                   help="torch.profiler over step N: GPU ms per kernel class and host ms per op "
                        "(benchmarks/profile_split.py); the profiled step itself is slower")
    p.add_argument("--out")
    p.add_argument("--append", action="store_true")
    a = p.parse_args()
    jit = count_cutedsl_compiles()
    cache_dir = os.environ.get("FFPA_PATCH_KERNEL_CACHE")
    cached_at_start = sum(len(f) for _, _, f in os.walk(cache_dir)) if cache_dir and os.path.isdir(cache_dir) else 0

    from transformers import DataCollatorWithFlattening, Gemma4ForCausalLM, Trainer, TrainerCallback, TrainingArguments

    if a.backend in ("sdpa-stock", "no-attention", "no-kernel"):
        ffpa_patch.revert()
    if a.backend in ("no-attention", "no-kernel"):
        register_no_attention()
    ffpa_patch.reset_stats()
    torch.manual_seed(0)
    attn = {"ffpa": "ffpa", "no-attention": "no_attention", "no-kernel": "no_kernel"}.get(a.backend, "sdpa")
    if a.model == "slice31b":
        from benchmarks.e2e import config as slice_config

        cfg = slice_config(6)
        cfg.pad_token_id, cfg._attn_implementation = 0, attn
    else:
        cfg = config(attn)
    model = Gemma4ForCausalLM(cfg)
    model = model.to("cuda", torch.bfloat16 if a.precision == "bf16" else torch.float32)
    per_step = a.per_step or (8 if a.collator == "packing" else 4)
    collator = DataCollatorWithFlattening() if a.collator == "packing" else padding_collator
    tokens = []  # real tokens of each batch, in the order the Trainer takes them (one batch a step)

    def collate(features):
        tokens.append(sum(len(f["input_ids"]) for f in features))
        return collator(features)

    times = []

    profiled = {}

    class Clock(TrainerCallback):
        def on_step_begin(self, *args, **kw):
            torch.cuda.synchronize()
            if len(times) + 1 == a.profile_step:
                from torch.profiler import ProfilerActivity, profile

                self.prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
                self.prof.__enter__()
            self.t = time.perf_counter()

        def on_step_end(self, *args, **kw):
            torch.cuda.synchronize()
            times.append((time.perf_counter() - self.t) * 1e3)
            if len(times) == a.profile_step:
                from benchmarks.profile_split import from_profiler

                self.prof.__exit__(None, None, None)
                profiled.update(from_profiler(self.prof))
            print(f"step {len(times)}: {times[-1]:.0f} ms, compiles {ffpa_patch.status().compiles}, cute.compile {jit}",
                  file=sys.stderr, flush=True)

    ckpt_args = {}
    if a.ckpt != "none":
        kwargs = {"use_reentrant": False}
        if a.ckpt == "selective":
            kwargs["context_fn"] = ffpa_patch.checkpointing.context_fn
        ckpt_args = {"gradient_checkpointing": True, "gradient_checkpointing_kwargs": kwargs}
    args = TrainingArguments(
        output_dir="/tmp/trainer-bench", per_device_train_batch_size=per_step, max_steps=a.steps, report_to=[],
        logging_steps=1, save_strategy="no", learning_rate=1e-4, bf16=a.precision == "autocast",
        dataloader_num_workers=0, remove_unused_columns=False, seed=0, **ckpt_args,
    )
    trainer = Trainer(model=model, args=args, train_dataset=documents(per_step * a.steps, 0, *a.doc_len), data_collator=collate,
                      callbacks=[Clock()])
    torch.cuda.reset_peak_memory_stats()
    from ffpa_patch.kernels import use
    from ffpa_patch.kernels import cute

    with use(cute.kernel_set(fa4=a.sliding == "fa4")):
        trainer.train()
    status = ffpa_patch.status()
    row = {
        "backend": a.backend, "precision": a.precision, "collator": a.collator, "sliding": a.sliding, "steps": a.steps,
        "model": a.model, "doc_len": a.doc_len, "per_step": per_step, "ckpt": a.ckpt,
        "median_step_ms": statistics.median(times[1:]), "first_step_ms": times[0], "step_ms": times,
        "tokens_per_step": tokens[: len(times)],
        "tokens_per_s": sum(tokens[1 : len(times)]) / sum(times[1:]) * 1e3 if len(times) > 1 else None,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
        "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
        "routes": status.routes, "compiles": status.compiles, "cutedsl_jit": jit, "kernel_cache": status.kernel_cache,
        "kernel_cache_files_at_start": cached_at_start, "env": env_info(),
    }
    if profiled:
        row["profile_step"] = a.profile_step
        row["profile"] = profiled
        print(json.dumps({"profile_split_ms": profiled["split_ms"]}), file=sys.stderr)
    print(json.dumps({k: v for k, v in row.items() if k not in ("step_ms", "losses", "env")}))
    if a.out:
        rows = []
        if a.append and os.path.exists(a.out):
            rows = json.load(open(a.out))
        rows.append(row)
        os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
        json.dump(rows, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
