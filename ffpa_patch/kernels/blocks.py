"""Causal (+ window) attention with bidirectional blocks, on any kernel that returns its log-sum-exp.

Gemma 4's image (and audio) tokens attend to each other both ways inside their block; the rest
of the mask is the layer's causal mask. On sliding layers Gemma 4's own vision masks AND the
window with it (the window bounds the block's past too); Transformers' generic ones (the 12B's
training forward) OR the block in whole (``Layout.block_past``). So each query's keys are two
disjoint sets:
  A. the causal (+ window) keys: the kernel's own dense or varlen call, as for text;
  B. the rest of its block: the keys after the query (and, with ``block_past``, those before
     the window): few (a block is ~280 tokens), computed here in fp32 torch over the blocks alone.
The two softmaxes merge by their log-sum-exps, as ring attention merges chunks:
``L = logaddexp(L_A, L_B)``, ``O = O_A exp(L_A - L) + O_B exp(L_B - L)``. The backward hands the
kernel's own backward the merged ``O`` and ``L``: with them its ``P = exp(S - L)`` and
``D = rowsum(dO * O)`` are the union's, so A's gradients are exact; B's are computed here the
same way. Nothing is built per batch and nothing compiles: block positions are plain index
tensors, and image positions can move every step.

The kernel provides ``dense_lse`` / ``varlen_lse`` (forward without autograd, returning the
natural-log LSE: ``[B, H, S]`` dense, ``[H, T]`` varlen) and ``dense_bwd`` / ``varlen_bwd``
(dq, dk, dv from dout and a given out/lse).
"""
from __future__ import annotations

import torch


def _block_rows(layout, device):
    """[n, L] flat positions (in B*S) of each block's tokens, padded with 0, and the [n, L] mask of real ones."""
    starts, lengths = layout.blocks[:, 0], layout.blocks[:, 1]
    offsets = torch.arange(layout.max_block, device=device)
    valid = offsets[None, :] < lengths[:, None]
    rows = torch.where(valid, starts[:, None] + offsets[None, :], 0)
    return rows, valid


def _in_block_part(q, k, rows, valid, scale: float, beyond: int | None = None):
    """The keys of each query's block that the kernel's causal (+ window) call does not see: the
    later ones, and with ``beyond`` (a window the block's own past is not bound by) those before
    the window. Scores [n, Hkv, g, L, L] in fp32 and their mask."""
    n, length = rows.shape
    hq, hk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    g = hq // hk
    qb = q.index_select(0, rows.flatten()).view(n, length, hk, g, d).float()
    kb = k.index_select(0, rows.flatten()).view(n, length, hk, d).float()
    scores = torch.einsum("nikgd,njkd->nkgij", qb, kb) * scale
    i = torch.arange(length, device=q.device)
    extra = i[None, :] > i[:, None]  # key after query
    if beyond is not None:
        extra = extra | (i[:, None] - i[None, :] >= beyond)  # key before the window
    later = extra[None] & valid[:, None, :] & valid[:, :, None]  # ... between two of the block's tokens (not padding slots)
    return scores, later[:, None, None], qb, kb


class BlockUnion(torch.autograd.Function):
    """``[B, S, H, D]`` q/k/v -> ``[B, S, H, D]``: the union of the kernel's causal (+ window) call
    and the in-block keys after each query (``layout.blocks``)."""

    @staticmethod
    def forward(ctx, q, k, v, kernel, layout, scale: float, window, deterministic: bool):
        batch, seq, hq, d = q.shape
        flat = (batch * seq,)
        qf, kf, vf = (t.reshape(*flat, *t.shape[2:]) for t in (q, k, v))
        if layout.cu_seqlens is None:  # one unpadded sequence per row
            out, lse = kernel.dense_lse(q, k, v, scale, window)
            out, lse = out.reshape(*flat, hq, d), lse.transpose(1, 2).reshape(*flat, hq)
        else:
            packed = [t.index_select(0, layout.indices) for t in (qf, kf, vf)]
            o_p, l_p = kernel.varlen_lse(*packed, layout.cu_seqlens, layout.max_seqlen, scale, window)
            out = o_p.new_zeros(*flat, hq, d).index_copy(0, layout.indices, o_p)
            lse = l_p.new_full((*flat, hq), float("-inf")).index_copy(0, layout.indices, l_p.transpose(0, 1))
        rows, valid = _block_rows(layout, q.device)
        beyond = window if layout.block_past else None
        scores, later, _, _ = _in_block_part(qf, kf, rows, valid, scale, beyond)
        scores = scores.masked_fill(~later, float("-inf"))
        lse_b = torch.logsumexp(scores, dim=-1)  # [n, hk, g, L]: -inf for a block's last token
        probs = torch.exp(scores - lse_b.nan_to_num(neginf=0.0)[..., None]).masked_fill(~later, 0.0)
        n, length = rows.shape
        vb = vf.index_select(0, rows.flatten()).view(n, length, -1, d).float()
        out_b = torch.einsum("nkgij,njkd->nikgd", probs, vb).reshape(n, length, hq, d)
        lse_b = lse_b.permute(0, 3, 1, 2).reshape(n, length, hq)
        pick = rows[valid]
        lse_a, out_a = lse.index_select(0, pick), out.index_select(0, pick).float()
        lse_b, out_b = lse_b[valid], out_b[valid]
        merged = torch.logaddexp(lse_a, lse_b)
        mixed = out_a * torch.exp(lse_a - merged)[..., None] + out_b * torch.exp(lse_b - merged)[..., None]
        out = out.index_copy(0, pick, mixed.to(out.dtype))
        lse = lse.index_copy(0, pick, merged)
        ctx.save_for_backward(q, k, v, out, lse, rows, valid)
        ctx.kernel, ctx.layout, ctx.scale, ctx.window, ctx.deterministic = kernel, layout, scale, window, deterministic
        return out.view(batch, seq, hq, d)

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, rows, valid = ctx.saved_tensors
        kernel, layout, scale = ctx.kernel, ctx.layout, ctx.scale
        batch, seq, hq, d = q.shape
        flat = (batch * seq,)
        dout_f = dout.reshape(*flat, hq, d)
        if layout.cu_seqlens is None:
            dq, dk, dv = kernel.dense_bwd(dout.contiguous(), q, k, v, out.view(batch, seq, hq, d),
                                          lse.view(batch, seq, hq).transpose(1, 2).contiguous(), scale, ctx.window,
                                          ctx.deterministic)
            dq, dk, dv = (t.reshape(*flat, *t.shape[2:]) for t in (dq, dk, dv))
        else:
            idx = layout.indices
            packed = [t.reshape(*flat, *t.shape[2:]).index_select(0, idx) for t in (q, k, v)]
            g_p = kernel.varlen_bwd(dout_f.index_select(0, idx).contiguous(), *packed, out.index_select(0, idx),
                                    lse.index_select(0, idx).transpose(0, 1).contiguous(), layout.cu_seqlens,
                                    layout.max_seqlen, scale, ctx.window, ctx.deterministic)
            dq, dk, dv = (t.new_zeros(*flat, *t.shape[1:]).index_copy(0, idx, t) for t in g_p)
        # B: the in-block keys after each query, with the union's P and D
        qf, kf, vf = (t.reshape(*flat, *t.shape[2:]) for t in (q, k, v))
        scores, later, qb, kb = _in_block_part(qf, kf, rows, valid, scale, ctx.window if layout.block_past else None)
        n, length = rows.shape
        hk = kf.shape[-2]
        g = hq // hk
        lse_rows = lse.index_select(0, rows.flatten()).view(n, length, hk, g).permute(0, 2, 3, 1)  # [n, hk, g, L]
        probs = torch.exp(scores - lse_rows[..., None]).masked_fill(~later, 0.0)
        dout_b = dout_f.index_select(0, rows.flatten()).view(n, length, hk, g, d).float()
        out_b = out.index_select(0, rows.flatten()).view(n, length, hk, g, d).float()
        vb = vf.index_select(0, rows.flatten()).view(n, length, hk, d).float()
        delta = (dout_b * out_b).sum(-1).permute(0, 2, 3, 1)  # [n, hk, g, L]
        dp = torch.einsum("nikgd,njkd->nkgij", dout_b, vb)
        ds = probs * (dp - delta[..., None]) * scale
        dq_b = torch.einsum("nkgij,njkd->nikgd", ds, kb).reshape(n, length, hq, d)
        dk_b = torch.einsum("nkgij,nikgd->njkd", ds, qb)
        dv_b = torch.einsum("nkgij,nikgd->njkd", probs, dout_b)
        pick = rows[valid]  # distinct positions: a plain read-add-write, deterministic
        grads = []
        for full, part, ref in ((dq, dq_b, q), (dk, dk_b, k), (dv, dv_b, v)):
            full = full.index_copy(0, pick, (full.index_select(0, pick).float() + part[valid]).to(full.dtype))
            grads.append(full.view(batch, seq, *full.shape[1:]).to(ref.dtype))
        return (*grads, None, None, None, None, None)


def attention(kernel, q, k, v, layout, scale: float, window, deterministic: bool = False):
    return BlockUnion.apply(q, k, v, kernel, layout, scale, window, deterministic)
