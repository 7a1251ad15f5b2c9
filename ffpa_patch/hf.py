"""Every Transformers internal ffpa_patch touches, in one place, imported only when used.

Routing, the patches, the CLI and the demo reach Transformers through this module alone
(tests/test_structure.py checks that nothing else imports it or reads its registries), so a
layout change in a new Transformers is one edit here. The Gemma 4 layouts are data:
``FAMILIES`` lists each modeling module with its text-attention class and text config type;
a new one (say another 12B-style layout) is one more ``Family`` here. ``check()`` asks every
function below, and ``ffpa-patch status --check`` reports what it finds before a forward runs.
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
from typing import Any, Callable, NamedTuple

MODELING_UTILS = "transformers.modeling_utils"
#: the keyword arguments of Transformers' mask functions the "ffpa" mask function reads
MASK_KWARGS = ("q_length", "kv_length", "q_offset", "kv_offset", "attention_mask", "local_size",
               "allow_is_causal_skip", "allow_is_bidirectional_skip", "config")
#: what routing reads off a text-attention layer (``status --check`` looks for each in the class)
LAYER_ATTRIBUTES = ("is_sliding", "layer_idx", "config", "head_dim", "is_causal")


class Family(NamedTuple):
    """One Gemma 4 layout in Transformers: a modeling module with its own text attention."""

    name: str  # the model_type of the whole model
    label: str  # how ffpa_patch names it to users
    models: str  # the released checkpoints that load as this family
    module: str  # the modeling module (post-import hooks target it)
    attention: str  # its text-attention class
    text_config: str  # its text config's model_type (what the "ffpa" mask function is handed)
    causal_lm: str  # its text-only LM class
    text_config_class: str  # its text config class

    @property
    def dropin(self) -> str:
        """The name of the patch that routes this family's models left on "sdpa"."""
        return f"{self.name}_dropin"


GEMMA4 = Family("gemma4", "Gemma4", "31B, 26B-A4B, E2B, E4B", "transformers.models.gemma4.modeling_gemma4",
                "Gemma4TextAttention", "gemma4_text", "Gemma4ForCausalLM", "Gemma4TextConfig")
GEMMA4_UNIFIED = Family("gemma4_unified", "Gemma4 12B (gemma4_unified)", "12B", "transformers.models.gemma4_unified.modeling_gemma4_unified",
                        "Gemma4UnifiedTextAttention", "gemma4_unified_text", "Gemma4UnifiedForCausalLM",
                        "Gemma4UnifiedTextConfig")
FAMILIES = (GEMMA4, GEMMA4_UNIFIED)
TEXT_CONFIG_TYPES = tuple(f.text_config for f in FAMILIES)
#: the whole Gemma 4 line, as status and the README name it
MODELS = ", ".join(f.models for f in FAMILIES)


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
    """Whatever the class-level "sdpa" entry holds now: Transformers' own, the repeat-KV fix, the
    drop-in, or a user's wrapper (fallbacks run what is beneath the drop-in:
    ``patches/gemma4_dropin.sdpa_beneath``)."""
    return attention_registry()["sdpa"]


def sdpa_mask() -> Callable:
    # the submodule, not ``from transformers import ...``: Dynamo breaks the graph on lazy-module imports
    from transformers.masking_utils import sdpa_mask as stock

    return stock


def sdpa_attention_module():
    from transformers.integrations import sdpa_attention

    return sdpa_attention


def stock_sdpa() -> Callable:
    """Transformers' own SDPA attention function, as its registry holds it at import."""
    from transformers import modeling_utils

    return modeling_utils.sdpa_attention_forward


def attention_table():
    """The shared ``ALL_ATTENTION_FUNCTIONS`` instance every Gemma 4 modeling module reads, and
    the one DeepSpeed's Ulysses SP writes its wrapper into (an instance-local entry)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS


def local_entry(name: str) -> Callable | None:
    """The shared table's instance-local entry for ``name`` (read before the class-level one), or None."""
    return attention_table()._local_mapping.get(name)


def local_mapping() -> dict:
    """The shared table's instance-local mapping (what ``ALL_ATTENTION_FUNCTIONS[name] = fn`` writes)."""
    return attention_table()._local_mapping


def attention_table_entry(name: str) -> Callable | None:
    """What a model on ``name`` calls now: the instance-local entry, else the class-level one."""
    local = local_entry(name)
    return local if local is not None else attention_registry().get(name)


# -- Gemma 4 ------------------------------------------------------------------------------
def family_of(module: Any) -> Family | None:
    """The Gemma 4 family whose text attention ``module`` is (or subclasses), else None. Read from
    the type's MRO: no import, and a constant to Dynamo."""
    cls = type(module)
    for family in FAMILIES:  # the class itself first: plain loops, this runs on every attention call
        if cls.__name__ == family.attention and cls.__module__ == family.module:
            return family
    for cls in cls.__mro__[1:]:
        for family in FAMILIES:
            if cls.__name__ == family.attention and cls.__module__ == family.module:
                return family
    return None


def is_text_attention(module: Any) -> bool:
    return family_of(module) is not None


def is_text_config(config: Any) -> bool:
    return getattr(config, "model_type", None) in TEXT_CONFIG_TYPES


def family_module(family: Family):
    return importlib.import_module(family.module)


def available_families() -> tuple[Family, ...]:
    """The families this Transformers has (the 12B's module exists from 5.12)."""
    found = []
    for family in FAMILIES:
        try:
            if importlib.util.find_spec(family.module) is not None:
                found.append(family)
        except ModuleNotFoundError:  # its parent package is missing
            pass
    return tuple(found)


def modules_to_import() -> tuple[str, ...]:
    """What ``status --check`` imports so the patches are really applied, not waiting."""
    return (MODELING_UTILS, *(f.module for f in available_families()))


def eager_attention(module: Any) -> Callable:
    """The eager attention of the module's own modeling file (Transformers' eager "fallback")."""
    return family_module(family_of(module) or GEMMA4).eager_attention_forward


class LayerFacts(NamedTuple):
    """What routing reads off a Gemma 4 text attention layer on every call (module attributes only:
    a config attribute costs microseconds on Transformers 5.15+, so those are read where needed)."""

    layer_idx: int
    is_sliding: bool
    is_causal: bool


def layer(module: Any) -> LayerFacts:
    return LayerFacts(module.layer_idx, bool(module.is_sliding), bool(getattr(module, "is_causal", True)))


def configured_window(module: Any) -> int | None:
    """The sliding window Transformers builds this forward's mask with: the config's, read at
    forward time (``module.sliding_window`` is the copy made when the model was built)."""
    return getattr(module.config, "sliding_window", None) if module.is_sliding else None


def is_last_layer(module: Any) -> bool:
    """The model's last decoder layer (the first-forward line is printed there)."""
    return module.layer_idx == getattr(module.config, "num_hidden_layers", 0) - 1


def config_of(module: Any) -> Any:
    return getattr(module, "config", None)


def attention_layers(text_config) -> list:
    """Every text-attention layer of a model with this text config, built on the meta device by
    the installed Transformers (``status --config``): head dims and flags exactly as this version
    computes them, whatever the config spells (``global_head_dim`` or ``per_layer_config``)."""
    import torch

    family = next((f for f in FAMILIES if f.text_config == getattr(text_config, "model_type", None)), None)
    if family is None:
        raise ValueError(f"not a Gemma 4 text config (model_type {getattr(text_config, 'model_type', None)!r}; "
                         f"known: {', '.join(TEXT_CONFIG_TYPES)})")
    cls = getattr(family_module(family), family.attention)
    with torch.device("meta"):
        return [cls(text_config, idx) for idx in range(text_config.num_hidden_layers)]


class HeadShape(NamedTuple):
    """One attention shape of a model's text layers, as this Transformers builds them."""

    head_dim: int
    heads: int
    kv_heads: int


def head_shapes(text_config) -> dict[HeadShape, list[str]]:
    """Each distinct (head_dim, query heads, KV heads) of the text layers, with the layer types that
    have it, read off the layers this Transformers builds (never ``config.head_dim``, which is the
    sliding layers' and raises from 5.15)."""
    shapes: dict[HeadShape, list[str]] = {}
    for layer in attention_layers(text_config):
        heads = layer.q_proj.out_features // layer.head_dim
        shape = HeadShape(layer.head_dim, heads, heads // layer.num_key_value_groups)
        kinds = shapes.setdefault(shape, [])
        kind = "sliding" if layer.is_sliding else "full"
        if kind not in kinds:
            kinds.append(kind)
    return shapes


def model_config(model_or_path: Any):
    """A loaded model's config, or the config of a Hub name / local path (as DeepSpeed reads it)."""
    if hasattr(model_or_path, "config"):
        return model_or_path.config
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model_or_path)


def load_text_config(source: str):
    """A model's text config from a local folder or config.json (never downloads)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(source, local_files_only=True)
    return getattr(config, "text_config", None) or config


def causal_lm(family: Family, **config) -> Any:
    """A random-weight text LM of ``family`` (the demo's model)."""
    return getattr(family_module(family), family.causal_lm)(_config_class(family)(**config))


def byte_level_tokenizer(config) -> Any:
    """A tokenizer for a random-weight model (the demo's saved folder): the 256 bytes after the config's
    special tokens, no merges. Any text round-trips, so what takes a tokenizer (TRL's SFTTrainer) runs
    on the folder with no download; the model's vocabulary must hold them (the demo's has 4,096)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    eos = config.eos_token_id[0] if isinstance(config.eos_token_id, (list, tuple)) else config.eos_token_id
    special = {config.pad_token_id: "<pad>", eos: "<eos>", config.bos_token_id: "<bos>"}
    vocab = {name: i for i, name in special.items()}
    first = max(special) + 1
    vocab.update({byte: first + i for i, byte in enumerate(pre_tokenizers.ByteLevel.alphabet())})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>",
                                   model_max_length=config.max_position_embeddings)


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
    """What ffpa_patch relies on in the installed Transformers and cannot find: [] when all is there.
    A family whose module this version lacks is not a problem (the 12B arrived in 5.12)."""
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
    need("modeling_utils.sdpa_attention_forward (the registry's own 'sdpa')", lambda: callable(stock_sdpa()))
    need("modeling_utils.ALL_ATTENTION_FUNCTIONS with a _local_mapping", lambda: isinstance(local_mapping(), dict))
    families = available_families()
    need(f"{GEMMA4.module}", lambda: GEMMA4 in families)
    for family in families:
        need(f"{family.module}.{family.attention}", lambda f=family: isinstance(getattr(family_module(f), f.attention), type))
        need(f"{family.module}.eager_attention_forward", lambda f=family: callable(family_module(f).eager_attention_forward))
        need(f"{family.module}.ALL_ATTENTION_FUNCTIONS is the shared modeling_utils table",
             lambda f=family: family_module(f).ALL_ATTENTION_FUNCTIONS is attention_table())
        need(f"{family.attention} attributes {', '.join(LAYER_ATTRIBUTES)}",
             lambda f=family: set(LAYER_ATTRIBUTES) <= _assigned(getattr(family_module(f), f.attention)))
        need(f"{family.text_config_class}.model_type == {family.text_config!r}",
             lambda f=family: _config_class(f).model_type == f.text_config)
    return problems


def _config_class(family: Family) -> type:
    return getattr(importlib.import_module(family.module.replace("modeling_", "configuration_")), family.text_config_class)


def _assigned(cls: type) -> set[str]:
    """The ``self.x = ...`` names in the class's source (no model is built; the class, not its
    ``__init__``, since Transformers wraps some ``__init__``s in decorators)."""
    import re

    return set(re.findall(r"self\.(\w+)\s*=", inspect.getsource(cls)))
