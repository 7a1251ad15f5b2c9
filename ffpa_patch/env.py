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
    d512_backward: str  # FFPA_PATCH_D512_BACKWARD=triton|ffpa-attn: the full layers' backward on Hopper


def read() -> Settings:
    """At apply time; raises ValueError on a value that is not an accepted spelling."""
    return Settings(
        disable=_flag("FFPA_PATCH_DISABLE"),
        strict=_flag("FFPA_PATCH_STRICT"),
        force=_flag("FFPA_PATCH_FORCE"),
        targets=_names("FFPA_PATCH_TARGETS"),
        exclude=_names("FFPA_PATCH_EXCLUDE") or frozenset(),
        d512_backward=d512_backward(),
    )


D512_BACKWARDS = ("triton", "ffpa-attn")


def d512_backward() -> str:
    """FFPA_PATCH_D512_BACKWARD: which backward the FFPA kernel's full layers run on Hopper: "triton"
    (the default: kernels/d512_bwd.py, no recomputation) or "ffpa-attn" (its own). Checked by apply()
    and read again at each backward, so a change between steps takes effect."""
    raw = os.environ.get("FFPA_PATCH_D512_BACKWARD", "").strip().lower() or D512_BACKWARDS[0]
    if raw not in D512_BACKWARDS:
        raise ValueError(f"FFPA_PATCH_D512_BACKWARD={os.environ['FFPA_PATCH_D512_BACKWARD']!r}: use one of {D512_BACKWARDS}")
    return raw


def strict_requested() -> bool:
    """FFPA_PATCH_STRICT, read where an error must not hide another (a bad value counts as no)."""
    return os.environ.get("FFPA_PATCH_STRICT", "").strip().lower() in _TRUE


def kernel_cache() -> str | None:
    """FFPA_PATCH_KERNEL_CACHE=DIR: where compiled kernels are kept; None when switched off
    (0/false/no/off/none), "" for the default. Read when a kernel package is first imported,
    so on its own: never raises."""
    raw = os.environ.get("FFPA_PATCH_KERNEL_CACHE", "").strip()
    return None if raw.lower() in (_FALSE | {"none"}) - {""} else raw
