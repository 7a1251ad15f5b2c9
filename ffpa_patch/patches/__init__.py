"""Patch targets, one module each; ``ALL`` lists them in apply order."""
from .attention_backend import FFPABackend
from .gemma4_dropin import Gemma4DropIn
from .nemo_moe_ring import NemoMoERing
from .sdpa_repeat_kv import SdpaRepeatKV

ALL = (SdpaRepeatKV, FFPABackend, Gemma4DropIn, NemoMoERing)
