"""Compiled CuTeDSL kernels kept on disk, so a second process skips their JIT.

flash-attn-4 has a disk cache of its own: ``FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1``
with ``FLASH_ATTENTION_CUTE_DSL_CACHE_DIR``, read once when ``flash_attn.cute`` is
imported. ffpa_patch turns it on for that import, in ``FFPA_PATCH_KERNEL_CACHE``
(default ``$XDG_CACHE_HOME/ffpa_patch/flash_attn_4``; ``0`` switches it off), and puts
the environment back afterwards. A user's own ``FLASH_ATTENTION_CUTE_DSL_CACHE_*``
settings win.

ffpa-attn 0.2.4 has none: its ``cute/utils/cache_utils.py`` keeps compiled kernels in
a per-process dict, ``cute.compile`` forces ``no_cache=True`` (so CuTeDSL's own file
cache never engages), and the same ``FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1`` only
makes it warn that the flag is inert. That is why the variables are set only around
flash-attn-4's import. The full layers' kernels therefore compile in every process.
"""
from __future__ import annotations

import logging
import os
import sys
from contextlib import contextmanager
from typing import Iterator

from .. import env

log = logging.getLogger("ffpa_patch")

ENABLED = "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"
DIRECTORY = "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"
OFF = {"0", "off", "false", "no", "none"}
FFPA_ATTN = "in-process only (ffpa-attn 0.2.4 has no disk cache; its kernels compile in every process)"

# What each package does with its compiled kernels, as found when it was imported.
state: dict[str, str] = {}


def default_directory() -> str:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "ffpa_patch", "flash_attn_4")


def _choice() -> tuple[dict[str, str], str]:
    """The variables to set for flash-attn-4's import, and what that means, in words."""
    if ENABLED in os.environ:
        where = os.environ.get(DIRECTORY, "flash-attn-4's default directory")
        on = os.environ[ENABLED] == "1"
        return {}, f"{'on, in ' + where if on else 'off'} ({ENABLED}={os.environ[ENABLED]} set by the user)"
    wanted = env.read().kernel_cache
    if wanted.lower() in OFF:
        return {}, "off (FFPA_PATCH_KERNEL_CACHE=0)"
    directory = os.path.abspath(os.path.expanduser(wanted)) if wanted else default_directory()
    try:
        os.makedirs(directory, exist_ok=True)
        if not os.access(directory, os.W_OK | os.X_OK):
            raise PermissionError("not writable")
    except OSError as exc:
        message = f"off: cannot use {directory} ({exc}); set FFPA_PATCH_KERNEL_CACHE to a writable directory"
        log.warning("ffpa_patch: flash-attn-4 kernel disk cache %s", message)
        return {}, message
    return {ENABLED: "1", DIRECTORY: directory}, f"on, in {directory} (FFPA_PATCH_KERNEL_CACHE to move it, =0 for off)"


@contextmanager
def for_flash_attn_4() -> Iterator[None]:
    """Around flash-attn-4's first import: its disk cache on, the environment restored after."""
    variables, meaning = _choice()
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
    state["ffpa-attn"] = FFPA_ATTN
    log.info("ffpa_patch: flash-attn-4 compiled kernels on disk: %s; ffpa-attn: %s", meaning, FFPA_ATTN)
