"""Host time ffpa_patch adds to one attention call, the kernel excluded.

Replays one forward's worth of attention calls of the tiny 6-layer test model (5 sliding, 1
full; the masks each layer really gets, captured from a forward and copied anew for each
replayed forward, as Transformers builds them) through ``route_attention`` with kernels that
return at once, minus the same number of bare calls of that instant kernel (and mask copies).
The per-call figure of a padded batch includes reading each mask once per forward.
Works with this package and with an older one on PYTHONPATH (its kernel seam is detected), so a
before/after comparison runs in one process family on one machine:

    python benchmarks/overhead.py --device cuda --out after.json
    PYTHONPATH=/path/to/old python benchmarks/overhead.py --device cuda --out before.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))


def instant_kernels():
    """The package's reference kernels with every fused entry point returning at once."""
    from ffpa_patch import kernels
    from ffpa_patch.kernels import reference

    if hasattr(kernels, "KernelSet"):  # this package: a kernel table
        from dataclasses import replace

        ref = reference.kernel_set()
        fast = lambda q, k, v, *args: q  # noqa: E731
        if hasattr(ref, "kernels"):  # an ordered table (after b8daa5f)
            return replace(ref, kernels=tuple(replace(k, dense=fast, varlen=fast) if k.dense else k for k in ref.kernels)), fast
        return replace(ref, full=replace(ref.full, dense=fast, varlen=fast), sliding=replace(ref.sliding, dense=fast, varlen=fast)), fast

    class Instant(reference.ReferenceKernels):  # before the kernel table (0a52d15 and earlier)
        def full_dense(self, q, k, v, *args):
            return q

        full_varlen = sliding_dense = sliding_varlen = full_dense

    return Instant(), lambda q, k, v, *args: q


def captured_calls(model, ids, kw):
    """(attention module, the mask Transformers handed it) for each layer of one forward."""
    calls = []
    hooks = [layer.self_attn.register_forward_pre_hook(lambda m, a, k: calls.append((m, k.get("attention_mask"))), with_kwargs=True)
             for layer in model.model.layers]
    with torch.no_grad():
        model(ids, **kw)
    for h in hooks:
        h.remove()
    return calls


def measure(backend: str, kind: str, device: str, seq: int, repeat: int) -> dict:
    import ffpa_patch
    import tiny
    from ffpa_patch.kernels import use
    from ffpa_patch.routing.attention import route_attention

    ffpa_patch.apply()
    model = tiny.causal_lm("dense31b", attn=backend).to(device, torch.bfloat16)
    ids = torch.randint(0, 128, (2, seq), device=device)
    kw = {}
    if kind == "padded":
        mask = torch.ones_like(ids)
        mask[0, : seq // 4] = 0
        kw["attention_mask"] = mask
    kernels, bare = instant_kernels()
    with use(kernels):
        calls = captured_calls(model, ids, kw)
        qkv = {}
        for module, _ in calls:
            d = module.head_dim
            heads = model.config.num_attention_heads
            kv_heads = heads // module.num_key_value_groups
            qkv[id(module)] = [torch.randn(2, h, seq, d, device=device, dtype=torch.bfloat16).transpose(1, 2).contiguous().transpose(1, 2)
                               for h in (heads, kv_heads, kv_heads)]

        def fresh_masks():
            """Transformers builds each forward's masks anew (one per layer kind, shared by its layers)."""
            fresh = {}
            return [fresh.setdefault(id(mask), mask.clone()) if isinstance(mask, torch.Tensor) else mask for _, mask in calls]

        def forward_calls():
            for (module, _), mask in zip(calls, fresh_masks()):
                q, k, v = qkv[id(module)]
                route_attention(module, q, k, v, mask, backend=backend, dropout=0.0, scaling=1.0,
                                sliding_window=module.sliding_window)

        def bare_calls():
            for (module, _), _mask in zip(calls, fresh_masks()):
                q, k, v = qkv[id(module)]
                bare(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), 1.0)

        def best(fn, n=200):
            fn()
            times = []
            for _ in range(repeat):
                if device == "cuda":
                    torch.cuda.synchronize()
                t = time.perf_counter()
                for _ in range(n):
                    fn()
                if device == "cuda":
                    torch.cuda.synchronize()
                times.append((time.perf_counter() - t) / (n * len(calls)))
            return min(times)

        routed, direct = best(forward_calls), best(bare_calls)
    routes = ffpa_patch.stats()
    ffpa_patch.revert()
    return {"backend": backend, "batch": kind, "seq": seq, "device": device, "calls_per_forward": len(calls),
            "overhead_us_per_call": (routed - direct) * 1e6, "routed_us": routed * 1e6, "bare_us": direct * 1e6,
            "routes": sorted({(r["layer"], r["kernel"], r["reason"]) for r in routes})}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--label", default="")
    ap.add_argument("--out")
    a = ap.parse_args()
    import ffpa_patch

    rows = []
    for backend in ("ffpa", "sdpa"):
        for kind in ("text", "padded"):
            row = measure(backend, kind, a.device, a.seq, a.repeat)
            row.update(label=a.label, package=os.path.dirname(ffpa_patch.__file__))
            rows.append(row)
            print(f"{a.label or 'ffpa_patch'} {backend:<5} {kind:<7}: {row['overhead_us_per_call']:6.1f} us per call "
                  f"(routed {row['routed_us']:.1f}, bare {row['bare_us']:.1f})")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1, default=list)


if __name__ == "__main__":
    main()
