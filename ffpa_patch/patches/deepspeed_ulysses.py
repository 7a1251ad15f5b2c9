"""DeepSpeed Ulysses sequence parallelism (ALST) for Gemma 4: what accelerate and the Trainer use.

``UlyssesSPAttentionHF.register_with_transformers`` builds one exchange module from the model's
single ``head_dim`` and KV-head count and puts a wrapper into Transformers' shared table that
passes every mask as None. For Gemma 4 neither holds: its full and sliding layers differ in head
size and KV heads (from 5.15 the config's ``head_dim`` raises), and without the mask the sliding
window, packing and padding are lost. This patch wraps the registration; for a Gemma 4 model it
registers instead:

- one ``UlyssesSPAttentionHF`` per layer shape (head_dim, query heads, KV heads), read off the
  layers Transformers builds, with DeepSpeed's own exchange and KV-head replication;
- one wrapper in the shared table, as DeepSpeed writes its own, around the entry that was there
  (ffpa_patch's drop-in for "sdpa", its "ffpa" backend, or a user's wrapper of either): each
  Gemma 4 text-attention call goes through its shape's module. The local mask's padding and
  image-block facts ride in the position ids DeepSpeed gathers (``masks.flag_positions``), so
  after the exchange every rank rebuilds the whole sequence's layout (``masks.over_positions``)
  and runs the fused kernels on its heads: dense, or varlen for packing and padding, O(S).

Other models register through DeepSpeed's own code, unchanged. ``revert()`` takes the wrapper off
the registration; a registration already made stays DeepSpeed's (as its own does).
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

from .. import hf, kernels
from ..registry import Patch, TargetNotFound
from ..wrapping import Undo, wrap_attribute

MODULE = "deepspeed.runtime.sequence_parallel.ulysses_sp"
METHOD = "UlyssesSPAttentionHF.register_with_transformers"
CORES = ("sdpa", "ffpa")  # the entries that reach ffpa_patch's route: the drop-in, and the "ffpa" backend


class DeepSpeedUlysses(Patch):
    name = "deepspeed_ulysses"
    module = MODULE
    dependencies = ("transformers", "torch", "deepspeed", *kernels.packages())
    summary = ("DeepSpeed Ulysses SP (accelerate, Trainer) for Gemma 4: one exchange per layer shape, "
               "the fused kernels on every rank, sliding window, packing and padding kept")

    def is_needed(self, module: Any) -> tuple[bool, str]:
        cls = getattr(module, "UlyssesSPAttentionHF", None)
        if cls is None or not hasattr(cls, "register_with_transformers"):
            raise TargetNotFound(f"{MODULE} has no {METHOD}")
        return True, "DeepSpeed reads one head_dim and KV-head count per model and drops every mask"

    def install(self, module: Any, record: Callable[[Undo], None]) -> None:
        record(wrap_attribute(module, METHOD, _register, self.name)[2])


def _register(wrapped, cls, args, kwargs):
    """DeepSpeed's registration for other models; ours for Gemma 4 (same arguments, same return)."""
    call = inspect.signature(wrapped).bind(*args, **kwargs)
    call.apply_defaults()
    given = call.arguments
    if given.get("sequence_parallel_size") == 1:
        return wrapped(*args, **kwargs)
    config = hf.model_config(given["model_name_or_path"])
    text = config.get_text_config()
    if not hf.is_text_config(text):
        return wrapped(*args, **kwargs)
    return register_gemma4(cls, config, text, given)


def register_gemma4(cls, config, text, given: dict):
    """What ``register_with_transformers`` does, per layer shape; returns DeepSpeed's mpu."""
    import deepspeed.runtime.sequence_parallel.parallel_state_sp as mpu

    core, sp_size = given["core_attn_implementation"], given["sequence_parallel_size"]
    seq_length = given.get("seq_length") or given.get("max_length")
    variable = given.get("seq_length_is_variable", True)
    if not variable and seq_length is None:
        raise ValueError("Either `seq_length_is_variable` needs to be `True` or `seq_length` needs to be set to an "
                         "integer value of the fixed batch size length.")
    loaded = hasattr(given["model_name_or_path"], "config")
    declared = getattr(config, "_attn_implementation", None) if loaded else None
    if declared is not None and declared != core:
        raise ValueError(f"core_attn_implementation='{core}' does not match model config attn_implementation="
                         f"'{declared}'. Set both to the same value so sequence-parallel wrapper can intercept the "
                         "active attention path.")
    table = hf.attention_table()
    if core not in CORES or core not in table:
        raise ValueError(
            f"ffpa_patch: Gemma 4 under DeepSpeed Ulysses sequence parallelism runs on core_attn_implementation "
            f"'sdpa' (ffpa_patch's drop-in; what accelerate's sp_attn_implementation takes) or 'ffpa' (with "
            f"ffpa_patch applied); got {core!r}. No flash-attention kernel takes Gemma 4's head_dim-512 full layers.")
    shapes = hf.head_shapes(text)
    check_degree(shapes, sp_size)
    mpu.initialize_sequence_parallel(sequence_parallel_size=sp_size)
    inner = table[core]
    inner = getattr(inner, "_ffpa_ulysses_inner", inner)  # registered again: around what the first one wrapped
    by_shape = {}
    for shape in shapes:
        module = cls(attn=inner, batch_size=given["micro_batch_size"], attn_head_count=shape.heads,
                     attn_head_size=shape.head_dim, kv_head_count=shape.kv_heads,
                     num_hidden_layers=text.num_hidden_layers, process_group=mpu.get_sequence_parallel_group(),
                     seq_length_is_variable=variable,
                     local_seq_length=None if variable else seq_length // mpu.get_sequence_parallel_world_size(),
                     global_seq_length=None if variable else seq_length,
                     disable_in_eval=given.get("disable_in_eval", False))
        module.core_attn_implementation = core
        by_shape[(shape.head_dim, shape.heads, shape.kv_heads)] = module
    table[core] = sequence_parallel_attention(by_shape, inner)  # where DeepSpeed puts its own wrapper
    return mpu


def check_degree(shapes: dict, sp_size: int) -> None:
    """Every layer shape must split: the query heads by the degree, the KV heads by it or it by them."""

    def fits(shape, degree):
        return shape.heads % degree == 0 and (shape.kv_heads % degree == 0 or degree % shape.kv_heads == 0)

    for shape, kinds in shapes.items():
        if not fits(shape, sp_size):
            top = max(s.heads for s in shapes)
            good = [d for d in range(2, top + 1) if all(fits(s, d) for s in shapes)]
            raise ValueError(
                f"ffpa_patch: sequence_parallel_size={sp_size} does not split this Gemma 4's {'/'.join(kinds)} layers "
                f"({shape.heads} query heads, {shape.kv_heads} KV heads, head_dim {shape.head_dim}): the degree must "
                f"divide the query heads and either divide the KV heads or be a multiple of them. Degrees that fit "
                f"every layer: {good or 'none'}.")


def sequence_parallel_attention(by_shape: dict, inner: Callable) -> Callable:
    """The shared table's entry while Gemma 4 trains under Ulysses SP."""
    from ..routing import masks

    def ulysses_attention(module, query, key, value, attention_mask, *args, **kwargs):
        if not hf.is_text_attention(module):  # a vision or audio tower: its tokens are not sharded
            return inner(module, query, key, value, attention_mask, *args, **kwargs)
        exchange = by_shape.get((query.shape[-1], query.shape[1], key.shape[1]))
        if exchange is None:
            raise ValueError(
                f"ffpa_patch: no Ulysses exchange for a Gemma 4 layer with head_dim {query.shape[-1]}, "
                f"{query.shape[1]} query heads and {key.shape[1]} KV heads: the model trained is not the one "
                f"registered for sequence parallelism (shapes registered: {sorted(by_shape)})")
        if not module.training and exchange.disable_in_eval:
            return inner(module, query, key, value, attention_mask, *args, **kwargs)
        if "position_ids" in kwargs:  # (without them DeepSpeed's own assertion says what to do)
            kwargs["position_ids"] = masks.flag_positions(attention_mask, kwargs["position_ids"], query.shape[0])
        groups = module.num_key_value_groups  # DeepSpeed rewrites it when it replicates KV heads
        try:
            return exchange(module, query, key, value, masks.SequenceParallel(), *args, **kwargs)
        finally:
            module.num_key_value_groups = groups

    ulysses_attention._ffpa_ulysses_inner = inner
    return ulysses_attention
