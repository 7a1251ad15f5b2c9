"""The kernel table: what each fused kernel serves, refuses and can do, behind one seam.

A ``KernelInfo`` declares what a kernel is, readable without torch (``ffpa-patch status``):
its name (the route's name in ``stats()``), the distribution that provides it, the layers it
serves, the head_dim status asks it about, whether it takes any mask (a FlexAttention
BlockMask: the kernel for masks that dense/varlen cannot express) and which routes may pick
it. A ``Kernel`` adds what it does: why it refuses a call (``unsupported``: device, dtype,
head_dim -> reason or None), its entry points, whether Dynamo may trace it, whether its
backward is repeatable under ``torch.use_deterministic_algorithms(True)``, and the forward ops
a selective-checkpointing policy keeps. A ``KernelSet`` is an ordered list of kernels: for each
layer kind, routing takes the first that accepts the call. Routing reads only this table;
adding a kernel is one entry here plus its module.

``active()`` is the production set (``cute.kernel_set()``: ffpa-attn, flash-attn-4,
FlexAttention, all imported lazily). ``use(reference.kernel_set())`` swaps in the fp32
reference, which refuses what the real kernels refuse: the one documented seam the
CPU tests use.

Entry points, all causal bottom-right aligned (query r sees keys <= r + Nkv - Nq), with
``window`` counting the query itself (Transformers' ``sliding_window``; None: no window):
- ``dense(q, k, v, scale, window, deterministic)``: ``[B, S, H, D]`` -> ``[B, S, H, D]``
- ``varlen(q, k, v, cu_seqlens, max_seqlen, scale, window, deterministic)``: ``[T, H, D]``
- ``block(query, key, value, layout, scale, window)``: ``[B, H, S, D]`` and a ``Layout`` (None:
  causal + window), any mask the layout describes -> ``[B, S, H, D]``
- ``dense_lse`` / ``varlen_lse``: the forward without autograd, returning ``(out, lse)`` with the
  natural-log LSE ``[B, H, S]`` / ``[H, T]`` (fp32); ``dense_bwd(dout, q, k, v, out, lse, scale,
  window, deterministic)`` / ``varlen_bwd(dout, q, k, v, out, lse, cu_seqlens, max_seqlen, ...)``:
  ``(dq, dk, dv)`` from a given out and lse. A kernel with all four takes causal masks with
  bidirectional blocks (Gemma 4's images) through kernels/blocks.py.

Nothing here imports torch until a kernel is asked a question.
"""
from __future__ import annotations

import functools
import importlib
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator, NamedTuple

from ..names import Backend, Fallback, Layer
from .catalog import ALWAYS, CATALOG, FA4, FFPA, FLAG, FLEX, NEVER, KernelInfo  # noqa: F401 (re-exported)

#: what a kernel module may provide, by the contract above
ENTRY_POINTS = ("dense", "varlen", "block", "dense_lse", "varlen_lse", "dense_bwd", "varlen_bwd")
MERGING = ("dense_lse", "varlen_lse", "dense_bwd", "varlen_bwd")


class KernelTableError(ValueError):
    """A kernel table that would route wrongly: refused when the table is built, not mid-forward."""


def packages(serves: Layer | None = None) -> tuple[str, ...]:
    """The distributions the catalog's fused kernels come from (those serving ``serves``), torch aside."""
    return tuple(dict.fromkeys(k.package for k in CATALOG if k.package != "torch" and k.fused and serves in (None, k.serves)))


def capability_problem(info: KernelInfo, major: int, minor: int, head_dim: int) -> str | None:
    """Why the row's kernel does not take ``head_dim`` on an sm{major}{minor} GPU, or None (pure)."""
    if info.head_dims is None:
        return None
    spans = {arch: (lo, hi) for arch, lo, hi in info.head_dims}
    if major not in spans:
        archs = "/".join(f"sm{arch}0" for arch in spans)
        return f"sm{major}{minor}: {info.title} runs on {archs} only"
    lo, hi = spans[major]
    if lo == hi and head_dim != hi:
        return f"head_dim {head_dim} != {hi} on sm{major}0"
    if not lo <= head_dim <= hi:
        return f"head_dim {head_dim} not in {lo}..{hi} on sm{major}0"
    return None


def dtype_problem(info: KernelInfo, dtype, dtypes: tuple | None = None) -> str | None:
    names = dtypes or info.dtypes
    if str(dtype).removeprefix("torch.") in names:
        return None
    short = "/".join({"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}.get(d, d) for d in names)
    return f"dtype {dtype} ({info.title} needs {short})"


@functools.lru_cache(maxsize=None)
def refusal(info: KernelInfo, import_error: Callable[[], "str | None"]) -> Callable:
    """The row's kernel's ``unsupported(device, dtype, head_dim)``: what the row declares (CUDA, its
    dtypes, its head_dims per GPU generation), then whether its package imports."""

    @machine_fact
    def unsupported(device, dtype, head_dim: int) -> str | None:
        import torch

        device = torch.device(device)
        if device.type != "cuda":
            return f"device {device.type} ({info.title} needs CUDA)"
        problem = dtype_problem(info, dtype) or capability_problem(info, *torch.cuda.get_device_capability(device), head_dim)
        return problem or import_error()

    return unsupported


@dataclass(frozen=True)
class Kernel:
    info: KernelInfo
    unsupported: Callable[..., "str | None"]
    dense: Callable | None = None
    varlen: Callable | None = None
    block: Callable | None = None
    dense_lse: Callable | None = None  # the forward with its log-sum-exp (kernels/blocks.py merges by it)
    varlen_lse: Callable | None = None
    dense_bwd: Callable | None = None  # the backward from a given out and lse
    varlen_bwd: Callable | None = None
    saved_ops: Callable[[], set] | None = None  # the forward ops a selective-checkpointing policy keeps
    missing: Callable[[], "str | None"] = lambda: None  # why it is not on this machine at all (not installed, switched off)

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def traceable(self) -> bool:
        """Dynamo may trace ``dense``/``block`` (else it runs inside the custom op)."""
        return self.info.traceable

    @property
    def repeatable(self) -> str:
        return self.info.repeatable

    @property
    def merges(self) -> bool:
        """It takes causal masks with bidirectional blocks (images) through kernels/blocks.py."""
        return None not in (self.dense_lse, self.varlen_lse, self.dense_bwd, self.varlen_bwd)

    def refuses(self, backend: str, device, dtype, head_dim: int, deterministic: bool) -> str | None:
        """Why this kernel cannot take the call, or None."""
        if backend not in self.info.routes:
            return f"{self.name}: not on the drop-in path ({self.info.why_not_drop_in})"
        problem = self.unsupported(device, dtype, head_dim)
        if problem is None and deterministic and self.repeatable == NEVER:
            problem = f"deterministic algorithms requested and {self.name}'s backward is not verified repeatable"
        return problem


def load(info: KernelInfo) -> Kernel:
    """The production kernel of a catalog row: its module's entry points, the refusal the row declares."""
    module = sys.modules.get(info.module) or importlib.import_module(info.module)  # (Dynamo traces the first)
    entries = {name: getattr(module, name) for name in ENTRY_POINTS if callable(getattr(module, name, None))}
    saved = functools.partial(registered_ops, info, module.import_error) if info.checkpoint_ops else None
    return Kernel(info, refusal(info, module.import_error), saved_ops=saved, missing=machine_fact(module.import_error), **entries)


def registered_ops(info: KernelInfo, import_error: Callable | None = None) -> set:
    """The row's checkpoint ops as torch op overloads, those registered now (none before the kernel's
    package is imported: they are looked up at each call, never frozen)."""
    if import_error is not None and import_error() is not None:
        return set()
    import torch

    found = set()
    for qualified in info.checkpoint_ops:
        namespace, op = qualified.split("::")
        packet = getattr(getattr(torch.ops, namespace), op, None) if hasattr(torch.ops, namespace) else None
        if packet is not None:
            found.add(packet.default)
    return found


def validate(name: str, kernels: tuple) -> None:
    """Refuse, at construction, a table that would route wrongly (tests/test_kernel_table.py: one per rule)."""
    from ..versions import SUPPORTED

    seen: set = set()
    fallbacks = {f.value for f in Fallback}
    for kernel in kernels:
        info = kernel.info
        where = f"kernel table {name!r}: kernel {info.name!r}"
        if info.name in seen:
            raise KernelTableError(f"{where} appears twice: stats() and routes tell kernels apart by name")
        seen.add(info.name)
        if info.name in fallbacks:
            raise KernelTableError(f"{where} has a fallback's name ({sorted(fallbacks)}): its calls would count "
                                   "and be judged as fallbacks")
        if info.serves not in (Layer.FULL, Layer.SLIDING):
            raise KernelTableError(f"{where} serves {info.serves!r}: a kernel serves 'full' or 'sliding' layers")
        if info.package != "torch" and info.package not in SUPPORTED:
            raise KernelTableError(f"{where} comes from {info.package!r}, which has no supported range "
                                   "(give its catalog row a versions range)")
        if not set(info.routes) <= {b.value for b in Backend}:
            raise KernelTableError(f"{where} routes {info.routes!r}: only {[b.value for b in Backend]}")
        if info.repeatable not in (ALWAYS, FLAG, NEVER):
            raise KernelTableError(f"{where} declares repeatable={info.repeatable!r}")
        if info.any_mask and kernel.block is None:
            raise KernelTableError(f"{where} takes any mask but has no block entry point")
        if not info.any_mask and (kernel.dense is None or kernel.varlen is None):
            raise KernelTableError(f"{where} needs dense and varlen entry points (or any_mask and block)")
        merging = [getattr(kernel, e) is not None for e in MERGING]
        if any(merging) and not all(merging):
            raise KernelTableError(f"{where} has some of {MERGING} but not all: image blocks need the four")
        # the ops registered by now, without importing the kernel's package (that waits for the first call)
        check_checkpoint_ops(where, registered_ops(info))


def check_checkpoint_ops(where: str, ops: set) -> None:
    """A selective-checkpointing policy sees an op only if it reaches the dispatcher as itself: an op
    with a CompositeImplicitAutograd kernel is decomposed before the policy looks, so keeping it saves nothing."""
    import torch

    for op in ops:
        if not isinstance(op, torch._ops.OpOverload):
            raise KernelTableError(f"{where} names {op!r} for checkpointing, which is not a torch op overload")
        if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd"):
            raise KernelTableError(f"{where} names {op.name()} for checkpointing, but it is composite: "
                                   "the checkpointing policy never sees it (register it with an autograd kernel)")


def switched_off(kernel: Kernel, why: str) -> Kernel:
    """``kernel`` refusing every call, as if not installed (e.g. flash-attn-4 off, to compare with FlexAttention)."""
    return replace(kernel, unsupported=lambda *args: why, missing=lambda: why)


class Offer(NamedTuple):
    """One candidate kernel for one call, as ``decide`` reads it."""

    kernel: str
    problem: str | None  # why it refuses the call, or None: it takes it
    any_mask: bool
    absent: bool = False  # refused because it is not on this machine at all: a fallback's reason is then the next one's
    impl: object = None  # the Kernel itself: a route that takes it carries it to dispatch (no lookup by name)


@dataclass(frozen=True)
class KernelSet:
    name: str
    kernels: tuple  # Kernel, in order of preference within each layer kind
    _offers: dict = field(default_factory=dict, compare=False, repr=False)  # eager calls' offers, by their facts

    def __post_init__(self):
        validate(self.name, self.kernels)

    def by_name(self, name: str) -> Kernel:
        for kernel in self.kernels:  # a loop, not a cached dict: Dynamo traces this
            if kernel.name == name:
                return kernel
        raise KeyError(f"kernel {name!r} is not in the {self.name!r} kernel set")

    def serving(self, layer: str) -> tuple:
        return tuple(k for k in self.kernels if k.info.serves == layer)

    def offers(self, layer: str, backend: str, device, dtype, head_dim: int, deterministic: bool = False) -> tuple:
        """Each kernel serving ``layer``, in order, with why it refuses this call (or None)."""
        return tuple(Offer(k.name, problem, k.info.any_mask, problem is not None and problem == k.missing(), k)
                     for k in self.kernels if k.info.serves == layer
                     for problem in (k.refuses(backend, device, dtype, head_dim, deterministic),))

    def cached_offers(self, *facts) -> tuple:
        """``offers`` remembered per set of facts (a kernel's answers depend on nothing else): an eager
        call's lookup is one dict read. Not for traced code, which calls ``offers``."""
        found = self._offers.get(facts)
        if found is None:
            found = self._offers[facts] = self.offers(*facts)
        return found


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


def on_install() -> None:
    """A routing patch is being installed (torch is imported by then): build the production table now,
    so a table that does not check out fails the patch, loudly, instead of a forward; and so the
    table is never first built inside a graph Dynamo traces (it imports the kernels' modules)."""
    active()


def on_revert() -> None:
    """revert(): ffpa-attn's own in-memory kernel caches back, as they were."""
    if _loaded("disk_cache") is not None:
        _loaded("disk_cache").restore()


def report() -> tuple[dict, dict, dict]:
    """(kernel builds this process did, where each package keeps compiled kernels, which backward
    the FFPA full layers ran and how often), read from loaded modules only: nothing is imported."""
    from . import jit_count

    compiles = {}
    flex = _loaded("flex")
    if flex is not None and flex.compiles():
        compiles["flex_attention"] = flex.compiles()
    compiles.update(jit_count.counts())
    disk = _loaded("disk_cache")
    ffpa = _loaded("ffpa")
    return compiles, (disk.report() if disk is not None else {}), (dict(ffpa.BACKWARDS) if ffpa is not None else {})
