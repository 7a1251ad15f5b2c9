"""Gemma 4 at full depth on several GPUs, trained by the Trainer as a user runs it, one packed sequence of
``--seq`` tokens per step and rank group, bf16 weights, gradient checkpointing, LoRA (PEFT r=16 on q/k/v/o)
or full fine-tuning; ``--parallel``:
- ``ulysses``: DeepSpeed Ulysses sequence parallelism through ``ParallelismConfig(sp_backend="deepspeed")``,
  ``--sp`` ranks sharing each sequence (ZeRO-3 for full fine-tuning);
- ``fsdp2``: the Trainer's FSDP2 (``fsdp_version 2``, full shard, one sequence per rank);
- ``none``: one process, the reference a loss is compared against.
Launch every rank through ``ffpa-patch run`` (what the README says users do):

    ffpa-patch run -- torchrun --nproc-per-node 8 benchmarks/trainer_parallel.py --parallel ulysses \\
        --model 31b --seq 65536 --sp 8 --vocab 32768 --steps 30 --out benchmarks/results/<run>/trainer_parallel.json

``--backend sdpa-stock`` reverts ffpa_patch first (under ``ulysses`` DeepSpeed then registers Gemma 4 on
its own, which fails: it reads one head_dim per model; the failure is the row). Rank 0 appends one row: tokens/s
per GPU (steps after the first two; ulysses: the sequence over its ``--sp`` GPUs), each step's time, the peak memory of every rank, the loss of every
step, and the routes the ranks took. ``--tiny`` runs a CPU-sized model on gloo ranks (the script's
own check, no GPU needed):

    ffpa-patch run -- torchrun --nproc-per-node 2 benchmarks/trainer_parallel.py --tiny --seq 256 --sp 2 \\
        --steps 3 --out /tmp/trainer_parallel.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import env_info  # noqa: E402
from benchmarks.models import text_config  # noqa: E402


def documents(seq: int, vocab: int, steps: int, seed: int = 0) -> list[dict]:
    """One packed row of ``seq`` tokens per step: documents of 1/8 to 1/2 of it, position ids restarting
    per document, each document's first label ignored (as DataCollatorWithFlattening marks them)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(steps):
        lengths, left = [], seq
        while left:
            n = min(left, int(torch.randint(seq // 8, seq // 2 + 1, (1,), generator=g)))
            lengths.append(n)
            left -= n
        positions = torch.cat([torch.arange(n) for n in lengths])
        ids = torch.randint(1, vocab, (seq,), generator=g)
        rows.append({"input_ids": ids, "position_ids": positions, "labels": torch.where(positions == 0, -100, ids)})
    return rows


class Clock:
    """A TrainerCallback-shaped timer: each step's wall time, measured after the device finished."""

    def __init__(self):
        self.times, self.t = [], None

    def on_step_begin(self, *a, **k):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.t = time.perf_counter()

    def on_step_end(self, *a, **k):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.times.append(time.perf_counter() - self.t)

    def __getattr__(self, name):  # every other callback event: nothing to do
        if name.startswith("on_"):
            return lambda *a, **k: None
        raise AttributeError(name)


def build(a):
    from transformers import Gemma4ForCausalLM

    import ffpa_patch

    if a.backend == "sdpa-stock":
        ffpa_patch.revert()
    torch.manual_seed(0)  # every rank, and the one-process reference, start from the same weights
    config = text_config(a.model, vocab=a.vocab, layers=a.layers, tiny=a.tiny)
    config.use_cache = False
    config._attn_implementation = "sdpa"  # accelerate's Ulysses accepts only sdpa / flash / hub kernels
    dtype = torch.float32 if a.tiny else torch.bfloat16
    gpu = torch.cuda.is_available() and not a.tiny
    if gpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))  # each rank builds on its own GPU
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # built in bf16: the 31B in fp32 (124 GB) fits no GPU
    try:
        with torch.device("cuda" if gpu else "cpu"):
            model = Gemma4ForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    if a.recipe == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parallel", choices=["ulysses", "fsdp2", "none"], default="ulysses")
    ap.add_argument("--model", default="31b")
    ap.add_argument("--seq", type=int, default=65536)
    ap.add_argument("--sp", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--recipe", choices=["lora", "full"], default="lora")
    ap.add_argument("--backend", choices=["ffpa", "sdpa-stock"], default="ffpa")
    ap.add_argument("--vocab", type=int)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--same-batch", action="store_true",
                    help="one packed sequence for every step: the losses then compare step by step with --parallel none "
                         "(Ulysses hands the ranks' samples round in turn, so the order of different batches differs)")
    ap.add_argument("--tiny", action="store_true", help="a CPU-sized model on gloo ranks: the script's own check")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if a.tiny and a.vocab is None:
        a.vocab = 1000

    from accelerate import PartialState
    from accelerate.utils import ParallelismConfig
    from accelerate.utils.dataclasses import DeepSpeedSequenceParallelConfig
    from transformers import Trainer, TrainingArguments

    import ffpa_patch
    from ffpa_patch.routing import stats

    gpu = torch.cuda.is_available() and not a.tiny
    if a.parallel == "ulysses":
        os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
    if not gpu and a.parallel == "ulysses":
        PartialState(backend="gloo")  # the Trainer's DeepSpeed branch names no backend: on a CPU it would run 1 process
    row = {"parallel": a.parallel, "model": a.model, "seq": a.seq, "sp": a.sp if a.parallel == "ulysses" else None, "recipe": a.recipe, "backend": a.backend, "vocab": a.vocab,
           "layers": a.layers, "tiny": a.tiny, "same_batch": a.same_batch, "command": "python benchmarks/trainer_parallel.py " + " ".join(sys.argv[1:])}
    clock = Clock()
    try:
        model = build(a)
        if a.parallel == "ulysses":
            parallel = dict(
                parallelism_config=ParallelismConfig(sp_backend="deepspeed", sp_size=a.sp, sp_handler=DeepSpeedSequenceParallelConfig(
                    sp_seq_length=a.seq, sp_attn_implementation="sdpa")),
                deepspeed={"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
                           "gradient_clipping": "auto", "zero_optimization": {"stage": 3 if a.recipe == "full" else 0},
                           "bf16": {"enabled": "auto"}})
        elif a.parallel == "fsdp2":
            layer = type(model.get_decoder().layers[0]).__name__
            parallel = dict(fsdp="full_shard auto_wrap", fsdp_config={"fsdp_version": 2, "transformer_layer_cls_to_wrap": [layer]})
        else:
            parallel = {}
        args = TrainingArguments(
            output_dir=os.environ.get("OUT_DIR", "/tmp/ffpa_trainer_parallel"), per_device_train_batch_size=1,
            max_steps=a.steps, learning_rate=1e-4 if a.recipe == "lora" else 1e-5, lr_scheduler_type="constant",
            logging_steps=1, save_strategy="no", report_to="none", bf16=gpu, gradient_checkpointing=True,
            gradient_checkpointing_kwargs={"use_reentrant": False}, ddp_backend=None if gpu or a.parallel == "none" else "gloo",
            use_cpu=not gpu and a.parallel == "fsdp2",
            accelerator_config={"use_configured_state": True} if not gpu and a.parallel == "ulysses" else None, **parallel)
        world = int(os.environ.get("WORLD_SIZE", "1"))
        data = documents(a.seq, model.config.vocab_size, 1 if a.same_batch else a.steps * world)  # fsdp2: one per rank and step
        data = data * (a.steps * world) if a.same_batch else data
        trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[clock])
        if gpu:
            torch.cuda.reset_peak_memory_stats()
        trainer.train()
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        timed = clock.times[2:] or clock.times
        row.update(losses=losses, step_s=clock.times, tokens_per_s_per_gpu=a.seq / (sum(timed) / len(timed)) / (a.sp if a.parallel == "ulysses" else 1),
                   routes=sorted({(r["layer"], r["kernel"], r["reason"]) for r in stats.snapshot()}),
                   peak_gib=torch.cuda.max_memory_allocated() / 2**30 if gpu else None)
    except Exception as exc:  # noqa: BLE001 - a failed recipe is a row (stock cannot register Gemma 4 at all)
        if os.environ.get("TRAINER_PARALLEL_RAISE"):
            raise
        row["error"] = f"{type(exc).__name__}: {exc}"[:500]
    rows = [None] * dist.get_world_size() if dist.is_initialized() else [row]
    if dist.is_initialized():
        dist.all_gather_object(rows, row)
    if not dist.is_initialized() or dist.get_rank() == 0:
        merged = dict(rows[0], peak_gib_per_rank=[r.get("peak_gib") for r in rows], env=env_info() if gpu else {"torch": torch.__version__},
                      patch=ffpa_patch.status().as_dict().get("state"),
                      patches=ffpa_patch.status().as_dict().get("patches"))
        old = json.load(open(a.out))["rows"] if os.path.exists(a.out) else []
        os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
        with open(a.out, "w") as f:
            json.dump({"rows": old + [merged]}, f, indent=1)
        print(json.dumps({k: v for k, v in merged.items() if k not in ("env", "step_s")}), flush=True)


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown (gloo threads sometimes abort there, after all work is done)
