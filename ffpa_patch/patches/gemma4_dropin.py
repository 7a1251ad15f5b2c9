"""Drop-in: Gemma 4 models left on "sdpa" get FFPA on their eligible full layers.

Every model looks its attention function up on every call in Transformers' shared table
(``ALL_ATTENTION_FUNCTIONS``: an instance-local entry first, then the class-level one that
``AttentionInterface.register`` writes). The drop-in wraps the class-level "sdpa" entry in
place: a Gemma 4 text-attention call (``hf.FAMILIES``: ``gemma4`` for 31B/26B-A4B/E2B/E4B,
``gemma4_unified`` for the 12B, each enabled by its own patch) is routed (full layers to FFPA,
sliding layers to flash-attn-4 where installed), every other call (other models, vision and
audio towers) goes to the entry it wraps, unchanged.

So the table Gemma 4 reads stays the one everybody else writes to. A wrapper installed after
``apply()`` (a user's ``register("sdpa", ...)``, DeepSpeed's Ulysses wrapper in the shared
instance) wraps ours and is called around the route, never bypassed; ``revert()`` then switches
ours off inside it, and the next ``apply()`` switches it back on instead of wrapping twice. An
entry someone else put there before ``apply()`` would sit inside ours and be skipped by routed
calls: the drop-in stands down instead, and says so.
"""
from __future__ import annotations

from typing import Any, Callable

from .. import hf, kernels
from ..names import Backend
from ..registry import Patch, StandDown, TargetNotFound
from ..wrapping import Undo, beneath, describe, is_ours, reaches, wrap_mapping_entry

NAME = "gemma4_dropin"  # the wrapper's name in the registry (one wrapper, shared by the families' patches)


class _Entry:
    """The one wrapper of the "sdpa" entry, and the families it routes (one patch per family)."""

    def __init__(self) -> None:
        self.families: frozenset = frozenset()
        self.fn: Callable | None = None  # ours, in the registry or inside whatever wrapped it since
        self._undo: Undo | None = None

    def enable(self, family: hf.Family) -> Undo:
        if self._undo is None:
            self.fn, _switch, self._undo = wrap_mapping_entry(hf.attention_registry(), "sdpa", self._route, NAME,
                                                              accept=acceptable,
                                                              reads=lambda: hf.attention_table_entry("sdpa"))
        self.families = self.families | {family}

        def undo() -> None:
            self.families = self.families - {family}
            if not self.families and self._undo is not None:
                self._undo, undo_entry = None, self._undo
                undo_entry()

        return undo

    def _route(self, original, _instance, args, kwargs):
        if len(args) == 5 and hf.family_of(args[0]) in self.families:  # Transformers' call: 5 positional
            from ..routing.attention import route_attention

            return route_attention(*args, backend=Backend.SDPA.value, sdpa=original, **kwargs)
        return original(*args, **kwargs)


ENTRY = _Entry()


def acceptable(entry: Any) -> bool:
    """Entries the drop-in may wrap: Transformers' own SDPA, or ffpa_patch's repeat-KV fix of it."""
    return entry is hf.stock_sdpa() or (is_ours(entry) and beneath(entry) is hf.stock_sdpa())


def sdpa_beneath() -> Callable:
    """The "sdpa" entry beneath the drop-in while it routes (Transformers' own, or the repeat-KV
    fix), else the class-level entry: what a fallback of the "ffpa" backend runs (the drop-in
    must not route it a second time). The drop-in's own fallbacks run what it wraps."""
    if ENTRY.families and ENTRY.fn is not None:
        return ENTRY.fn.__wrapped__
    return hf.global_sdpa()


class Gemma4DropIn(Patch):
    """The drop-in for one family (``family``); ``DROPINS`` holds one subclass per family."""

    family: hf.Family = hf.GEMMA4
    name = hf.GEMMA4.dropin
    module = hf.MODELING_UTILS  # the shared table exists from here, before anyone can capture its "sdpa"
    requires = hf.GEMMA4.module
    dependencies = ("transformers", "torch", *kernels.packages())
    summary = f'{hf.GEMMA4.label} on the default "sdpa": head_dim-512 full layers run FFPA'

    def is_needed(self, module: Any) -> tuple[bool, str]:
        if not hasattr(module, "ALL_ATTENTION_FUNCTIONS"):
            raise TargetNotFound(f"{hf.MODELING_UTILS} has no ALL_ATTENTION_FUNCTIONS (the table Gemma 4 reads)")
        if self.family not in hf.available_families():
            raise TargetNotFound(f"{self.family.module} is not in this transformers version")
        local = hf.local_entry("sdpa")
        if local is not None and not reaches(local, ENTRY.fn) and not is_ours(local):
            raise StandDown(
                f"Transformers' shared attention table has an instance-local 'sdpa' entry "
                f"({describe(local)}) installed before ffpa_patch: {self.family.label} models on \"sdpa\" call it "
                "first, and it does not reach ffpa_patch, so they run stock SDPA. Apply ffpa_patch before "
                "installing it (import ffpa_patch first, or `ffpa-patch run -- ...`)")
        return True, f"{self.family.attention} under sdpa routes full layers to FFPA"

    def warnings(self) -> list[str]:
        from . import kernels_cannot_run_here

        if not self.applied:
            return []
        found = kernels_cannot_run_here()
        effective = hf.attention_table_entry("sdpa")
        if ENTRY.fn is not None and not reaches(effective, ENTRY.fn):
            found.append(f"the 'sdpa' entry {self.family.label} reads is now {describe(effective)}, installed after "
                         "ffpa_patch, and ffpa_patch's drop-in was not found inside it: models on \"sdpa\" may run stock SDPA")
        return found

    def install(self, module: Any, record: Callable[[Undo], None]) -> None:
        kernels.on_install()
        record(ENTRY.enable(self.family))


def dropin_for(family: hf.Family) -> type[Gemma4DropIn]:
    if family == hf.GEMMA4:
        return Gemma4DropIn
    return type(f"{family.attention.removesuffix('TextAttention')}DropIn", (Gemma4DropIn,), {
        "family": family, "name": family.dropin, "requires": family.module,
        "summary": f'{family.label} on the default "sdpa": head_dim-512 full layers run FFPA',
        "__doc__": f"The drop-in for {family.label}."})


DROPINS = tuple(dropin_for(f) for f in hf.FAMILIES)
