"""Compiled CuTeDSL kernels kept on disk, so a second process skips their JIT.

Both live under one root, ``FFPA_PATCH_KERNEL_CACHE`` (default
``$XDG_CACHE_HOME/ffpa_patch/kernels``, i.e. ``~/.cache/ffpa_patch/kernels``; ``0``
switches both off):

- flash-attn-4 has a disk cache of its own: ``FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1``
  with ``FLASH_ATTENTION_CUTE_DSL_CACHE_DIR``, read once when ``flash_attn.cute`` is
  imported. ffpa_patch sets them for that import only (``<root>/flash_attn_4``) and puts
  the environment back, because ffpa-attn reads the same flag and only warns that it is
  inert. A user's own ``FLASH_ATTENTION_CUTE_DSL_CACHE_*`` settings win.
- ffpa-attn 0.2.4 has none (its compiled kernels live in a per-process dict, and
  ``cute.compile`` forces ``no_cache=True``, so CuTeDSL's file cache never engages);
  ``ffpa_disk`` adds one under ``<root>/ffpa_attn``.
"""
from __future__ import annotations

import logging
import os
import sys
from contextlib import contextmanager
from typing import Iterator

from .. import env
from . import private_dir

log = logging.getLogger("ffpa_patch")

ENABLED = "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"
DIRECTORY = "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"
HOW = "FFPA_PATCH_KERNEL_CACHE to move it, =0 for off"

# What each package does with its compiled kernels, as found when it was imported.
state: dict[str, str] = {}
_said: set[str] = set()


def default_root() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ffpa_patch", "kernels")


FIX = "FFPA_PATCH_KERNEL_CACHE=DIR names a folder of your own (or =0 turns the cache off)"


def private(directory: str) -> str | None:
    """Make ``directory`` owner-only if it is new; None when it is safe to load from, else why not."""
    try:
        private_dir.make(directory)
        if not os.access(directory, os.W_OK | os.X_OK):
            raise PermissionError("not writable")
        return private_dir.problem(directory)
    except OSError as exc:
        return f"cannot use {directory} ({exc})"


def root() -> tuple[str | None, str]:
    """The cache root, or None and why there is none (said once, with the fix)."""
    wanted = env.kernel_cache()
    if wanted is None:
        return None, "off (FFPA_PATCH_KERNEL_CACHE=0)"
    directory = os.path.abspath(os.path.expanduser(wanted)) if wanted else default_root()
    problem = private(directory)
    if problem is not None:
        why = f"off: {problem}; compiled kernels there could come from another user. {FIX}"
        if why not in _said:  # one line, however many packages ask
            _said.add(why)
            from .. import loud

            loud.emit(f"ffpa_patch: kernel disk cache {why}", logging.WARNING)
        return None, why
    return directory, ""


def _flash_attn_4_choice() -> tuple[dict[str, str], str]:
    """The variables to set for flash-attn-4's import, and what that means, in words."""
    if ENABLED in os.environ:
        where = os.environ.get(DIRECTORY, "flash-attn-4's default directory")
        on = os.environ[ENABLED] == "1"
        return {}, f"{'on, in ' + where if on else 'off'} ({ENABLED}={os.environ[ENABLED]} set by the user)"
    directory, why = root()
    if directory is None:
        return {}, why
    directory = os.path.join(directory, "flash_attn_4")
    problem = private(directory)  # made here, owner-only, before flash-attn-4 writes into it
    if problem is not None:
        return {}, f"off: {problem}. {FIX}"
    return {ENABLED: "1", DIRECTORY: directory}, f"on, in {directory} ({HOW})"


@contextmanager
def for_flash_attn_4() -> Iterator[None]:
    """Around flash-attn-4's first import: its disk cache on, the environment restored after. Not
    installed: nothing to cache, so no folder is made and status() lists none."""
    from ..versions import installed

    if installed("flash-attn-4") is None:
        yield
        return
    variables, meaning = _flash_attn_4_choice()
    already = "flash_attn.cute.cache_utils" in sys.modules
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    imported = sys.modules.get("flash_attn.cute.cache_utils")
    if already and variables and not getattr(imported, "CUTE_DSL_CACHE_ENABLED", False):
        meaning = f"off (flash_attn.cute was imported before ffpa_patch could turn it on; set {ENABLED}=1 yourself)"
    state["flash-attn-4"] = meaning
    log.info("ffpa_patch: flash-attn-4 compiled kernels on disk: %s", meaning)


def after_ffpa_attn_import() -> None:
    """Keep ffpa-attn's kernels on disk (idempotent; a failure leaves its own cache alone)."""
    from . import ffpa_disk

    directory, why = root()
    if directory is None:
        state["ffpa-attn"] = why
        return
    try:
        meaning = ffpa_disk.install(os.path.join(directory, "ffpa_attn"))
    except Exception as exc:
        ffpa_disk.restore()
        meaning = f"in-process only (disk cache not installed: {type(exc).__name__}: {exc})"
    state["ffpa-attn"] = meaning + (f" ({HOW})" if meaning.startswith("on") else "")
    log.info("ffpa_patch: ffpa-attn compiled kernels on disk: %s", state["ffpa-attn"])


def after_apply() -> None:
    """apply() after a revert(): keep ffpa-attn's kernels on disk again, if it is imported."""
    if "ffpa_attn.cute" in sys.modules:
        after_ffpa_attn_import()


def restore() -> None:
    """revert(): ffpa-attn's own kernel caches back, as they were."""
    ffpa_disk = sys.modules.get("ffpa_patch.kernels.ffpa_disk")
    if ffpa_disk is not None and ffpa_disk.installed():
        ffpa_disk.restore()
        state["ffpa-attn"] = "in-process only (ffpa_patch reverted)"


def report() -> dict:
    """Where each package keeps compiled kernels, with this process's disk traffic."""
    kept = dict(state)
    ffpa_disk = sys.modules.get("ffpa_patch.kernels.ffpa_disk")
    if ffpa_disk is not None and ffpa_disk.installed() and "ffpa-attn" in kept:
        kept["ffpa-attn"] += "; this process: {loaded} loaded from disk, {exported} compiled and written".format(**ffpa_disk.counts())
    return kept
