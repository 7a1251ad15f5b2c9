"""Run by tests/test_ulysses_trainer.py under torchrun (2 gloo ranks, CPU): a tiny Gemma 4 left on
"sdpa" trained two SGD steps under DeepSpeed Ulysses SP as a user drives it, through accelerate's
``ParallelismConfig(sp_backend="deepspeed")`` + ``prepare()`` (``accelerate``) or the ``Trainer``
(``trainer``), against one process on the whole sequence. The batch is packed (position ids
restart per document) and the same at both steps, so the second loss checks the first update.

On a CPU-only host both need the gloo backend named (accelerate otherwise runs every rank as a
single process, silently), and DeepSpeed's gradient clipping (1.0 by default) is turned off.
"""
import copy
import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ffpa_patch  # noqa: E402
import tiny  # noqa: E402
from ffpa_patch.kernels import reference, use  # noqa: E402
from ffpa_patch.routing import stats  # noqa: E402

S, LR, STEPS = 32, 0.5, 2
POSITIONS = torch.cat([torch.arange(11), torch.arange(13), torch.arange(8)])
IDS = torch.randint(1, 100, (S,), generator=torch.Generator().manual_seed(3))
LABELS = torch.where(POSITIONS == 0, -100, IDS)  # as DataCollatorWithFlattening marks document starts


def reference_losses(model) -> list[float]:
    """One process, the whole sequence, stock eager attention: the losses of two SGD steps."""
    ref = copy.deepcopy(model)
    ref.set_attn_implementation("eager")
    opt = torch.optim.SGD(ref.parameters(), lr=LR)
    losses = []
    for _ in range(STEPS):
        loss = ref(IDS[None], position_ids=POSITIONS[None], labels=LABELS[None]).loss
        losses.append(loss.item())
        loss.backward()
        opt.step()
        opt.zero_grad()
    return losses


def sp_config():
    from accelerate.utils import ParallelismConfig
    from accelerate.utils.dataclasses import DeepSpeedSequenceParallelConfig

    return ParallelismConfig(sp_backend="deepspeed", sp_size=2, sp_handler=DeepSpeedSequenceParallelConfig(
        sp_attn_implementation="sdpa", sp_seq_length_is_variable=True))


def with_accelerate(model) -> list[float]:
    from accelerate import Accelerator
    from accelerate.utils import DeepSpeedPlugin, InitProcessGroupKwargs
    from deepspeed.utils import groups

    ds_config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
                 "zero_optimization": {"stage": 0}}
    accelerator = Accelerator(parallelism_config=sp_config(), deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=ds_config),
                              kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")])
    data = [{"input_ids": IDS, "position_ids": POSITIONS, "labels": LABELS}] * (STEPS * 2)
    loader = torch.utils.data.DataLoader(data, batch_size=1)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    engine, opt, loader = accelerator.prepare(model, opt, loader)
    group = groups._get_sequence_parallel_group()
    losses = []
    for step, batch in zip(range(STEPS), loader):
        shift = batch["shift_labels"]
        logits = engine(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
        local = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), shift.flatten(), ignore_index=-100,
                                                  reduction="sum")
        totals = torch.stack([local.detach(), (shift != -100).sum().float()])
        dist.all_reduce(totals, group=group)
        loss = (local + (totals[0] - local.detach())) / totals[1]  # as the Trainer combines it: the global mean
        losses.append(loss.item())
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
    return losses


def with_trainer(model) -> list[float]:
    from accelerate import PartialState
    from transformers import Trainer, TrainingArguments

    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
    PartialState(backend="gloo")  # (the Trainer's DeepSpeed branch names no backend: on a CPU it would run 1 process)
    args = TrainingArguments(
        output_dir=os.environ.get("OUT_DIR", "/tmp/ffpa_sp_trainer"), per_device_train_batch_size=1, max_steps=STEPS,
        learning_rate=LR, optim="sgd", lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=0.0,
        logging_steps=1, save_strategy="no", report_to="none", parallelism_config=sp_config(), ddp_backend="gloo",
        deepspeed={"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
                   "gradient_clipping": "auto", "zero_optimization": {"stage": 0}},
        accelerator_config={"use_configured_state": True})
    data = [{"input_ids": IDS, "position_ids": POSITIONS, "labels": LABELS}] * (STEPS * 2)
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def main(mode: str):
    torch.manual_seed(0)
    model = tiny.causal_lm("dense31b", attn="sdpa").train()  # left on "sdpa": accelerate takes only that
    expected = reference_losses(model)
    stats.reset()
    with use(reference.kernel_set(fp32=True)):
        losses = (with_accelerate if mode == "accelerate" else with_trainer)(model)
    rows = stats.snapshot()
    result = {"losses": losses, "expected": expected, "routes": sorted({(r["layer"], r["kernel"], r["reason"]) for r in rows}),
              "applied": ffpa_patch.status().as_dict()["patches"]}
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, result)
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(gathered), flush=True)
    dist.barrier()


if __name__ == "__main__":
    main(sys.argv[1])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown (gloo threads sometimes abort there, after all work is done)
