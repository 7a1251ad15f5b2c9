"""Drop-in: Gemma4 models left on "sdpa" get FFPA on their eligible full layers.

Gemma4's attention looks its function up on every call in the module-level
``ALL_ATTENTION_FUNCTIONS``. Transformers' documented way for one model file to
override an entry is an ``AttentionInterface`` instance of its own with a local
mapping; we give ``modeling_gemma4`` exactly that, with a local "sdpa" that
routes ``Gemma4TextAttention`` calls (full layers to FFPA, sliding layers to
flash-attn-4 where installed, else SDPA) and passes every other module (vision, audio) to the global "sdpa".
No other model, and no Gemma4 model on another backend, is touched.
"""
from __future__ import annotations

from typing import Any, Callable

from .. import hf
from ..registry import Patch, TargetNotFound
from ..wrapping import Undo, set_attribute


def make_dropin_sdpa() -> Callable:
    from ..routing.attention import route_attention

    def dropin_sdpa(module, query, key, value, attention_mask, **kwargs):
        if hf.is_text_attention(module):
            return route_attention(module, query, key, value, attention_mask, backend="sdpa", **kwargs)
        return hf.global_sdpa()(module, query, key, value, attention_mask, **kwargs)

    dropin_sdpa._ffpa_patch = True
    return dropin_sdpa


class Gemma4DropIn(Patch):
    name = "gemma4_dropin"
    dependencies = ("transformers", "torch", "ffpa-attn", "flash-attn-4")
    module = "transformers.models.gemma4.modeling_gemma4"
    summary = 'Gemma4 on the default "sdpa": head_dim-512 full layers run FFPA'

    def is_needed(self, module: Any) -> tuple[bool, str]:
        if not hasattr(module, "Gemma4TextAttention") or not hasattr(module, "ALL_ATTENTION_FUNCTIONS"):
            raise TargetNotFound("modeling_gemma4 has no Gemma4TextAttention / ALL_ATTENTION_FUNCTIONS")
        return True, "Gemma4TextAttention under sdpa routes full layers to FFPA"

    def warnings(self) -> list[str]:
        from . import kernels_cannot_run_here

        return kernels_cannot_run_here() if self.applied else []

    def install(self, module: Any, record: Callable[[Undo], None]) -> None:
        current = module.ALL_ATTENTION_FUNCTIONS
        scoped = type(current)()
        scoped._local_mapping.update(getattr(current, "_local_mapping", {}))
        scoped["sdpa"] = make_dropin_sdpa()
        record(set_attribute(module, "ALL_ATTENTION_FUNCTIONS", scoped))
