"""ffpa_patch: FFPA attention for stock Hugging Face Gemma4, by patching at run time.

Importing this package activates it (``FFPA_PATCH_DISABLE=1`` turns that off):
it checks installed versions without importing them and installs post-import
hooks, so each target is patched when its module is imported. ``apply()`` is
the explicit, idempotent form; ``revert()`` puts back exactly what was there.
"""
from __future__ import annotations

import functools
import importlib.util
import logging
import os
import sys
import threading
import warnings
from typing import Iterable

from . import env, loud, runtime, versions
from .patches import ALL as _PATCH_CLASSES
from .registry import APPLIED, NOT_APPLIED, NOT_INSTALLED, PENDING, SKIPPED, UNSUPPORTED, Patch
from .report import Status
from .runtime import FFPAFallbackError
from .routing import stats as _stats
from .wrapping import when_imported

__all__ = ["apply", "revert", "is_applied", "status", "stats", "reset_stats", "UnsupportedVersionError",
           "FFPAFallbackError", "PATCH_NAMES", "checkpointing"]
__version__ = "0.1.0"

log = logging.getLogger("ffpa_patch")
log.addHandler(logging.NullHandler())

_patches: dict[str, Patch] = {cls.name: cls() for cls in _PATCH_CLASSES}
PATCH_NAMES = tuple(_patches)
_wanted: set[str] = set()
_message = ["not applied"]
_logged: set[str] = set()
# apply(), revert() and the post-import hooks (which run on whichever thread imports first)
# change the same patches: one lock for all of them. Re-entrant: a hook can fire inside apply().
_lock = threading.RLock()


def _locked(fn):
    @functools.wraps(fn)
    def guarded(*args, **kwargs):
        with _lock:
            return fn(*args, **kwargs)

    return guarded


class UnsupportedVersionError(RuntimeError):
    """Installed versions are outside the supported range (strict mode)."""


class FFPAPatchWarning(UserWarning):
    pass


def _callers_level() -> int:
    """warnings' stacklevel of the first frame outside this package (seen from _say)."""
    here = os.path.dirname(os.path.abspath(__file__))
    frame, level = sys._getframe(2), 2
    while frame is not None and frame.f_code.co_filename.startswith(here):
        frame, level = frame.f_back, level + 1
    return level


def _say(explicit: bool, msg: str) -> None:
    """Warn on the explicit path (pointing at the caller of apply()); on the automatic one,
    one line to the logger or, when logging is not configured, stderr."""
    if explicit:
        warnings.warn(msg, FFPAPatchWarning, stacklevel=_callers_level())
    elif msg not in _logged:
        _logged.add(msg)
        loud.emit(msg, logging.WARNING)


def _select(targets: Iterable[str] | None, exclude: Iterable[str], settings: env.Settings) -> list[str]:
    chosen = {t.lower() for t in targets} if targets is not None else set(settings.targets or PATCH_NAMES)
    dropped = {e.lower() for e in exclude} | settings.exclude
    unknown = (chosen | dropped) - set(PATCH_NAMES)
    if unknown:
        raise ValueError(f"unknown ffpa_patch target(s) {sorted(unknown)}; known: {list(PATCH_NAMES)}")
    return [n for n in PATCH_NAMES if n in chosen and n not in dropped]


def _hook(name: str):
    @_locked
    def on_import(module) -> None:
        patch = _patches[name]
        if name not in _wanted or patch.applied:
            return
        try:
            patch.apply_to(module)
        except Exception as exc:
            _say(False, f"ffpa_patch: {name} failed on import of {patch.module} and was rolled back: {exc}")

    return on_import


_hooks = {name: _hook(name) for name in PATCH_NAMES}


@_locked
def _apply(*, explicit: bool, strict: bool | None, targets, exclude, force: bool | None) -> Status:
    settings = env.read()
    if settings.disable:
        _message[0] = "disabled by FFPA_PATCH_DISABLE=1"
        return status()
    strict = settings.strict if strict is None else strict
    force = settings.force if force is None else force
    names = _select(targets, exclude, settings)
    checks = versions.check_all()
    blocked = {n: versions.gate_problems([c for c in checks if c.name in _patches[n].dependencies]) for n in names}
    problems = list(dict.fromkeys(m for n in names for m in blocked[n]))
    for name in names:  # judged afresh at each apply()
        if _patches[name].state == UNSUPPORTED:
            _patches[name].state, _patches[name].reason = NOT_APPLIED, ""
    off = []
    if problems and not force:
        off = [n for n in names if blocked[n]]
        hint = ". Set FFPA_PATCH_FORCE=1 (or force=True) to patch anyway."
        if len(off) == len(names):
            msg = "ffpa_patch not applied: " + "; ".join(problems) + hint
        else:
            msg = f"ffpa_patch: {', '.join(off)} off: " + "; ".join(problems) + hint
        if strict:
            raise UnsupportedVersionError(msg)
        _say(explicit, msg)
        for name in off:
            _patches[name].state, _patches[name].reason = UNSUPPORTED, "; ".join(blocked[name])
        names = [n for n in names if not blocked[n]]
        if not names:
            _message[0] = msg
            return status()
    runtime.strict = strict
    newly_applied: list[Patch] = []
    for name in names:
        patch = _patches[name]
        module = sys.modules.get(patch.module)
        if module is None or patch.applied:
            continue
        try:
            if patch.apply_to(module) == APPLIED:
                newly_applied.append(patch)
        except Exception as exc:
            for done in reversed(newly_applied):
                done.revert()
            msg = f"ffpa_patch: {name} failed, rolled back this apply(): {type(exc).__name__}: {exc}"
            _message[0] = msg
            if explicit:
                raise
            _say(False, msg)
            return status()
    if "ffpa_attn.cute" in sys.modules and "ffpa_patch.kernels.disk_cache" in sys.modules:
        sys.modules["ffpa_patch.kernels.disk_cache"].after_ffpa_attn_import()  # again after a revert()
    _wanted.update(names)
    for name in names:
        when_imported(_patches[name].module, _hooks[name])
    _message[0] = "active" + (" (FORCED outside the supported versions)" if problems and force else "")
    if off:
        _message[0] += f" ({', '.join(off)} off: unsupported versions)"
    return status()


def apply(*, strict: bool | None = None, targets: Iterable[str] | None = None, exclude: Iterable[str] = (), force: bool | None = None) -> Status:
    """Patch now (and on later imports). Idempotent; returns ``status()``.

    ``strict`` raises on unsupported versions and makes any fallback of a
    head_dim > 256 full layer raise; ``targets`` / ``exclude`` pick patches by
    name (``PATCH_NAMES``); ``force`` patches outside the supported versions.
    Unset arguments come from FFPA_PATCH_STRICT / FFPA_PATCH_TARGETS /
    FFPA_PATCH_EXCLUDE / FFPA_PATCH_FORCE.
    """
    return _apply(explicit=True, strict=strict, targets=targets, exclude=exclude, force=force)


@_locked
def revert() -> Status:
    """Undo every patch exactly; later imports are left alone."""
    _wanted.clear()
    for patch in reversed(list(_patches.values())):
        if patch.applied:
            patch.revert()
        elif patch.state == UNSUPPORTED:
            patch.state, patch.reason = NOT_APPLIED, "reverted"
    disk = sys.modules.get("ffpa_patch.kernels.disk_cache")
    if disk is not None:
        disk.restore()
    runtime.strict = False
    _message[0] = "reverted"
    return status()


def is_applied() -> bool:
    """True while apply() is in effect (patches applied, or waiting for their module's import)."""
    return bool(_wanted)


def _patch_row(patch: Patch) -> dict:
    state, reason = patch.state, patch.reason
    if patch.name in _wanted and not patch.applied and state not in ("not needed", "failed"):
        top = patch.module.split(".")[0]
        if top not in sys.modules and importlib.util.find_spec(top) is None:
            state, reason = NOT_INSTALLED, f"{top} is not installed"
        else:
            state, reason = PENDING, f"{patch.module} not imported yet"
    elif patch.name not in _wanted and not patch.applied and state == "not applied" and _wanted:
        state, reason = SKIPPED, "excluded by targets/exclude"
    try:
        warned = patch.warnings()
    except Exception as exc:  # status must always answer
        warned = [f"could not check: {exc}"]
    return {"name": patch.name, "state": state, "reason": reason, "summary": patch.summary, "warnings": warned}


def status() -> Status:
    return Status(
        active=is_applied(),
        strict=runtime.strict,
        message=_message[0],
        versions=versions.check_all(),
        patches=[_patch_row(p) for p in _patches.values()],
        routes=_stats.snapshot(),
        compiles=_compiles(),
        kernel_cache=_kernel_cache(),
    )


def _compiles() -> dict:
    """Kernel builds this process did for routing (FlexAttention's), without importing torch."""
    flex = sys.modules.get("ffpa_patch.kernels.flex")
    return {"flex_attention": flex.compiles()} if flex is not None and flex.compiles() else {}


def _kernel_cache() -> dict:
    """Where each CuTeDSL package keeps compiled kernels (known once it was imported)."""
    disk = sys.modules.get("ffpa_patch.kernels.disk_cache")
    kept = dict(disk.state) if disk is not None else {}
    ffpa_disk = sys.modules.get("ffpa_patch.kernels.ffpa_disk")
    if ffpa_disk is not None and ffpa_disk._swapped and "ffpa-attn" in kept:
        kept["ffpa-attn"] += "; this process: {loaded} loaded from disk, {exported} compiled and written".format(**ffpa_disk.counts())
    return kept


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


def _activate_on_import() -> None:
    try:
        _apply(explicit=False, strict=None, targets=None, exclude=(), force=None)
    except Exception as exc:  # never break the user's import, unless FFPA_PATCH_STRICT=1 asked for it
        _message[0] = f"not applied: {exc}"
        if env.strict_requested():
            raise
        _say(False, f"ffpa_patch not applied: {exc}")


_activate_on_import()
