"""The only code that touches wrapt: exact wrap/unwrap, registry entries, safe hooks.

Every change returns an *undo* callable. Undo puts back exactly what the owner's
own ``__dict__`` held (or deletes the attribute if it was inherited). If someone
wrapped on top of ours meanwhile, ours is switched off in place instead of being
torn out from under them.
"""
from __future__ import annotations

import logging
import types
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


_ours: dict[int, tuple[Any, str, "_Switch"]] = {}  # id -> (our wrapper, its name, its switch)


def is_ours(obj: Any) -> bool:
    """Identity, not attribute lookup: a proxy on top of ours forwards attributes to ours."""
    entry = _ours.get(id(obj))
    return entry is not None and entry[0] is obj


def make_wrapper(original: Any, wrapper: Callable, name: str) -> tuple[wrapt.FunctionWrapper, _Switch]:
    switch = _Switch()
    fw = wrapt.FunctionWrapper(original, wrapper, enabled=switch)
    _ours[id(fw)] = (fw, name, switch)
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

    _ours[id(call)] = (call, name, switch)
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


def set_mapping_entry(mapping: dict, key: str, value: Any) -> Undo:
    """Set ``mapping[key]`` (a class-level registry dict); undo restores or deletes it, unless
    someone replaced our value since (theirs then stays)."""
    old = mapping.get(key, _MISSING)
    mapping[key] = value

    def undo() -> None:
        if mapping.get(key, _MISSING) is not value:
            return
        if old is _MISSING:
            del mapping[key]
        else:
            mapping[key] = old

    return undo


class ForeignEntry(RuntimeError):
    """A registry entry holds someone else's function: wrapping it would put ours outside theirs."""


#: our registry wrappers switched off by an undo, kept because someone may still hold them (a wrapper
#: put on top, or one that captured ours): (id(mapping), key, name) -> (wrapper, switch, what it wraps).
#: The next wrap revives such a wrapper instead of making another, so nobody's wrapper is dropped or doubled.
_parked: dict[tuple[int, str, str], tuple[Callable, _Switch, Any]] = {}


def wrap_mapping_entry(mapping: dict, key: str, wrapper: Callable, name: str, accept: Callable[[Any], bool],
                       reads: Callable[[], Any] | None = None) -> tuple[Callable, _Switch, Undo]:
    """Wrap ``mapping[key]`` (a registry models read on every call) with a plain, traceable function.

    ``accept(entry)`` says whether the entry is one ours may wrap (Transformers' own, or ours).
    Anything else raises ``ForeignEntry``: ours would sit outside it, and calls it routes would
    never reach it. ``reads()``: what callers actually call (default: ``mapping[key]``).

    Undo switches ours off (whoever holds it, now or later, gets what it wrapped) and puts the
    entry back if ours is still there; if someone wrapped on top since, theirs keeps working.
    The next call here revives that same wrapper (no second copy): back into the entry if the
    entry is again what ours wrapped, or switched on where it sits, inside what callers read.
    """
    slot = (id(mapping), key, name)
    current = mapping.get(key, _MISSING)
    parked = _parked.pop(slot, None)
    if parked is not None:
        fn, switch, original = parked
        if current is original:  # the entry is back to what ours wrapped: ours goes back on top of it
            mapping[key] = fn
        elif not reaches(reads() if reads is not None else current, fn):
            parked = None  # out of every chain: it stays off, and a new one is made
        if parked is not None:
            switch.on = True
    if parked is None:
        if current is _MISSING or not accept(current):
            raise ForeignEntry(f"the {key!r} attention entry is {describe(current)}, not Transformers' own: "
                               "ffpa_patch would sit outside it and its calls would skip it")
        original, switch = current, _Switch()
        fn = traceable(original, wrapper, switch, name)
        mapping[key] = fn

    def undo() -> None:
        switch.off()
        _parked[slot] = (fn, switch, original)
        if mapping.get(key, _MISSING) is fn:
            mapping[key] = original
        else:
            log.warning("ffpa_patch: the %r attention entry was wrapped by someone else (%s); ours is switched off "
                        "inside it", key, describe(mapping.get(key)))

    return fn, switch, undo


def describe(fn: Any) -> str:
    """A function as a user finds it: ``module.qualname``."""
    if fn is _MISSING or fn is None:
        return "missing"
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


def live_in_chain(fn: Any, name: str) -> int:
    """How many of our switched-on wrappers called ``name`` sit along ``fn``'s ``__wrapped__`` chain
    (tests: 1 when a patch is in effect, never 2)."""
    count = 0
    while fn is not None:
        entry = _ours.get(id(fn))
        if entry is not None and entry[0] is fn and entry[1] == name and entry[2]():
            count += 1
        fn = getattr(fn, "__wrapped__", None)
    return count


def beneath(fn: Any) -> Any:
    """What one of our registry wrappers wraps (``fn`` itself if it is not ours)."""
    return fn.__wrapped__ if is_ours(fn) and hasattr(fn, "__wrapped__") else fn


def reaches(fn: Any, target: Any, depth: int = 6) -> bool:
    """Whether calling ``fn`` can plausibly reach ``target``: ``fn`` is it, or holds it (its
    ``__wrapped__``, the functions and callable objects in its closure, its bound ``self`` or, for a
    callable object, its attributes, the module-level functions it names; DeepSpeed's Ulysses
    module keeps the entry it wraps as ``attn``). Best effort, for apply() and status(): a
    wrapper that holds ours somewhere it does not call would count as reaching it."""
    if target is None:
        return False
    seen: set[int] = set()
    todo = [(fn, 0)]
    while todo:
        obj, level = todo.pop()
        if obj is target:
            return True
        if id(obj) in seen or level >= depth or obj is None:
            continue
        seen.add(id(obj))
        found: list = []
        for attr in ("__wrapped__", "__func__", "__self__", "func", "attn", "fn"):
            found.append(getattr(obj, attr, None))
        for cell in getattr(obj, "__closure__", None) or ():
            try:
                found.append(cell.cell_contents)
            except ValueError:  # an empty cell
                pass
        if not isinstance(obj, (type, types.FunctionType, types.ModuleType)):  # a callable object: its own callables
            found.extend(v for v in getattr(obj, "__dict__", {}).values() if callable(v) or hasattr(v, "attn"))
        code, globs = getattr(obj, "__code__", None), getattr(obj, "__globals__", None)
        if code is not None and isinstance(globs, dict):
            found.extend(globs.get(n) for n in code.co_names)
        todo.extend((f, level + 1) for f in found if f is not None and (callable(f) or hasattr(f, "attn")))
    return False


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
