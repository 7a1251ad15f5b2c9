"""Run by tests/test_ulysses.py under torchrun (gloo, CPU): tiny Gemma 4 models trained one step
under DeepSpeed Ulysses sequence parallelism, each case against one process on the whole sequence.

Every rank computes the reference itself (stock eager attention, fp32, the whole sequence), then
registers the model for SP through DeepSpeed's own ``register_with_transformers`` (which
ffpa_patch's patch takes over for Gemma 4), runs its shard and compares: its logits with the
reference's slice, the loss summed over ranks, every gradient summed over ranks. The kernels are
the fp32 reference seam. Prints one JSON line per case from rank 0: the worst errors over ranks.
"""
import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ffpa_patch  # noqa: E402
import tiny  # noqa: E402
from ffpa_patch import hf  # noqa: E402
from ffpa_patch.kernels import reference, use  # noqa: E402
from ffpa_patch.routing import stats  # noqa: E402

S = 32  # whole sequence; the tiny models' sliding window is 8, so the window matters


def batch(layout: str, image: bool = False):
    """(ids, position_ids, 2-D attention mask or None, shift_labels, real tokens) for the whole sequence."""
    g = torch.Generator().manual_seed(7)
    rows = 2 if layout == "padded" else 1
    ids = torch.randint(1, 100, (rows, S), generator=g)
    pos = torch.arange(S).repeat(rows, 1)
    mask = None
    real = torch.ones(rows, S, dtype=torch.bool)
    if layout == "packed":  # three documents, one of them crossing the shard boundary
        pos = torch.cat([torch.arange(11), torch.arange(13), torch.arange(8)])[None]
    elif layout == "padded":  # row 0 left-padded, row 1 right-padded: both cross shard boundaries
        real[0, :5] = False
        real[1, 21:] = False
        mask = real.long()
    if image:  # on rank 0's half only: rank 1 learns of it from the gathered positions
        ids[0, 4:10] = tiny.IMAGE_TOKEN
    labels = torch.where(real, ids, -100)
    shift = torch.nn.functional.pad(labels, (0, 1), value=-100)[:, 1:]
    shift = torch.where(real, shift, -100)  # padded rows predict nothing (their outputs are not stock's: zeros)
    return ids, pos, mask, shift, real


def token_losses(logits, shift):
    return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), shift.flatten(), ignore_index=-100,
                                             reduction="sum")


def one_case(case: dict, rank: int, world: int, counter: list) -> dict:
    from deepspeed.runtime.sequence_parallel import parallel_state_sp as mpu
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

    family, layout, backend = case["family"], case["layout"], case["backend"]
    if case.get("stock"):  # DeepSpeed's own registration, ffpa_patch's patch of it left out
        ffpa_patch.revert()
        ffpa_patch.apply(exclude=["deepspeed_ulysses"])
        try:
            UlyssesSPAttentionHF.register_with_transformers(
                model_name_or_path=tiny.causal_lm(family, attn=backend), core_attn_implementation=backend,
                sequence_parallel_size=world, micro_batch_size=1, seq_length_is_variable=True)
            return {"stock_error": None}
        except Exception as exc:
            return {"stock_error": f"{type(exc).__name__}: {exc}"}
        finally:
            mpu._release_sequence_parallel_groups()
            ffpa_patch.apply()
    image = case.get("image", False)
    build = (lambda attn: tiny.vision_lm(family, attn=attn)) if image else (lambda attn: tiny.causal_lm(family, attn=attn))
    ids, pos, mask, shift, real = batch(layout, image)
    extra = {"mm_token_type_ids": (ids == tiny.IMAGE_TOKEN).long()} if image else {}

    ref = build("eager").train()
    if case.get("ckpt"):
        ref.gradient_checkpointing_enable({"use_reentrant": False})
    out = ref(ids, position_ids=pos, attention_mask=mask, **extra).logits
    count = (shift != -100).sum()
    (token_losses(out, shift) / count).backward()
    ref_loss = float(token_losses(out, shift) / count)
    ref_grads = {n: p.grad for n, p in ref.named_parameters() if p.grad is not None}

    model = build(backend).train()
    model.load_state_dict(ref.state_dict())
    if case.get("ckpt"):
        model.gradient_checkpointing_enable({"use_reentrant": False})
    saved = dict(hf.local_mapping())
    amp = case.get("autocast", False)  # Trainer(bf16=True) over fp32 weights: q/k fp32, v bf16 reach attention
    kernels = reference.kernel_set(fp32=not (case.get("fallback") or amp))  # not fp32: the seam refuses it, as the GPU kernels do
    try:
        UlyssesSPAttentionHF.register_with_transformers(
            model_name_or_path=model, core_attn_implementation=backend, sequence_parallel_size=world,
            micro_batch_size=ids.shape[0], seq_length_is_variable=True)
        stats.reset()
        counter[0] = 0
        shard = slice(rank * S // world, (rank + 1) * S // world)
        local_mask = mask[:, shard] if mask is not None else None
        local_extra = {k: v[:, shard] for k, v in extra.items()}
        try:
            with use(kernels), torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                logits = model(ids[:, shard], position_ids=pos[:, shard], attention_mask=local_mask, **local_extra).logits
                local_sum = token_losses(logits, shift[:, shard])
                total = local_sum.detach().clone()
                dist.all_reduce(total)
                (local_sum / count).backward()
        except ffpa_patch.FFPAFallbackError as exc:
            return {"refused": str(exc)}
    finally:
        hf.local_mapping().clear()
        hf.local_mapping().update(saved)
        mpu._release_sequence_parallel_groups()
    worst = 0.0
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        grad = p.grad.clone()
        dist.all_reduce(grad)
        worst = max(worst, tiny.relative_error(grad, ref_grads[name]))
    valid = real[:, shard]
    rows = stats.snapshot()
    return {
        "loss": float(total / count), "ref_loss": ref_loss,
        "logits": tiny.relative_error(logits.detach()[valid], out.detach()[:, shard][valid]),
        "grads": worst, "grads_compared": len(ref_grads), "exchanges": counter[0],
        "routes": sorted({(r["layer"], r["kernel"], r["reason"]) for r in rows}),
    }


def main():
    import deepspeed
    from deepspeed.runtime.sequence_parallel import ulysses_sp

    cases = json.loads(sys.argv[1])
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    counter = [0]
    exchange = ulysses_sp._dim_zero_all_to_all

    def counted(*args, **kwargs):  # proves DeepSpeed's own exchange ran
        counter[0] += 1
        return exchange(*args, **kwargs)

    ulysses_sp._dim_zero_all_to_all = counted
    for case in cases:
        got = one_case(case, rank, world, counter)
        gathered = [None] * world
        dist.all_gather_object(gathered, got)
        if rank == 0:
            print("CASE " + json.dumps({"case": case, "ranks": gathered}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown (gloo threads sometimes abort there, after all work is done)
