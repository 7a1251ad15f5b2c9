"""FlexAttention for sliding layers where flash-attn-4 is absent or cannot express the mask.

The BlockMask is built from the structure ``routing.masks`` read out of the
4-D mask (causal + window + segments, where padding is segment 0), or, for
masks that are not causal+padding/packing (Gemma4's bidirectional image
blocks), from the bool mask itself. Building it is pure torch and runs
anywhere (CPU tests use it); only the fused kernel needs CUDA.
flex_attention is compiled with automatic dynamic shapes (``dynamic=None``):
packing changes the sequence length every step, and ``dynamic=False`` (what
Transformers' flex backend uses) compiled a new kernel per step, ~7.8 s each.
On CPU the first length compiled static, the second once more with a symbolic
length, and then no more (tests/test_flex.py); not yet measured on the GPU.
``compiles()`` counts them (``status()`` shows it). Called
directly when the caller is already compiling.
"""
from __future__ import annotations

import functools

import torch

from ..names import Shape
from . import import_problem, refusal
from .catalog import FLEX

# Default flex tiles overflow shared memory above head_dim 256 on Hopper
# (NeMo-Automodel #3064); NeMo's small-tile options, forward and backward.
SMALL_TILES = {
    "BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_M1": 32, "BLOCK_N1": 32,
    "BLOCK_M2": 32, "BLOCK_N2": 32, "num_stages": 1, "num_warps": 4,
}


@functools.lru_cache(maxsize=1)
def import_error() -> str | None:
    return import_problem("torch.nn.attention.flex_attention", "FlexAttention", attr="flex_attention")


unsupported = refusal(FLEX, import_error)  # what its catalog row declares (any CUDA GPU, fp16/bf16/fp32)


def kernel_options(head_dim: int) -> dict | None:
    return dict(SMALL_TILES) if head_dim > 256 else None


def block_mask(layout, batch: int, q_len: int, kv_len: int, window: int | None, device):
    """The BlockMask for ``layout`` (a ``kernels.layout.Layout``, or None for "no mask given").

    Built once per mask (kept in the layout, which is cached per mask tensor)
    and shared by every sliding layer of the forward.
    """
    if torch.compiler.is_compiling():  # no Python-side caches inside a graph
        return _build(layout if layout is not None and layout.kind != Shape.DENSE else None, batch, q_len, kv_len, window, device)
    if layout is None or layout.kind == Shape.DENSE:
        return _causal_block_mask(q_len, kv_len, window, device)
    key = ("flex", batch, q_len, kv_len, window)
    if key not in layout.built:
        layout.built[key] = _build(layout, batch, q_len, kv_len, window, device)
    return layout.built[key]


@functools.lru_cache(maxsize=16)
def _causal_block_mask(q_len, kv_len, window, device):
    return _build(None, 1, q_len, kv_len, window, device)


def _build(layout, batch, q_len, kv_len, window, device):
    """Causal is bottom-right aligned (query r sees keys <= r + kv_len - q_len), as
    in the fused kernels; a window W lets a query see itself and W-1 keys before."""
    from torch.nn.attention.flex_attention import create_block_mask

    # fused block-mask build, no S x S temporaries (inside a compiled graph inductor fuses it anyway)
    compiled = torch.device(device).type == "cuda" and not torch.compiler.is_compiling()
    offset = kv_len - q_len
    if layout is not None and layout.kind in (Shape.OTHER, Shape.BLOCKS):
        allowed = layout.allowed
        pick_b = allowed.shape[0] > 1
        pick_h = allowed.shape[1] > 1

        def mask_mod(b, h, q, kv):
            return allowed[b if pick_b else 0, h if pick_h else 0, q, kv]

        return create_block_mask(mask_mod, batch if pick_b else None, allowed.shape[1] if pick_h else None,
                                 q_len, kv_len, device=device, _compile=compiled)

    segments = layout.segments if layout is not None else None

    def mask_mod(b, h, q, kv):
        keep = q + offset >= kv
        if window is not None:
            keep = keep & (q + offset - kv < window)
        if segments is not None:
            keep = keep & (segments[b, q] == segments[b, kv]) & (segments[b, kv] > 0)
        return keep

    return create_block_mask(mask_mod, batch if segments is not None else None, None, q_len, kv_len,
                             device=device, _compile=compiled)


_compile_count = 0


def compiles() -> int:
    """How many times Dynamo compiled our flex_attention in this process (each one a kernel build)."""
    return _compile_count


def _counting_inductor(graph, example_inputs):
    global _compile_count
    from torch._inductor.compile_fx import compile_fx

    _compile_count += 1
    return compile_fx(graph, example_inputs)


@functools.lru_cache(maxsize=1)
def _compiled():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=None, backend=_counting_inductor)


def block(query, key, value, layout, scale: float, window: int | None):
    """``[B, H, S, D]`` q/k/v (GQA native) and the mask's layout (None: causal + window) -> ``[B, S, H, D]``."""
    from torch.nn.attention.flex_attention import flex_attention

    mask = block_mask(layout, query.shape[0], query.shape[2], key.shape[2], window, query.device)
    fn = flex_attention if torch.compiler.is_compiling() else _compiled()
    out = fn(query, key, value, block_mask=mask, scale=scale, enable_gqa=query.shape[1] != key.shape[1],
             kernel_options=kernel_options(query.shape[-1]))
    return out.transpose(1, 2)
