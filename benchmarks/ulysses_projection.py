"""A projection, from one GPU, of a Gemma 4 training step under DeepSpeed Ulysses SP on N GPUs.

Under Ulysses each rank runs attention on H/N query heads over the whole sequence (its KV heads
replicated up to N where N exceeds them, as DeepSpeed does), and four all-to-alls per layer move
q, k, v in and the output back. This script times exactly that per-rank attention on the one GPU
it has (ffpa_patch's kernels: FFPA on full layers, flash-attn-4 on sliding ones, fwd and bwd),
adds the all-to-all volume at an assumed NVLink bandwidth, and the rest of the step from a
measured attention-free step of the same model on one GPU (``--floor-tps``: tokens/s of
benchmarks/full_model.py ``--backend floor``), scaled to the rank's S/N tokens. With gradient
checkpointing a layer's forward runs twice (and its exchanges too). Nothing overlaps in the
projection: it is an upper bound on the step time of the model it describes. It is a projection,
not a multi-GPU measurement (that needs several GPUs: benchmarks/README.md says which issue).

    python benchmarks/ulysses_projection.py --model 31B --degrees 8 4 --seqs 65536 131072 \\
        --floor-tps 1946 --out benchmarks/results/<run>/ulysses_projection.json
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import env_info, write  # noqa: E402
from benchmarks.kernel_map import FULL, SLIDING, measure  # noqa: E402

#: layers of each released model: (full, sliding) (benchmarks/models.py: 5 sliding : 1 full, E2B 4 : 1)
LAYERS = {"31B": (10, 50), "26B-A4B": (5, 25), "12B": (8, 40), "E4B": (7, 35), "E2B": (7, 28)}


def per_rank(model: str, degree: int) -> dict:
    hq, hk_full = FULL[model]
    _, hk_sliding, window = SLIDING[model]
    if hq % degree:
        raise ValueError(f"{model}: {hq} query heads do not split {degree} ways")
    return {"full": (hq // degree, max(hk_full // degree, 1), 512, None, max(hk_full, degree)),
            "sliding": (hq // degree, max(hk_sliding // degree, 1), 256, window, max(hk_sliding, degree))}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="31B", choices=list(LAYERS))
    ap.add_argument("--degrees", type=int, nargs="+", default=[8, 4])
    ap.add_argument("--seqs", type=int, nargs="+", default=[65536, 131072])
    ap.add_argument("--floor-tps", type=float, required=True,
                    help="measured tokens/s of the attention-free step of this model on one GPU (full_model.py --backend floor)")
    ap.add_argument("--nvlink-gbs", type=float, default=350.0,
                    help="assumed all-to-all bandwidth per GPU in GB/s (not measured here)")
    ap.add_argument("--one-gpu-tps", type=float, default=None, help="ffpa_patch on one GPU at its longest length, to compare")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    n_full, n_sliding = LAYERS[a.model]
    rows = []
    for degree in a.degrees:
        shapes = per_rank(a.model, degree)
        for seq in a.seqs:
            local = seq // degree
            row = {"model": a.model, "degree": degree, "seq": seq, "tokens_per_rank": local}
            attn_s, comm_bytes = 0.0, 0.0
            for layer, count in (("full", n_full), ("sliding", n_sliding)):
                hq, hk, d, window, hk_sent = shapes[layer]
                kernel = "ffpa" if layer == "full" else "fa4"
                m = measure(kernel, hq, hk, d, window, seq, "dense", a.iters)
                torch.cuda.empty_cache()
                per_layer = (2 * m["fwd_ms"] + m["bwd_ms"]) / 1e3  # forward, its checkpointed recompute, backward
                # each rank sends (N-1)/N of its local q, k, v (KV replicated to hk_sent heads first) and output, bf16
                sent = (degree - 1) / degree * local * 2 * (2 * hq * degree * d + 2 * hk_sent * d)
                row[layer] = {"q_heads": hq, "kv_heads": hk, "head_dim": d, "window": window, "kernel": kernel,
                              "fwd_ms": m["fwd_ms"], "bwd_ms": m["bwd_ms"], "fwd_tflops": m["fwd_tflops"],
                              "bwd_tflops": m["bwd_tflops"], "layers": count, "exchange_mb_per_pass": sent / 1e6}
                attn_s += count * per_layer
                comm_bytes += count * 3 * sent  # forward, recompute, backward
                print(a.model, degree, seq, layer, {k: round(v, 2) if isinstance(v, float) else v for k, v in row[layer].items()}, flush=True)
            rest_s = local / a.floor_tps
            comm_s = comm_bytes / (a.nvlink_gbs * 1e9)
            step = rest_s + attn_s + comm_s
            row.update(attention_s=attn_s, exchange_s=comm_s, exchange_gb=comm_bytes / 1e9, rest_s=rest_s, step_s=step,
                       tokens_per_s_per_gpu=local / step, floor_tokens_per_s_per_gpu=local / (rest_s + comm_s))
            rows.append(row)
            print({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items() if k not in ("full", "sliding")}, flush=True)
    write(a.out, {"env": env_info(), "assumptions": {"floor_tps": a.floor_tps, "nvlink_gbs": a.nvlink_gbs,
                                                     "one_gpu_tps": a.one_gpu_tps, "overlap": "none"},
                  "rows": rows, "command": "python benchmarks/ulysses_projection.py " + " ".join(sys.argv[1:])})


if __name__ == "__main__":
    main()
