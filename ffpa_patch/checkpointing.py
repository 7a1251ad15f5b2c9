"""Selective activation checkpointing that keeps the FFPA forward outputs.

    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={
        "use_reentrant": False, "context_fn": ffpa_patch.checkpointing.context_fn})

With plain checkpointing every FFPA forward runs twice per step (forward, then
recompute in backward). Here the forward ops the kernel table names (``Kernel.saved_ops``:
FFPA's) are MUST_SAVE, so the recompute reuses their outputs; everything else is
recomputed as usual. The ops are looked up when a step starts, never frozen at import.
"""
from __future__ import annotations


def must_save_ops() -> set:
    """The forward ops the active kernels ask to keep (empty without ffpa-attn)."""
    from .kernels import active

    return set().union(*(kernel.saved_ops() for kernel in active().kernels if kernel.saved_ops is not None))


def context_fn():
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    keep = must_save_ops()

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)
