"""ffpa-patch doctor: does FFPA run right here? One small causal GQA fwd/bwd vs the fp32 reference, for a
dense batch and for packed documents, each saying which backward ran."""
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
    scale = 1 / 512**0.5
    q, k, v = (torch.randn(1, 2048, h, 512, device=dev, dtype=torch.bfloat16, requires_grad=True) for h in (8, 2, 2))
    t0 = time.perf_counter()
    ok, line = _against_fp32(lambda *t: ffpa.dense(*t, scale), lambda *t: reference.attention(*t, scale), (q, k, v))
    torch.cuda.synchronize()
    lines += [f"first call (JIT compile): {time.perf_counter() - t0:.1f} s", "dense batch: " + line]
    cu = torch.tensor([0, 700, 2048], device=dev, dtype=torch.int32)  # two packed documents
    packed = tuple(t.detach()[0].requires_grad_() for t in (q, k, v))
    ok_packed, line = _against_fp32(lambda *t: ffpa.varlen(*t, cu, 1348, scale), lambda *t: reference.varlen(*t, cu, scale), packed)
    lines.append("packed batch: " + line)
    ok = ok and ok_packed

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


def _against_fp32(ours, fp32, tensors) -> tuple[bool, str]:
    """One forward/backward of ``ours`` against ``fp32`` on fp32 copies: (passed, "errors -> PASS; backward: which")."""
    import torch

    from .kernels import ffpa

    before = ffpa.BACKWARDS.copy()
    out = ours(*tensors)
    grads = torch.autograd.grad(out.sum(), tensors)
    ran = ", ".join(name for name, n in ffpa.BACKWARDS.items() if n > before[name])
    ref_in = tuple(t.detach().float().requires_grad_() for t in tensors)
    ref = fp32(*ref_in)
    ref_grads = torch.autograd.grad(ref.sum(), ref_in)
    errs = [((a.float() - b).norm() / b.norm()).item() for a, b in zip((out, *grads), (ref, *ref_grads))]
    ok = errs[0] < 1e-2 and max(errs[1:]) < 2e-2
    return ok, ("relative error vs fp32: out {:.1e}, dq {:.1e}, dk {:.1e}, dv {:.1e} -> {}; backward: {}"
                .format(*errs, "PASS" if ok else "FAIL", ran))
