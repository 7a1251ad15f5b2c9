"""A second full-layer kernel, written as a contributor would add one: this module and its catalog
row (tests/test_kernel_table.py), nothing else. torch's SDPA with an explicit bottom-right causal mask:
correct, and no faster than stock, so its row says it does not count as fused."""
import torch
import torch.nn.functional as F


def import_error():
    return None


def dense(q, k, v, scale, window=None, deterministic=False):
    """``[B, S, H, D]`` in and out, causal aligned bottom-right, as the contract asks."""
    n_q, n_k = q.shape[1], k.shape[1]
    allowed = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril(n_k - n_q)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=allowed,
                                         scale=scale, enable_gqa=q.shape[2] != k.shape[2])
    return out.transpose(1, 2)


def varlen(q, k, v, cu_seqlens, max_seqlen, scale, window=None, deterministic=False):
    bounds = cu_seqlens.tolist()
    return torch.cat([dense(q[None, a:b], k[None, a:b], v[None, a:b], scale)[0] for a, b in zip(bounds, bounds[1:])])
