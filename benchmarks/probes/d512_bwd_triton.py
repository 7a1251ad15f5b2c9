"""ffpa_patch's Triton head_dim-512 backward (ffpa_patch/kernels/d512_bwd.py, design M of
docs/notes/d512-backward-design.md: no recomputation, P and dS through HBM) against ffpa-attn 0.2.4's,
on the released full-layer shapes, dense and packed: time, counted TF/s, errors against fp32 and ffpa-attn.
Until commit 29c8078 the kernels lived in this file (results/2026-12-08-h100-a ran them from here).
A GPU probe; the index math is checked on a CPU by tests/test_d512_backward.py.

    python benchmarks/probes/d512_bwd_triton.py --out benchmarks/results/<run>/d512_bwd_triton.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from ffpa_patch.kernels import reference
from ffpa_patch.kernels.d512_bwd import CONFIG as DEFAULT_CFG
from ffpa_patch.kernels.d512_bwd import backward, chunk_plan


def fp32_reference(q, k, v, dout, scale):
    """out, lse (nats), dq, dk, dv in fp32, from ffpa_patch's reference kernels."""
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    grads = torch.autograd.grad(reference.attention(qf, kf, vf, scale), (qf, kf, vf), dout.float())
    return (*reference.attention_lse(qf.detach(), kf.detach(), vf.detach(), scale), *grads)


def rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)).item()


SWEEP_PDS = ({"GROUP_M": 1}, {"GROUP_M": 16})  # 1: the tile order of 29c8078
SWEEP_GEMM = ({"BLOCK_D": 128}, {"BLOCK_K": 32, "num_stages": 4})
SEGMENT_TOKENS = (2048, 4096, 8192)
HEADS = {"31B": (32, 4), "26B-A4B": (16, 2), "12B": (16, 1), "E2B": (8, 1),
         "31B-sp8": (4, 1)}  # what one Ulysses rank runs at sp 8: the whole sequence, an eighth of the heads


def sweep_configs() -> list[dict]:
    cfgs = [DEFAULT_CFG]
    for pds in SWEEP_PDS:
        cfgs.append({**DEFAULT_CFG, "pds": {**DEFAULT_CFG["pds"], **pds}})
    for g in SWEEP_GEMM:
        cfgs.append({**DEFAULT_CFG, "kv": {**DEFAULT_CFG["kv"], **g}, "q": {**DEFAULT_CFG["q"], **g}})
    return cfgs


def exactness_row() -> dict:
    """A small case with the 31B's heads against fp32 autograd, ffpa-attn's error beside ours."""
    ops, scale = torch.ops.ffpa_attn, 512 ** -0.5
    torch.manual_seed(0)
    q, k, v, dout = (torch.randn(1, 2048, h, 512, device="cuda", dtype=torch.bfloat16) for h in (32, 4, 4, 32))
    _, lse, rq, rk, rv = fp32_reference(q, k, v, dout, scale)
    out, flse = ops._fwd_cute(q, k, v, scale, 1, 1)
    ours = backward(dout, q, k, v, out, flse, scale)
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
            ms = cuda_ms(lambda c=cfg: backward(dout, q, k, v, out, lse, scale, config=c,
                                                              scratch_bytes=scratch_gb * 1e9), warmup=1, iters=3)
            ours = backward(dout, q, k, v, out, lse, scale, config=cfg, scratch_bytes=scratch_gb * 1e9)
            row[f"cfg{ci}"] = {"cfg": cfg, "ms": ms, "tflops": flop / ms / 1e9, "speedup": ffpa_ms / ms,
                               "rel_diff_vs_ffpa": [rel_err(x, y) for x, y in zip(ours, theirs)]}
            if time.time() > deadline:
                break
    row["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return row


def packed_row(model: str, n: int, doc: int, scratch_gb: float, cuda_ms) -> dict:
    """Packed documents of ``doc`` tokens (the last one shorter) filling ``n``: ffpa-attn's varlen backward
    against the Triton kernel's varlen mode (``cu_seqlens``), counted over the documents' causal areas."""
    ops, scale = torch.ops.ffpa_attn, 512 ** -0.5
    from ffpa_patch.kernels import ffpa as ffpa_kernels

    hq, hkv = HEADS[model]
    torch.manual_seed(0)
    q, k, v, dout = (torch.randn(n, h, 512, device="cuda", dtype=torch.bfloat16) for h in (hq, hkv, hkv, hq))
    bounds = list(range(0, n, doc)) + [n]
    cu = torch.tensor(bounds, device="cuda", dtype=torch.int32)
    longest = max(b - a for a, b in zip(bounds, bounds[1:]))
    flop = 2.5 * 4 * hq * 512 * sum((b - a) * (b - a + 1) / 2 for a, b in zip(bounds, bounds[1:]))
    row = {"model": model, "n": n, "doc": doc, "documents": len(bounds) - 1, "hq": hq, "hkv": hkv, "scratch_gb": scratch_gb,
           "chunk_plan": chunk_plan(hq, hkv, n, scratch_gb * 1e9)}
    with torch.no_grad():
        out, lse = ffpa_kernels.varlen_lse(q, k, v, cu, longest, scale)
        theirs_fn = lambda: ops._varlen_bwd_cute(q, k, v, out, dout, lse, cu, cu, longest, longest, scale, True,  # noqa: E731
                                                 ffpa_kernels._no_window(), ffpa_kernels._no_window(), 0.0, None)
        ffpa_ms = cuda_ms(theirs_fn, warmup=1, iters=3)
        ms = cuda_ms(lambda: backward(dout, q, k, v, out, lse, scale, scratch_bytes=scratch_gb * 1e9, cu_seqlens=cu),
                     warmup=1, iters=3)
        ours = backward(dout, q, k, v, out, lse, scale, scratch_bytes=scratch_gb * 1e9, cu_seqlens=cu)
        theirs = theirs_fn()
        row.update(ffpa_ms=ffpa_ms, ffpa_tflops=flop / ffpa_ms / 1e9, ms=ms, tflops=flop / ms / 1e9, speedup=ffpa_ms / ms,
                   rel_diff_vs_ffpa=[rel_err(x, y) for x, y in zip(ours, theirs)])
        for seg in SEGMENT_TOKENS:  # the candidate: segments of whole documents (d512_bwd.segments)
            run = lambda s=seg: backward(dout, q, k, v, out, lse, scale, scratch_bytes=scratch_gb * 1e9,  # noqa: E731
                                         cu_seqlens=cu, segment_tokens=s)
            seg_ms = cuda_ms(run, warmup=1, iters=3)
            row[f"segments_{seg}"] = {"ms": seg_ms, "tflops": flop / seg_ms / 1e9, "speedup": ffpa_ms / seg_ms,
                                      "rel_diff_vs_ffpa": [rel_err(x, y) for x, y in zip(run(), theirs)]}
    row["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--shapes", nargs="+", default=["31B:8192", "31B:16384", "31B:16384:0.25", "31B:32768", "12B:16384", "26B-A4B:16384",
                             "E2B:16384", "31B:4096", "12B:4096", "31B-sp8:65536", "31B-sp8:131072",
                             "31B:16384:docs2048", "31B:16384:docs512", "26B-A4B:8192:docs1024"],
                    help="MODEL:TOKENS[:SCRATCH_GB][:docsN] (scratch 1 GiB unless given; docsN: packed documents of N tokens)")
    ap.add_argument("--sweep", action="store_true", help="try a few tile configs at the first shape")
    ap.add_argument("--budget-s", type=float, default=300)
    a = ap.parse_args()
    import ffpa_attn.cute  # noqa: F401  (registers torch.ops.ffpa_attn.*)

    from benchmarks.common import cuda_ms, env_info

    deadline = time.time() + a.budget_s
    rows = []
    for i, spec in enumerate(["check"] + a.shapes):
        try:
            if spec == "check":
                row = exactness_row()
            else:
                model, n, *rest = spec.split(":")
                docs = [int(r[4:]) for r in rest if r.startswith("docs")]
                gb = [float(r) for r in rest if not r.startswith("docs")]
                scratch = gb[0] if gb else 2**30 / 1e9
                if docs:
                    row = packed_row(model, int(n), docs[0], scratch, cuda_ms)
                else:
                    row = timing_row(model, int(n), scratch, sweep_configs() if a.sweep and i == 1 else [DEFAULT_CFG], cuda_ms, deadline)
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
