"""Hugging Face Trainer as users run it: padding-free packing, autocast over fp32 weights or bf16.

The strict seam refuses fp32 as the GPU kernels do, so these routes are the GPU's.
"""
import pytest
import torch

import tiny
from ffpa_patch.routing import stats

pytest.importorskip("accelerate")


def documents(n=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(5, 30, (n,), generator=g).tolist()
    return [{"input_ids": torch.randint(1, 120, (n_tok,), generator=g).tolist()} for n_tok in lengths]


def train(tmp_path, model, collator, **args):
    from transformers import Trainer, TrainingArguments

    targs = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=3, use_cpu=True,
                              report_to=[], logging_steps=1, save_strategy="no", learning_rate=1e-3,
                              dataloader_num_workers=0, remove_unused_columns=False, **args)
    trainer = Trainer(model=model, args=targs, train_dataset=documents(), data_collator=collator)
    result = trainer.train()
    return result, [h["loss"] for h in trainer.state.log_history if "loss" in h]


@pytest.mark.parametrize("precision", ["autocast_bf16", "bf16_weights"])
@pytest.mark.parametrize("collator", ["flattening", "padding"])
def test_trainer_steps_run_fused_on_every_layer(precision, collator, tmp_path, patched, strict_kernels):
    from transformers import DataCollatorForLanguageModeling, DataCollatorWithFlattening, PreTrainedTokenizerFast

    model = tiny.causal_lm("dense31b", attn="ffpa").train()
    args = {"bf16": True} if precision == "autocast_bf16" else {}
    if precision == "bf16_weights":
        model = model.bfloat16()
    if collator == "flattening":
        collate = DataCollatorWithFlattening()
    else:
        from tokenizers import Tokenizer, models

        tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"<pad>": 0, "<unk>": 1}, unk_token="<unk>")),
                                      pad_token="<pad>", unk_token="<unk>")
        collate = DataCollatorForLanguageModeling(tok, mlm=False)
    _, losses = train(tmp_path, model, collate, gradient_checkpointing=True, **args)
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
    rows = stats.snapshot()
    kinds = {r["kernel"] for r in rows}
    assert kinds <= {"ffpa", "fa4"}, rows  # nothing fell back
    expected = "varlen (padding/packing)"
    assert any(r["layer"] == "full" and r["reason"].startswith(expected) for r in rows), rows
    cast = "autocast: q/k/v cast to bfloat16"
    assert all(r["reason"].endswith(cast) == (precision == "autocast_bf16") for r in rows), rows
    assert all(p.dtype == (torch.float32 if precision == "autocast_bf16" else torch.bfloat16) for p in model.parameters())
