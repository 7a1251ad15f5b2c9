"""NeMo-Automodel 0.6.x: the Gemma4-MoE decoder's ring attach honours cp_full_attn_backend.

In 0.6.x ``Gemma4MoEDecoderLayer.__init__`` calls
``attach_gemma4_cp_ring_attention(self.self_attn)`` without ``use_ffpa``; only the
dense branch reads ``text_config.cp_full_attn_backend``, so MoE ring CP silently ran
its full-attention chunks on FlexAttention. We wrap the name ``model.py`` calls: a
call that does not say ``use_ffpa`` gets it from the attention module's own config,
validated as 0.7 does. 0.7+ applies that policy itself (``_apply_cp_attention_backend_policy``):
there the patch is not needed.
"""
from __future__ import annotations

from typing import Any, Callable

from .. import hf
from ..registry import Patch, TargetNotFound
from ..wrapping import Undo, wrap_attribute

_BACKENDS = ("flex", "ffpa")


def full_attn_backend(config: Any) -> str:
    backend = str(getattr(config, "cp_full_attn_backend", "flex")).lower()
    if backend not in _BACKENDS:
        raise ValueError(f"Unsupported cp_full_attn_backend: {backend!r} (expected one of {_BACKENDS})")
    return backend


def _attach_with_policy(wrapped, instance, args, kwargs):
    if "use_ffpa" not in kwargs and args:
        kwargs = dict(kwargs, use_ffpa=full_attn_backend(getattr(args[0], "config", None)) == "ffpa")
    return wrapped(*args, **kwargs)


class NemoMoERing(Patch):
    name = "nemo_moe_ring"
    dependencies = ("transformers", "torch", "nemo-automodel")
    module = "nemo_automodel.components.models.gemma4_moe.model"
    summary = "NeMo-Automodel 0.6.x Gemma4-MoE ring CP passes use_ffpa=True when cp_full_attn_backend is ffpa"

    def is_needed(self, module: Any) -> tuple[bool, str]:
        generation = getattr(module, "Gemma4ForConditionalGeneration", None)
        if generation is not None and hasattr(generation, "_apply_cp_attention_backend_policy"):
            return False, "this NeMo applies cp_full_attn_backend to MoE layers itself (0.7+)"
        if not hasattr(module, "attach_gemma4_cp_ring_attention") or not hasattr(module, "Gemma4MoEDecoderLayer"):
            raise TargetNotFound("no attach_gemma4_cp_ring_attention / Gemma4MoEDecoderLayer in this NeMo")
        return True, "MoE decoder layers read text_config.cp_full_attn_backend"

    def warnings(self) -> list[str]:
        import sys

        if self.module not in sys.modules:
            return []
        found = []
        from ..kernels import ffpa

        if ffpa.import_error():
            found.append(f"cp_full_attn_backend: ffpa has no effect here: {ffpa.import_error()}")
        sdpa = hf.attention_registry().get("sdpa")
        if getattr(sdpa, "__name__", "") == "sdpa_fp32_attention_forward":
            found.append("NeMo's fp32 SDPA override is active: attention inputs become fp32, which FFPA cannot take")
        return found

    def install(self, module: Any, record: Callable[[Undo], None]) -> None:
        record(wrap_attribute(module, "attach_gemma4_cp_ring_attention", _attach_with_policy, self.name)[2])
