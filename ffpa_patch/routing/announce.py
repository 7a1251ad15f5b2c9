"""One line per model at its first forward: which layers went where.

Collected per config object while the first forward runs, printed when its
last decoder layer has been routed, e.g.
``ffpa_patch: Gemma4 model on "ffpa": 1 full -> ffpa: dense causal | 5 sliding -> fa4: dense causal``
(``Gemma4 12B (gemma4_unified) model`` for the 12B): kinds apart by ``|``, a reason after its kernel's colon.
Goes to the ``ffpa_patch`` logger at INFO, or to stderr when logging is not configured.
"""
from __future__ import annotations

import weakref
from collections import Counter

from .. import loud
# Configs are unhashable: keyed by id, with a weak reference to tell a reused id apart.
_done: dict[int, weakref.ref] = {}
_pending: dict[int, Counter] = {}


def pending(config) -> bool:
    """This model's first forward has not been said yet."""
    ref = _done.get(id(config))
    return config is not None and (ref is None or ref() is not config)


def note(config, last: bool, backend: str, family: str, layer: str, kernel: str, reason: str) -> None:
    """One call of a model's first forward; ``last``: its last decoder layer (the line is printed)."""
    key = id(config)
    ref = _done.get(key)
    if config is None or (ref is not None and ref() is config):
        return
    seen = _pending.setdefault(key, Counter())
    seen[(layer, kernel, reason)] += 1
    if last:
        _done[key] = weakref.ref(config)
        del _pending[key]
        parts = " | ".join(f"{n} {lay} -> {ker}: {why}" for (lay, ker, why), n in sorted(seen.items()))
        emit(f'ffpa_patch: {family} model on "{backend}": {parts}')


def emit(msg: str) -> None:
    loud.emit(msg)
