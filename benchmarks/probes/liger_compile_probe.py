"""Is liger-kernel's fused linear cross entropy right under torch.compile? (GPU)

The compiled ffpa + Liger row of the 8k slice barely trained (loss 26.525 -> 26.517 in a
step, against 26.521 -> 26.289 eager), while compiled ffpa without Liger trains as eager
does. Liger's open PR #1338 reports a wrong FLCE loss under torch.compile when targets hold
ignore_index, and Transformers' label shift puts one in every row. This checks that alone,
without any model or ffpa_patch: LigerForCausalLMLoss eager and compiled against a torch
reference (fp32 logits, Gemma4's softcap 30), loss and gradients, with the shift's one
ignored label per row and with none.

    python benchmarks/probes/liger_compile_probe.py [--out FILE]
"""
import argparse
import json

import torch


def reference(h, w, labels, softcap):
    logits = (h.float() @ w.float().t())
    logits = torch.tanh(logits / softcap) * softcap
    return torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100)


def measure(fn, h, w, labels):
    h, w = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    loss = fn(h, w, labels)
    loss.backward()
    return loss.detach().float(), h.grad.float(), w.grad.float()


def main():
    from liger_kernel.transformers.model.loss_utils import LigerForCausalLMLoss

    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--hidden", type=int, default=5376)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--out")
    a = p.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    h = torch.randn(a.tokens, a.hidden, device="cuda", generator=g).bfloat16()
    w = (torch.randn(a.vocab, a.hidden, device="cuda", generator=g) * a.hidden ** -0.5).bfloat16()
    ids = torch.randint(0, a.vocab, (1, a.tokens), device="cuda", generator=g)
    shifted = torch.nn.functional.pad(ids, (0, 1), value=-100)[..., 1:].reshape(-1)  # what Transformers and Liger do
    cases = {"one ignored label (the causal-LM shift)": shifted, "no ignored label": ids.reshape(-1)}
    rows = []
    for name, labels in cases.items():
        def liger(hh, ww, labels=labels):
            return LigerForCausalLMLoss(hh, ww, None, a.hidden, shift_labels=labels, final_logit_softcapping=30.0)

        torch._dynamo.reset()
        want = measure(lambda hh, ww, t: reference(hh, ww, t, 30.0), h.float(), w.float(), labels)
        row = {"case": name}
        for how, fn in (("eager", liger), ("compiled", torch.compile(liger))):
            got = measure(lambda hh, ww, t: fn(hh, ww), h, w, labels)
            row[how] = {"loss": round(got[0].item(), 5), "loss_ref": round(want[0].item(), 5),
                        "dh_rel_err": round(((got[1] - want[1]).norm() / want[1].norm()).item(), 5),
                        "dw_rel_err": round(((got[2] - want[2]).norm() / want[2].norm()).item(), 5)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if a.out:
        import liger_kernel  # noqa: F401
        from importlib.metadata import version

        json.dump({"liger-kernel": version("liger-kernel"), "torch": torch.__version__, "args": vars(a), "rows": rows},
                  open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
