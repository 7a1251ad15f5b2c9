"""Selective checkpointing helper: lazy op lookup; a checkpointed model still trains exactly."""
import torch

import ffpa_patch
import tiny
from ffpa_patch import checkpointing


def test_ops_are_resolved_at_call_time_not_import():
    from ffpa_patch.kernels import ffpa
    from ffpa_patch.kernels.catalog import FFPA

    assert "ffpa_attn::_fwd_cute" in FFPA.checkpoint_ops

    ops = checkpointing.must_save_ops()
    assert (ops == set()) is (ffpa.import_error() is not None)


def test_checkpointed_model_with_context_fn_matches_plain(patched, reference_kernels):
    model = tiny.causal_lm("dense31b", attn="ffpa").train()
    ids = torch.randint(0, 128, (1, 16))
    model(ids, labels=ids).loss.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False, "context_fn": checkpointing.context_fn})
    model(ids, labels=ids).loss.backward()
    for n, p in model.named_parameters():
        if n in want:
            torch.testing.assert_close(p.grad, want[n], atol=1e-5, rtol=1e-4, msg=n)
