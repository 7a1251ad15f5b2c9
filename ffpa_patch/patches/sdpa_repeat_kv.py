"""Transformers 5.5-5.12: never call SDPA with ``enable_gqa=True`` above head_dim 256.

Those versions pass ``enable_gqa=True`` whenever the mask is None. No fused SDPA
kernel takes GQA broadcast above head_dim 256, so Gemma4's 512-dim full layers
silently ran the MATH kernel and materialised S x S scores. For exactly that case
the wrapper repeats K/V (what 5.13+ does) and calls what it wraps with the module's
``num_key_value_groups`` hidden, so no ``enable_gqa`` is added and an earlier wrapper
still runs; every other call goes to the original unchanged.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

from .. import hf
from ..registry import Patch
from ..wrapping import Undo, wrap_attribute, wrap_mapping_entry

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


class _RepeatedAlready:
    """The attention module as the wrapped ``sdpa_attention_forward`` sees it once K/V are
    repeated: every attribute but ``num_key_value_groups``, whose presence is what makes
    5.5-5.12 pass ``enable_gqa``. So whatever was wrapped (Transformers' own function, or an
    earlier wrapper such as an fp32-upcast override) still runs, on a mask-free call that a
    fused kernel takes."""

    def __init__(self, module: Any):
        object.__setattr__(self, "_module", module)

    def __getattr__(self, name: str) -> Any:
        if name == "num_key_value_groups":
            raise AttributeError(name)
        return getattr(self._module, name)


def make_fixed_sdpa(repeat_kv: Callable) -> Callable:
    def fixed_sdpa(wrapped, instance, args, kwargs):
        call = dict(zip(_PARAMS, args))
        call.update((k, kwargs[k]) for k in _PARAMS if k in kwargs)
        if len(args) > len(_PARAMS) or not all(k in call for k in _PARAMS[:5]):
            return wrapped(*args, **kwargs)
        module, key, value = call["module"], call["key"], call["value"]
        if not needs_repeat(module, key, value, call["attention_mask"]):
            return wrapped(*args, **kwargs)
        n_rep = module.num_key_value_groups
        key, value = repeat_kv(key, n_rep), repeat_kv(value, n_rep)
        rest = {k: v for k, v in kwargs.items() if k not in _PARAMS}
        rest.update((k, call[k]) for k in _PARAMS[5:] if k in call)
        return wrapped(_RepeatedAlready(module), call["query"], key, value, None, **rest)

    return fixed_sdpa


class SdpaRepeatKV(Patch):
    name = "sdpa_repeat_kv"
    module = hf.MODELING_UTILS
    summary = "repeat K/V instead of enable_gqa for head_dim > 256 (Transformers 5.5-5.12 MATH-kernel fix)"

    def is_needed(self, module: Any) -> tuple[bool, str]:
        if _bug_present(hf.sdpa_attention_module()):
            return True, "installed use_gqa_in_sdpa enables GQA at head_dim 512 (SDPA would run MATH)"
        return False, "installed use_gqa_in_sdpa already refuses GQA above head_dim 256"

    def install(self, module: Any, record: Callable[[Undo], None]) -> None:
        sdpa_attention = hf.sdpa_attention_module()
        original = sdpa_attention.sdpa_attention_forward
        fixed = make_fixed_sdpa(sdpa_attention.repeat_kv)
        record(wrap_attribute(sdpa_attention, "sdpa_attention_forward", fixed, self.name)[2])
        # the registry entry is what models call, inside compiled graphs too: a plain function. The fix
        # always calls what it wraps (with K/V repeated), so an earlier wrapper (an fp32 upcast, say) may
        # be wrapped, as long as the registry and the module attribute agree on it
        record(wrap_mapping_entry(hf.attention_registry(), "sdpa", fixed, self.name, accept=lambda e: e is original,
                                  reads=lambda: hf.attention_table_entry("sdpa"))[2])
