"""ffpa_patch: FFPA attention for stock Hugging Face Gemma4, by patching at run time.

Importing this package activates it (``FFPA_PATCH_DISABLE=1`` turns that off):
it checks installed versions without importing them and installs post-import
hooks, so each target is patched when its module is imported. ``apply()`` is
the explicit, idempotent form; ``revert()`` puts back exactly what was there.
"""
from __future__ import annotations

import logging
from typing import Iterable

from .errors import FFPAFallbackError, FFPANotAppliedError, FFPAPatchWarning, UnsupportedVersionError
from . import lifecycle as _lifecycle_module
from .lifecycle import Lifecycle
from .patches import ALL as _PATCH_CLASSES
from .report import Status
from .routing import stats as _stats

__all__ = ["apply", "revert", "is_applied", "status", "stats", "reset_stats", "UnsupportedVersionError", "FFPANotAppliedError",
           "FFPAFallbackError", "FFPAPatchWarning", "PATCH_NAMES", "checkpointing"]
__version__ = "0.1.0"

log = logging.getLogger("ffpa_patch")
log.addHandler(logging.NullHandler())

_lifecycle = Lifecycle(_PATCH_CLASSES)
PATCH_NAMES = _lifecycle.names


def apply(*, strict: bool | None = None, targets: Iterable[str] | None = None, exclude: Iterable[str] | None = (),
          force: bool | None = None) -> Status:
    """Patch now (and on later imports). Idempotent; returns ``status()``.

    ``strict`` raises on unsupported versions and makes any fallback of a
    head_dim > 256 full layer raise; ``targets`` / ``exclude`` pick patches by
    name (``PATCH_NAMES``); ``force`` patches outside the supported versions.
    Unset arguments come from FFPA_PATCH_STRICT / FFPA_PATCH_TARGETS /
    FFPA_PATCH_EXCLUDE / FFPA_PATCH_FORCE.
    """
    return _lifecycle.apply(explicit=True, strict=strict, targets=targets, exclude=exclude, force=force)


def revert() -> Status:
    """Undo every patch exactly; later imports are left alone."""
    return _lifecycle.revert()


def is_applied() -> bool:
    """True while apply() is in effect (patches applied, or waiting for their module's import)."""
    return _lifecycle.is_applied()


def status() -> Status:
    """What is patched, what is waiting, versions, routes taken, kernel builds and caches."""
    return _lifecycle.status()


def stats() -> list[dict]:
    """Attention routing counts: one row per (layer kind, kernel, reason)."""
    return _stats.snapshot()


def reset_stats() -> None:
    _stats.reset()


def __getattr__(name: str):
    """``ffpa_patch.checkpointing`` without its own import (it imports torch, so only on use)."""
    if name == "checkpointing":
        import importlib

        return importlib.import_module(".checkpointing", __name__)
    raise AttributeError(f"module 'ffpa_patch' has no attribute {name!r}")


_lifecycle.activate_on_import(cli=_lifecycle_module.started_as_cli())
