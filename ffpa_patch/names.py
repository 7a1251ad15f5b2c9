"""The names routing, the kernel table and stats share: one spelling each.

``str`` enums, so a stats row, a reason or a test compares them with plain strings, and
they print as their values (``f"{Layer.FULL}"`` is ``full``).
"""
from __future__ import annotations

from enum import Enum


class Name(str, Enum):
    __str__ = str.__str__
    __format__ = str.__format__


class Layer(Name):
    """What an attention call is, as stats() counts it; a kernel serves FULL or SLIDING."""

    FULL = "full"  # a Gemma 4 full-attention layer (head_dim 512 on every released model)
    SLIDING = "sliding"  # a Gemma 4 sliding-window layer (head_dim 256)
    OTHER = "other"  # not Gemma 4 text attention (another model on "ffpa", a vision tower)


class Backend(Name):
    """How the call reached ffpa_patch."""

    FFPA = "ffpa"  # attn_implementation="ffpa"
    SDPA = "sdpa"  # the drop-in: a Gemma 4 model left on "sdpa"


class Fallback(Name):
    """Routes that run no table kernel."""

    SDPA = "sdpa"  # the global "sdpa" entry, with the mask stock would give it
    EAGER = "eager"  # Transformers' eager attention (an attention softcap)
    REFUSE = "refuse"  # raise: no exact answer exists (FFPAFallbackError)


class Mask(Name):
    """What arrives as the attention mask (routing/masks.py ``kind_of`` tells them apart)."""

    NONE = "none"
    PLAIN = "plain causal"  # the "ffpa" mask function's CausalMask
    TENSOR = "tensor"  # a 4-D bool/float tensor, read by ``masks.analyse``
    SEQUENCE_PARALLEL = "sequence parallel"  # Ulysses SP: the layout is in the gathered position_ids
    OPAQUE = "opaque"  # anything else: handed to the fallback as given


class Shape(Name):
    """The structure a 4-D mask turned out to have (kernels/layout.py ``Layout.kind``)."""

    DENSE = "dense"  # causal (+ window), one unpadded sequence per row
    VARLEN = "varlen"  # causal (+ window) per segment: padding and/or packing
    BLOCKS = "blocks"  # that, plus bidirectional blocks (Gemma 4's image/audio tokens): kernels/blocks.py
    OTHER = "other"  # anything else: a kernel with a ``block`` entry, or the fallback


class InGraph(Name):
    """How a fused route runs while Dynamo traces (routing/decide.py ``in_graph``)."""

    DIRECT = "direct"
    OP = "op"
    EAGER_REGION = "eager region"
