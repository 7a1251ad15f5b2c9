"""The only code that touches wrapt: exact wrap/unwrap, registry entries, safe hooks.

Every change returns an *undo* callable. Undo puts back exactly what the owner's
own ``__dict__`` held (or deletes the attribute if it was inherited). If someone
wrapped on top of ours meanwhile, ours is switched off in place instead of being
torn out from under them.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

import wrapt

log = logging.getLogger("ffpa_patch")

Undo = Callable[[], None]
_MISSING = object()


class _Switch:
    """Per-wrapper on/off, read by wrapt on every call."""

    def __init__(self) -> None:
        self.on = True

    def __call__(self) -> bool:
        return self.on

    def off(self) -> None:
        self.on = False


_ours: dict[int, tuple[wrapt.FunctionWrapper, str]] = {}


def is_ours(obj: Any) -> bool:
    """Identity, not attribute lookup: a proxy on top of ours forwards attributes to ours."""
    entry = _ours.get(id(obj))
    return entry is not None and entry[0] is obj


def make_wrapper(original: Any, wrapper: Callable, name: str) -> tuple[wrapt.FunctionWrapper, _Switch]:
    switch = _Switch()
    fw = wrapt.FunctionWrapper(original, wrapper, enabled=switch)
    _ours[id(fw)] = (fw, name)
    return fw, switch


def traceable(original: Callable, wrapper: Callable, switch: _Switch, name: str) -> Callable:
    """A plain function doing what ``wrapt.FunctionWrapper(original, wrapper, enabled=switch)``
    does, for places torch.compile traces through (Dynamo cannot guard on a wrapt object:
    "FuncDefaultsGuardAccessor: Not a function", an AssertionError on Transformers 5.5-5.12)."""
    import functools

    @functools.wraps(original)
    def call(*args, **kwargs):
        if switch():
            return wrapper(original, None, args, kwargs)
        return original(*args, **kwargs)

    _ours[id(call)] = (call, name)
    return call


def wrap_attribute(owner: Any, path: str, wrapper: Callable, name: str) -> tuple[wrapt.FunctionWrapper, _Switch, Undo]:
    """Wrap ``owner.path`` (``"func"`` or ``"Class.method"``) with a wrapt wrapper."""
    parent, attribute, original = wrapt.resolve_path(owner, path)
    if is_ours(original):
        raise RuntimeError(f"{path} is already wrapped by ffpa_patch ({_ours[id(original)][1]})")
    own = vars(parent).get(attribute, _MISSING)
    fw, switch = make_wrapper(original, wrapper, name)
    setattr(parent, attribute, fw)

    def undo() -> None:
        current = vars(parent).get(attribute, _MISSING)
        if current is fw:
            if own is _MISSING:
                delattr(parent, attribute)
            else:
                setattr(parent, attribute, own)
            _ours.pop(id(fw), None)
        else:
            switch.off()
            log.warning("ffpa_patch: %s was re-wrapped by someone else; disabled ours in place", path)

    return fw, switch, undo


def set_attribute(owner: Any, attribute: str, value: Any) -> Undo:
    """Replace a plain attribute (a module global, say); undo restores it exactly."""
    own = vars(owner).get(attribute, _MISSING)
    setattr(owner, attribute, value)

    def undo() -> None:
        if vars(owner).get(attribute, _MISSING) is not value:
            log.warning("ffpa_patch: %s.%s changed since we set it; left as is", getattr(owner, "__name__", owner), attribute)
            return
        if own is _MISSING:
            delattr(owner, attribute)
        else:
            setattr(owner, attribute, own)

    return undo


def set_mapping_entry(mapping: dict, key: str, value: Any, on_replaced: Callable[[], None] | None = None) -> Undo:
    """Set ``mapping[key]`` (a class-level registry dict); undo restores or deletes it."""
    old = mapping.get(key, _MISSING)
    mapping[key] = value

    def undo() -> None:
        if mapping.get(key, _MISSING) is not value:
            if on_replaced is not None:
                on_replaced()
            return
        if old is _MISSING:
            del mapping[key]
        else:
            mapping[key] = old

    return undo


_hooked: set[tuple[str, int]] = set()


def when_imported(module_name: str, hook: Callable[[Any], None]) -> None:
    """Run ``hook(module)`` once ``module_name`` is imported (at once if it is).

    Registered at most once per (module, hook); exceptions are logged, never
    raised into the importing code.
    """
    key = (module_name, id(hook))
    if key in _hooked:
        return
    _hooked.add(key)

    def safe(module: Any) -> None:
        try:
            hook(module)
        except Exception:  # a hook must never break the user's import
            log.exception("ffpa_patch: post-import hook for %s failed; left unpatched", module_name)

    wrapt.register_post_import_hook(safe, module_name)
