"""Transformers 5.5-5.12: never call SDPA with ``enable_gqa=True`` above head_dim 256.

Those versions pass ``enable_gqa=True`` whenever the mask is None. No fused SDPA
kernel takes GQA broadcast above head_dim 256, so Gemma4's 512-dim full layers
silently ran the MATH kernel and materialised S x S scores. For exactly that case
the wrapper repeats K/V and calls SDPA itself (what 5.13+ does); every other call
goes to the original unchanged.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

from ..registry import Patch
from ..wrapping import Undo, set_mapping_entry, wrap_attribute

_MAX_GQA_HEAD_DIM = 256
_PARAMS = ("module", "query", "key", "value", "attention_mask", "dropout", "scaling", "is_causal")


def _bug_present(sdpa_module: Any) -> bool:
    """Ask the installed ``use_gqa_in_sdpa`` whether a 512-dim, mask-less call uses GQA."""
    import torch

    use_gqa = getattr(sdpa_module, "use_gqa_in_sdpa", None)
    if use_gqa is None:
        return False
    key = torch.empty(1, 1, 2, 512, device="meta")
    n_args = len(inspect.signature(use_gqa).parameters)
    args = (None, key, key)[:n_args]
    return bool(use_gqa(*args))


def needs_repeat(module: Any, key: Any, value: Any, attention_mask: Any) -> bool:
    return (
        attention_mask is None
        and getattr(module, "num_key_value_groups", 1) > 1
        and (key.shape[-1] > _MAX_GQA_HEAD_DIM or key.shape[-1] != value.shape[-1])
    )


def make_fixed_sdpa(repeat_kv: Callable) -> Callable:
    import torch

    def fixed_sdpa(wrapped, instance, args, kwargs):
        call = dict(zip(_PARAMS, args))
        call.update((k, kwargs[k]) for k in _PARAMS if k in kwargs)
        if len(args) > len(_PARAMS) or not all(k in call for k in _PARAMS[:5]):
            return wrapped(*args, **kwargs)
        module, key, value = call["module"], call["key"], call["value"]
        if not needs_repeat(module, key, value, call["attention_mask"]):
            return wrapped(*args, **kwargs)
        query = call["query"]
        n_rep = module.num_key_value_groups
        key, value = repeat_kv(key, n_rep), repeat_kv(value, n_rep)
        is_causal = call.get("is_causal")
        is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        out = torch.nn.functional.scaled_dot_product_attention(
            query,
            key,
            value,
            attn_mask=None,
            dropout_p=call.get("dropout", 0.0),
            scale=call.get("scaling"),
            is_causal=query.shape[2] > 1 and bool(is_causal),
        )
        return out.transpose(1, 2).contiguous(), None

    return fixed_sdpa


class SdpaRepeatKV(Patch):
    name = "sdpa_repeat_kv"
    module = "transformers.modeling_utils"
    summary = "repeat K/V instead of enable_gqa for head_dim > 256 (Transformers 5.5-5.12 MATH-kernel fix)"

    def is_needed(self, module: Any) -> tuple[bool, str]:
        from transformers.integrations import sdpa_attention

        if _bug_present(sdpa_attention):
            return True, "installed use_gqa_in_sdpa enables GQA at head_dim 512 (SDPA would run MATH)"
        return False, "installed use_gqa_in_sdpa already refuses GQA above head_dim 256"

    def install(self, module: Any, record: Callable[[Undo], None]) -> None:
        from transformers.integrations import sdpa_attention

        original = sdpa_attention.sdpa_attention_forward
        fw, switch, undo = wrap_attribute(sdpa_attention, "sdpa_attention_forward", make_fixed_sdpa(sdpa_attention.repeat_kv), self.name)
        record(undo)
        mapping = module.AttentionInterface._global_mapping
        if mapping.get("sdpa") is not original:
            raise RuntimeError("the 'sdpa' attention registry entry is not Transformers' own; refusing to guess")
        record(set_mapping_entry(mapping, "sdpa", fw, on_replaced=switch.off))
