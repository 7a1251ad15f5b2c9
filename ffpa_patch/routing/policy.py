"""What happens around a decided route: counting it, saying it once per model, strict mode,
and the user's global choices (deterministic algorithms, ``sdpa_kernel``). One place, obeyed
by the eager path, the traced path (at trace time, once per compiled layer) and the custom op (at run
time). Imports nothing heavy: ``apply()`` sets strict here without importing torch.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import FFPAFallbackError
from ..kernels import ALWAYS, FLAG
from . import announce, stats
from .decide import Route, strict_violation

#: where a route was taken, as its stats() reason begins
EAGER_CALL = ""  # counted per call
TRACED = "torch.compile (traced): "  # counted once per compiled layer (Dynamo may trace a frame twice)
IN_OP = "torch.compile op: "  # the custom op, at run time: once per compiled layer and route, as traced routes


@dataclass
class Policy:
    strict: bool = False  # apply(strict=True) / FFPA_PATCH_STRICT=1


current = Policy()


def set_strict(on: bool) -> None:
    current.strict = on


def counts_as_fused(route: Route) -> bool:
    """A table kernel whose catalog row counts it as fused (a stand-in no faster than SDPA does not)."""
    return route.fused and route.impl.info.fused


def _enforce(layer: str, head_dim: int, route: Route) -> None:
    if current.strict and strict_violation(layer != "full", head_dim, route, counts_as_fused(route)):
        what = f"ran {route.kernel}, which its catalog row does not count as fused" if route.fused else f"fell back to {route.kernel}"
        raise FFPAFallbackError(
            f"ffpa_patch strict mode: a head_dim={head_dim} full-attention layer {what}: {route.reason}")


def account(layer: str, head_dim: int, route: Route, *, where: str = EAGER_CALL, layer_idx: int = -1,
            announce_as: tuple | None = None) -> None:
    """Count a route (per call in eager code; once per compiled layer while tracing and in the op),
    say a model's first forward (``announce_as``: its config, last-layer flag, backend and family),
    and raise in strict mode. While Dynamo traces, the raise reaches the caller as itself."""
    if where:
        record_at_trace_time(layer_idx, layer, route.kernel, where + route.reason)
    else:
        stats.record(layer, route.kernel, route.reason)
    if announce_as is not None:
        announce.note(*announce_as, layer, route.kernel, route.reason)
    if current.strict:
        _enforce(layer, head_dim, route)


def _dynamo_constant(fn):
    """``torch.compiler.assume_constant_result`` without importing torch (that decorator only sets
    this attribute; tests/test_structure.py checks that it still does): Dynamo then calls ``fn`` once
    while tracing and folds its result in, and eager code calls it as it is."""
    fn._dynamo_marked_constant = True
    return fn


@_dynamo_constant
def record_at_trace_time(layer_idx: int, layer: str, kernel: str, reason: str) -> int:
    stats.record_once(layer_idx, layer, kernel, reason)
    return 0


def deterministic() -> bool:
    """``torch.use_deterministic_algorithms(True)`` is in force (Dynamo guards on it)."""
    import torch

    return torch.are_deterministic_algorithms_enabled()


def determinism_note(repeatable: str, on: bool) -> str | None:
    if not on:
        return None
    return {FLAG: "deterministic=True", ALWAYS: "deterministic (its backward is repeatable as it is)"}.get(repeatable)


@_dynamo_constant
def sdpa_pinned() -> str | None:
    """The SDPA backends ``torch.nn.attention.sdpa_kernel(...)`` (or ``torch.backends.cuda.enable_*_sdp``)
    leaves on, when it turned any off; None at torch's default (all on). Dynamo cannot trace
    these reads: inside a compiled graph the choice is read once, when the graph is traced (as
    Inductor's own SDPA lowering does)."""
    import torch

    b = torch.backends.cuda
    enabled = {"flash": b.flash_sdp_enabled(), "mem_efficient": b.mem_efficient_sdp_enabled(),
               "math": b.math_sdp_enabled(), "cudnn": b.cudnn_sdp_enabled()}
    if all(enabled.values()):
        return None
    return "/".join(n for n, on in enabled.items() if on) or "no backend"
