"""Register the "ffpa" attention backend and its mask function with Transformers.

Both registries are written through their class-level mapping (what
``register`` does): an attention name missing from the mask registry would get
``mask=None`` on every layer, silently dropping padding and the sliding window.
The mask function is Transformers' own ``sdpa_mask``, except that
- it never skips the mask when q_len != kv_len, so a missing mask always means
  aligned (bottom-right) causal attention, which is what the kernels compute;
- it skips the sliding layers' mask when it would be plain sliding-window causal
  (no padding, packing or image blocks): the kernels take the window from the
  module, and ``route_attention`` builds the mask for a fallback that needs it.
  At 8k that S x S mask is 64 MiB, built and then read back every forward.
"""
from __future__ import annotations

from typing import Any, Callable

from ..registry import Patch
from ..wrapping import Undo, set_mapping_entry

BACKEND = "ffpa"


def ffpa_attention_forward(module, query, key, value, attention_mask, **kwargs):
    from ..routing.attention import route_attention

    return route_attention(module, query, key, value, attention_mask, backend="ffpa", **kwargs)


def ffpa_mask(*args, **kwargs):
    # the submodule, not ``from transformers import ...``: Dynamo breaks the graph on lazy-module imports
    from transformers.masking_utils import sdpa_mask

    if not args:
        if kwargs.get("q_length") != kwargs.get("kv_length"):
            kwargs["allow_is_causal_skip"] = False
        elif plain_sliding_window(kwargs):
            return None
    return sdpa_mask(*args, **kwargs)


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
    dependencies = ("transformers", "torch", "ffpa-attn", "flash-attn-4")
    module = "transformers.modeling_utils"
    summary = 'attn_implementation="ffpa": FFPA full layers, flash-attn-4 sliding layers, exact fallbacks'

    def is_needed(self, module: Any) -> tuple[bool, str]:
        from transformers import masking_utils

        for registry in (module.AttentionInterface, masking_utils.AttentionMaskInterface):
            if BACKEND in registry._global_mapping:
                raise RuntimeError(f"{registry.__name__} already has a {BACKEND!r} entry that is not ours")
        return True, 'registers attn_implementation="ffpa"'

    def warnings(self) -> list[str]:
        from . import kernels_cannot_run_here

        return kernels_cannot_run_here() if self.applied else []

    def install(self, module: Any, record: Callable[[Undo], None]) -> None:
        from transformers import masking_utils

        record(set_mapping_entry(module.AttentionInterface._global_mapping, BACKEND, ffpa_attention_forward))
        record(set_mapping_entry(masking_utils.AttentionMaskInterface._global_mapping, BACKEND, ffpa_mask))
