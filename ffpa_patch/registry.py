"""The patch contract and the transactional apply/revert of one patch.

A patch names the module it changes; its ``is_needed`` looks at the installed
code (behaviour, not version numbers) and its ``install`` makes changes only
through ``wrapping`` helpers, handing each undo to ``record``. If ``install``
fails half-way, everything recorded so far is undone.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

from .wrapping import ForeignEntry, Undo

log = logging.getLogger("ffpa_patch")

# States a patch can be in, as status() reports them.
APPLIED = "applied"
NOT_NEEDED = "not needed"
PENDING = "waiting for import"
SKIPPED = "skipped"
FAILED = "failed"
NOT_APPLIED = "not applied"
TARGET_NOT_FOUND = "target not found"
UNSUPPORTED = "unsupported versions"
NOT_INSTALLED = "not installed"
STOOD_DOWN = "stood down"


class StandDown(Exception):
    """Applying would be wrong here (it would bypass what someone else installed): the patch
    stays off, and the lifecycle says why, loudly."""


class TargetNotFound(Exception):
    """The target module exists but not in a layout we know: stay out of the way."""


class Patch:
    """One patch target. Subclasses set ``name``, ``module``, ``summary`` and
    implement ``is_needed`` and ``install``."""

    name: str = ""
    module: str = ""  # what a post-import hook waits for; ``install`` gets it
    requires: str = ""  # a module that must exist for the patch to mean anything (default: ``module``)
    summary: str = ""
    #: distributions (keys of versions.SUPPORTED) whose range this patch relies on: one
    #: out of range turns off this patch only (an optional one only when installed).
    dependencies: tuple[str, ...] = ("transformers", "torch")

    def __init__(self) -> None:
        self._undo: list[Undo] = []
        self.state = NOT_APPLIED
        self.reason = ""

    # -- to implement -------------------------------------------------------
    def is_needed(self, module: Any) -> tuple[bool, str]:
        """(needed, why) judged from the installed code."""
        raise NotImplementedError

    def install(self, module: Any, record: Callable[[Undo], None]) -> None:
        raise NotImplementedError

    def warnings(self) -> list[str]:
        """Settings that would silently defeat this patch (shown by status())."""
        return []

    # -- driven by the package ------------------------------------------------
    @property
    def applied(self) -> bool:
        return bool(self._undo)

    def apply_to(self, module: Any) -> str:
        """Apply to the imported target; returns the new state. Raises on failure
        after rolling back (the caller decides whether to raise or log)."""
        if self.applied:
            return self.state
        try:
            needed, why = self.is_needed(module)
        except TargetNotFound as exc:
            self.state, self.reason = TARGET_NOT_FOUND, str(exc)
            return self.state
        except (StandDown, ForeignEntry) as exc:
            self.state, self.reason = STOOD_DOWN, str(exc)
            return self.state
        except Exception as exc:  # e.g. a conflicting registry entry: status must say so
            self.state, self.reason = FAILED, f"{type(exc).__name__}: {exc}"
            raise
        if not needed:
            self.state, self.reason = NOT_NEEDED, why
            return self.state
        undo: list[Undo] = []
        try:
            self.install(module, undo.append)
        except (StandDown, ForeignEntry) as exc:
            _run_undo(undo, self.name)
            self.state, self.reason = STOOD_DOWN, str(exc)
            return self.state
        except Exception as exc:
            _run_undo(undo, self.name)
            self.state, self.reason = FAILED, f"{type(exc).__name__}: {exc}"
            raise
        self._undo = undo
        self.state, self.reason = APPLIED, why
        return self.state

    def revert(self) -> None:
        _run_undo(self._undo, self.name)
        self._undo = []
        self.state, self.reason = NOT_APPLIED, "reverted"


def _run_undo(undo: list[Undo], name: str) -> None:
    for step in reversed(undo):
        try:
            step()
        except Exception:
            log.exception("ffpa_patch: undoing part of %s failed", name)
    undo.clear()
