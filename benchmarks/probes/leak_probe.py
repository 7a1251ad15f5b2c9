"""What stays allocated on the GPU after one patched e2e run (was: the +5.5 GiB of a second model).

python benchmarks/probes/leak_probe.py [--backend ffpa|ffpa-flex|sdpa-dropin|...]
-> GiB still allocated, the largest live CUDA tensors with their first referrers, and,
where objgraph is importable, the shortest reference chain from a module to the largest
one (what keeps the dead model alive). On the H200 before the fix: 6.1 GiB, the dead model's
weights, held by the first forward's frames through CuTeDSL's import (README, "The leak");
after it 0.06 GiB.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from benchmarks import e2e  # noqa: E402


def describe(obj) -> str:
    import types

    if isinstance(obj, types.FrameType):
        return f"frame {obj.f_code.co_name} ({obj.f_code.co_filename}:{obj.f_lineno})"
    if isinstance(obj, dict):
        return f"dict keys={list(obj)[:6]}"
    if isinstance(obj, (list, tuple)):
        return f"{type(obj).__name__} len={len(obj)}"
    if isinstance(obj, types.FunctionType):
        return f"function {obj.__module__}.{obj.__qualname__}"
    if isinstance(obj, types.CellType):
        return "cell"
    if isinstance(obj, types.ModuleType):
        return f"module {obj.__name__}"
    if isinstance(obj, torch.Tensor):
        return f"{type(obj).__name__} {tuple(obj.shape)}"
    return type(obj).__module__ + "." + type(obj).__qualname__


def storage_bytes(t: torch.Tensor) -> int | None:
    """Bytes of ``t``'s storage; None for tensors without one (functorch's batched tensors, left by flex's vmap)."""
    try:
        return t.untyped_storage().nbytes()
    except (NotImplementedError, RuntimeError):
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="sdpa-dropin", choices=list(e2e.ATTN))
    ap.add_argument("--seq", type=int, default=4096)
    args = ap.parse_args()
    e2e.run(args.backend, args.seq, 6, 2, 1, False, None)
    gc.collect()
    torch.cuda.synchronize()
    print("allocated after the run: %.2f GiB" % (torch.cuda.memory_allocated() / 2**30))
    live = sorted((o for o in gc.get_objects() if type(o) in (torch.Tensor, torch.nn.Parameter) and o.is_cuda
                   and storage_bytes(o) is not None), key=lambda t: -storage_bytes(t))
    for t in live[:8]:
        owners = [type(r).__name__ for r in gc.get_referrers(t)[:4]]
        print(tuple(t.shape), t.dtype, storage_bytes(t) >> 20, "MiB, referrers:", owners)
    if not live:
        return
    try:
        import objgraph
    except ImportError:
        print("objgraph not importable: no reference chain")
        return
    target = live[0]
    del live
    chain = objgraph.find_backref_chain(target, objgraph.is_proper_module, max_depth=40)
    print(f"reference chain ({len(chain)} links, module first):")
    for obj in chain:
        print("  ", describe(obj)[:300])
    if len(chain) == 1:  # no module reaches it: a frame, a cycle, or a reference gc cannot see
        level, here = [target], sys._getframe()
        for depth in range(30):
            nxt = []
            for o in level:
                nxt += [r for r in gc.get_referrers(o) if r is not level and r is not nxt and r is not here]
            if not nxt:
                print(f"depth {depth}: nothing gc can see refers to the objects above")
                break
            level = nxt[:12]
            print(f"referrers at depth {depth + 1}:", [describe(r)[:120] for r in level])


if __name__ == "__main__":
    main()
