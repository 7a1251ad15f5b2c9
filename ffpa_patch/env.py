"""Every FFPA_PATCH_* environment variable, parsed in one place. A value that is not one of
the accepted spellings is an error, never silently false."""
from __future__ import annotations

import os
from dataclasses import dataclass

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}
SPELLINGS = "1/true/yes/on or 0/false/no/off"


def _flag(name: str) -> bool:
    raw = os.environ.get(name, "").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ValueError(f"{name}={os.environ[name]!r} is not a switch: use {SPELLINGS}")


def read_names(name: str) -> frozenset[str] | None:
    return _names(name)


def _names(name: str) -> frozenset[str] | None:
    raw = os.environ.get(name, "").strip()
    return frozenset(n.strip().lower() for n in raw.split(",") if n.strip()) if raw else None


@dataclass(frozen=True)
class Settings:
    disable: bool  # FFPA_PATCH_DISABLE=1: nothing is patched, always wins
    strict: bool  # FFPA_PATCH_STRICT=1: raise instead of warn; fallbacks of D>256 layers raise
    force: bool  # FFPA_PATCH_FORCE=1: patch outside the supported version range
    targets: frozenset[str] | None  # FFPA_PATCH_TARGETS=a,b: only these patches
    exclude: frozenset[str]  # FFPA_PATCH_EXCLUDE=a,b: never these patches


def read() -> Settings:
    """At apply time; raises ValueError on a value that is not an accepted spelling."""
    return Settings(
        disable=_flag("FFPA_PATCH_DISABLE"),
        strict=_flag("FFPA_PATCH_STRICT"),
        force=_flag("FFPA_PATCH_FORCE"),
        targets=_names("FFPA_PATCH_TARGETS"),
        exclude=_names("FFPA_PATCH_EXCLUDE") or frozenset(),
    )


def strict_requested() -> bool:
    """FFPA_PATCH_STRICT, read where an error must not hide another (a bad value counts as no)."""
    return os.environ.get("FFPA_PATCH_STRICT", "").strip().lower() in _TRUE


def kernel_cache() -> str | None:
    """FFPA_PATCH_KERNEL_CACHE=DIR: where compiled kernels are kept; None when switched off
    (0/false/no/off/none), "" for the default. Read when a kernel package is first imported,
    so on its own: never raises."""
    raw = os.environ.get("FFPA_PATCH_KERNEL_CACHE", "").strip()
    return None if raw.lower() in (_FALSE | {"none"}) - {""} else raw
