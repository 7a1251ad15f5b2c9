"""Read the structure out of the 4-D mask Transformers hands the attention call.

A bool (or additive float) ``[B|1, 1|H, S, S]`` mask is accepted for a fused
kernel only if, on every real query row, it is exactly "causal, same segment,
key not padding" (plus the sliding window): then the call is ``dense`` (no
padding, one sequence per row) or ``varlen`` (padding and/or packed sequences,
described by cu_seqlens and per-position segment ids). Anything else
(bidirectional image blocks, custom masks) is ``other``: FlexAttention can
take it as a bool mask, otherwise SDPA gets the mask as given; so does a float mask
with any value besides 0 and the dtype's min (or -inf), i.e. a soft bias, and a batch
with no real token at all. A token is real
when it sees itself; a segment starts at a real token that cannot see the one
before it. The result is cached per mask buffer: all layers of one kind share
one mask per forward, except for inference tensors, which keep no version counter.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch

_ROW_CHUNK = 1024


@dataclass
class Layout:
    kind: str  # "dense" | "varlen" | "other"
    indices: torch.Tensor | None = None  # flat positions (in B*S) of real tokens
    cu_seqlens: torch.Tensor | None = None  # int32, segment bounds in the packed order
    max_seqlen: int = 0
    segments: torch.Tensor | None = None  # [B, S] int32 segment id per position, 0 = padding (varlen)
    allowed: torch.Tensor | None = None  # the bool mask itself, for "other" (FlexAttention can take it)
    block_masks: dict = field(default_factory=dict)  # FlexAttention BlockMasks built from this layout


_cache: list[tuple[weakref.ref, tuple, int | None, int, Layout]] = []


def _version(t: torch.Tensor) -> int | None:
    try:
        return t._version
    except RuntimeError:  # inference-mode tensors keep no version counter
        return None


def _identity(mask: torch.Tensor) -> tuple[weakref.ref, tuple]:
    """What makes two mask tensors the same mask: their storage (alive, the same object),
    offset, shape, strides and version. Not the tensor object: a compiled graph hands each
    layer's op a fresh view of the one mask buffer."""
    try:
        storage = weakref.ref(mask.untyped_storage())
        if storage() is not None:  # torch keeps a storage's Python object while the storage lives
            return storage, (mask.storage_offset(), tuple(mask.shape), mask.stride(), _version(mask))
    except (RuntimeError, NotImplementedError, TypeError):  # tensors without a plain storage
        pass
    return weakref.ref(mask), (_version(mask),)


def analyse(mask: torch.Tensor, batch: int, window: int | None) -> Layout:
    if _version(mask) is None:  # an inference tensor: an in-place edit would go unseen, so no cache
        return _analyse(mask, batch, window)
    owner, fingerprint = _identity(mask)
    for ref, seen, win, b, layout in _cache:
        if ref() is not None and ref() is owner() and seen == fingerprint and win == window and b == batch:
            return layout
    layout = _analyse(mask, batch, window)
    _cache.insert(0, (owner, fingerprint, window, batch, layout))
    del _cache[4:]
    return layout


def _analyse(mask: torch.Tensor, batch: int, window: int | None) -> Layout:
    other = Layout("other", allowed=mask if is_bool_4d(mask) else None)
    if mask.dim() != 4 or mask.shape[-1] != mask.shape[-2]:
        return other
    if mask.dtype == torch.bool:
        allowed = mask
    else:
        allowed = mask == 0
        # Only 0 (attend) and the dtype's min or -inf (masked) are a hard mask; a finite bias
        # (a soft mask, ALiBi) must reach SDPA as given.
        if not bool((allowed | (mask <= torch.finfo(mask.dtype).min)).all()):
            return other
    if allowed.shape[1] != 1 and not bool((allowed == allowed[:, :1]).all()):
        return other
    allowed = allowed[:, 0]
    seq = allowed.shape[-1]
    real = allowed.diagonal(dim1=-2, dim2=-1)
    sees_prev = torch.nn.functional.pad(allowed.diagonal(offset=-1, dim1=-2, dim2=-1), (1, 0), value=False)
    starts = real & ~sees_prev
    segment = starts.cumsum(-1)
    pos = torch.arange(seq, device=mask.device)
    bad = torch.zeros((), dtype=torch.bool, device=mask.device)
    for r0 in range(0, seq, _ROW_CHUNK):
        rows = pos[r0 : r0 + _ROW_CHUNK, None]
        expected = (segment[:, r0 : r0 + _ROW_CHUNK, None] == segment[:, None, :]) & real[:, None, :] & (pos <= rows)
        if window is not None:
            expected &= (rows - pos) < window
        wrong = (allowed[:, r0 : r0 + _ROW_CHUNK] != expected) & real[:, r0 : r0 + _ROW_CHUNK, None]
        bad |= wrong.any()
    if bad.item():
        return other
    real, starts, segment = (t.expand(batch, seq) for t in (real, starts, segment))
    if not bool(real.any()):  # nothing but padding (or batch 0): stock's own handling, via SDPA
        return other
    if bool((real.all(-1) & (starts.sum(-1) == 1)).all()):
        return Layout("dense")
    per_row = starts.sum(-1)
    row_offset = torch.nn.functional.pad(per_row.cumsum(0)[:-1], (1, 0))
    global_segment = (segment + row_offset[:, None]).flatten()
    indices = real.flatten().nonzero().squeeze(1)
    lengths = torch.bincount(global_segment[indices] - 1, minlength=int(per_row.sum()))
    cu_seqlens = torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
    segments = torch.where(real, global_segment.view(batch, seq), 0).to(torch.int32)
    return Layout("varlen", indices, cu_seqlens, int(lengths.max()), segments)


def is_bool_4d(mask: torch.Tensor) -> bool:
    return mask.dtype == torch.bool and mask.dim() == 4


def causal(q_len: int, kv_len: int, device, window: int | None = None) -> torch.Tensor:
    """Bottom-right aligned causal "may attend" mask ``[1, 1, q_len, kv_len]`` (what a missing
    mask means); a window W lets a query see itself and W-1 keys before it."""
    i = torch.arange(q_len, device=device)[:, None] + (kv_len - q_len)
    j = torch.arange(kv_len, device=device)[None, :]
    allowed = j <= i
    if window is not None:
        allowed &= i - j < window
    return allowed[None, None]


def to_additive(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """A bool "may attend" mask as the additive float mask eager attention adds."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
