"""Selective activation checkpointing that keeps the FFPA forward outputs.

    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={
        "use_reentrant": False, "context_fn": ffpa_patch.checkpointing.context_fn})

With plain checkpointing every FFPA forward runs twice per step (forward, then
recompute in backward). Here the FFPA forward ops are MUST_SAVE, so the recompute
reuses their outputs; everything else is recomputed as usual. The ops exist only
after ``import ffpa_attn.cute``, so they are looked up at each call, never frozen
at import.
"""
from __future__ import annotations

_OP_NAMES = ("_fwd_cute", "_varlen_fwd_cute")


def must_save_ops() -> set:
    """The FFPA forward overloads registered right now (empty without ffpa-attn)."""
    import torch

    from .kernels import ffpa

    if ffpa.import_error() is not None:
        return set()
    namespace = torch.ops.ffpa_attn
    return {getattr(namespace, name).default for name in _OP_NAMES if hasattr(namespace, name)}


def context_fn():
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    keep = must_save_ops()

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)
