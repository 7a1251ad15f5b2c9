"""While ffpa_patch is imported but off, a request for attn_implementation="ffpa" says why.

Transformers' own error names only the implementations it knows. When ffpa_patch is
imported but not applied (FFPA_PATCH_DISABLE=1, a misconfigured switch, unsupported
versions, a patch that failed), this wraps the one method that raises it,
``PreTrainedModel.get_correct_attn_implementation``, so that the error for "ffpa" names
ffpa_patch and the reason. Nothing else changes; applying ffpa_patch or ``revert()`` removes it.
"""
from __future__ import annotations

from typing import Any, Callable

from .. import hf
from ..errors import FFPANotAppliedError
from ..names import Backend
from ..registry import Patch, TargetNotFound
from ..wrapping import Undo, wrap_attribute

BACKEND = Backend.FFPA.value
METHOD = "PreTrainedModel.get_correct_attn_implementation"


class ExplainOff(Patch):
    name = "explain_off"
    module = hf.MODELING_UTILS
    summary = 'attn_implementation="ffpa" while ffpa_patch is off: an error that says why'

    def __init__(self, reason: Callable[[], str]):
        super().__init__()
        self.reason = reason

    def is_needed(self, module: Any) -> tuple[bool, str]:
        if not hasattr(getattr(module, "PreTrainedModel", None), "get_correct_attn_implementation"):
            raise TargetNotFound(f"no {METHOD} in this Transformers")
        return True, "ffpa_patch is off"

    def install(self, module: Any, record: Callable[[Undo], None]) -> None:
        reason = self.reason

        def explain(wrapped, instance, args, kwargs):
            try:
                return wrapped(*args, **kwargs)
            except ValueError as exc:
                requested = args[0] if args else kwargs.get("requested_attention")
                if requested != BACKEND:
                    raise
                raise FFPANotAppliedError(
                    f'attn_implementation="{BACKEND}" comes from ffpa_patch, which is imported here but not applied: '
                    f"{reason().removeprefix('not applied: ')}. `ffpa-patch status` says more.") from exc

        record(wrap_attribute(module, METHOD, explain, self.name)[2])
