"""The kernel catalog: every fused kernel ffpa_patch may route to, in preference order, one row each.

A row declares what a kernel serves and what it is, and everything else derives from it:
routing's candidates and their refusals (kernels/__init__.py builds a ``Kernel`` from the row and
its module), the CPU test twins (kernels/reference.py), the supported version ranges
(versions.py), the pip extras (setup.py runs this file on its own), both statuses, the ops
selective checkpointing keeps. Adding a kernel is one row here plus its module.

This file imports nothing, not even from its own package: setup.py reads it before anything is
installed, and ``ffpa-patch status`` reads it without torch.
"""
from __future__ import annotations

from dataclasses import dataclass, field

# What a kernel's backward does under torch.use_deterministic_algorithms(True).
ALWAYS = "always"  # repeatable as it is (checked bit for bit on the GPU: tests/gpu)
FLAG = "flag"  # repeatable when called with deterministic=True
NEVER = "not verified"  # not known to be repeatable: such calls fall back

HALF = ("float16", "bfloat16")
BOTH_ROUTES = ("ffpa", "sdpa")  # the backends (names.Backend) a kernel may be picked on


@dataclass(frozen=True)
class KernelInfo:
    """One kernel, declared once. Its module provides the entry points the contract names
    (kernels/__init__.py): ``import_error()`` and ``dense``/``varlen`` (or ``block`` for a kernel that
    takes any mask), optionally the four log-sum-exp entry points that merge image blocks."""

    name: str  # the route's name in stats(); never a fallback's ("sdpa", "eager", "refuse")
    title: str  # how messages name it ("FFPA")
    serves: str  # "full" or "sliding" (names.Layer)
    package: str  # the distribution that provides it ("torch": torch itself)
    versions: str  # the package's supported range ("" for torch: versions.py holds torch's)
    extra: str  # the pip extra that installs the package ("" for torch)
    module: str  # ffpa_patch's module with its entry points
    head_dim: int  # the head_dim a status asks it about
    #: (compute capability major, lowest, highest head_dim) it takes there; None: any CUDA GPU, any head_dim
    head_dims: tuple | None = None
    dtypes: tuple = HALF  # the torch dtypes (names) it takes
    any_mask: bool = False  # takes any mask (``block``), not only causal + padding/packing
    routes: tuple = BOTH_ROUTES
    why_not_drop_in: str = ""  # why a model left on "sdpa" never gets it (when routes leave "sdpa" out)
    fused: bool = True  # counts as fused for strict mode and status (False: a stand-in no faster than SDPA)
    traceable: bool = False  # Dynamo may trace its entry points (else they run inside the custom op)
    repeatable: str = NEVER
    checkpoint_ops: tuple = field(default=())  # "namespace::op" forward ops selective checkpointing keeps

    @property
    def label(self) -> str:
        return f"{self.name} ({self.package}, {self.serves} layers, D={self.head_dim})"


FFPA = KernelInfo("ffpa", "FFPA", "full", "ffpa-attn", ">=0.2.4,<0.3", "ffpa", "ffpa_patch.kernels.ffpa", 512,
                  head_dims=((9, 320, 512), (10, 512, 512)), traceable=True, repeatable=ALWAYS,
                  checkpoint_ops=("ffpa_attn::_fwd_cute", "ffpa_attn::_varlen_fwd_cute"))
FA4 = KernelInfo("fa4", "flash-attn-4", "sliding", "flash-attn-4", ">=4.0.0b36", "fa4", "ffpa_patch.kernels.fa4", 256,
                 head_dims=((9, 1, 256), (10, 1, 256)), repeatable=FLAG)
FLEX = KernelInfo("flex", "FlexAttention", "sliding", "torch", "", "", "ffpa_patch.kernels.flex", 256,
                  dtypes=(*HALF, "float32"), any_mask=True, routes=("ffpa",),
                  why_not_drop_in="FlexAttention compiles, which a model left on \"sdpa\" did not ask for",
                  traceable=True, repeatable=NEVER)
#: the production kernels, in order of preference within each layer kind
CATALOG = (FFPA, FA4, FLEX)


def extras(catalog=CATALOG) -> dict:
    """setup.py's extras: each extra name -> the requirement of its package."""
    return {info.extra: [f"{info.package}{info.versions}"] for info in catalog if info.extra}


def ranges(catalog=CATALOG) -> dict:
    """The kernel packages' supported ranges (versions.SUPPORTED adds them to the core's)."""
    return {info.package: info.versions for info in catalog if info.package != "torch"}
