"""Register the "ffpa" attention backend and its mask function with Transformers.

Both registries are written through their class-level mapping (what ``register`` does): an
attention name missing from the mask registry would get ``mask=None`` on every layer,
silently dropping padding and the sliding window.

For any model that is not Gemma 4 text (``hf.FAMILIES``: the 31B/26B-A4B/E2B/E4B layout and the
12B's ``gemma4_unified``), the mask function is exactly Transformers' own
``sdpa_mask``, and the attention function hands every call to the global "sdpa" entry:
such a model gets what stock "sdpa" gives it. For Gemma4 text it is ``sdpa_mask`` except that
- it never skips the mask when q_len != kv_len, so a skipped mask always means aligned
  (bottom-right) causal attention, which is what the kernels compute;
- where stock would skip the mask (SDPA's ``is_causal``), or the mask would be the config's
  plain sliding window over unpadded rows, it returns a ``CausalMask`` carrying the window
  Transformers asked for, instead of None or an S x S tensor (64 MiB at 8k, 16 GiB at 128k).
  So a None that reaches a Gemma4 layer on "ffpa" always means this function did not run.
"""
from __future__ import annotations

from typing import Any, Callable

from .. import hf, kernels
from ..names import Backend
from ..registry import Patch
from ..wrapping import Undo, set_mapping_entry

BACKEND = Backend.FFPA.value


def ffpa_attention_forward(module, query, key, value, attention_mask, **kwargs):
    from ..routing.attention import route_attention
    from .gemma4_dropin import sdpa_beneath

    return route_attention(module, query, key, value, attention_mask, backend=BACKEND, sdpa=sdpa_beneath(), **kwargs)


def ffpa_mask(*args, **kwargs):
    from ..routing.masks import CausalMask

    stock = hf.sdpa_mask()
    if args or not hf.is_text_config(kwargs.get("config")):
        return stock(*args, **kwargs)
    if kwargs.get("q_length") != kwargs.get("kv_length"):
        kwargs["allow_is_causal_skip"] = False
    elif plain_sliding_window(kwargs):
        return CausalMask(window=kwargs["local_size"])
    mask = stock(**kwargs)
    if mask is None and kwargs.get("allow_is_causal_skip", True) and not kwargs.get("allow_is_bidirectional_skip", False):
        return CausalMask(window=kwargs.get("local_size"))  # stock's "use is_causal" (a window, if any, has no effect)
    return mask


def plain_sliding_window(kw: dict) -> bool:
    """The mask asked for is the config's sliding window over one unpadded sequence per row.

    Transformers clears ``allow_is_causal_skip`` when it adds packing or image
    blocks; a ``local_size`` other than ``config.sliding_window`` is another mask
    (chunked attention); a padding mask counts only if it has a padded position.
    """
    window = kw.get("local_size")
    if window is None or not kw.get("allow_is_causal_skip", True):
        return False
    if window != getattr(kw.get("config"), "sliding_window", None):
        return False
    if any(not isinstance(kw.get(k, 0), int) or kw.get(k, 0) for k in ("q_offset", "kv_offset")):
        return False
    padding, kv_length = kw.get("attention_mask"), kw.get("kv_length")
    if padding is None:
        return True
    import torch

    if torch.compiler.is_compiling() or padding.shape[-1] < kv_length:
        return False  # reading the values would break the graph; a short mask pads with "padding"
    return bool(padding[:, :kv_length].all())


class FFPABackend(Patch):
    name = "ffpa_backend"
    dependencies = ("transformers", "torch", *kernels.packages())
    module = hf.MODELING_UTILS
    summary = 'attn_implementation="ffpa": FFPA full layers, flash-attn-4 sliding layers, exact fallbacks'

    def is_needed(self, module: Any) -> tuple[bool, str]:
        for what, registry in (("AttentionInterface", hf.attention_registry()), ("AttentionMaskInterface", hf.mask_registry())):
            if BACKEND in registry:
                raise RuntimeError(f"{what} already has a {BACKEND!r} entry that is not ours")
        return True, 'registers attn_implementation="ffpa"'

    def warnings(self) -> list[str]:
        from . import kernels_cannot_run_here

        return kernels_cannot_run_here() if self.applied else []

    def install(self, module: Any, record: Callable[[Undo], None]) -> None:
        kernels.on_install()
        record(set_mapping_entry(hf.attention_registry(), BACKEND, ffpa_attention_forward))
        record(set_mapping_entry(hf.mask_registry(), BACKEND, ffpa_mask))
