"""Run by test_distributed.py under `ffpa-patch run -- torchrun --nproc-per-node 2`.

Each rank checks that the launcher activated ffpa_patch before any user import, then
trains one step of a tiny Gemma4 sharded with FSDP2 (gloo, CPU) on the "ffpa" backend.
"""
import os
import sys

activated_by_launcher = "ffpa_patch" in sys.modules  # before this script imports anything of ours

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ffpa_patch  # noqa: E402
import tiny  # noqa: E402
from ffpa_patch.kernels import use  # noqa: E402
from ffpa_patch.kernels import reference  # noqa: E402


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    from torch.distributed.fsdp import fully_shard

    model = tiny.causal_lm("dense31b", attn="ffpa").train()
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    ids = torch.randint(0, 128, (1, 16), generator=torch.Generator().manual_seed(rank))
    with use(reference.kernel_set(fp32=True)):
        loss = model(ids, labels=ids).loss
        loss.backward()
    ok = torch.tensor([int(activated_by_launcher and ffpa_patch.is_applied() and ffpa_patch._stats.total("full", "ffpa") == 1 and torch.isfinite(loss).item())])
    dist.all_reduce(ok)
    if rank == 0:
        print(f"RANKS_OK {int(ok)} of {dist.get_world_size()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: a gloo/C++ thread destructor there sometimes aborts the
    # process ("terminate called without an active exception") after all work is done.
    os._exit(0)
