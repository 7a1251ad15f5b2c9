"""Which route each Gemma 4 layer type would take, from a config read locally.

Attention modules are built on the meta device by the installed Transformers (``hf``), so
head dims and flags are exactly what that version computes; routes come from the same
``decide`` and kernel table the attention path uses, for a bf16 training prefill on this
machine's device.
"""
from __future__ import annotations

from collections import Counter


def layer_plan(text_config, backend: str) -> list[dict]:
    import torch

    from . import hf
    from .kernels import active
    from .names import Layer, Mask
    from .routing.decide import CallFacts, decide

    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    kernels = active()
    kinds: Counter = Counter()
    for attn in hf.attention_layers(text_config):
        kind = Layer.SLIDING if attn.is_sliding else Layer.FULL
        offers = kernels.offers(kind, backend, device, torch.bfloat16, attn.head_dim)
        route = decide(CallFacts(backend=backend, is_sliding=attn.is_sliding, is_causal=bool(attn.is_causal), head_dim=attn.head_dim,
                                 q_len=4096, kv_len=4096, mask=Mask.PLAIN, dropout=0.0, scaling=attn.scaling, softcap=None,
                                 offers=offers))
        kinds[(str(kind), attn.head_dim, str(route.kernel), route.reason)] += 1
    return [dict(layer=k[0], head_dim=k[1], kernel=k[2], reason=k[3], layers=n) for k, n in sorted(kinds.items())]
