"""NeMo-Automodel's Gemma4-MoE (26B-A4B) training under its own context parallelism, with and without
ffpa_patch: how many of the full layers' ring steps ran FFPA, and NeMo's benchmark recipe's step times
(issue: multi-GPU runs, item 3).

NeMo-Automodel 0.6.x ignores ``cp_full_attn_backend: ffpa`` on MoE decoder layers (their ring is attached
without ``use_ffpa``); ffpa_patch's ``nemo_moe_ring`` patch passes it. 0.7.0 does it itself, and the patch
reports *not needed*. The counts come from wrapping NeMo's own ring functions
(``nemo_automodel.components.models.gemma4_moe.cp_attention``): ``_ring_use_ffpa_varlen`` (each layer
call's decision, by head_dim), ``_ffpa_dense_fwd`` / ``_ffpa_varlen_fwd`` (FFPA chunks) and
``_run_gemma4_flex_chunk`` (FlexAttention chunks, by head_dim).

  python benchmarks/nemo_ring_cp.py --write-config DIR [--layers N] [--tiny]
      a Gemma4 26B-A4B config folder (random weights; text_config.cp_full_attn_backend: ffpa)
  [ffpa-patch run --] torchrun --nproc-per-node 2 benchmarks/nemo_ring_cp.py --label L --out OUT.json \\
      --config benchmarks/nemo_ring_cp.yaml --model.config.pretrained_model_name_or_path DIR \\
      --distributed.cp_size 2 --dataset.seq_len 16384 --benchmark.json_output_path SUMMARY.json
      NeMo's benchmark recipe (every argument after --label/--out is NeMo's); rank 0 appends one row to OUT

The driver is benchmarks/run/multi_gpu.sh (parts N6, N6P, N7P).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys

COUNTS: collections.Counter = collections.Counter()
RING = "nemo_automodel.components.models.gemma4_moe.cp_attention"


def write_config(path: str, layers: int | None, tiny: bool, vocab: int) -> None:
    from transformers import Gemma4Config
    from transformers.models.gemma4.configuration_gemma4 import Gemma4VisionConfig

    from benchmarks.models import text_config

    text = text_config("26b-a4b", vocab=vocab, layers=layers, tiny=tiny)
    text.cp_full_attn_backend = "ffpa"  # NeMo reads it from the text config (its Gemma 4 CP recipes do the same)
    text.pad_token_id = 0
    vision = Gemma4VisionConfig(hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                num_key_value_heads=2, head_dim=16)  # text batches only: the tower is never run
    cfg = Gemma4Config(text_config=text.to_dict(), vision_config=vision.to_dict(), audio_config=None)
    cfg.architectures = ["Gemma4ForConditionalGeneration"]  # NeMo's registry maps it to its MoE model
    cfg.save_pretrained(path)


def install_counters() -> None:
    """Count NeMo's ring decisions and chunk calls (wrapt: the functions stay NeMo's, called as before)."""
    import wrapt

    def by_head_dim(name, head_dim_of):
        def counted(wrapped, instance, args, kwargs):
            result = wrapped(*args, **kwargs)
            suffix = f" -> {result}" if isinstance(result, bool) else ""
            COUNTS[f"{name} head_dim {head_dim_of(args, kwargs)}{suffix}"] += 1
            return result
        return counted

    def plain(name):
        def counted(wrapped, instance, args, kwargs):
            COUNTS[name] += 1
            return wrapped(*args, **kwargs)
        return counted

    def query_dim(args, kwargs):
        ctx = args[1] if len(args) > 1 else kwargs["ctx"]
        return ctx.query.shape[-1]

    wrapt.wrap_function_wrapper(RING, "_ring_use_ffpa_varlen", by_head_dim("ring uses FFPA", query_dim))
    wrapt.wrap_function_wrapper(RING, "_run_gemma4_flex_chunk", by_head_dim("flex chunk", query_dim))
    for name in ("_ffpa_dense_fwd", "_ffpa_varlen_fwd"):
        wrapt.wrap_function_wrapper(RING, name, plain(f"FFPA chunk {name}"))


def gathered_counts() -> list[dict]:
    import torch.distributed as dist

    mine = dict(COUNTS)
    if not (dist.is_available() and dist.is_initialized()):
        return [mine]
    every = [None] * dist.get_world_size()
    try:  # NeMo keeps its process group until exit (atexit), so the ranks can still meet here
        dist.all_gather_object(every, mine)
    except Exception as exc:  # noqa: BLE001 - the row says so rather than losing rank 0's counts
        return [{**mine, "gather failed": f"{type(exc).__name__}: {exc}"[:200]}]
    return every


def run(label: str, out: str, nemo_args: list[str]) -> None:
    import importlib.metadata as md

    import ffpa_patch

    install_counters()
    from nemo_automodel.recipes.llm import benchmark

    sys.argv = [sys.argv[0], *nemo_args]  # NeMo's parser reads --config and --dotted.key overrides from argv
    benchmark.main()
    counts = gathered_counts()
    if int(os.environ.get("RANK", "0")) != 0:
        return
    summary_path = next((nemo_args[i + 1] for i, a in enumerate(nemo_args[:-1]) if a == "--benchmark.json_output_path"), None)
    status = ffpa_patch.status()
    row = {
        "label": label,
        "nemo_automodel": md.version("nemo-automodel"),
        "transformers": md.version("transformers"),
        "ffpa_patch": status.state,
        "nemo_moe_ring": next((p for p in status.patches if p["name"] == "nemo_moe_ring"), None),
        "ring_counts_per_rank": counts,
        "nemo_args": nemo_args,
        "summary": json.load(open(summary_path)) if summary_path and os.path.exists(summary_path) else None,
    }
    with open(out, "a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write-config", metavar="DIR")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default: the released 30)")
    ap.add_argument("--tiny", action="store_true", help="CPU-sized widths, same structure")
    ap.add_argument("--vocab", type=int, default=262144)
    ap.add_argument("--label", default="run")
    ap.add_argument("--out", default="nemo_ring_cp.json")
    a, nemo_args = ap.parse_known_args()
    if a.write_config:
        write_config(a.write_config, a.layers, a.tiny, a.vocab)
        return
    run(a.label, a.out, nemo_args)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main()
