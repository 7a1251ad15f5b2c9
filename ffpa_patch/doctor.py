"""ffpa-patch doctor: does FFPA run right here? One small causal GQA fwd/bwd vs the fp32 reference."""
from __future__ import annotations

import time


PASS, FAIL, CANNOT_RUN_HERE = 0, 1, 3  # exit codes (3 as `ffpa-patch status`)


def run() -> tuple[int, list[str]]:
    import torch

    from .kernels import ffpa, reference

    lines = []
    if not torch.cuda.is_available():
        return CANNOT_RUN_HERE, ["no CUDA device: cannot check the FFPA kernels here (routing falls back to SDPA on this machine)"]
    dev = torch.device("cuda")
    problem = ffpa.unsupported(dev, torch.bfloat16, 512)
    if problem:
        return CANNOT_RUN_HERE, [f"FFPA cannot run here: {problem}"]
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2048, h, 512, device=dev, dtype=torch.bfloat16, requires_grad=True) for h in (8, 2, 2))
    t0 = time.perf_counter()
    before = ffpa.BACKWARDS.copy()
    out = ffpa.dense(q, k, v, 1 / 512**0.5)
    out.sum().backward()
    torch.cuda.synchronize()
    lines.append(f"first call (JIT compile): {time.perf_counter() - t0:.1f} s")
    lines.append("backward: " + ", ".join(name for name, n in ffpa.BACKWARDS.items() if n > before[name]))
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref = reference.attention(qf, kf, vf, 1 / 512**0.5)
    ref.sum().backward()
    errs = [((a.float() - b).norm() / b.norm()).item() for a, b in ((out, ref), (q.grad, qf.grad), (k.grad, kf.grad), (v.grad, vf.grad))]
    ok = errs[0] < 1e-2 and max(errs[1:]) < 2e-2
    lines.append("relative error vs fp32: out {:.1e}, dq {:.1e}, dk {:.1e}, dv {:.1e} -> {}".format(*errs, "PASS" if ok else "FAIL"))

    def timed(fn):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t) / 10 * 1e3

    with torch.no_grad():
        t_ffpa = timed(lambda: ffpa.dense(q, k, v, 0.05))
        kr, vr = (t.transpose(1, 2).repeat_interleave(4, 1) for t in (k, v))
        t_sdpa = timed(lambda: torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), kr, vr, is_causal=True))
    lines.append(f"forward N=2048: FFPA {t_ffpa:.2f} ms, SDPA repeat-KV {t_sdpa:.2f} ms ({t_sdpa / t_ffpa:.1f}x)")
    return (PASS if ok else FAIL), lines
