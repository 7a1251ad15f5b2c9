"""Kernel providers behind one seam.

Routing asks ``active()`` for the kernels. By default that is ``CuteKernels``
(ffpa-attn for the head_dim-512 full layers, flash-attn-4 for sliding layers,
FlexAttention for sliding layers without flash-attn-4 or with image blocks; all
imported lazily). ``use(ReferenceKernels())`` swaps in the fp32 reference
with the same signatures and bottom-right causal semantics: the one documented
seam CPU tests use. All tensors are ``[B, S, H, D]`` (dense) or ``[T, H, D]``
(varlen); ``flex`` takes ``[B, H, S, D]`` and a BlockMask (built by routing,
not by the provider); causal masking is bottom-right aligned; ``window`` counts the query
itself (Transformers' ``sliding_window``).
"""
from __future__ import annotations

import functools
from contextlib import contextmanager
from typing import Iterator, Protocol


class Kernels(Protocol):
    name: str

    def full_unsupported(self, device, dtype, head_dim: int) -> str | None: ...
    def full_dense(self, q, k, v, scale: float): ...
    def full_varlen(self, q, k, v, cu_seqlens, max_seqlen: int, scale: float): ...
    def sliding_unsupported(self, device, dtype, head_dim: int) -> str | None: ...
    def sliding_dense(self, q, k, v, scale: float, window: int): ...
    def sliding_varlen(self, q, k, v, cu_seqlens, max_seqlen: int, scale: float, window: int): ...
    def flex_unsupported(self, device, dtype, head_dim: int) -> str | None: ...
    def flex(self, query, key, value, block_mask, scale: float): ...


def machine_fact(fn):
    """Cache ``fn`` (a question about the machine: device, dtype, head_dim -> reason or None)
    and make it a constant to Dynamo, which calls it once while tracing instead of tracing
    its imports. The marker sits on a plain function around the cache: Dynamo unwraps
    ``lru_cache`` itself, with a warning."""
    import torch

    cached = functools.lru_cache(maxsize=64)(fn)

    @torch.compiler.assume_constant_result
    @functools.wraps(fn)
    def fact(*args):
        return cached(*args)

    fact.cache_clear = cached.cache_clear
    return fact


def import_problem(module: str, package: str, attr: str | None = None) -> str | None:
    """Import ``module`` on a helper thread: None when it imports (and has ``attr``), else why not.

    The thread is a leak fix. CuTeDSL's decorators keep the frame that defines
    them, and a finished frame keeps its ``f_back`` chain alive: imported from a
    model's first forward, that chain reached the forward's frames and held the
    whole model for the rest of the process (6.1 GiB after a 4k run of the
    31B-shaped slice, found with benchmarks/leak_probe.py). A thread's stack
    starts at its own bootstrap, so nothing of the caller's is reachable.
    """
    import importlib
    import threading

    failure: list[str] = []

    def load():
        try:
            loaded = importlib.import_module(module)
            if attr is not None:
                getattr(loaded, attr)
        except Exception as exc:  # ImportError, or a broken CuTeDSL stack
            failure.append(f"{package} not importable ({type(exc).__name__}: {exc})")

    thread = threading.Thread(target=load, name=f"ffpa_patch import {module}", daemon=True)
    thread.start()
    thread.join()
    return failure[0] if failure else None


_active: Kernels | None = None


def active() -> Kernels:
    global _active
    if _active is None:
        from .cute import CuteKernels

        _active = CuteKernels()
    return _active


@contextmanager
def use(kernels: Kernels) -> Iterator[Kernels]:
    """Route through ``kernels`` inside the block (tests: ``use(ReferenceKernels())``)."""
    global _active
    previous, _active = _active, kernels
    try:
        yield kernels
    finally:
        _active = previous
