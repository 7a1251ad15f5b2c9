"""Timing helpers shared by the benchmarks (CUDA events, medians, peak memory)."""
import json
import os
import statistics
import sys

import torch


def cuda_ms(fn, warmup=2, iters=10):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def env_info():
    import transformers

    info = {"torch": torch.__version__, "transformers": transformers.__version__, "gpu": torch.cuda.get_device_name()}
    for dist in ("ffpa-attn", "flash-attn-4", "liger-kernel"):
        try:
            from importlib.metadata import version

            info[dist] = version(dist)
        except Exception:
            info[dist] = None
    info["PYTORCH_CUDA_ALLOC_CONF"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")  # changes what fits (64k on an H100)
    return info


def write(path, data):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
    print(f"wrote {path}", file=sys.stderr)
