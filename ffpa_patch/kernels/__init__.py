"""The kernel table: what each fused kernel serves, refuses and can do, behind one seam.

A ``Kernel`` declares its name (the route's name in ``stats()``), the layers it
serves, why it refuses a call (``unsupported``: device, dtype, head_dim -> reason or
None), its entry points, whether Dynamo may trace it, and whether its backward is
repeatable under ``torch.use_deterministic_algorithms(True)``. A ``KernelSet`` is one
kernel per role: full layers, sliding layers, and FlexAttention for masks the others
cannot express. Routing reads only this table; adding a kernel is one entry here plus
its module.

``active()`` is the production set (``cute.kernel_set()``: ffpa-attn, flash-attn-4,
FlexAttention, all imported lazily). ``use(reference.kernel_set())`` swaps in the fp32
reference, which refuses what the real kernels refuse: the one documented seam the
CPU tests use.

Entry points, all causal bottom-right aligned (query r sees keys <= r + Nkv - Nq), with
``window`` counting the query itself (Transformers' ``sliding_window``; None: no window):
- ``dense(q, k, v, scale, window, deterministic)``: ``[B, S, H, D]`` -> ``[B, S, H, D]``
- ``varlen(q, k, v, cu_seqlens, max_seqlen, scale, window, deterministic)``: ``[T, H, D]``
- ``block(query, key, value, block_mask, scale)``: ``[B, H, S, D]`` and a FlexAttention
  BlockMask (built by routing) -> ``[B, S, H, D]``

Nothing here imports torch until a kernel is asked a question.
"""
from __future__ import annotations

import functools
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Callable, Iterator

#: What a kernel's backward does under torch.use_deterministic_algorithms(True).
ALWAYS = "always"  # repeatable as it is (checked bit for bit on the GPU: tests/gpu)
FLAG = "flag"  # repeatable when called with deterministic=True
NEVER = "not verified"  # not known to be repeatable: such calls fall back

#: kernel name -> the distribution that provides it (``status`` reads this without torch).
PACKAGES = {"ffpa": "ffpa-attn", "fa4": "flash-attn-4", "flex": "torch"}
#: kernel name -> (layers it serves, the head_dim ``status --check`` asks it about).
SERVES = {"ffpa": ("full", 512), "fa4": ("sliding", 256), "flex": ("sliding", 256)}


@dataclass(frozen=True)
class Kernel:
    name: str
    unsupported: Callable[..., "str | None"]
    dense: Callable | None = None
    varlen: Callable | None = None
    block: Callable | None = None
    traceable: bool = False  # Dynamo may trace ``dense`` (else it runs inside the custom op)
    repeatable: str = NEVER

    @property
    def package(self) -> str:
        return PACKAGES[self.name]

    def refuses(self, device, dtype, head_dim: int, deterministic: bool) -> str | None:
        """Why this kernel cannot take the call, or None."""
        problem = self.unsupported(device, dtype, head_dim)
        if problem is None and deterministic and self.repeatable == NEVER:
            problem = f"deterministic algorithms requested and {self.name}'s backward is not verified repeatable"
        return problem


def switched_off(kernel: Kernel, why: str) -> Kernel:
    """``kernel`` refusing every call (e.g. flash-attn-4 off, to compare with FlexAttention)."""
    return replace(kernel, unsupported=lambda *args: why)


@dataclass(frozen=True)
class KernelSet:
    name: str
    full: Kernel
    sliding: Kernel
    flex: Kernel

    def for_layer(self, is_sliding: bool) -> Kernel:
        return self.sliding if is_sliding else self.full

    def by_name(self, name: str) -> Kernel:
        for kernel in (self.full, self.sliding, self.flex):  # a loop, not a cached dict: Dynamo traces this
            if kernel.name == name:
                return kernel
        raise KeyError(name)

    def problems(self, is_sliding: bool, device, dtype, head_dim: int, deterministic: bool = False) -> tuple[str | None, str | None]:
        """(why the layer's kernel refuses, why FlexAttention refuses): what ``decide`` reads."""
        kernel = self.for_layer(is_sliding).refuses(device, dtype, head_dim, deterministic)
        flex = self.flex.refuses(device, dtype, head_dim, deterministic) if is_sliding else None
        return kernel, flex


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
    31B-shaped slice, found with benchmarks/probes/leak_probe.py). A thread's stack
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


_active: KernelSet | None = None


def active() -> KernelSet:
    global _active
    if _active is None:
        from .cute import kernel_set

        _active = kernel_set()
    return _active


@contextmanager
def use(kernels: KernelSet) -> Iterator[KernelSet]:
    """Route through ``kernels`` inside the block (tests: ``use(reference.kernel_set())``)."""
    global _active
    previous, _active = _active, kernels
    try:
        yield kernels
    finally:
        _active = previous


# -- the kernel side of apply / revert / status (the lifecycle asks here, never reaches in) --
def _loaded(name: str):
    import sys

    return sys.modules.get(f"{__name__}.{name}")


def on_apply() -> None:
    """After apply(): ffpa-attn's kernels back on disk if a revert() took them off."""
    if _loaded("disk_cache") is not None:
        _loaded("disk_cache").after_apply()


def on_revert() -> None:
    """revert(): ffpa-attn's own in-memory kernel caches back, as they were."""
    if _loaded("disk_cache") is not None:
        _loaded("disk_cache").restore()


def report() -> tuple[dict, dict]:
    """(kernel builds this process did, where each package keeps compiled kernels), read
    from loaded modules only: nothing is imported."""
    from . import jit_count

    compiles = {}
    flex = _loaded("flex")
    if flex is not None and flex.compiles():
        compiles["flex_attention"] = flex.compiles()
    compiles.update(jit_count.counts())
    disk = _loaded("disk_cache")
    return compiles, (disk.report() if disk is not None else {})
