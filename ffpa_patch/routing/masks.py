"""What Transformers hands the attention call as its mask, turned into what a kernel needs.

Four kinds arrive (``kind_of``):
- ``CausalMask``: the "ffpa" mask function's stand-in for a mask that is exactly causal
  (+ a window) over one unpadded sequence per row (patches/attention_backend.py);
- a 4-D bool or float tensor: ``analyse`` reads its structure, exactly or not at all;
- None: on the drop-in path, stock ``sdpa_mask``'s "use is_causal"; on "ffpa", a mask the
  "ffpa" mask function did not make (decide refuses to guess);
- anything else (a mask that requires grad, an integer mask, a BlockMask): handed to the
  fallback as given, so stock's own code computes it (or raises its own error).

``analyse`` accepts a tensor for a fused kernel only if, on every real query row, it is
exactly "causal, same segment, key not padding" (plus the sliding window): then the call
is ``dense`` (no padding, one sequence per row) or ``varlen`` (padding and/or packed
sequences, described by cu_seqlens and per-position segment ids). Anything else
(bidirectional image blocks, custom masks) is ``other``: FlexAttention can take it as a
bool mask, otherwise SDPA gets the mask as given; so does a float mask with any value
besides 0 and the dtype's min (or -inf), i.e. a soft bias, and a batch with no real token
at all. A token is real when it sees itself; a segment starts at a real token that cannot
see the one before it.

The analysis is shared by the layers of one forward, and by the recomputes of its backward
(gradient checkpointing must see the mask as the forward did); a new forward, seen when a
layer index does not increase, reads the mask again. A mask buffer rewritten between two
forwards (through numpy or ``.data``, which torch's version counter does not see) is
therefore never taken for the last batch's.
"""
from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass

import torch

from ..kernels.layout import Layout
from ..names import Mask, Shape

_ROW_CHUNK = 1024


@dataclass(frozen=True)
class CausalMask:
    """A mask that is exactly causal (+ ``window``: a query sees itself and window-1 keys
    before it) over one unpadded sequence per row, not built. Bottom-right aligned, as the
    kernels compute (the same as top-left when q_len == kv_len). ``window`` is the one
    Transformers asked for in this forward (the config's, read at forward time)."""

    window: int | None = None

    def __getitem__(self, index):
        """Transformers 5.23+ keeps the last queries of KV-shared layers (``mask[:, :, -n:, :]``):
        the tail of a bottom-right causal mask is bottom-right causal. Any other indexing is not
        a mask we stand for, so it is refused rather than guessed."""
        if isinstance(index, tuple) and len(index) == 4 and isinstance(index[2], slice) and index[2].stop is None \
                and index[2].step in (None, 1) and all(i == slice(None) for i in (index[0], index[1], index[3])):
            return self
        raise TypeError(f"ffpa_patch.CausalMask cannot be indexed with {index!r}")


PAD, NOT_CAUSAL = -1, -2  # what a position id says of its token under Ulysses SP (``flag_positions``)
IMAGES_UNDER_SP = (
    "ffpa_patch: this batch has bidirectional blocks (image or audio tokens) under DeepSpeed Ulysses sequence "
    "parallelism, which passes no mask to attention, so their in-block attention cannot be reconstructed on the "
    "gathered sequence. Train image batches without sequence parallelism (sp_size=1), or send only text batches "
    "through the sequence-parallel model."
)
NO_POSITIONS = (
    "ffpa_patch: Ulysses sequence parallelism reached attention without position_ids, so the layout of the "
    "gathered sequence is unknown; put position_ids in every batch (DeepSpeed's UlyssesSPDataLoaderAdapter requires them)."
)


@dataclass(frozen=True, eq=False)
class SequenceParallel:
    """What ffpa_patch's Ulysses SP wrapper hands the attention call in place of a mask: DeepSpeed
    drops masks (a mask for the local shard is wrong for the gathered sequence, and O(S^2) at the
    full length), so the layout travels in the position ids DeepSpeed gathers (``flag_positions``),
    and ``over_positions`` reads it there (``layout``, or the ``problem`` that refuses the call),
    with ``window`` the layer's sliding window."""

    layout: Layout | None = None
    problem: str | None = None
    window: int | None = None

    def __getattr__(self, name):  # stock code taking this for a tensor: say what it is instead of a bare AttributeError
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"ffpa_patch.SequenceParallel has no {name!r}: this Gemma 4 model was registered for DeepSpeed Ulysses "
            "sequence parallelism through ffpa_patch, and an attention function that is not ffpa_patch's received "
            "its stand-in mask (was ffpa_patch reverted? apply() it again, or register again)")


def flag_positions(mask, position_ids: torch.Tensor, batch: int) -> torch.Tensor:
    """The local shard's position ids ``[B, s]``, with what the local mask knows and the gathered
    sequence needs: ``PAD`` for padding (a token that does not see itself), ``NOT_CAUSAL`` for every
    token of a row whose mask lets a query see a later key (image blocks) or is not one ffpa_patch
    reads. DeepSpeed all-gathers these, so every rank sees every rank's flags and decides alike."""
    positions = position_ids.expand(batch, -1)
    kind, _ = kind_of(mask)
    if kind in (Mask.NONE, Mask.PLAIN):
        return positions.contiguous()
    if kind != Mask.TENSOR or mask.shape[-1] != mask.shape[-2] or mask.shape[-1] != positions.shape[-1]:
        return torch.full_like(positions, NOT_CAUSAL)
    allowed = hard_allowed(mask)
    if allowed is None:  # a soft bias: nothing ffpa_patch reads
        return torch.full_like(positions, NOT_CAUSAL)
    allowed = allowed[:, 0].expand(batch, -1, -1)
    real = allowed.diagonal(dim1=-2, dim2=-1)
    later = torch.triu(allowed, diagonal=1).flatten(1).any(-1)
    return torch.where(later[:, None], NOT_CAUSAL, torch.where(real, positions, PAD)).contiguous()


def hard_allowed(mask: torch.Tensor) -> torch.Tensor | None:
    """A 4-D mask as bool "may attend", or None for a float mask with any value besides 0 and the
    dtype's min (or -inf): a soft bias (ALiBi, say) must reach SDPA as given."""
    if mask.dtype == torch.bool:
        return mask
    allowed = mask == 0
    return allowed if bool((allowed | (mask <= torch.finfo(mask.dtype).min)).all()) else None


def over_positions(positions, batch: int, seq: int, window: int | None) -> SequenceParallel:
    """The layout of the gathered sequence from its flagged position ids ``[B, S]``: sequences
    restart where the ids do not go up by one (packing, as Transformers reads position_ids when no
    attention mask is given); with padding, each row's real tokens are one sequence (as Transformers
    does when an attention mask is given). Size O(B*S): no S x S mask is built."""
    if not isinstance(positions, torch.Tensor) or positions.shape[-1] != seq:
        return SequenceParallel(problem=NO_POSITIONS, window=window)
    positions = positions.expand(batch, -1)
    if bool((positions == NOT_CAUSAL).any()):
        return SequenceParallel(problem=IMAGES_UNDER_SP, window=window)
    real = positions != PAD
    if bool(real.all()):
        starts = torch.diff(positions, dim=-1, prepend=positions[:, :1] - 2) != 1  # (the first token starts one)
    else:
        starts = real & (real.cumsum(-1) == 1)
    if not bool(real.any()):
        return SequenceParallel(Layout(Shape.OTHER), window=window)
    if bool(real.all()) and bool((starts.sum(-1) == 1).all()):
        return SequenceParallel(Layout(Shape.DENSE), window=window)
    return SequenceParallel(_varlen(Shape.VARLEN, real, starts, starts.cumsum(-1), batch, seq), window=window)


def kind_of(mask) -> tuple[Mask, str | None]:
    """(kind, why a tensor must go to the fallback as given, or None)."""
    if mask is None:
        return Mask.NONE, None
    if isinstance(mask, CausalMask):
        return Mask.PLAIN, None
    if isinstance(mask, SequenceParallel):
        return Mask.SEQUENCE_PARALLEL, mask.problem
    if not isinstance(mask, torch.Tensor):
        return Mask.OPAQUE, f"mask is a {type(mask).__name__}, handed over as given"
    if mask.dim() != 4:
        return Mask.OPAQUE, f"{mask.dim()}-D mask, handed over as given"
    if mask.dtype != torch.bool and not mask.dtype.is_floating_point:
        return Mask.OPAQUE, f"{str(mask.dtype).removeprefix('torch.')} mask, handed over as given"
    if mask.requires_grad:
        return Mask.OPAQUE, "mask requires grad (a learnable bias), handed over as given"
    return Mask.TENSOR, None


# -- one analysis per mask per forward --------------------------------------------------------
_pass = threading.local()  # per forward thread: the last layer index and the forward count
_lock = threading.Lock()
_cache: list[tuple[weakref.ref, tuple, tuple, Layout]] = []  # (owner, fingerprint, pass, layout), newest first


def pass_token(layer_idx: int) -> tuple | None:
    """Which forward a call belongs to (a new one begins whenever a layer index does not
    increase), or None inside a backward: a checkpoint's recompute must see the mask as its
    forward did (selective checkpointing even requires the same ops), so it reuses that analysis."""
    if torch._C._current_graph_task_id() != -1:
        return None
    last, generation = getattr(_pass, "last", None), getattr(_pass, "generation", 0)
    if last is None or layer_idx <= last:
        generation += 1
    _pass.last, _pass.generation = layer_idx, generation
    return (threading.get_ident(), generation)


def _identity(mask: torch.Tensor) -> tuple[weakref.ref, tuple]:
    """What makes two mask tensors the same mask within a pass: their storage (alive, the same
    object), offset, shape, strides and version. Not the tensor object: a compiled graph hands
    each layer's op a fresh view of the one mask buffer."""
    try:
        version = mask._version
    except RuntimeError:  # inference-mode tensors keep no version counter
        version = None
    try:
        storage = weakref.ref(mask.untyped_storage())
        if storage() is not None:  # torch keeps a storage's Python object while the storage lives
            return storage, (mask.storage_offset(), tuple(mask.shape), mask.stride(), version)
    except (RuntimeError, NotImplementedError, TypeError):  # tensors without a plain storage
        pass
    return weakref.ref(mask), (version,)


def analyse(mask: torch.Tensor, batch: int, window: int | None, layer_idx: int) -> Layout:
    """``read``, shared by the layers of one forward (and the recomputes of its backward)."""
    owner, fingerprint = _identity(mask)
    fingerprint = (fingerprint, window, batch)
    token = pass_token(layer_idx)
    with _lock:
        for ref, seen, when, layout in _cache:
            if ref() is not None and ref() is owner() and seen == fingerprint and token in (when, None):
                return layout
    layout = read(mask, batch, window)
    with _lock:
        _cache.insert(0, (owner, fingerprint, token, layout))
        del _cache[8:]  # a forward has one mask per layer kind; older forwards' entries are dead anyway
    return layout


def read(mask: torch.Tensor, batch: int, window: int | None) -> Layout:
    """The structure of one mask (uncached)."""
    other = Layout(Shape.OTHER, allowed=mask if mask.dtype == torch.bool else None)
    if mask.shape[-1] != mask.shape[-2]:
        return other
    allowed = hard_allowed(mask)
    if allowed is None:
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
    ends = None  # bidirectional blocks: the last key each query sees (its block's last token)
    whole = False  # blocks see their own past beyond the window too (Transformers' generic vision masks)
    if _differs(allowed, real, segment, window, pos):
        ends = _last_key(allowed, pos)
        # a block is a run: a token that sees past itself shares its last key with the next token
        after = torch.nn.functional.pad(ends[:, 1:], (0, 1), value=-1)
        if bool((real & (ends > pos) & (after != ends)).any()):
            return other
        if _differs(allowed, real, segment, window, pos, ends):
            whole = window is not None and not _differs(allowed, real, segment, window, pos, ends, whole=True)
            if not whole:
                return other
    real, starts, segment = (t.expand(batch, seq) for t in (real, starts, segment))
    if not bool(real.any()):  # nothing but padding (or batch 0): stock's own handling, via SDPA
        return other
    blocks = None if ends is None else _blocks(ends.expand(batch, seq), real, pos)
    if blocks is not None and blocks.shape[0] == 0:
        return other  # "blocks" with no later key at all: cannot be (the first check would have passed)
    unpadded = bool((real.all(-1) & (starts.sum(-1) == 1)).all())
    if blocks is not None:
        kw = dict(allowed=mask if mask.dtype == torch.bool else None, blocks=blocks, max_block=int(blocks[:, 1].max()),
                  block_past=whole)
        if unpadded:
            return Layout(Shape.BLOCKS, **kw)
        return _varlen(Shape.BLOCKS, real, starts, segment, batch, seq, **kw)
    if unpadded:
        return Layout(Shape.DENSE)
    return _varlen(Shape.VARLEN, real, starts, segment, batch, seq)


def _differs(allowed, real, segment, window, pos, ends=None, whole: bool = False) -> bool:
    """Whether the mask differs, on some real query row, from "causal in the query's segment, key
    not padding, within the window" (with ``ends``: OR "a later key of the query's block", a block
    being the run of tokens whose last visible key is the same; ``whole``: OR "any key of the
    query's block", the window then bounding only the text)."""
    bad = torch.zeros((), dtype=torch.bool, device=allowed.device)
    for r0 in range(0, allowed.shape[-1], _ROW_CHUNK):
        rows = pos[r0 : r0 + _ROW_CHUNK, None]
        same_segment = segment[:, r0 : r0 + _ROW_CHUNK, None] == segment[:, None, :]
        expected = same_segment & real[:, None, :] & (pos <= rows)
        if window is not None:
            expected &= (rows - pos) < window
        if ends is not None:
            in_block = same_segment & real[:, None, :] & (ends[:, r0 : r0 + _ROW_CHUNK, None] == ends[:, None, :])
            expected |= in_block if whole else in_block & (pos > rows)
        wrong = (allowed[:, r0 : r0 + _ROW_CHUNK] != expected) & real[:, r0 : r0 + _ROW_CHUNK, None]
        bad |= wrong.any()
    return bool(bad.item())


def _last_key(allowed, pos):
    """The last key each query row may see (-1 for a row that sees none)."""
    return torch.cat([torch.where(allowed[:, r0 : r0 + _ROW_CHUNK], pos, -1).amax(-1)
                      for r0 in range(0, allowed.shape[-1], _ROW_CHUNK)], dim=-1)


def _blocks(ends, real, pos):
    """[n, 2] (flat start in B*S, length) of the runs of real tokens that see keys after themselves:
    a block starts where a token sees past itself and its neighbour before does not share its end."""
    batch, seq = ends.shape
    later = real & (ends > pos)
    first = later & (torch.nn.functional.pad(ends[:, :-1], (1, 0), value=-1) != ends)
    row, start = first.nonzero(as_tuple=True)
    length = ends[row, start] - start + 1
    return torch.stack([row * seq + start, length], dim=1)


def _varlen(kind, real, starts, segment, batch: int, seq: int, **extra) -> Layout:
    per_row = starts.sum(-1)
    row_offset = torch.nn.functional.pad(per_row.cumsum(0)[:-1], (1, 0))
    global_segment = (segment + row_offset[:, None]).flatten()
    indices = real.flatten().nonzero().squeeze(1)
    lengths = torch.bincount(global_segment[indices] - 1, minlength=int(per_row.sum()))
    cu_seqlens = torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
    segments = torch.where(real, global_segment.view(batch, seq), 0).to(torch.int32)
    return Layout(kind, indices, cu_seqlens, int(lengths.max()), segments, **extra)


# -- masks spelled out for fallbacks ------------------------------------------------------------
def causal(q_len: int, kv_len: int, device, window: int | None = None) -> torch.Tensor:
    """Bottom-right aligned causal "may attend" mask ``[1, 1, q_len, kv_len]``; a window W lets
    a query see itself and W-1 keys before it."""
    i = torch.arange(q_len, device=device)[:, None] + (kv_len - q_len)
    j = torch.arange(kv_len, device=device)[None, :]
    allowed = j <= i
    if window is not None:
        allowed &= i - j < window
    return allowed[None, None]


def for_fallback(mask, q_len: int, kv_len: int, device):
    """The mask a fallback hands stock code: a ``CausalMask`` as None where SDPA's own
    ``is_causal`` means exactly the same (what stock's mask function returns there), else
    spelled out, as is a ``SequenceParallel`` layout (O(S^2): fallbacks only); any other mask as given."""
    if isinstance(mask, SequenceParallel):
        return spelled(mask.layout, q_len, device, mask.window)
    if not isinstance(mask, CausalMask):
        return mask
    if (mask.window is None or mask.window >= kv_len) and q_len in (kv_len, 1):
        return None
    return causal(q_len, kv_len, device, mask.window)


def to_additive(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """A bool "may attend" mask as the additive float mask eager attention adds."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)


def spelled(layout: Layout, seq: int, device, window: int | None) -> torch.Tensor | None:
    """A dense or varlen layout as the bool mask ``[B, 1, S, S]`` stock SDPA takes (None: plain causal,
    SDPA's ``is_causal``). A padding query row sees the real keys before it (or itself), as in
    Transformers' masks, so no row is empty."""
    if layout.segments is None:  # dense (or no real token at all: stock's own causal)
        return None if window is None or window >= seq else causal(seq, seq, device, window)
    allowed = causal(seq, seq, device, window)[0]  # [1, S, S]
    segments = layout.segments
    same = (segments[:, :, None] == segments[:, None, :]) & (segments[:, None, :] > 0)
    padding_row = (segments == 0)[:, :, None] & (segments[:, None, :] > 0)
    eye = torch.eye(seq, dtype=torch.bool, device=device)
    return ((same | padding_row) & allowed | eye & (segments == 0)[:, :, None])[:, None]
