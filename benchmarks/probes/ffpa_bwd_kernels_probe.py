"""ffpa-attn 0.2.4's head_dim-512 backward split into its kernels (preprocess, dK/dV, dQ, and any copies),
each one's GPU time from torch.profiler, at the released full-layer shapes: the first measurement
docs/notes/d512-backward-design.md asks for before any new kernel is written. Dense, causal, bf16, B=1;
one profiled backward after two warm-up calls. A GPU probe (the op is called directly).

    python benchmarks/probes/ffpa_bwd_kernels_probe.py --out benchmarks/results/<run>/ffpa_bwd_kernels.json
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from benchmarks.common import env_info  # noqa: E402

SHAPES = {"31B": (32, 4), "26B-A4B": (16, 2), "12B": (16, 1), "E2B": (8, 1)}


def kernels_of_one_backward(hq, hk, n, d=512) -> dict:
    ops, scale = torch.ops.ffpa_attn, d ** -0.5
    q, k, v = (torch.randn(1, n, h, d, device="cuda", dtype=torch.bfloat16) for h in (hq, hk, hk))
    dout = torch.randn(1, n, hq, d, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        out, lse = ops._fwd_cute(q, k, v, scale, 1, 1)
        for _ in range(2):
            ops._bwd_cute(dout, q, k, v, out, lse, scale, 1, 0)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            ops._bwd_cute(dout, q, k, v, out, lse, scale, 1, 0)
            torch.cuda.synchronize()
    times = collections.defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            times[event.name[:120]] += event.device_time_total / 1e3  # ms
    flop = 2.5 * 4 * hq * d * n * (n + 1) / 2
    total = sum(times.values())
    return {"kernels_ms": dict(sorted(times.items(), key=lambda kv: -kv[1])), "total_ms": total,
            "bwd_tflops_counted": flop / total / 1e9}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqs", type=int, nargs="+", default=[16384, 32768])
    ap.add_argument("--models", nargs="+", default=list(SHAPES))
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    import ffpa_attn.cute  # noqa: F401  (registers torch.ops.ffpa_attn.*)

    rows = []
    for model in a.models:
        hq, hk = SHAPES[model]
        for n in a.seqs:
            row = {"model": model, "hq": hq, "hkv": hk, "n": n}
            try:
                row.update(kernels_of_one_backward(hq, hk, n))
            except Exception as exc:  # noqa: BLE001 - a probe row records its failure
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            rows.append(row)
            print(json.dumps(row), flush=True)
            with open(a.out, "w") as f:
                json.dump({"env": env_info(), "rows": rows, "command": " ".join(sys.argv)}, f, indent=1)


if __name__ == "__main__":
    main()
