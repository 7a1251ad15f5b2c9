"""A causal head_dim-512 attention backward for Hopper in Triton, used in place of ffpa-attn's.

ffpa-attn's sm90 backward splits head_dim 512 into two 256-wide passes and recomputes S and dP in
each and again for dQ: it executes ~1.8x the counted FLOPs and runs at 205-230 TF/s on an H100.
This one recomputes nothing. Kernel 1 forms S = QK^T and dP = dO V^T over the full head_dim for a
128x128 tile, then P and dS = P (dP - delta) in fp32, and stores both in the input dtype (the
precision FlashAttention feeds its dV/dK/dQ GEMMs anyway). Three causal block-sparse GEMMs follow:
dV = P^T dO, dK = scale dS^T Q, dQ = scale dS K, fp32 accumulators, no atomics, a fixed order (so
repeatable bit for bit). The price is HBM traffic (~10 bytes per causal score) and a bounded scratch:
heads go in chunks and, when one head's P and dS do not fit, strips of query rows, with dK/dV then
accumulated in fp32. Design and measurements: docs/notes/d512-backward-design.md ("M").

Inputs as ffpa-attn's ops take them: q/dout/out ``[B, S, H, D]``, k/v ``[B, S, Hkv, D]`` (last dim
contiguous), lse ``[B, H, S]`` fp32 in nats; self-attention only (as many queries as keys).
Imports triton: load this module only where a backward runs.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
HEAD_DIM = 512
SCRATCH_BYTES = 1 << 30  # P and dS of one chunk; 1-8 GB measured the same speed at 31B 16k (H100)

#: tile configs (H100-tuned; benchmarks/results/2026-12-08-h100-a)
CONFIG = {
    "delta": {"BLOCK_M": 32, "num_warps": 4},
    "pds": {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_D": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3},
    "kv": {"BLOCK_N": 128, "BLOCK_D": 256, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3},
    "q": {"BLOCK_M": 128, "BLOCK_D": 256, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3},
}


@triton.jit
def _delta_kernel(OUT, DO, DELTA, s_ob, s_os, s_oh, s_db, s_ds, s_dh, s_lb, s_lh, seqlen,
                  HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """delta[b, h, m] = sum_d out * dout, in fp32."""
    pid_m = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    in_m = offs_m < seqlen
    o = tl.load(OUT + b * s_ob + h * s_oh + offs_m[:, None] * s_os + offs_d[None, :], mask=in_m[:, None], other=0.0)
    do = tl.load(DO + b * s_db + h * s_dh + offs_m[:, None] * s_ds + offs_d[None, :], mask=in_m[:, None], other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    tl.store(DELTA + b * s_lb + h * s_lh + offs_m, delta, mask=in_m)


@triton.jit
def _p_ds_kernel(Q, K, V, DO, LSE, DELTA, P, DS, DOC,
                 s_qb, s_qs, s_qh, s_kb, s_ks, s_kh, s_lb, s_lh, s_ph, s_pm,
                 b, h0, n_rep, heads_per_kv, seqlen, row0, n_m, n_n, qk_scale_log2,
                 HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                 GROUP_M: tl.constexpr, VARLEN: tl.constexpr):
    """One (m, n) tile of one head: S and dP over the full head_dim, then P and dS stored at row
    m - row0 of the strip's scratch. Tiles run in groups of GROUP_M query blocks so that the Q/dO
    and K/V blocks in flight stay in L2. VARLEN: DOC holds each token's document; a tile whose keys all
    come before its queries' first document is skipped (never written, never read)."""
    pid = tl.program_id(0)
    hc = tl.program_id(1)
    per_group = GROUP_M * n_n
    first_m = (pid // per_group) * GROUP_M
    group_m = tl.minimum(n_m - first_m, GROUP_M)
    pid_m = row0 // BLOCK_M + first_m + (pid % per_group) % group_m
    pid_n = (pid % per_group) // group_m
    if pid_n * BLOCK_N > pid_m * BLOCK_M + BLOCK_M - 1:
        return
    if VARLEN:
        if tl.load(DOC + tl.minimum(pid_n * BLOCK_N + BLOCK_N, seqlen) - 1) < tl.load(DOC + pid_m * BLOCK_M):
            return
    h = h0 + (hc // heads_per_kv) * n_rep + hc % heads_per_kv
    kvh = h // n_rep
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    in_m = offs_m < seqlen
    in_n = offs_n < seqlen
    q_ptrs = Q + b * s_qb + h * s_qh + offs_m[:, None] * s_qs + offs_d[None, :]
    do_ptrs = DO + b * s_qb + h * s_qh + offs_m[:, None] * s_qs + offs_d[None, :]
    k_ptrs = K + b * s_kb + kvh * s_kh + offs_n[:, None] * s_ks + offs_d[None, :]
    v_ptrs = V + b * s_kb + kvh * s_kh + offs_n[:, None] * s_ks + offs_d[None, :]
    acc_s = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_dp = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for d0 in range(0, HEAD_DIM, BLOCK_D):
        q = tl.load(q_ptrs + d0, mask=in_m[:, None], other=0.0)
        k = tl.load(k_ptrs + d0, mask=in_n[:, None], other=0.0)
        acc_s = tl.dot(q, tl.trans(k), acc_s)
        do = tl.load(do_ptrs + d0, mask=in_m[:, None], other=0.0)
        v = tl.load(v_ptrs + d0, mask=in_n[:, None], other=0.0)
        acc_dp = tl.dot(do, tl.trans(v), acc_dp)
    lse = tl.load(LSE + b * s_lb + h * s_lh + offs_m, mask=in_m, other=0.0)
    delta = tl.load(DELTA + b * s_lb + h * s_lh + offs_m, mask=in_m, other=0.0)
    p = tl.math.exp2(acc_s * qk_scale_log2 - lse[:, None] * 1.4426950408889634)
    visible = offs_m[:, None] >= offs_n[None, :]
    if VARLEN:
        doc_m = tl.load(DOC + offs_m, mask=in_m, other=-1)
        doc_n = tl.load(DOC + offs_n, mask=in_n, other=-2)
        visible = visible & (doc_m[:, None] == doc_n[None, :])
    p = tl.where(visible, p, 0.0)
    ds = p * (acc_dp - delta[:, None])
    out = hc * s_ph + (offs_m - row0)[:, None] * s_pm + offs_n[None, :]
    keep = in_m[:, None] & in_n[None, :]
    tl.store(P + out, p.to(P.dtype.element_ty), mask=keep)
    tl.store(DS + out, ds.to(DS.dtype.element_ty), mask=keep)


@triton.jit
def _kv_grad_kernel(A, X, OUT, DOC, CU, s_ah, s_am, s_xb, s_xs, s_xh, s_ob, s_os, s_oh,
                    b, h0, n_rep, seqlen, row0, row1, alpha,
                    HEADS_PER_KV: tl.constexpr, ACCUM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                    BLOCK_K: tl.constexpr, VARLEN: tl.constexpr):
    """OUT[b, n, kvh, d] (+)= alpha * sum over the chunk's heads of this KV head and the strip's rows
    m >= n of A[hc, m - row0, n] * X[b, m, h, d]: dV from (P, dO), dK from (dS, Q). VARLEN: rows stop
    at the end of the block's last document (CU holds the documents' bounds)."""
    pid_n = tl.program_id(0)
    pid_d = tl.program_id(1)
    g = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    offs_k = tl.arange(0, BLOCK_K)
    in_n = offs_n < seqlen
    acc = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    h_first = h0 + g * n_rep
    m_end = row1
    if VARLEN:
        last_doc = tl.load(DOC + tl.minimum(pid_n * BLOCK_N + BLOCK_N, seqlen) - 1)
        m_end = tl.minimum(row1, tl.load(CU + last_doc + 1))
    for r in range(HEADS_PER_KV):
        hc = g * HEADS_PER_KV + r
        h = h_first + r
        for m0 in range(tl.maximum(pid_n * BLOCK_N, row0), m_end, BLOCK_K):
            offs_m = m0 + offs_k
            in_m = offs_m < m_end
            a = tl.load(A + hc * s_ah + (offs_m - row0)[:, None] * s_am + offs_n[None, :],
                        mask=in_m[:, None] & in_n[None, :], other=0.0)
            x = tl.load(X + b * s_xb + h * s_xh + offs_m[:, None] * s_xs + offs_d[None, :],
                        mask=in_m[:, None], other=0.0)
            acc = tl.dot(tl.trans(a), x, acc)
    acc = acc * alpha
    kvh = h_first // n_rep
    o_ptrs = OUT + b * s_ob + kvh * s_oh + offs_n[:, None] * s_os + offs_d[None, :]
    if ACCUM:
        acc += tl.load(o_ptrs, mask=in_n[:, None], other=0.0)
    tl.store(o_ptrs, acc.to(OUT.dtype.element_ty), mask=in_n[:, None])


@triton.jit
def _q_grad_kernel(DS, K, DQ, DOC, CU, s_ah, s_am, s_kb, s_ks, s_kh, s_qb, s_qs, s_qh,
                   b, h0, n_rep, heads_per_kv, seqlen, row0, alpha, n_m_blocks,
                   BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr, VARLEN: tl.constexpr):
    """dQ[b, m, h, d] = alpha * sum over n <= m of dS[hc, m - row0, n] * K[b, n, kvh, d]; longest rows first.
    VARLEN: keys start at the block's first document (rounded down to a whole key step)."""
    pid_m = row0 // BLOCK_M + n_m_blocks - 1 - tl.program_id(0)
    pid_d = tl.program_id(1)
    hc = tl.program_id(2)
    h = h0 + (hc // heads_per_kv) * n_rep + hc % heads_per_kv
    kvh = h // n_rep
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    offs_k = tl.arange(0, BLOCK_K)
    in_m = offs_m < seqlen
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    end = tl.minimum((pid_m + 1) * BLOCK_M, seqlen)
    start = 0
    if VARLEN:
        start = tl.load(CU + tl.load(DOC + pid_m * BLOCK_M)) // BLOCK_K * BLOCK_K
    for n0 in range(start, end, BLOCK_K):
        offs_n = n0 + offs_k
        in_n = offs_n < seqlen
        a = tl.load(DS + hc * s_ah + (offs_m - row0)[:, None] * s_am + offs_n[None, :],
                    mask=in_m[:, None] & in_n[None, :], other=0.0)
        k = tl.load(K + b * s_kb + kvh * s_kh + offs_n[:, None] * s_ks + offs_d[None, :],
                    mask=in_n[:, None], other=0.0)
        acc = tl.dot(a, k, acc)
    q_ptrs = DQ + b * s_qb + h * s_qh + offs_m[:, None] * s_qs + offs_d[None, :]
    tl.store(q_ptrs, (acc * alpha).to(DQ.dtype.element_ty), mask=in_m[:, None])


def chunk_plan(hq: int, hkv: int, seqlen: int, budget_bytes: float, block: int = 128,
               itemsize: int = 2) -> tuple[int, int, int]:
    """(KV heads, query heads per KV head, query rows) per chunk, so that the chunk's P and dS
    (heads x rows x seqlen, two of them) fit the budget: whole GQA groups first, then fewer heads of
    one group, then strips of rows (a multiple of ``block``)."""
    n_rep = hq // hkv
    per_head = 2 * itemsize * seqlen * seqlen
    heads = int(budget_bytes // per_head)
    if heads >= n_rep:
        return max(d for d in range(1, hkv + 1) if hkv % d == 0 and d * n_rep <= heads), n_rep, seqlen
    if heads >= 1:
        return 1, max(d for d in range(1, n_rep + 1) if n_rep % d == 0 and d <= heads), seqlen
    rows = max(block, int(budget_bytes // (2 * itemsize * seqlen)) // block * block)
    return 1, 1, min(rows, seqlen)


def backward(dout, q, k, v, out, lse, scale: float, config=None, scratch_bytes: float = SCRATCH_BYTES,
             cu_seqlens=None, segment_tokens: int | None = None):
    """(dq, dk, dv) of causal self-attention from its out and lse; see the module docstring. With
    ``cu_seqlens`` (int32, the documents' bounds) the inputs are packed: q/dout/out ``[T, H, D]``,
    k/v ``[T, Hkv, D]``, lse ``[H, T]``, each document causal on its own, and so are the gradients.
    ``segment_tokens``: run the packed batch in segments of whole documents of about that many tokens
    (``segments``), so that tiles and scratch scale with the segments, not the whole batch (one read
    of ``cu_seqlens`` on the host); None: the whole batch at once."""
    if cu_seqlens is None:
        return _backward(dout, q, k, v, out, lse, scale, config, scratch_bytes)
    if segment_tokens is None:
        return _packed(dout, q, k, v, out, lse, scale, config, scratch_bytes, cu_seqlens)
    parts = [_packed(dout[a:b], q[a:b], k[a:b], v[a:b], out[a:b], lse[:, a:b], scale, config, scratch_bytes,
                     torch.tensor(local, device=q.device, dtype=torch.int32))
             for a, b, local in segments(cu_seqlens.tolist(), segment_tokens)]
    return tuple(torch.cat(grads) for grads in zip(*parts))


def segments(bounds: list[int], target: int) -> list[tuple[int, int, list[int]]]:
    """Consecutive whole documents grouped into segments of at most ``target`` tokens (a longer document
    is a segment of its own): ``[(start, end, bounds relative to start)]``. No document crosses a
    segment, so each segment's gradients need only its own tokens."""
    out, start, local = [], bounds[0], [0]
    for end in bounds[1:]:
        if end - start > target and local[-1] > 0:
            out.append((start, start + local[-1], local))
            start, local = start + local[-1], [0]
        local.append(end - start)
    if local[-1] > 0 or not out:
        out.append((start, start + local[-1], local))
    return out


def _packed(dout, q, k, v, out, lse, scale, config, scratch_bytes, cu_seqlens):
    doc = torch.repeat_interleave(torch.arange(cu_seqlens.numel() - 1, device=q.device, dtype=torch.int32),
                                  (cu_seqlens[1:] - cu_seqlens[:-1]).long(), output_size=q.shape[0])
    grads = _backward(dout[None], q[None], k[None], v[None], out[None], lse[None], scale, config, scratch_bytes,
                      doc, cu_seqlens.to(torch.int32))
    return tuple(g[0] for g in grads)


def _backward(dout, q, k, v, out, lse, scale, config, scratch_bytes, doc=None, cu=None):
    cfg = config or CONFIG
    varlen = doc is not None
    if not varlen:
        doc = cu = torch.empty(1, device=q.device, dtype=torch.int32)  # not read
    bsz, seqlen, hq, d = q.shape
    hkv = k.shape[2]
    n_rep = hq // hkv
    q, k, v, dout, out = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, dout, out))
    lse = lse.float().contiguous()
    c0, c1, c2, c3 = cfg["delta"], cfg["pds"], cfg["kv"], cfg["q"]
    delta = torch.empty_like(lse)
    _delta_kernel[(triton.cdiv(seqlen, c0["BLOCK_M"]), hq, bsz)](
        out, dout, delta, out.stride(0), out.stride(1), out.stride(2), dout.stride(0), dout.stride(1), dout.stride(2),
        delta.stride(0), delta.stride(1), seqlen, HEAD_DIM=d, **c0)
    block = max(c1["BLOCK_M"], c1["BLOCK_N"], c2["BLOCK_N"], c3["BLOCK_M"])
    kv_chunk, rep_chunk, rows = chunk_plan(hq, hkv, seqlen, scratch_bytes, block, q.element_size())
    accum = rep_chunk < n_rep or rows < seqlen
    dq = torch.empty_like(q)
    dk = torch.zeros(k.shape, device=k.device, dtype=torch.float32) if accum else torch.empty_like(k)
    dv = torch.zeros(v.shape, device=v.device, dtype=torch.float32) if accum else torch.empty_like(v)
    hc_n = kv_chunk * rep_chunk
    p = torch.empty(hc_n, rows, seqlen, device=q.device, dtype=q.dtype)
    ds = torch.empty_like(p)
    for b in range(bsz):
        for kv0 in range(0, hkv, kv_chunk):
            for r0 in range(0, n_rep, rep_chunk):
                h0 = kv0 * n_rep + r0
                for row0 in range(0, seqlen, rows):
                    row1 = min(row0 + rows, seqlen)
                    n_m, n_n = triton.cdiv(row1 - row0, c1["BLOCK_M"]), triton.cdiv(row1, c1["BLOCK_N"])
                    _p_ds_kernel[(n_m * n_n, hc_n)](
                        q, k, v, dout, lse, delta, p, ds, doc,
                        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                        lse.stride(0), lse.stride(1), p.stride(0), p.stride(1),
                        b, h0, n_rep, rep_chunk, seqlen, row0, n_m, n_n, scale * LOG2E, HEAD_DIM=d, VARLEN=varlen, **c1)
                    grid = (triton.cdiv(row1, c2["BLOCK_N"]), d // c2["BLOCK_D"], kv_chunk)
                    for a, x, o, alpha in ((p, dout, dv, 1.0), (ds, q, dk, scale)):
                        _kv_grad_kernel[grid](
                            a, x, o, doc, cu, a.stride(0), a.stride(1), x.stride(0), x.stride(1), x.stride(2),
                            o.stride(0), o.stride(1), o.stride(2), b, h0, n_rep, seqlen, row0, row1, alpha,
                            HEADS_PER_KV=rep_chunk, ACCUM=accum and (r0 > 0 or row0 > 0), VARLEN=varlen, **c2)
                    n_mq = triton.cdiv(row1 - row0, c3["BLOCK_M"])
                    _q_grad_kernel[(n_mq, d // c3["BLOCK_D"], hc_n)](
                        ds, k, dq, doc, cu, ds.stride(0), ds.stride(1), k.stride(0), k.stride(1), k.stride(2),
                        dq.stride(0), dq.stride(1), dq.stride(2), b, h0, n_rep, rep_chunk, seqlen, row0, scale, n_mq, VARLEN=varlen, **c3)
    if accum:
        dk, dv = dk.to(k.dtype), dv.to(v.dtype)
    return dq, dk, dv
