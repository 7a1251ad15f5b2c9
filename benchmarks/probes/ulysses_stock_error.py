"""What stock DeepSpeed Ulysses SP + SDPA computes for a sliding-window model, against one process.

DeepSpeed passes every mask as None to the core attention, so SDPA runs plain causal attention over
the gathered sequence: a sliding window (layout "window": one document, window 16 of 64 tokens)
and packed documents (layout "packed": three documents, no window) are lost. Gemma 4 cannot even register
on stock DeepSpeed (two head sizes), so this uses a tiny Mistral (one head size, ``sliding_window``
shorter than the sequence), without ffpa_patch. CPU, 2 gloo ranks:

    OMP_NUM_THREADS=1 python -m torch.distributed.run --nproc-per-node 2 --standalone \\
        benchmarks/probes/ulysses_stock_error.py [OUT.json]
"""
import copy
import json
import os
import sys

import torch
import torch.distributed as dist

os.environ["FFPA_PATCH_DISABLE"] = "1"  # stock only, even under `ffpa-patch run`
S = 64


def rel(a, b):
    return float((a - b).norm() / b.norm())


def run(layout: str, rank: int, world: int) -> dict:
    from deepspeed.runtime.sequence_parallel import parallel_state_sp as mpu
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF
    from transformers import MistralConfig, MistralForCausalLM
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    torch.manual_seed(0)
    config = MistralConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa",
                           sliding_window=16 if layout == "window" else None)  # packed: documents only
    ref = MistralForCausalLM(config).float()
    ids = torch.randint(0, 128, (1, S), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(S)[None] if layout == "window" else torch.cat([torch.arange(20), torch.arange(30), torch.arange(14)])[None]
    shift = torch.nn.functional.pad(ids, (0, 1), value=-100)[:, 1:]
    shift = torch.where(torch.nn.functional.pad(pos, (0, 1), value=0)[:, 1:] == 0, -100, shift)  # no target across documents
    count = (shift != -100).sum()

    def losses(logits, labels):
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum")

    ref.set_attn_implementation("eager")  # the whole sequence with the window and documents: the truth
    out = ref(ids, position_ids=pos, use_cache=False).logits  # (a cache turns packing detection off)
    (losses(out, shift) / count).backward()
    want_loss = float(losses(out, shift) / count)
    model = MistralForCausalLM(copy.deepcopy(config)).float()
    model.set_attn_implementation("sdpa")
    model.load_state_dict(ref.state_dict())
    saved = dict(ALL_ATTENTION_FUNCTIONS._local_mapping)
    UlyssesSPAttentionHF.register_with_transformers(model_name_or_path=model, core_attn_implementation="sdpa",
                                                    sequence_parallel_size=world, micro_batch_size=1)
    shard = slice(rank * S // world, (rank + 1) * S // world)
    logits = model(ids[:, shard], position_ids=pos[:, shard], use_cache=False).logits
    local = losses(logits, shift[:, shard])
    total = local.detach().clone()
    dist.all_reduce(total)
    (local / count).backward()
    ALL_ATTENTION_FUNCTIONS._local_mapping.clear()
    ALL_ATTENTION_FUNCTIONS._local_mapping.update(saved)
    mpu._release_sequence_parallel_groups()
    grads = []
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        g = p.grad.clone()
        dist.all_reduce(g)
        grads.append(rel(g, q.grad))
    return {"layout": layout, "loss": float(total / count), "one_process_loss": want_loss,
            "logits_error_this_rank": rel(logits.detach(), out.detach()[:, shard]), "worst_gradient_error": max(grads)}


def main():
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = [run(layout, rank, world) for layout in ("window", "packed")]
    gathered = [None] * world
    dist.all_gather_object(gathered, rows)
    if rank == 0:
        text = json.dumps({"ranks": gathered, "command": "python -m torch.distributed.run --nproc-per-node 2 "
                           "--standalone benchmarks/probes/ulysses_stock_error.py " + " ".join(sys.argv[1:])}, indent=1)
        print(text, flush=True)
        if len(sys.argv) > 1:
            with open(sys.argv[1], "w") as f:
                f.write(text)
    dist.barrier()


if __name__ == "__main__":
    main()
    os._exit(0)
