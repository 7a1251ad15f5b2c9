"""Which route each Gemma4 layer type would take, from a config read locally.

Attention modules are built on the meta device with the installed Transformers,
so head dims and flags are exactly what that version computes; routes come from
the same ``decide`` the attention path uses, for a bf16 training prefill on this
machine's device.
"""
from __future__ import annotations

from collections import Counter


def load_text_config(source: str):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(source, local_files_only=True)
    return getattr(config, "text_config", None) or config


def layer_plan(text_config, backend: str) -> list[dict]:
    import torch
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextAttention

    from .kernels import active
    from .routing.decide import PLAIN, CallFacts, decide

    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    kernels = active()
    kinds: Counter = Counter()
    for idx in range(text_config.num_hidden_layers):
        with torch.device("meta"):
            attn = Gemma4TextAttention(text_config, idx)
        kernel_problem, flex_problem = kernels.problems(attn.is_sliding, device, torch.bfloat16, attn.head_dim)
        route = decide(CallFacts(backend=backend, is_sliding=attn.is_sliding, is_causal=bool(attn.is_causal), head_dim=attn.head_dim,
                                 q_len=4096, kv_len=4096, mask=PLAIN, dropout=0.0, scaling=attn.scaling, softcap=None,
                                 kernel_problem=kernel_problem, flex_problem=flex_problem))
        kinds[("sliding" if attn.is_sliding else "full", attn.head_dim, route.kernel, route.reason)] += 1
    return [dict(layer=k[0], head_dim=k[1], kernel=k[2], reason=k[3], layers=n) for k, n in sorted(kinds.items())]
