"""One process: liger-kernel's Gemma4 patches and ffpa_patch applied in the order given
(``liger-first`` or ``ffpa-first``), a training step, then ffpa_patch.revert(). Liger has no
revert, so each order gets its own process. Prints one JSON line.

``python liger_worker.py ORDER cpu``: the same without the step (Liger's norms are Triton
kernels, which need a GPU): which patches are in place with both, and what revert() leaves."""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import ffpa_patch  # noqa: E402
import tiny  # noqa: E402
from ffpa_patch.routing import stats  # noqa: E402


def step(model, ids):
    model.train()  # liger's fused linear cross entropy runs in training only
    model.zero_grad(set_to_none=True)
    loss = model(ids, labels=ids).loss
    loss.backward()
    return loss.item(), {n: p.grad.float().norm().item() for n, p in model.named_parameters() if p.grad is not None}


def worst(grads: dict, reference: dict) -> list:
    """[largest relative difference of a parameter's gradient norm, that parameter] (None on CPU)."""
    diffs = [(abs(grads[n] - b) / max(b, 1e-6), n) for n, b in reference.items() if n in grads]
    return list(max(diffs)) if diffs else None


def top(grads: dict, reference: dict, k: int = 3) -> list:
    """The k parameters whose gradient norms differ most: [relative difference, name, norm, reference norm]."""
    diffs = sorted(((abs(grads[n] - b) / max(b, 1e-6), n, grads[n], b) for n, b in reference.items() if n in grads), reverse=True)
    return [list(d) for d in diffs[:k]]


def run(order: str, device: str = "cuda") -> dict:
    """This worker in a fresh interpreter (liger has no revert); its JSON line as a dict."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    done = subprocess.run([sys.executable, os.path.abspath(__file__), order, device], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(order, device="cuda"):
    from liger_kernel.transformers import apply_liger_kernel_to_gemma4_text
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface
    from transformers.models.gemma4 import modeling_gemma4

    ffpa_patch.revert()
    stock_mapping = modeling_gemma4.ALL_ATTENTION_FUNCTIONS
    torch.manual_seed(0)
    ids = torch.randint(0, 128, (2, 1024), device=device)
    cfg = dict(head_dim=256, hidden_size=256)
    on_gpu = device == "cuda"
    plain = tiny.causal_lm("dense31b", attn="sdpa", **cfg).to(device, torch.bfloat16)
    want_loss, want_grads = step(plain, ids) if on_gpu else (None, {})
    ffpa_only_grads = {}
    if on_gpu:  # ffpa_patch without Liger: how far the kernels alone move each gradient norm
        ffpa_patch.apply()
        ffpa_only = tiny.causal_lm("dense31b", attn="ffpa", **cfg).to(device, torch.bfloat16)
        ffpa_only.load_state_dict(plain.state_dict())
        _, ffpa_only_grads = step(ffpa_only, ids)
        del ffpa_only
        ffpa_patch.revert()

    if order == "liger-first":
        apply_liger_kernel_to_gemma4_text()
        ffpa_patch.apply()
    else:
        ffpa_patch.apply()
        apply_liger_kernel_to_gemma4_text()
    stats.reset()
    both = tiny.causal_lm("dense31b", attn="ffpa", **cfg).to(device, torch.bfloat16)
    both.load_state_dict(plain.state_dict())
    loss, grads = step(both, ids) if on_gpu else (None, {})
    applied = sorted(p["name"] for p in ffpa_patch.status().patches if p["state"] == "applied")
    routing_mapping = modeling_gemma4.ALL_ATTENTION_FUNCTIONS is not stock_mapping
    norms = {type(m).__name__ for m in both.modules() if "RMSNorm" in type(m).__name__}
    mlps = {type(m).__name__ for m in both.modules() if "MLP" in type(m).__name__}
    routed = stats.total("full", "ffpa")
    ffpa_patch.revert()
    # Liger alone (ffpa_patch reverted, liger has no revert): the baseline that isolates ffpa_patch's effect
    liger_loss, liger_grads = None, {}
    if on_gpu:
        liger_only = tiny.causal_lm("dense31b", attn="sdpa", **cfg).to(device, torch.bfloat16)
        liger_only.load_state_dict(plain.state_dict())
        liger_loss, liger_grads = step(liger_only, ids)
    print(json.dumps({
        "order": order, "loss": loss, "stock_loss": want_loss, "liger_only_loss": liger_loss,
        "grad_norm_rel_diff_vs_liger_only": worst(grads, liger_grads),
        "grad_norm_rel_diff_vs_plain": worst(grads, want_grads),
        "liger_only_grad_norm_rel_diff_vs_plain": worst(liger_grads, want_grads),
        "ffpa_only_grad_norm_rel_diff_vs_plain": worst(ffpa_only_grads, want_grads),
        "top_both_vs_liger_only": top(grads, liger_grads), "top_ffpa_only_vs_plain": top(ffpa_only_grads, want_grads),
        "top_liger_only_vs_plain": top(liger_grads, want_grads),
        "applied_with_liger": applied, "dropin_mapping_with_liger": routing_mapping,
        "n_grads": [len(grads), len(want_grads)], "norms": sorted(norms), "mlps": sorted(mlps),
        "full_ffpa_calls": routed, "ffpa_registered_after_revert": "ffpa" in AttentionInterface._global_mapping,
        "mapping_restored": modeling_gemma4.ALL_ATTENTION_FUNCTIONS is stock_mapping is ALL_ATTENTION_FUNCTIONS,
        "liger_kept_after_revert": modeling_gemma4.Gemma4RMSNorm.__name__.startswith("Liger"),
    }))


if __name__ == "__main__":
    main(*sys.argv[1:])
