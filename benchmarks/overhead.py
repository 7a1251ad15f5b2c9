"""CPU-side cost of one routed attention call, kernel excluded.

Times ``route_attention`` with a kernel provider that returns at once, minus
the same call on that provider directly. python benchmarks/overhead.py
"""
import os
import sys
import timeit

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import ffpa_patch  # noqa: E402
from ffpa_patch.kernels import use  # noqa: E402
from ffpa_patch.kernels import reference  # noqa: E402
from ffpa_patch.routing.attention import route_attention  # noqa: E402


class Instant(ReferenceKernels):
    def full_dense(self, q, k, v, scale):
        return q


def main():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
    import tiny

    ffpa_patch.apply()
    model = tiny.causal_lm("dense31b", attn="ffpa")
    attn = next(l.self_attn for l in model.model.layers if not l.self_attn.is_sliding)
    q, k = torch.randn(1, 4, 64, 512).transpose(1, 2).transpose(1, 2), torch.randn(1, 1, 64, 512)
    kern = Instant()
    n = 20000
    with use(kern):
        routed = min(timeit.repeat(lambda: route_attention(attn, q, k, k, None, backend="ffpa", scaling=1.0), number=n, repeat=5)) / n
        direct = min(timeit.repeat(lambda: kern.full_dense(q.transpose(1, 2), k.transpose(1, 2), k.transpose(1, 2), 1.0), number=n, repeat=5)) / n
    print(f"route_attention overhead per call: {(routed - direct) * 1e6:.1f} us (routed {routed * 1e6:.1f} us, bare kernel call {direct * 1e6:.1f} us)")


if __name__ == "__main__":
    main()
