"""The attention kernels at every released Gemma 4 layer shape: forward and backward apart, in TF/s.

Full layers (head_dim 512, causal) and sliding layers (head_dim 256, causal with the model's
window), at B=1 over ``--seqs``, dense, varlen or batched (``--layouts``; varlen: the same tokens as 4
equal documents packed in one row; batched: those 4 documents as a dense B=4 batch, the same
attention work, so varlen's distance from it is the cost of the layout, not of short documents), for the kernels the routing can take (``ffpa``: ffpa-attn through ffpa_patch's
low-copy entry; ``fa4``: flash-attn-4) and stock's (``sdpa``: SDPA with K/V repeated, as
Transformers 5.13+ runs full layers; with the window as a 4-D mask on sliding layers).

``--sp N...`` adds the head counts one rank of DeepSpeed Ulysses sees at degree N (query heads /N,
KV heads /N but at least 1, as DeepSpeed replicates them), over the whole sequence.

FLOPs stated: a (query, key) pair the mask allows costs 4·D multiply-adds forward per query head
(QK^T and PV) and 2.5 times that backward (dS, dQ, dK, dV and the recomputed P); causal pairs are
N(N+1)/2, windowed ones sum(min(i+1, W)); varlen counts each document's own pairs. ``%peak`` is
against a bf16 GEMM (8192^3) measured on the same card in the same process.

    python benchmarks/kernel_map.py --seqs 2048 4096 8192 16384 32768 --out benchmarks/results/<run>/kernel_map.json
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import cuda_ms, env_info, write  # noqa: E402

#: (query heads, KV heads) of the released models (benchmarks/models.py), and their sliding window
FULL = {"31B": (32, 4), "26B-A4B": (16, 2), "12B": (16, 1), "E4B": (8, 2), "E2B": (8, 1)}
SLIDING = {"31B": (32, 16, 1024), "26B-A4B": (16, 8, 1024), "12B": (16, 8, 1024), "E4B": (8, 2, 512), "E2B": (8, 1, 512)}


def pairs(n: int, window: int | None, docs: int) -> float:
    length = n // docs
    if window is None:
        return docs * length * (length + 1) / 2
    w = min(window, length)
    return docs * (w * (w + 1) / 2 + (length - w) * w)


def matmul_peak() -> float:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = cuda_ms(lambda: a @ b, warmup=3, iters=20)
    return 2 * 8192**3 / ms / 1e9


def kernel_fn(name: str, d: int, window, cu, max_len):
    from ffpa_patch.kernels import fa4, ffpa

    module = {"ffpa": ffpa, "fa4": fa4}.get(name)
    if module is not None:
        if cu is None:
            return lambda q, k, v: module.dense(q, k, v, d ** -0.5, window)
        return lambda q, k, v: module.varlen(q[0], k[0], v[0], cu, max_len, d ** -0.5, window)[None]

    def sdpa(q, k, v):  # [B, S, H, D] in, stock's computation
        n, rep = q.shape[1], q.shape[2] // k.shape[2]
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2).repeat_interleave(rep, 1), v.transpose(1, 2).repeat_interleave(rep, 1)
        if window is None and cu is None:
            return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True, scale=d ** -0.5).transpose(1, 2)
        i, j = torch.arange(n, device="cuda")[:, None], torch.arange(n, device="cuda")[None]
        mask = j <= i
        if window is not None:
            mask &= i - j < window
        if cu is not None:
            doc = torch.bucketize(torch.arange(n, device="cuda"), cu[1:], right=True)
            mask &= doc[:, None] == doc[None]
        return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, scale=d ** -0.5).transpose(1, 2)

    return sdpa  # [B, S, H, D] out, as the kernels


def measure(kernel: str, hq: int, hk: int, d: int, window, n: int, layout: str, iters: int) -> dict:
    docs = 1 if layout == "dense" else 4
    cu = torch.arange(0, n + 1, n // docs, device="cuda", dtype=torch.int32) if layout == "varlen" else None
    fn = kernel_fn(kernel, d, window, cu, n // docs)
    b, s = (docs, n // docs) if layout == "batched" else (1, n)
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for h in (hq, hk, hk))
    g = torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        fwd = cuda_ms(lambda: fn(q, k, v), warmup=2, iters=iters)
    out = fn(q, k, v)
    bwd = cuda_ms(lambda: torch.autograd.grad(out, (q, k, v), g, retain_graph=True), warmup=1, iters=iters)
    flop = 4 * hq * d * pairs(n, window, docs)
    return dict(kernel=kernel, hq=hq, hkv=hk, d=d, window=window, n=n, layout=layout, fwd_ms=fwd, bwd_ms=bwd,
                fwd_flop=flop, bwd_flop=2.5 * flop, fwd_tflops=flop / fwd / 1e9, bwd_tflops=2.5 * flop / bwd / 1e9)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqs", type=int, nargs="+", default=[2048, 4096, 8192, 16384, 32768])
    ap.add_argument("--models", nargs="+", default=list(FULL))
    ap.add_argument("--layers", nargs="+", default=["full", "sliding"], choices=["full", "sliding"])
    ap.add_argument("--layouts", nargs="+", default=["dense", "varlen"], choices=["dense", "varlen", "batched"])
    ap.add_argument("--sp", type=int, nargs="+", default=[1], help="Ulysses degrees whose per-rank head counts to add")
    ap.add_argument("--kernels", nargs="+", default=["ffpa", "fa4", "sdpa"])
    ap.add_argument("--sdpa-max", type=int, default=16384, help="longest length stock SDPA is timed at")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    peak = matmul_peak()
    print(f"bf16 GEMM 8192^3: {peak:.0f} TF/s", flush=True)
    rows, env = [], env_info()
    for layer in a.layers:
        for model in a.models:
            hq_model, hk_model, window = (*FULL[model], None) if layer == "full" else SLIDING[model]
            d = 512 if layer == "full" else 256
            for sp, kernel in ((sp, kernel) for sp in a.sp for kernel in a.kernels):
                if hq_model % sp:
                    continue
                hq, hk = hq_model // sp, max(hk_model // sp, 1)
                if (kernel == "ffpa") != (layer == "full") and kernel != "sdpa":
                    continue
                for layout in a.layouts:
                    for n in a.seqs:
                        if kernel == "sdpa" and n > a.sdpa_max:
                            continue
                        try:
                            row = dict(model=model, layer=layer, sp=sp, **measure(kernel, hq, hk, d, window, n, layout, a.iters))
                        except Exception as exc:  # out of memory, or a kernel that refuses the shape
                            row = dict(model=model, layer=layer, sp=sp, kernel=kernel, n=n, layout=layout, error=f"{type(exc).__name__}: {exc}"[:300])
                        row["fwd_pct_peak"] = 100 * row["fwd_tflops"] / peak if "fwd_tflops" in row else None
                        row["bwd_pct_peak"] = 100 * row["bwd_tflops"] / peak if "bwd_tflops" in row else None
                        rows.append(row)
                        print({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
                        torch.cuda.empty_cache()
                        write(a.out, {"env": env, "matmul_peak_tflops": peak, "rows": rows,  # as it goes: a timeout keeps the rows
                                      "command": "python benchmarks/kernel_map.py " + " ".join(sys.argv[1:])})


if __name__ == "__main__":
    main()
