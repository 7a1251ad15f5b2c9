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


def tokenizer():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"<pad>": 0, "<unk>": 1}, unk_token="<unk>")),
                                   pad_token="<pad>", unk_token="<unk>", eos_token="<unk>")


def test_trainer_packing_losses_and_gradients_match_stock(tmp_path, patched, reference_kernels):
    """fp32 (the seam's opt-in) so that stock and the shim agree to float rounding: any
    mis-read packing boundary would show in the losses and the first step's gradients."""
    import ffpa_patch
    from transformers import DataCollatorWithFlattening, Trainer, TrainerCallback, TrainingArguments

    def run(attn):
        grads = {}

        class FirstGradients(TrainerCallback):
            def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
                if not grads:
                    grads.update({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})

        model = tiny.causal_lm("dense31b", attn=attn).train()
        targs = TrainingArguments(output_dir=str(tmp_path / attn), per_device_train_batch_size=4, max_steps=3,
                                  use_cpu=True, report_to=[], logging_steps=1, save_strategy="no",
                                  dataloader_num_workers=0, remove_unused_columns=False, max_grad_norm=0.0)
        trainer = Trainer(model=model, args=targs, train_dataset=documents(), data_collator=DataCollatorWithFlattening(),
                          callbacks=[FirstGradients()])
        trainer.train()
        return [h["loss"] for h in trainer.state.log_history if "loss" in h], grads

    ffpa_patch.revert()
    stock_losses, stock_grads = run("sdpa")
    ffpa_patch.apply()
    our_losses, our_grads = run("ffpa")
    assert stats.total("full", "ffpa") > 0 and stats.total("sliding", "fa4") > 0, stats.snapshot()
    assert our_losses == pytest.approx(stock_losses, rel=1e-4)
    assert our_grads.keys() == stock_grads.keys() and len(our_grads) > 10
    for name, want in stock_grads.items():
        assert tiny.relative_error(our_grads[name], want) < 1e-4, name


def test_trl_sft_trainer_padding_free_runs_fused(tmp_path, patched, strict_kernels):
    """TRL's SFTTrainer with padding_free=True (position_ids, no mask) under bf16 autocast;
    TRL takes attn_implementation="ffpa" on a model it is handed without a word."""
    pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    from trl import SFTConfig, SFTTrainer

    model = tiny.causal_lm("dense31b", attn="ffpa").train()
    config = SFTConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=2, use_cpu=True, bf16=True,
                       report_to=[], logging_steps=1, save_strategy="no", padding_free=True, max_length=None,
                       dataloader_num_workers=0)
    trainer = SFTTrainer(model=model, args=config, train_dataset=datasets.Dataset.from_list(documents()),
                         processing_class=tokenizer())
    trainer.train()
    rows = stats.snapshot()
    assert {r["kernel"] for r in rows} <= {"ffpa", "fa4"}, rows
    assert all(r["reason"] == "varlen (padding/packing); autocast: q/k/v cast to bfloat16" for r in rows), rows
    assert model.config._attn_implementation == "ffpa"


def test_peft_lora_on_q_k_v_o_runs_fused_and_trains_the_adapters(tmp_path, patched, strict_kernels):
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model
    from transformers import DataCollatorWithFlattening

    model = get_peft_model(tiny.causal_lm("dense31b", attn="ffpa").train(),
                           LoraConfig(r=4, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], lora_dropout=0.0))
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    train(tmp_path, model, DataCollatorWithFlattening(), bf16=True)
    rows = stats.snapshot()
    assert {r["kernel"] for r in rows} <= {"ffpa", "fa4"} and stats.total("full", "ffpa") > 0, rows
    moved = [n for n, p in model.named_parameters() if p.requires_grad and not torch.equal(p, before[n])]
    full_q = [n for n in moved if ".layers.5.self_attn.q_proj.lora_B" in n]
    assert full_q and len(moved) == len(before), sorted(set(before) - set(moved))


def test_selective_checkpointing_through_trainingarguments_as_the_readme_shows(tmp_path, patched, strict_kernels):
    """README: gradient_checkpointing_kwargs={"use_reentrant": False, "context_fn":
    ffpa_patch.checkpointing.context_fn} in TrainingArguments. Trainer must accept it, the
    layers must be checkpointed with it, and training must run fused."""
    import ffpa_patch
    from transformers import DataCollatorWithFlattening

    model = tiny.causal_lm("dense31b", attn="ffpa").train()
    seen = []
    real = ffpa_patch.checkpointing.context_fn

    def context_fn():  # the user's function, observed: it is what checkpoint() calls per layer
        seen.append(1)
        return real()

    kwargs = {"use_reentrant": False, "context_fn": context_fn}
    _, losses = train(tmp_path, model, DataCollatorWithFlattening(), bf16=True,
                      gradient_checkpointing=True, gradient_checkpointing_kwargs=kwargs)
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
    assert len(seen) >= 3 * len(model.model.layers)  # every layer, every step
    assert {r["kernel"] for r in stats.snapshot() if r["layer"] == "full"} == {"ffpa"}
