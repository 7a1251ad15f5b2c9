"""Every Transformers internal ffpa_patch touches, in one place, imported only when used.

Routing and the patches reach Transformers through these functions alone, so a layout
change in a new Transformers is one edit here; ``check()`` asks each of them, and
``ffpa-patch status --check`` reports what it finds before any forward runs.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, NamedTuple

GEMMA4 = "transformers.models.gemma4.modeling_gemma4"
TEXT_ATTENTION = "Gemma4TextAttention"
TEXT_CONFIG_TYPE = "gemma4_text"  # Gemma4TextConfig.model_type
#: the keyword arguments of Transformers' mask functions the "ffpa" mask function reads
MASK_KWARGS = ("q_length", "kv_length", "q_offset", "kv_offset", "attention_mask", "local_size",
               "allow_is_causal_skip", "config")


# -- registries ---------------------------------------------------------------------------
def attention_interface():
    from transformers.modeling_utils import AttentionInterface

    return AttentionInterface


def mask_interface():
    from transformers.masking_utils import AttentionMaskInterface

    return AttentionMaskInterface


def attention_registry() -> dict:
    """The class-level mapping ``AttentionInterface.register`` writes (every model reads it)."""
    return attention_interface()._global_mapping


def mask_registry() -> dict:
    return mask_interface()._global_mapping


def global_sdpa() -> Callable:
    """Whatever the global "sdpa" entry holds now: Transformers' own, the repeat-KV fix, or
    a user's wrapper. Every fallback calls this."""
    return attention_registry()["sdpa"]


def sdpa_mask() -> Callable:
    # the submodule, not ``from transformers import ...``: Dynamo breaks the graph on lazy-module imports
    from transformers.masking_utils import sdpa_mask as stock

    return stock


def sdpa_attention_module():
    from transformers.integrations import sdpa_attention

    return sdpa_attention


# -- Gemma4 -------------------------------------------------------------------------------
def gemma4_module():
    import importlib

    return importlib.import_module(GEMMA4)


def eager_attention() -> Callable:
    return gemma4_module().eager_attention_forward


def is_text_attention(module: Any) -> bool:
    """A Gemma4 text attention layer (or a subclass). Read from the type's MRO: no import, and a
    constant to Dynamo."""
    for cls in type(module).__mro__:  # a plain loop: this runs on every attention call
        if cls.__name__ == TEXT_ATTENTION and cls.__module__ == GEMMA4:
            return True
    return False


def is_text_config(config: Any) -> bool:
    return getattr(config, "model_type", None) == TEXT_CONFIG_TYPE


class Layer(NamedTuple):
    """What routing reads off a Gemma4 text attention layer (a tuple: this runs on every call)."""

    layer_idx: int
    is_sliding: bool
    is_causal: bool


def layer(module: Any) -> Layer:
    return Layer(module.layer_idx, bool(module.is_sliding), bool(getattr(module, "is_causal", True)))


def configured_window(module: Any) -> int | None:
    """The sliding window Transformers builds this forward's mask with: the config's, read at
    forward time (``module.sliding_window`` is the copy made when the model was built)."""
    return getattr(module.config, "sliding_window", None) if module.is_sliding else None


class StandIn:
    """What the global "sdpa" entry sees of a layer when the compiled graph's op falls back at
    run time (the op cannot carry the module): the attributes Transformers' SDPA path and the
    repeat-KV fix read."""

    def __init__(self, heads: int, kv_heads: int, layer_idx: int, window: int | None):
        self.is_causal = True
        self.training = False
        self.num_key_value_groups = heads // kv_heads
        self.layer_idx = layer_idx
        self.is_sliding = window is not None
        self.sliding_window = window


# -- status --check -----------------------------------------------------------------------
def check() -> list[str]:
    """What ffpa_patch relies on in the installed Transformers and cannot find: [] when all is there."""
    problems: list[str] = []

    def need(what: str, probe: Callable[[], Any]) -> None:
        try:
            if probe() is False:
                problems.append(f"Transformers: {what} not as expected")
        except Exception as exc:
            problems.append(f"Transformers: {what}: {type(exc).__name__}: {exc}")

    need("AttentionInterface._global_mapping with 'sdpa'", lambda: isinstance(attention_registry(), dict) and "sdpa" in attention_registry())
    need("AttentionMaskInterface._global_mapping with 'sdpa'", lambda: isinstance(mask_registry(), dict) and "sdpa" in mask_registry())
    need("masking_utils.sdpa_mask keywords " + ", ".join(MASK_KWARGS[:-1]),
         lambda: set(MASK_KWARGS[:-1]) <= set(inspect.signature(sdpa_mask()).parameters))
    need("integrations.sdpa_attention.sdpa_attention_forward", lambda: callable(sdpa_attention_module().sdpa_attention_forward))
    need(f"{GEMMA4}.{TEXT_ATTENTION}", lambda: isinstance(getattr(gemma4_module(), TEXT_ATTENTION), type))
    need(f"{GEMMA4}.eager_attention_forward", lambda: callable(eager_attention()))
    need(f"{GEMMA4}.ALL_ATTENTION_FUNCTIONS with a _local_mapping",
         lambda: isinstance(getattr(gemma4_module().ALL_ATTENTION_FUNCTIONS, "_local_mapping", None), dict))
    need(f"{TEXT_ATTENTION} attributes is_sliding, layer_idx, config, head_dim",
         lambda: {"is_sliding", "layer_idx", "config", "head_dim"} <= _assigned(getattr(gemma4_module(), TEXT_ATTENTION)))
    return problems


def _assigned(cls: type) -> set[str]:
    """The ``self.x = ...`` names in the class's source (no model is built; the class, not its
    ``__init__``, since Transformers wraps some ``__init__``s in decorators)."""
    import re

    return set(re.findall(r"self\.(\w+)\s*=", inspect.getsource(cls)))
