"""Run by test_accelerate.py under `ffpa-patch run -- accelerate launch --cpu --mixed_precision bf16`.

The launcher must have activated ffpa_patch before this script imports anything of ours;
accelerate's mixed precision (autocast over fp32 weights) must reach the fused route. The
seam refuses fp32 as the real kernels do, so a full layer counts as "ffpa" only if the
autocast cast happened. Prints one line per process.
"""
import os
import sys

activated_by_launcher = "ffpa_patch" in sys.modules

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ffpa_patch  # noqa: E402
import tiny  # noqa: E402
from ffpa_patch.kernels import use  # noqa: E402
from ffpa_patch.kernels import reference  # noqa: E402


def main():
    from accelerate import Accelerator

    accelerator = Accelerator()
    model = tiny.causal_lm("dense31b", attn="ffpa").train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt = accelerator.prepare(model, opt)
    ids = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(accelerator.process_index))
    with use(reference.kernel_set()):
        loss = model(input_ids=ids, labels=ids).loss
        accelerator.backward(loss)
    opt.step()
    full = [r for r in ffpa_patch.stats() if r["layer"] == "full"]
    ok = (activated_by_launcher and accelerator.mixed_precision == "bf16" and loss.dtype == torch.float32
          and torch.isfinite(loss).item() and [r["kernel"] for r in full] == ["ffpa"]
          and full[0]["reason"].endswith("autocast: q/k/v cast to bfloat16"))
    flag = accelerator.reduce(torch.tensor([int(ok)]), reduction="sum")
    accelerator.print(f"PROCESSES_OK {int(flag)} of {accelerator.num_processes}; full layers: {full}")
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # as dist_worker.py: skip gloo's teardown
