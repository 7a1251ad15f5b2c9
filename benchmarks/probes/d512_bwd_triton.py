"""A head_dim-512 causal attention backward in Triton with no recomputation (design M of
docs/notes/d512-backward-design.md): P and dS are written to HBM in bf16 (the precision FlashAttention
feeds its dV/dK/dQ GEMMs anyway), then dV = P^T dO, dK = scale * dS^T Q and dQ = scale * dS K run as
causal block-sparse GEMMs over them. Executed FLOPs equal the counted 5 GEMMs (r = 1.0 against ffpa's
1.8); the price is ~10 bytes of HBM traffic per causal score. Heads go in chunks so the scratch stays
bounded. A GPU probe of whether it beats ffpa-attn 0.2.4's backward by the issue's 1.2x gate; dense only.

    python benchmarks/probes/d512_bwd_triton.py --out benchmarks/results/<run>/d512_bwd_triton.json
    TRITON_INTERPRET=1 python benchmarks/probes/d512_bwd_triton.py --cpu-check   # the math, on a CPU
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def _p_ds_kernel(Q, K, V, DO, LSE, DELTA, P, DS,
                 s_qb, s_qs, s_qh, s_kb, s_ks, s_kh, s_lb, s_lh, s_ph, s_pm,
                 b, h0, n_rep, heads_per_kv, seqlen, row0, qk_scale_log2,
                 HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """One (m, n) tile of one head: S and dP over the full head_dim, then P and dS stored in bf16 at row
    m - row0 of the strip's scratch."""
    pid_m = row0 // BLOCK_M + tl.program_id(0)
    pid_n = tl.program_id(1)
    hc = tl.program_id(2)
    if pid_n * BLOCK_N > pid_m * BLOCK_M + BLOCK_M - 1:
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
    p = tl.where(offs_m[:, None] >= offs_n[None, :], p, 0.0)
    ds = p * (acc_dp - delta[:, None])
    out = hc * s_ph + (offs_m - row0)[:, None] * s_pm + offs_n[None, :]
    keep = in_m[:, None] & in_n[None, :]
    tl.store(P + out, p.to(P.dtype.element_ty), mask=keep)
    tl.store(DS + out, ds.to(DS.dtype.element_ty), mask=keep)


@triton.jit
def _kv_grad_kernel(A, X, OUT, s_ah, s_am, s_xb, s_xs, s_xh, s_ob, s_os, s_oh,
                    b, h0, n_rep, seqlen, row0, row1, alpha,
                    HEADS_PER_KV: tl.constexpr, ACCUM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr):
    """OUT[b, n, kvh, d] (+)= alpha * sum over the chunk's heads of this KV head and the strip's rows
    m >= n of A[hc, m - row0, n] * X[b, m, h, d]: dV from (P, dO), dK from (dS, Q)."""
    pid_n = tl.program_id(0)
    pid_d = tl.program_id(1)
    g = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    offs_k = tl.arange(0, BLOCK_K)
    in_n = offs_n < seqlen
    acc = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    h_first = h0 + g * n_rep
    for r in range(HEADS_PER_KV):
        hc = g * HEADS_PER_KV + r
        h = h_first + r
        for m0 in range(tl.maximum(pid_n * BLOCK_N, row0), row1, BLOCK_K):
            offs_m = m0 + offs_k
            in_m = offs_m < row1
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
def _q_grad_kernel(DS, K, DQ, s_ah, s_am, s_kb, s_ks, s_kh, s_qb, s_qs, s_qh,
                   b, h0, n_rep, heads_per_kv, seqlen, row0, alpha, n_m_blocks,
                   BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr):
    """dQ[b, m, h, d] = alpha * sum over n <= m of dS[hc, m, n] * K[b, n, kvh, d]; longest rows first."""
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
    for n0 in range(0, end, BLOCK_K):
        offs_n = n0 + offs_k
        in_n = offs_n < seqlen
        a = tl.load(DS + hc * s_ah + (offs_m - row0)[:, None] * s_am + offs_n[None, :],
                    mask=in_m[:, None] & in_n[None, :], other=0.0)
        k = tl.load(K + b * s_kb + kvh * s_kh + offs_n[:, None] * s_ks + offs_d[None, :],
                    mask=in_n[:, None], other=0.0)
        acc = tl.dot(a, k, acc)
    q_ptrs = DQ + b * s_qb + h * s_qh + offs_m[:, None] * s_qs + offs_d[None, :]
    tl.store(q_ptrs, (acc * alpha).to(DQ.dtype.element_ty), mask=in_m[:, None])


DEFAULT_CFG = {
    "pds": {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_D": 64, "num_warps": 8, "num_stages": 3},
    "kv": {"BLOCK_N": 128, "BLOCK_D": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3},
    "q": {"BLOCK_M": 128, "BLOCK_D": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3},
}


def chunk_plan(hq: int, hkv: int, seqlen: int, budget_bytes: float, block: int = 128) -> tuple[int, int, int]:
    """(KV heads, query heads per KV head, query rows) per chunk, so that the chunk's P and dS scratch
    (heads x rows x seqlen, bf16, two of them) fits the budget: whole groups first, then fewer heads,
    then strips of rows (a multiple of the block)."""
    n_rep = hq // hkv
    per_head = 2 * 2 * seqlen * seqlen
    heads = int(budget_bytes // per_head)
    if heads >= n_rep:
        return max(d for d in range(1, hkv + 1) if hkv % d == 0 and d * n_rep <= heads), n_rep, seqlen
    if heads >= 1:
        return 1, max(d for d in range(1, n_rep + 1) if n_rep % d == 0 and d <= heads), seqlen
    rows = max(block, int(budget_bytes // (2 * 2 * seqlen)) // block * block)
    return 1, 1, min(rows, seqlen)


def d512_backward(dout, q, k, v, out, lse, scale, cfg=DEFAULT_CFG, scratch_bytes=8e9):
    """dq, dk, dv of causal attention, BSHD (q [B, S, H, D], k/v [B, S, Hkv, D]), lse [B, H, S] in nats."""
    bsz, seqlen, hq, d = q.shape
    hkv = k.shape[2]
    n_rep = hq // hkv
    c1, c2, c3 = cfg["pds"], cfg["kv"], cfg["q"]
    block = max(c1["BLOCK_M"], c1["BLOCK_N"], c2["BLOCK_N"], c3["BLOCK_M"])
    delta = (out.float() * dout.float()).sum(-1).transpose(1, 2).contiguous()  # [B, H, S]
    lse = lse.contiguous()
    dq = torch.empty_like(q)
    kv_chunk, rep_chunk, rows = chunk_plan(hq, hkv, seqlen, scratch_bytes, block)
    accum = rep_chunk < n_rep or rows < seqlen
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
                    grid1 = (triton.cdiv(row1 - row0, c1["BLOCK_M"]), triton.cdiv(row1, c1["BLOCK_N"]), hc_n)
                    _p_ds_kernel[grid1](q, k, v, dout, lse, delta, p, ds,
                                        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                                        lse.stride(0), lse.stride(1), p.stride(0), p.stride(1),
                                        b, h0, n_rep, rep_chunk, seqlen, row0, scale * LOG2E, HEAD_DIM=d, **c1)
                    grid2 = (triton.cdiv(row1, c2["BLOCK_N"]), d // c2["BLOCK_D"], kv_chunk)
                    for a_, x_, o_, alpha in ((p, dout, dv, 1.0), (ds, q, dk, scale)):
                        _kv_grad_kernel[grid2](a_, x_, o_, a_.stride(0), a_.stride(1),
                                               x_.stride(0), x_.stride(1), x_.stride(2),
                                               o_.stride(0), o_.stride(1), o_.stride(2),
                                               b, h0, n_rep, seqlen, row0, row1, alpha, HEADS_PER_KV=rep_chunk,
                                               ACCUM=accum and (r0 > 0 or row0 > 0), **c2)
                    n_m = triton.cdiv(row1 - row0, c3["BLOCK_M"])
                    grid3 = (n_m, d // c3["BLOCK_D"], hc_n)
                    _q_grad_kernel[grid3](ds, k, dq, ds.stride(0), ds.stride(1), k.stride(0), k.stride(1), k.stride(2),
                                          dq.stride(0), dq.stride(1), dq.stride(2),
                                          b, h0, n_rep, rep_chunk, seqlen, row0, scale, n_m, **c3)
    if accum:
        dk, dv = dk.to(k.dtype), dv.to(v.dtype)
    return dq, dk, dv


def reference(q, k, v, dout, scale):
    """fp32 autograd reference: out, lse (nats), dq, dk, dv."""
    n_rep = q.shape[2] // k.shape[2]
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    qh = qf.transpose(1, 2)
    kh = kf.transpose(1, 2).repeat_interleave(n_rep, 1)
    vh = vf.transpose(1, 2).repeat_interleave(n_rep, 1)
    s = qh @ kh.transpose(-1, -2) * scale
    n = q.shape[1]
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    lse = torch.logsumexp(s, -1)
    o = (torch.softmax(s, -1) @ vh).transpose(1, 2)
    o.backward(dout.float())
    return o.detach(), lse.detach(), qf.grad, kf.grad, vf.grad


def rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)).item()


def cpu_check():
    """The index math in Triton's interpreter, tiny blocks, fp32 throughout (the interpreter mishandles bf16):
    errors against fp32 autograd, including chunked heads (with and without dK/dV accumulation), batch 2
    and lengths that are not a multiple of the block."""
    torch.manual_seed(0)
    cfg = {"pds": {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_D": 32}, "kv": {"BLOCK_N": 16, "BLOCK_D": 64, "BLOCK_K": 16},
           "q": {"BLOCK_M": 16, "BLOCK_D": 64, "BLOCK_K": 16}}
    cases = ((1, 40, 4, 2, 1e9),                     # whole groups, one chunk
             (2, 48, 4, 1, 2 * 2 * 48 * 48 * 2),     # two heads of a group per chunk: dK/dV accumulate
             (1, 33, 2, 2, 2 * 2 * 33 * 33),         # one head per chunk, a ragged length
             (1, 70, 2, 1, 2 * 2 * 70 * 20))         # strips of 16 rows: dK/dV accumulate across strips
    for bsz, n, hq, hkv, budget in cases:
        q, k, v, dout = (torch.randn(bsz, n, h, 512) for h in (hq, hkv, hkv, hq))
        scale = 512 ** -0.5
        o, lse, rq, rk, rv = reference(q, k, v, dout, scale)
        dq, dk, dv = d512_backward(dout, q, k, v, o, lse, scale, cfg=cfg, scratch_bytes=budget)
        errs = [rel_err(a, r) for a, r in ((dq, rq), (dk, rk), (dv, rv))]
        print(json.dumps({"shape": [bsz, n, hq, hkv], "chunks": chunk_plan(hq, hkv, n, budget, 16), "rel_err": errs}))
        assert max(errs) < 1e-4, errs


SWEEP_PDS = ({"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_D": 64, "num_warps": 4, "num_stages": 3},
             {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_D": 64, "num_warps": 8, "num_stages": 2})
SWEEP_GEMM = ({"BLOCK_D": 256, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3},
              {"BLOCK_D": 128, "BLOCK_K": 64, "num_warps": 4, "num_stages": 4})
HEADS = {"31B": (32, 4), "26B-A4B": (16, 2), "12B": (16, 1), "E2B": (8, 1)}


def sweep_configs() -> list[dict]:
    cfgs = [DEFAULT_CFG]
    for pds in SWEEP_PDS:
        cfgs.append({**DEFAULT_CFG, "pds": pds})
    for g in SWEEP_GEMM:
        cfgs.append({**DEFAULT_CFG, "kv": {**DEFAULT_CFG["kv"], **g}, "q": {**DEFAULT_CFG["q"], **g}})
    return cfgs


def exactness_row() -> dict:
    """A small case with the 31B's heads against fp32 autograd, ffpa-attn's error beside ours."""
    ops, scale = torch.ops.ffpa_attn, 512 ** -0.5
    torch.manual_seed(0)
    q, k, v, dout = (torch.randn(1, 2048, h, 512, device="cuda", dtype=torch.bfloat16) for h in (32, 4, 4, 32))
    _, lse, rq, rk, rv = reference(q, k, v, dout, scale)
    out, flse = ops._fwd_cute(q, k, v, scale, 1, 1)
    ours = d512_backward(dout, q, k, v, out, flse, scale)
    theirs = ops._bwd_cute(dout, q, k, v, out, flse, scale, 1, 0)
    return {"check": "31B heads, 2k, vs fp32", "lse_max_abs_diff_vs_ref": (flse.float() - lse).abs().max().item(),
            "ours_rel_err": [rel_err(x, r) for x, r in zip(ours, (rq, rk, rv))],
            "ffpa_rel_err": [rel_err(x, r) for x, r in zip(theirs, (rq, rk, rv))]}


def timing_row(model: str, n: int, scratch_gb: float, cfgs: list[dict], cuda_ms, deadline: float) -> dict:
    ops, scale = torch.ops.ffpa_attn, 512 ** -0.5
    hq, hkv = HEADS[model]
    torch.manual_seed(0)
    q, k, v, dout = (torch.randn(1, n, h, 512, device="cuda", dtype=torch.bfloat16) for h in (hq, hkv, hkv, hq))
    row = {"model": model, "n": n, "hq": hq, "hkv": hkv, "scratch_gb": scratch_gb,
           "chunk_plan": chunk_plan(hq, hkv, n, scratch_gb * 1e9)}
    flop = 2.5 * 4 * hq * 512 * n * (n + 1) / 2
    with torch.no_grad():
        out, lse = ops._fwd_cute(q, k, v, scale, 1, 1)
        ffpa_ms = cuda_ms(lambda: ops._bwd_cute(dout, q, k, v, out, lse, scale, 1, 0), warmup=1, iters=3)
        theirs = ops._bwd_cute(dout, q, k, v, out, lse, scale, 1, 0)
        row.update(ffpa_ms=ffpa_ms, ffpa_tflops=flop / ffpa_ms / 1e9)
        for ci, cfg in enumerate(cfgs):
            ms = cuda_ms(lambda c=cfg: d512_backward(dout, q, k, v, out, lse, scale, cfg=c,
                                                              scratch_bytes=scratch_gb * 1e9), warmup=1, iters=3)
            ours = d512_backward(dout, q, k, v, out, lse, scale, cfg=cfg, scratch_bytes=scratch_gb * 1e9)
            row[f"cfg{ci}"] = {"cfg": cfg, "ms": ms, "tflops": flop / ms / 1e9, "speedup": ffpa_ms / ms,
                               "rel_diff_vs_ffpa": [rel_err(x, y) for x, y in zip(ours, theirs)]}
            if time.time() > deadline:
                break
    row["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu-check", action="store_true")
    ap.add_argument("--out")
    ap.add_argument("--shapes", nargs="+", default=["31B:8192", "31B:16384", "31B:16384:2", "31B:32768", "12B:16384", "26B-A4B:16384"],
                    help="MODEL:TOKENS[:SCRATCH_GB] (scratch 8 GB unless given)")
    ap.add_argument("--sweep", action="store_true", help="try a few tile configs at the first shape")
    ap.add_argument("--budget-s", type=float, default=300)
    a = ap.parse_args()
    if a.cpu_check:
        return cpu_check()
    import ffpa_attn.cute  # noqa: F401  (registers torch.ops.ffpa_attn.*)

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from benchmarks.common import cuda_ms, env_info

    deadline = time.time() + a.budget_s
    rows = []
    for i, spec in enumerate(["check"] + a.shapes):
        try:
            if spec == "check":
                row = exactness_row()
            else:
                model, n, *gb = spec.split(":")
                row = timing_row(model, int(n), float(gb[0]) if gb else 8.0, sweep_configs() if a.sweep and i == 1 else [DEFAULT_CFG], cuda_ms, deadline)
        except Exception as exc:  # noqa: BLE001 - a probe row records its failure
            row = {"spec": spec, "error": f"{type(exc).__name__}: {exc}"[:400]}
        rows.append(row)
        print(json.dumps(row), flush=True)
        torch.cuda.empty_cache()
        if a.out:
            with open(a.out, "w") as f:
                json.dump({"env": env_info(), "rows": rows, "command": " ".join(sys.argv)}, f, indent=1)
        if time.time() > deadline:
            break


if __name__ == "__main__":
    main()
