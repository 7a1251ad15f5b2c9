"""Where a full-depth training step's time goes, from the kernel map: attention per layer kind, forward
and backward, against the attention-free floor, per model and length; and what a faster head_dim-512
backward would give.

A step with plain (non-reentrant) checkpointing runs each layer's attention forward twice (the forward
and its recomputation) and backward once, so one step's attention is, per layer kind,
``layers x (2 x fwd_ms + bwd_ms)`` at that model's dense shapes (kernel_map.py rows, sp=1, B=1). The rest
of the step is the attention-free floor measured at full depth (full_model.py ``--backend floor``): its
tokens/s at the nearest measured length scales to other lengths (it barely moves with length: 31B 1,923
tok/s at 8k, 1,946 at 16k). Where ffpa_patch's own full-depth step was measured, the projection is
checked against it (``measured_attention_s`` = patched step - floor step).

    python benchmarks/attention_share.py --map benchmarks/results/<run>/kernel_map.json \
        --full benchmarks/results/2026-12-06-h100-d/full_model.json benchmarks/results/2026-12-07-h100-a/full_model.json \
        --out benchmarks/results/<run>/attention_share.json [--plot benchmarks/results/<run>/attention_share.png]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import write
from benchmarks.models import PERIOD, RELEASED

#: kernel_map.py's model names -> benchmarks/models.py's
NAMES = {"31B": "31b", "26B-A4B": "26b-a4b", "12B": "12b", "E4B": "e4b", "E2B": "e2b"}
FUSED = {"full": "ffpa", "sliding": "fa4"}


def layer_counts(model: str) -> dict:
    layers = RELEASED[model]["num_hidden_layers"]
    full = layers // PERIOD[model]
    return {"full": full, "sliding": layers - full}


def floors(full_rows: list[dict]) -> dict:
    """(model, seq) -> floor tokens/s, and (model, seq) -> patched step seconds, at plain checkpointing."""
    floor, patched = {}, {}
    for r in full_rows:
        if r.get("ckpt") != "plain" or "tokens_per_s" not in r:
            continue
        key = (r["model"], r["seq"])
        if r["backend"] == "floor":
            floor[key] = r["tokens_per_s"]
        elif r["backend"] == "ffpa":
            patched[key] = r["step_s"]
    return floor, patched


def nearest_floor(floor: dict, model: str, n: int):
    seqs = sorted(s for m, s in floor if m == model)
    if not seqs:
        return None, None
    s = min(seqs, key=lambda s: abs(s - n))
    return floor[(model, s)], s


def share(map_rows: list[dict], floor: dict, patched: dict, faster_bwd: float) -> list[dict]:
    kern = {(r["model"], r["layer"], r["n"]): r for r in map_rows
            if r.get("sp", 1) == 1 and r.get("layout") == "dense" and "fwd_ms" in r and r["kernel"] == FUSED[r["layer"]]}
    out = []
    for model_map, model in NAMES.items():
        counts = layer_counts(model)
        for n in sorted({n for m, _, n in kern if m == model_map}):
            parts = {}
            for layer in ("full", "sliding"):
                r = kern.get((model_map, layer, n))
                if r is None:
                    break
                parts[f"{layer}_fwd_s"] = counts[layer] * 2 * r["fwd_ms"] / 1e3
                parts[f"{layer}_bwd_s"] = counts[layer] * r["bwd_ms"] / 1e3
            else:
                tps, floor_seq = nearest_floor(floor, model, n)
                if tps is None:
                    continue
                attention = sum(parts.values())
                rest = n / tps
                step = rest + attention
                row = {"model": model, "n": n, **parts, "attention_s": attention, "floor_s": rest,
                       "floor_from_seq": floor_seq, "step_s": step, "attention_share": attention / step,
                       "tokens_per_s": n / step, "pct_of_floor": 100 * rest / step,
                       f"step_s_bwd{faster_bwd:g}x": step - parts["full_bwd_s"] * (1 - 1 / faster_bwd)}
                row[f"gain_bwd{faster_bwd:g}x"] = step / row[f"step_s_bwd{faster_bwd:g}x"] - 1
                if (model, n) in patched and floor_seq == n:
                    row["measured_step_s"] = patched[(model, n)]
                    row["measured_attention_s"] = patched[(model, n)] - n / tps
                out.append(row)
    return out


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = [m for m in NAMES.values() if any(r["model"] == m for r in rows)]
    fig, axes = plt.subplots(1, len(models), figsize=(3.2 * len(models), 3.4), sharey=True, squeeze=False)
    for ax, model in zip(axes[0], models):
        rs = [r for r in rows if r["model"] == model]
        x = [f"{r['n'] // 1024}k" for r in rs]
        bottom = [0.0] * len(rs)
        for key, label in (("full_bwd_s", "full bwd (FFPA)"), ("full_fwd_s", "full fwd x2"),
                           ("sliding_bwd_s", "sliding bwd (FA4)"), ("sliding_fwd_s", "sliding fwd x2")):
            vals = [100 * r[key] / r["step_s"] for r in rs]
            ax.bar(x, vals, bottom=bottom, label=label)
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_title(model)
        ax.set_xlabel("tokens")
    axes[0][0].set_ylabel("% of the step")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle("attention's share of a full-depth step (LoRA, checkpointing; kernel map + floor)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--map", required=True, help="kernel_map.py's JSON")
    ap.add_argument("--full", nargs="+", required=True, help="full_model.py JSONs with floor rows")
    ap.add_argument("--faster-bwd", type=float, default=1.5, help="the head_dim-512 backward speed-up to evaluate")
    ap.add_argument("--out", required=True)
    ap.add_argument("--plot")
    a = ap.parse_args()
    kmap = json.load(open(a.map))
    full_rows = [r for path in a.full for r in json.load(open(path))["rows"]]
    floor, patched = floors(full_rows)
    rows = share(kmap["rows"], floor, patched, a.faster_bwd)
    for r in rows:
        print(f"{r['model']:8s} {r['n']:6d}  attention {r['attention_s']:6.2f} s of {r['step_s']:6.2f} "
              f"({100 * r['attention_share']:4.1f}%; full bwd {r['full_bwd_s']:5.2f} s)  "
              f"{r['pct_of_floor']:4.1f}% of floor  {a.faster_bwd:g}x bwd: +{100 * r[f'gain_bwd{a.faster_bwd:g}x']:.1f}%"
              + (f"  measured attention {r['measured_attention_s']:.2f} s" if "measured_attention_s" in r else ""))
    write(a.out, {"map_env": kmap.get("env"), "map": a.map, "full": a.full, "rows": rows,
                  "command": "python benchmarks/attention_share.py " + " ".join(sys.argv[1:])})
    if a.plot:
        plot(rows, a.plot)


if __name__ == "__main__":
    main()
