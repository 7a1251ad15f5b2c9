"""NeMo-Automodel 0.6.x: the Gemma4-MoE decoder's ring attach honours cp_full_attn_backend.

Placeholder until the NeMo target lands: it reports itself not found.
"""
from __future__ import annotations

from typing import Any, Callable

from ..registry import Patch
from ..wrapping import Undo


class NemoMoERing(Patch):
    name = "nemo_moe_ring"
    module = "nemo_automodel.components.models.gemma4_moe.model"
    summary = "NeMo-Automodel 0.6.x Gemma4-MoE ring CP passes use_ffpa=True when cp_full_attn_backend is ffpa"

    def is_needed(self, module: Any) -> tuple[bool, str]:
        return False, "not implemented yet"

    def install(self, module: Any, record: Callable[[Undo], None]) -> None:
        raise NotImplementedError
