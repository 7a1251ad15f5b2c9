"""Every FFPA_PATCH_* environment variable, parsed in one place (at apply time, and when a kernel package is first imported)."""
from __future__ import annotations

import os
from dataclasses import dataclass

_TRUE = {"1", "true", "yes", "on"}


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


def _names(name: str) -> frozenset[str] | None:
    raw = os.environ.get(name, "").strip()
    return frozenset(n.strip() for n in raw.split(",") if n.strip()) if raw else None


@dataclass(frozen=True)
class Settings:
    disable: bool  # FFPA_PATCH_DISABLE=1: nothing is patched, always wins
    strict: bool  # FFPA_PATCH_STRICT=1: raise instead of warn; fallbacks of D>256 layers raise
    force: bool  # FFPA_PATCH_FORCE=1: patch outside the supported version range
    targets: frozenset[str] | None  # FFPA_PATCH_TARGETS=a,b: only these patches
    exclude: frozenset[str]  # FFPA_PATCH_EXCLUDE=a,b: never these patches
    kernel_cache: str  # FFPA_PATCH_KERNEL_CACHE=DIR: flash-attn-4's on-disk kernels ("0" = off, "" = default)


def read() -> Settings:
    return Settings(
        disable=_flag("FFPA_PATCH_DISABLE"),
        strict=_flag("FFPA_PATCH_STRICT"),
        force=_flag("FFPA_PATCH_FORCE"),
        targets=_names("FFPA_PATCH_TARGETS"),
        exclude=_names("FFPA_PATCH_EXCLUDE") or frozenset(),
        kernel_cache=os.environ.get("FFPA_PATCH_KERNEL_CACHE", "").strip(),
    )
