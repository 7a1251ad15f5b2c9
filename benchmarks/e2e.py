"""One training step of a reduced-depth Gemma4 text model with 31B layer shapes.

Backends: sdpa-stock (patch reverted), sdpa-fixed (only the 5.5-5.12 repeat-KV fix),
sdpa-dropin (patch applied, model on sdpa), ffpa (attn_implementation="ffpa": FFPA
full layers, flash-attn-4 sliding layers).
python benchmarks/e2e.py --seqs 8192 16384 --layers 6 --out benchmarks/results/e2e.json
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import ffpa_patch  # noqa: E402
from benchmarks.common import env_info, write  # noqa: E402


def config(layers):
    from transformers import Gemma4TextConfig

    cfg = Gemma4TextConfig(
        vocab_size=4096, hidden_size=5376, intermediate_size=21504, num_hidden_layers=layers,
        num_attention_heads=32, num_key_value_heads=16, head_dim=256, global_head_dim=512,
        num_global_key_value_heads=4, attention_k_eq_v=True, sliding_window=1024,
        hidden_size_per_layer_input=0, vocab_size_per_layer_input=4096, final_logit_softcapping=30.0,
        tie_word_embeddings=True, use_cache=False,
        layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(layers)],
    )
    return cfg


def run(backend, seq, layers, steps, batch, padded, ckpt, targets=None):
    from transformers import Gemma4ForCausalLM

    ffpa_patch.revert()
    if backend != "sdpa-stock":
        ffpa_patch.apply(targets=targets)
    ffpa_patch.reset_stats()
    attn = {"sdpa-stock": "sdpa", "sdpa-dropin": "sdpa", "sdpa-fixed": "sdpa", "ffpa": "ffpa"}[backend]
    torch.manual_seed(0)
    cfg = config(layers)
    cfg._attn_implementation = attn
    with torch.device("cuda"):
        model = Gemma4ForCausalLM(cfg).to(torch.bfloat16)
    model.config._attn_implementation = attn
    if ckpt:
        kwargs = {"use_reentrant": False}
        if ckpt == "selective":
            from ffpa_patch import checkpointing

            kwargs["context_fn"] = checkpointing.context_fn
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
    ids = torch.randint(0, 4096, (batch, seq), device="cuda")
    mask = torch.ones_like(ids)
    if padded:
        mask[-1, seq * 3 // 4 :] = 0
    labels = ids.masked_fill(mask == 0, -100)
    torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    for _ in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = model(ids, attention_mask=mask if padded else None, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    step = statistics.median(times[1:])
    row = dict(backend=backend, seq=seq, batch=batch, layers=layers, padded=padded, ckpt=ckpt,
               tokens_per_s=int(mask.sum()) / step, step_s=step, first_step_s=times[0],
               peak_gib=torch.cuda.max_memory_allocated() / 2**30, losses=losses, routes=ffpa_patch.stats())
    del model, opt
    torch.cuda.empty_cache()
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", type=int, nargs="+", default=[8192])
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--padded", action="store_true")
    ap.add_argument("--ckpt", choices=["plain", "selective"], default=None)
    ap.add_argument("--backends", nargs="+", default=["sdpa-stock", "sdpa-dropin", "ffpa"])
    ap.add_argument("--out", default="benchmarks/results/e2e.json")
    args = ap.parse_args()
    rows = []
    for seq in args.seqs:
        for backend in args.backends:
            try:
                targets = ["sdpa_repeat_kv"] if backend == "sdpa-fixed" else None
                rows.append(run(backend, seq, args.layers, args.steps, args.batch, args.padded, args.ckpt, targets))
            except torch.OutOfMemoryError as exc:
                rows.append(dict(backend=backend, seq=seq, error=f"OOM: {exc}"[:200]))
                torch.cuda.empty_cache()
            r = rows[-1]
            print({k: v for k, v in r.items() if k not in ("routes", "losses")}, flush=True)
    write(args.out, {"env": env_info(), "args": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
