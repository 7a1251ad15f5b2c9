"""One Gemma4-31B full-attention layer (B=1, Hq=32, Hkv=4, D=512, causal, bf16).

python benchmarks/kernel.py --seqs 4096 8192 16384 32768 --out benchmarks/results/kernel.json
FlexAttention is compiled (dynamic=False) with NeMo's small tiles, which D=512 needs.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import cuda_ms, env_info, write  # noqa: E402

HQ, HKV, D = 32, 4, 512


def flops(n, bwd):
    f = 4 * n * n * D * HQ / 2  # causal
    return f * (3.5 if bwd else 1.0)


def variants():
    from ffpa_attn import ffpa_attn_func

    from ffpa_patch.kernels import ffpa, flex

    F = torch.nn.functional

    def shim(q, k, v):  # q/k/v in Gemma4's [B, H, S, D] transposed-view layout
        return ffpa.dense(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), 1.0)

    def raw(q, k, v):
        return ffpa_attn_func(q, k, v, is_causal=True, scale=1.0, enable_gqa=True, backend="cutedsl").transpose(1, 2).contiguous()

    def sdpa_repeat(q, k, v):
        r = HQ // HKV
        return F.scaled_dot_product_attention(q, k.repeat_interleave(r, 1), v.repeat_interleave(r, 1), is_causal=True, scale=1.0).transpose(1, 2).contiguous()

    def sdpa_gqa_math(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0, enable_gqa=True).transpose(1, 2).contiguous()

    def flex_attention(q, k, v):
        return flex.block(q, k, v, None, 1.0, None)

    return {"ffpa_patch low-copy": shim, "ffpa_attn_func": raw, "sdpa repeat-KV": sdpa_repeat,
            "sdpa enable_gqa (MATH)": sdpa_gqa_math, "flex (small tiles)": flex_attention}


def inputs(n):
    # Gemma4 layout: [B, S, H, D] storage handed over as [B, H, S, D] views
    return [torch.randn(1, n, h, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_() for h in (HQ, HKV, HKV)]


def held_for_backward(fn, n):
    q, k, v = inputs(n)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    out = fn(q, k, v)
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - before - out.numel() * out.element_size()
    del out
    return held


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", type=int, nargs="+", default=[4096, 8192, 16384, 32768])
    ap.add_argument("--variants", nargs="+", default=None, help="names (default: all)")
    ap.add_argument("--math-max", type=int, default=8192)
    ap.add_argument("--out", default="benchmarks/results/kernel.json")
    args = ap.parse_args()
    rows = []
    for n in args.seqs:
        for name, fn in variants().items():
            if "MATH" in name and n > args.math_max or args.variants and name not in args.variants:
                continue
            q, k, v = inputs(n)
            g = torch.randn(1, n, HQ, D, device="cuda", dtype=torch.bfloat16)
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            with torch.no_grad():
                fwd = cuda_ms(lambda: fn(q, k, v))
            fb = cuda_ms(lambda: fn(q, k, v).backward(g))
            peak = (torch.cuda.max_memory_allocated() - base) / 2**30
            held = held_for_backward(fn, n) / 2**20
            rows.append(dict(n=n, variant=name, fwd_ms=fwd, fwd_bwd_ms=fb, fwd_tflops=flops(n, False) / fwd / 1e9,
                             fwd_bwd_tflops=flops(n, True) / fb / 1e9, extra_peak_gib=peak, held_for_backward_mib=held))
            print(rows[-1], flush=True)
            del q, k, v, g
            torch.cuda.empty_cache()
    write(args.out, {"env": env_info(), "shape": dict(B=1, Hq=HQ, Hkv=HKV, D=D, causal=True, dtype="bf16"), "rows": rows})


if __name__ == "__main__":
    main()
