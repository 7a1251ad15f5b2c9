"""One training step of a reduced-depth Gemma4 text model with 31B layer shapes.

Backends: sdpa-stock (patch reverted), flex-stock (patch reverted, Transformers'
flex_attention with NeMo's small tiles, which D=512 needs), sdpa-fixed (only the
5.5-5.12 repeat-KV fix), sdpa-dropin (patch applied, model on sdpa), ffpa
(attn_implementation="ffpa": FFPA full layers, flash-attn-4 sliding layers),
ffpa-flex (the same without flash-attn-4: sliding layers on FlexAttention).
python benchmarks/e2e.py --seqs 8192 16384 --layers 6 --out benchmarks/results/e2e.json
Peak memory is reported per phase of the last step (forward, backward, optimizer).
Before the kernel-import fix a second patched model in one process peaked ~5 GiB higher
(README, "The leak"); the committed tables run one backend per process (--append).
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


ATTN = {"sdpa-stock": "sdpa", "flex-stock": "flex_attention", "sdpa-fixed": "sdpa", "sdpa-dropin": "sdpa",
        "ffpa": "ffpa", "ffpa-flex": "ffpa"}


def packed_positions(seq, n, mixed):
    """position_ids of n documents in one row: equal lengths, or (mixed) random cut points."""
    if not mixed:
        return torch.arange(seq, device="cuda").remainder(seq // n)
    g = torch.Generator().manual_seed(2)
    cuts = sorted(torch.randperm(seq - 1, generator=g)[: n - 1].add(1).tolist())
    lengths = [b - a for a, b in zip([0] + cuts, cuts + [seq])]
    return torch.cat([torch.arange(k) for k in lengths]).to("cuda")


def run(backend, seq, layers, steps, batch, padded, ckpt, targets=None, optimizer=True, compile_model=False, profile=None,
        packed=0, mixed=False, liger=False):
    from ffpa_patch import kernels
    from ffpa_patch.kernels import cute

    ffpa_patch.revert()
    if not backend.endswith("-stock"):
        ffpa_patch.apply(targets=targets)
    ffpa_patch.reset_stats()
    with kernels.use(cute.kernel_set(fa4=backend != "ffpa-flex")):
        return _run(backend, seq, layers, steps, batch, padded, ckpt, optimizer, compile_model, profile, packed, mixed, liger)


def _run(backend, seq, layers, steps, batch, padded, ckpt, optimizer, compile_model, profile, packed, mixed, liger):
    from torch._dynamo.utils import counters
    from transformers import Gemma4ForCausalLM

    from ffpa_patch.kernels import flex

    attn = ATTN[backend]
    if liger:  # class-level swaps (RMSNorm, GEGLU MLP, fused linear cross entropy), for the rest of the process
        from liger_kernel.transformers import apply_liger_kernel_to_gemma4_text

        apply_liger_kernel_to_gemma4_text()
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
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True) if optimizer else None
    g = torch.Generator(device="cuda").manual_seed(1)
    ids = torch.randint(0, 4096, (batch, seq), device="cuda", generator=g)
    mask = torch.ones_like(ids)
    if padded:
        mask[-1, seq * 3 // 4 :] = 0
    labels = ids.masked_fill(mask == 0, -100)
    extra = {"kernel_options": flex.SMALL_TILES} if backend == "flex-stock" else {}
    if packed:  # N documents per row, as DataCollatorWithFlattening / TRL padding-free make them
        extra["position_ids"] = packed_positions(seq, packed, mixed).expand(batch, seq)
    forward = torch.compile(model) if compile_model else model
    counters.clear()
    torch.cuda.reset_peak_memory_stats()
    times, losses, phase_peaks, peaks = [], [], {}, []

    def take_peak():
        """Peak GiB since the last call (the phases of one step)."""
        torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated() / 2**30)
        torch.cuda.reset_peak_memory_stats()
        return peaks[-1]

    def step(track=False):
        loss = forward(ids, attention_mask=mask if padded else None, labels=labels, **extra).loss
        if track:
            phase_peaks["forward"] = take_peak()
        loss.backward()
        if track:
            phase_peaks["backward"] = take_peak()
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)
        else:
            model.zero_grad(set_to_none=True)
        if track:
            phase_peaks["optimizer"] = take_peak()
        return loss

    for _ in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    median = statistics.median(times[1:])
    take_peak()
    step(track=True)  # one more, untimed, with the peak per phase
    row = dict(backend=backend, seq=seq, batch=batch, layers=layers, padded=padded, packed=packed, mixed=mixed, liger=liger, ckpt=ckpt, optimizer=optimizer,
               compiled=compile_model, tokens_per_s=int(mask.sum()) / median, step_s=median, first_step_s=times[0], step_times_s=times,
               peak_gib=max(peaks), phase_peak_gib=dict(phase_peaks), losses=losses, routes=ffpa_patch.stats())
    if compile_model:
        row["graph_breaks"] = {k: v for k, v in counters["graph_break"].items()}
    if profile:
        from benchmarks.profile_split import profile_step

        row["profile"] = profile_step(step)
    del model, opt, forward
    torch.cuda.empty_cache()
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", type=int, nargs="+", default=[8192])
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--padded", action="store_true")
    ap.add_argument("--packed", type=int, default=0, metavar="N", help="N packed documents per row (position_ids restart)")
    ap.add_argument("--liger", action="store_true", help="liger-kernel's Gemma4 patches too (norms, GEGLU, fused loss)")
    ap.add_argument("--mixed", action="store_true", help="with --packed: documents of random lengths (fixed seed)")
    ap.add_argument("--ckpt", choices=["plain", "selective"], default=None)
    ap.add_argument("--backends", nargs="+", default=["sdpa-stock", "sdpa-dropin", "ffpa"], choices=list(ATTN))
    ap.add_argument("--no-optimizer", action="store_true", help="forward+backward only (as the prototype in FACTS.md)")
    ap.add_argument("--compile", action="store_true", help="torch.compile(model); graph breaks are reported")
    ap.add_argument("--skip-ckpt-side-effects", action="store_true",
                    help="torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint: with --compile and --ckpt, "
                         "Transformers' Gemma4 layers otherwise break the graph once per checkpointed layer")
    ap.add_argument("--profile", action="store_true", help="torch.profiler split of one more step")
    ap.add_argument("--build-sliding-mask", action="store_true",
                    help="A/B: the ffpa mask function builds the plain S x S sliding mask, as before it learnt to skip it")
    ap.add_argument("--out", default="benchmarks/results/e2e.json")
    ap.add_argument("--append", action="store_true",
                    help="keep the rows already in --out (one process per backend: a dead model's memory never counts)")
    args = ap.parse_args()
    if args.build_sliding_mask:
        from ffpa_patch.patches import attention_backend

        attention_backend.plain_sliding_window = lambda kwargs: False
    if args.skip_ckpt_side_effects:
        torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint = True
    rows = []
    if args.append and os.path.exists(args.out):
        with open(args.out) as f:
            rows = json.load(f)["rows"]
    patched_before = 0  # in this process (rows from before the leak fix: a dead patched model held ~5 GiB)
    for seq in args.seqs:
        for backend in args.backends:
            try:
                targets = ["sdpa_repeat_kv"] if backend == "sdpa-fixed" else None
                rows.append(run(backend, seq, args.layers, args.steps, args.batch, args.padded, args.ckpt, targets,
                                not args.no_optimizer, args.compile, args.profile, args.packed, args.mixed, args.liger))
            except Exception as exc:  # OOM (stock sdpa at 16k on 5.12), or a kernel that fails: record, go on
                rows.append(dict(backend=backend, seq=seq, ckpt=args.ckpt, compiled=args.compile, liger=args.liger,
                                 packed=args.packed, error=f"{type(exc).__name__}: {exc}"[:300]))
            torch.cuda.empty_cache()
            r = rows[-1]
            r["patched_before_in_process"] = patched_before
            r["sliding_mask_built"] = args.build_sliding_mask
            r["dead_models_freed"] = True  # kernels imported on a helper thread (the leak fix)
            r["skip_ckpt_side_effects"] = args.skip_ckpt_side_effects
            r["env"] = env_info()  # per row: appended rows may come from processes with other settings
            patched_before += "error" not in r and not backend.endswith("-stock")
            print({k: v for k, v in r.items() if k not in ("routes", "losses", "profile")}, flush=True)
            write(args.out, {"env": env_info(), "args": vars(args), "rows": rows})  # after each row: a timeout keeps what ran


if __name__ == "__main__":
    main()
