"""Dynamo graph-break report: a tiny Gemma4 (31B layer pattern) on the GPU, stock vs patched.

python benchmarks/probes/graph_breaks.py --out benchmarks/results/graph_breaks.json
Each break is listed with its reason and the innermost frames of the user stack, so
breaks caused by ffpa_patch (file paths under ffpa_patch/) are told apart from others.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tests"))
import ffpa_patch  # noqa: E402
import tiny  # noqa: E402
from benchmarks.common import env_info, write  # noqa: E402


def explain(attn, padded):
    ffpa_patch.revert()
    if attn != "sdpa-stock":
        ffpa_patch.apply()
    model = tiny.causal_lm("dense31b", attn="sdpa" if attn.startswith("sdpa") else attn, head_dim=256, hidden_size=256)
    model = model.to("cuda", torch.bfloat16).train()
    ids = torch.randint(0, 128, (2, 1024), device="cuda")
    kw = {}
    if padded:
        mask = torch.ones_like(ids)
        mask[0, :100] = 0
        kw["attention_mask"] = mask
    torch._dynamo.reset()
    result = torch._dynamo.explain(model)(ids, labels=ids, **kw)
    breaks = []
    for r in result.break_reasons:
        frames = [f"{f.filename.split('site-packages/')[-1].split('/work/main/')[-1]}:{f.lineno} {f.name}" for f in r.user_stack[-4:]]
        breaks.append({"reason": r.reason.splitlines()[0][:200], "frames": frames,
                       "ffpa_patch": any("ffpa_patch" in f.filename for f in r.user_stack)})
    return {"model": attn, "padded": padded, "graphs": result.graph_count, "graph_breaks": result.graph_break_count,
            "distinct_reasons": len(breaks), "caused_by_ffpa_patch": sum(b["ffpa_patch"] for b in breaks), "breaks": breaks}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results/graph_breaks.json")
    args = ap.parse_args()
    rows = []
    for attn in ("sdpa-stock", "ffpa", "sdpa-dropin"):
        for padded in (False, True):
            rows.append(explain(attn, padded))
            print({k: v for k, v in rows[-1].items() if k != "breaks"}, flush=True)
            for b in rows[-1]["breaks"]:
                print("   ", b["reason"], b["frames"][-2:], flush=True)
    write(args.out, {"env": env_info(), "rows": rows})


if __name__ == "__main__":
    main()
