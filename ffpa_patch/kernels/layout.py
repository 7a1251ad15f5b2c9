"""What a 4-D mask turned out to be, in the terms the kernels take it (routing/masks.py reads it).

Kernels take a ``Layout`` and nothing of routing's: ``dense`` and ``varlen`` entry points
read ``indices`` / ``cu_seqlens`` / ``max_seqlen`` (BLOCKS: ``cu_seqlens`` None means one
unpadded sequence per row, and ``blocks`` lists the bidirectional blocks); a ``block`` entry (FlexAttention) builds
its BlockMask from ``segments`` or ``allowed`` and keeps it in ``built``, so the layers of one
forward share it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..names import Shape


@dataclass
class Layout:
    kind: Shape
    indices: Any = None  # flat positions (in B*S) of real tokens (varlen)
    cu_seqlens: Any = None  # int32, segment bounds in the packed order (varlen)
    max_seqlen: int = 0
    segments: Any = None  # [B, S] int32 segment id per position, 0 = padding (varlen)
    allowed: Any = None  # the bool mask itself, for OTHER and BLOCKS (a ``block`` kernel can take it)
    blocks: Any = None  # BLOCKS: [n, 2] int64 (flat start in B*S, length) of each bidirectional block
    max_block: int = 0
    block_past: bool = False  # BLOCKS: a block's queries also see its keys before the window (not only later ones)
    built: dict = field(default_factory=dict)  # what a block kernel built from this layout, by its own key

