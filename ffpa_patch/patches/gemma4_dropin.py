"""Drop-in: Gemma 4 models left on "sdpa" get FFPA on their eligible full layers.

Each Gemma 4 layout (``hf.FAMILIES``: ``gemma4`` for 31B/26B-A4B/E2B/E4B, ``gemma4_unified``
for the 12B) looks its attention function up on every call in its modeling module's
``ALL_ATTENTION_FUNCTIONS``. Transformers' documented way for one model file to override an
entry is an ``AttentionInterface`` instance of its own with a local mapping; each family's
patch gives its module exactly that, with a local "sdpa" that routes its text-attention calls
(full layers to FFPA, sliding layers to flash-attn-4 where installed, else SDPA) and passes
every other module (vision, audio) to the global "sdpa". No other model, and no Gemma 4 model
on another backend, is touched.
"""
from __future__ import annotations

from typing import Any, Callable

from .. import hf, kernels
from ..names import Backend
from ..registry import Patch, TargetNotFound
from ..wrapping import Undo, set_attribute


def make_dropin_sdpa() -> Callable:
    from ..routing.attention import route_attention

    def dropin_sdpa(module, query, key, value, attention_mask, **kwargs):
        if hf.is_text_attention(module):
            return route_attention(module, query, key, value, attention_mask, backend=Backend.SDPA.value, **kwargs)
        return hf.global_sdpa()(module, query, key, value, attention_mask, **kwargs)

    dropin_sdpa._ffpa_patch = True
    return dropin_sdpa


class Gemma4DropIn(Patch):
    """The drop-in for one family (``family``); ``DROPINS`` holds one subclass per family."""

    family: hf.Family = hf.GEMMA4
    name = hf.GEMMA4.dropin
    module = hf.GEMMA4.module
    dependencies = ("transformers", "torch", *kernels.packages())
    summary = f'{hf.GEMMA4.label} on the default "sdpa": head_dim-512 full layers run FFPA'

    def is_needed(self, module: Any) -> tuple[bool, str]:
        if not hasattr(module, self.family.attention) or not hasattr(module, "ALL_ATTENTION_FUNCTIONS"):
            raise TargetNotFound(f"{self.family.module} has no {self.family.attention} / ALL_ATTENTION_FUNCTIONS")
        return True, f"{self.family.attention} under sdpa routes full layers to FFPA"

    def warnings(self) -> list[str]:
        from . import kernels_cannot_run_here

        return kernels_cannot_run_here() if self.applied else []

    def install(self, module: Any, record: Callable[[Undo], None]) -> None:
        scoped = hf.scoped_interface(module.ALL_ATTENTION_FUNCTIONS)
        scoped["sdpa"] = make_dropin_sdpa()
        record(set_attribute(module, "ALL_ATTENTION_FUNCTIONS", scoped))


def dropin_for(family: hf.Family) -> type[Gemma4DropIn]:
    if family == hf.GEMMA4:
        return Gemma4DropIn
    return type(f"{family.attention.removesuffix('TextAttention')}DropIn", (Gemma4DropIn,), {
        "family": family, "name": family.dropin, "module": family.module,
        "summary": f'{family.label} on the default "sdpa": head_dim-512 full layers run FFPA',
        "__doc__": f"The drop-in for {family.label}."})


DROPINS = tuple(dropin_for(f) for f in hf.FAMILIES)
