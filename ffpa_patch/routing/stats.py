"""Counters of routing decisions by (layer kind, kernel, reason)."""
from __future__ import annotations

from collections import Counter

_counts: Counter = Counter()
_once: set = set()


def record(layer: str, kernel: str, reason: str) -> None:
    _counts[(str(layer), str(kernel), str(reason))] += 1  # plain strings: rows print as users read them


def record_once(key, layer: str, kernel: str, reason: str) -> None:
    """Count ``key`` (a layer's route in a compiled graph) once, however often Dynamo traces it."""
    if (key, str(layer), str(kernel), str(reason)) not in _once:
        _once.add((key, str(layer), str(kernel), str(reason)))
        record(layer, kernel, reason)


def snapshot() -> list[dict]:
    return [
        {"layer": layer, "kernel": kernel, "reason": reason, "count": n}
        for (layer, kernel, reason), n in sorted(_counts.items())
    ]


def total(layer: str | None = None, kernel: str | None = None) -> int:
    return sum(n for (lay, ker, _), n in _counts.items() if layer in (None, lay) and kernel in (None, ker))


def reset() -> None:
    _counts.clear()
    _once.clear()
