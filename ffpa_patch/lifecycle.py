"""One object owns the patches' lifecycle: what was asked for, what is in place, the hooks.

Like OpenTelemetry's ``BaseInstrumentor`` instance, it keeps the state that apply(),
revert(), status() and the post-import hooks share, under one re-entrant lock: hooks run
on whichever thread imports a target first, and a hook can fire inside apply().
``ffpa_patch`` holds the one instance and exposes its methods as module functions.
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

from . import env, kernels, loud, versions
from .errors import FFPAPatchWarning, UnsupportedVersionError
from .patches.explain_off import ExplainOff
from .registry import APPLIED, NOT_APPLIED, NOT_INSTALLED, PENDING, SKIPPED, STOOD_DOWN, UNSUPPORTED, Patch
from .report import Status
from .routing import policy
from .routing import stats as _stats
from .wrapping import when_imported

_HERE = os.path.dirname(os.path.abspath(__file__))


# What the lifecycle is in, as status().state says it (and `ffpa-patch status` exits by it).
NOT_YET, ACTIVE, REVERTED = "not applied", "active", "reverted"
DISABLED, MISCONFIGURED, UNSUPPORTED_VERSIONS, FAILED = "disabled", "misconfigured", "unsupported versions", "failed"
OFF = (DISABLED, MISCONFIGURED, UNSUPPORTED_VERSIONS, FAILED)


def _locked(method):
    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return guarded


def started_as_cli() -> bool:
    """This process is the `ffpa-patch` command (the console script, or ``python -m ffpa_patch``)."""
    argv = getattr(sys, "orig_argv", sys.argv)
    return os.path.basename(sys.argv[0] or "") == "ffpa-patch" or list(argv[1:3]) == ["-m", "ffpa_patch"]


def _callers_level() -> int:
    """warnings' stacklevel of the first frame outside this package (seen from ``_say``)."""
    frame, level = sys._getframe(2), 2
    while frame is not None and frame.f_code.co_filename.startswith(_HERE):
        frame, level = frame.f_back, level + 1
    return level


def _module_exists(name: str) -> bool:
    """Whether ``name``'s source file is installed, found without importing its packages (status()
    must not import Transformers): its top-level package's folder, then the path below it."""
    if name in sys.modules:
        return True
    top, _, rest = name.partition(".")
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        return spec is not None and not rest
    base = os.path.join(list(spec.submodule_search_locations)[0], *rest.split("."))
    return not rest or os.path.exists(base + ".py") or os.path.isdir(base)


BACKEND_PATCH = "ffpa_backend"  # the patch that registers attn_implementation="ffpa"


def _flag(name: str, value) -> bool:
    """apply()'s strict= / force=: a bool (None means "from the environment"), never a truthy string."""
    if isinstance(value, bool):
        return value
    raise TypeError(f"ffpa_patch.apply({name}=...) takes True, False or None (the {name.upper()} switch), got {value!r}")


def _names(what: str, value) -> tuple[str, ...]:
    """apply()'s targets= / exclude=: patch names, as an iterable of strings or one string
    ("a" or "a,b", as FFPA_PATCH_TARGETS takes them)."""
    if isinstance(value, str):
        value = value.split(",")
    try:
        items = tuple(value)
    except TypeError:
        items = (value,)
    if not all(isinstance(v, str) for v in items):
        raise TypeError(f"ffpa_patch.apply({what}=...) takes patch names (strings, or one string \"a,b\"), got {value!r}")
    return tuple(v.strip().lower() for v in items if v.strip())


class Lifecycle:
    def __init__(self, patch_classes):
        self.patches: dict[str, Patch] = {cls.name: cls() for cls in patch_classes}
        self.names = tuple(self.patches)
        self.wanted: set[str] = set()  # asked for by apply(): applied now or on their module's import
        self.message = "not applied"
        self.state = NOT_YET
        self._logged: set[str] = set()  # automatic-path lines already said once
        self._quiet = False  # activating in the `ffpa-patch` process itself (activate_on_import)
        self._lock = threading.RLock()
        self._hooks = {name: self._hook(name) for name in self.names}
        # while off, attn_implementation="ffpa" gets an error naming the reason (patches/explain_off.py)
        self._explainer = ExplainOff(self._why_no_backend)
        self._explain_hook = self._explainer_hook()

    # -- saying things -------------------------------------------------------------------
    def _say(self, explicit: bool, msg: str) -> None:
        """Warn on the explicit path (pointing at the caller of apply()); on the automatic one,
        one line to the logger or, when logging is not configured, stderr. ``msg`` is said
        after "ffpa_patch: ", as status() shows its message."""
        msg = f"ffpa_patch: {msg}"
        if self._quiet and not explicit:
            return
        if explicit:
            warnings.warn(msg, FFPAPatchWarning, stacklevel=_callers_level())
        elif msg not in self._logged:
            self._logged.add(msg)
            loud.emit(msg, logging.WARNING)

    # -- choosing ------------------------------------------------------------------------
    def _select(self, targets: Iterable[str] | None, exclude: Iterable[str], settings: env.Settings) -> list[str]:
        """The patches asked for; a selection that names nothing, or names one patch both to
        apply and to leave out, is a mistake to say, not an empty "active"."""
        chosen = set(targets) if targets is not None else set(self.names if settings.targets is None else settings.targets)
        dropped = set(exclude) | settings.exclude
        unknown = (chosen | dropped) - set(self.names)
        if unknown:
            raise ValueError(f"unknown ffpa_patch target(s) {sorted(unknown)}; known: {list(self.names)}")
        if not chosen:
            raise ValueError(f"the ffpa_patch targets name no patch (FFPA_PATCH_TARGETS / targets=); known: {list(self.names)}")
        both = chosen & dropped if (targets is not None or settings.targets is not None) else set()
        if both:
            raise ValueError(f"ffpa_patch target(s) {sorted(both)} both chosen and excluded (FFPA_PATCH_TARGETS / FFPA_PATCH_EXCLUDE)")
        return [n for n in self.names if n in chosen and n not in dropped]

    def _hook(self, name: str):
        def on_import(module) -> None:
            with self._lock:
                patch = self.patches[name]
                if name not in self.wanted or patch.applied:
                    return
                try:
                    if patch.apply_to(module) == STOOD_DOWN:
                        self._say(False, f"{name} stood down: {patch.reason}")
                except Exception as exc:
                    self._say(False, f"{name} failed on import of {patch.module} and was rolled back: {exc}")

        return on_import

    # -- apply / revert ------------------------------------------------------------------
    def _explainer_hook(self):
        def on_import(module) -> None:
            with self._lock:
                if self._explains() and not self._explainer.applied:
                    try:
                        self._explainer.apply_to(module)
                    except Exception as exc:  # it only improves an error message: never worth failing for
                        self._say(False, f"could not explain attn_implementation='ffpa' errors: {exc}")

        return on_import

    def _set(self, state: str, message: str) -> None:
        """Every change of state goes through here: while off (or on without the "ffpa" backend)
        requests for "ffpa" are explained; after revert() nothing of ffpa_patch's stays."""
        self.state, self.message = state, message
        if self._explains():
            module = sys.modules.get(self._explainer.module)
            if module is not None:  # imported already: a hook registered before would not fire again
                self._explain_hook(module)
            else:
                when_imported(self._explainer.module, self._explain_hook)
        elif self._explainer.applied:
            self._explainer.revert()

    def _explains(self) -> bool:
        return self.state in OFF or (self.state == ACTIVE and BACKEND_PATCH not in self.wanted)

    def _why_no_backend(self) -> str:
        """What the "ffpa" explanation says: the off state's message, or why the backend patch is out."""
        if self.state in OFF:
            return self.message
        env_targets = env.read_names("FFPA_PATCH_TARGETS")
        how = "FFPA_PATCH_EXCLUDE / exclude=" if env_targets is None or BACKEND_PATCH in env_targets else "FFPA_PATCH_TARGETS / targets="
        return f"its {BACKEND_PATCH} patch is not among the patches applied ({how})"

    @_locked
    def apply(self, *, explicit: bool, strict: bool | None, targets, exclude, force: bool | None) -> Status:
        # the arguments' types first: a wrong one is the caller's mistake, not a state to be in
        strict = None if strict is None else _flag("strict", strict)
        force = None if force is None else _flag("force", force)
        targets = None if targets is None else _names("targets", targets)
        exclude = () if exclude is None else _names("exclude", exclude)  # (FFPA_PATCH_EXCLUDE is added either way)
        try:
            settings = env.read()
            names = [] if settings.disable else self._select(targets, exclude, settings)
        except ValueError as exc:
            self._set(MISCONFIGURED, f"not applied: {exc}")
            raise
        if settings.disable:
            self._set(DISABLED, f"disabled by FFPA_PATCH_DISABLE={os.environ.get('FFPA_PATCH_DISABLE', '').strip()}")
            return self.status()
        strict = settings.strict if strict is None else strict
        force = settings.force if force is None else force
        if not names:
            self._set(DISABLED, "not applied: every patch is excluded (FFPA_PATCH_EXCLUDE / exclude=)")
            return self.status()
        checks = versions.check_all()
        blocked = {n: versions.gate_problems([c for c in checks if c.name in self.patches[n].dependencies]) for n in names}
        problems = list(dict.fromkeys(m for n in names for m in blocked[n]))
        for name in names:  # judged afresh at each apply()
            if self.patches[name].state == UNSUPPORTED:
                self.patches[name].state, self.patches[name].reason = NOT_APPLIED, ""
        off = []
        if problems and not force:
            off = [n for n in names if blocked[n]]
            hint = ". Set FFPA_PATCH_FORCE=1 (or force=True) to patch anyway."
            if len(off) == len(names):
                msg = "not applied: " + "; ".join(problems) + hint
            else:
                msg = f"{', '.join(off)} off: " + "; ".join(problems) + hint
            if strict:
                if len(off) == len(names):
                    self._set(UNSUPPORTED_VERSIONS, msg)
                raise UnsupportedVersionError(msg)
            self._say(explicit, msg)
            for name in off:
                self.patches[name].state, self.patches[name].reason = UNSUPPORTED, "; ".join(blocked[name])
            names = [n for n in names if not blocked[n]]
            if not names:
                self._set(UNSUPPORTED_VERSIONS, msg)
                return self.status()
        policy.set_strict(strict)
        newly_applied: list[Patch] = []
        for name in names:
            patch = self.patches[name]
            module = sys.modules.get(patch.module)
            if module is None or patch.applied:
                continue
            try:
                result = patch.apply_to(module)
                if result == APPLIED:
                    newly_applied.append(patch)
                elif result == STOOD_DOWN:
                    if strict:
                        raise RuntimeError(f"stood down: {patch.reason}")
                    self._say(explicit, f"{name} stood down: {patch.reason}")
            except Exception as exc:
                for done in reversed(newly_applied):
                    done.revert()
                msg = f"{name} failed, rolled back this apply(): {type(exc).__name__}: {exc}"
                self._set(FAILED, msg)
                if explicit:
                    raise
                self._say(False, msg)
                return self.status()
        kernels.on_apply()
        self.wanted.update(names)
        for name in names:
            when_imported(self.patches[name].module, self._hooks[name])
        message = "active" + (" (FORCED outside the supported versions)" if problems and force else "")
        if off:
            message += f" ({', '.join(off)} off: unsupported versions)"
        self._set(ACTIVE, message)
        return self.status()

    @_locked
    def revert(self) -> Status:
        self.wanted.clear()
        for patch in reversed(list(self.patches.values())):
            if patch.applied:
                patch.revert()
            elif patch.state in (UNSUPPORTED, STOOD_DOWN):
                patch.state, patch.reason = NOT_APPLIED, "reverted"
        kernels.on_revert()
        policy.set_strict(False)
        self._set(REVERTED, "reverted")
        return self.status()

    def activate_on_import(self, cli: bool = False) -> None:
        """``cli``: the process is `ffpa-patch` itself, which reports the state with its exit codes:
        nothing is said here and strict mode does not raise from the import."""
        self._quiet = cli
        try:
            self.apply(explicit=False, strict=None, targets=None, exclude=(), force=None)
        except Exception as exc:  # never break the user's import, unless FFPA_PATCH_STRICT=1 asked for it
            if self.state not in OFF:
                self._set(FAILED, f"not applied: {exc}")
            if env.strict_requested() and not cli:
                raise
            self._say(False, f"not applied: {exc}")
        finally:
            self._quiet = False

    # -- telling -------------------------------------------------------------------------
    def is_applied(self) -> bool:
        return bool(self.wanted)

    def _patch_row(self, patch: Patch) -> dict:
        state, reason = patch.state, patch.reason
        if patch.name in self.wanted and not patch.applied and state not in ("not needed", "failed", STOOD_DOWN):
            needed = patch.requires or patch.module
            top = needed.split(".")[0]
            if top not in sys.modules and importlib.util.find_spec(top) is None:
                state, reason = NOT_INSTALLED, f"{top} is not installed"
            elif not _module_exists(needed):
                state, reason = NOT_INSTALLED, f"{needed} is not in this {top} version"
            else:
                state, reason = PENDING, f"{patch.module} not imported yet"
        elif patch.name not in self.wanted and not patch.applied and state == "not applied" and self.wanted:
            state, reason = SKIPPED, "excluded by targets/exclude"
        elif not self.wanted and not patch.applied and not reason:
            reason = f"nothing applied ({self.state}): see the first line"  # disabled, misconfigured, ...
        try:
            warned = patch.warnings()
        except Exception as exc:  # status must always answer
            warned = [f"could not check: {exc}"]
        return {"name": patch.name, "state": state, "reason": reason, "summary": patch.summary, "warnings": warned}

    @_locked
    def status(self) -> Status:
        compiles, kernel_cache, backwards = kernels.report()
        return Status(
            active=self.is_applied(),
            strict=policy.current.strict,
            state=self.state,
            message=self.message,
            versions=versions.check_all(),
            patches=[self._patch_row(p) for p in self.patches.values()],
            routes=_stats.snapshot(),
            compiles=compiles,
            kernel_cache=kernel_cache,
            backwards=backwards,
        )
