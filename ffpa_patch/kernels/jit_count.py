"""How many CuTeDSL kernels ffpa-attn and flash-attn-4 hold in this process.

Both packages keep each compiled kernel in a ``JITCache`` (a ``.cache`` dict keyed by
dtype, head_dim, varlen, causal, tiles: never a length) hung on the function that launches
it as ``compile_cache*``. Counting the entries says whether a run of changing lengths keeps
building kernels: the count should stop growing after the first step. Read from the loaded
modules only; nothing is imported.
"""
from __future__ import annotations

import sys
import types

PACKAGES = {"ffpa-attn": "ffpa_attn.", "flash-attn-4": "flash_attn.cute"}


def _entries(cache) -> int:
    inner = getattr(cache, "memory", cache)  # ffpa_disk.DiskKernels keeps ffpa-attn's JITCache as .memory
    table = getattr(inner, "cache", None)
    return len(table) if isinstance(table, dict) else 0


def held(prefix: str) -> int:
    seen, total = set(), 0
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(prefix):
            continue
        for value in list(vars(module).values()):
            if not isinstance(value, types.FunctionType):
                continue
            for attr, cache in list(vars(value).items()):  # another thread may be compiling
                if attr.startswith("compile_cache") and id(cache) not in seen:
                    seen.add(id(cache))
                    total += _entries(cache)
    return total


def counts() -> dict[str, int]:
    """{package: kernels held}, for the packages that are imported and hold any."""
    found = {}
    for package, prefix in PACKAGES.items():
        n = held(prefix)
        if n:
            found[package] = n
    return found
