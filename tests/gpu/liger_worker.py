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
from ffpa_patch.wrapping import live_in_chain  # noqa: E402


def step(model, ids):
    """Loss, the number of parameters that got a gradient, and each layer's q_proj gradient."""
    model.train()  # liger's fused linear cross entropy runs in training only
    model.zero_grad(set_to_none=True)
    loss = model(ids, labels=ids).loss
    loss.backward()
    n_grads = sum(p.grad is not None for p in model.parameters())
    return loss.item(), n_grads, [layer.self_attn.q_proj.weight.grad.float() for layer in model.model.layers]


def errors(grads: list, reference: list) -> list:
    """Each layer's relative gradient error against the fp32 model."""
    return [round(float((g - r).norm() / r.norm()), 4) for g, r in zip(grads, reference)]


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
    stock_entry = AttentionInterface._global_mapping["sdpa"]
    torch.manual_seed(0)
    ids = torch.randint(0, 128, (2, 1024), device=device)
    cfg = dict(head_dim=256, hidden_size=256)
    on_gpu = device == "cuda"
    nothing = (None, None, [])
    fp32 = tiny.causal_lm("dense31b", attn="eager", **cfg).to(device)  # the yardstick: no patch, no Liger, fp32
    _, _, want = step(fp32, ids) if on_gpu else nothing
    plain = tiny.causal_lm("dense31b", attn="sdpa", **cfg).to(device, torch.bfloat16)
    plain.load_state_dict(fp32.state_dict())
    stock_loss, stock_n, stock_grads = step(plain, ids) if on_gpu else nothing
    ffpa_only_grads = []
    if on_gpu:  # ffpa_patch without Liger: the kernels' own share of the error
        ffpa_patch.apply()
        ffpa_only = tiny.causal_lm("dense31b", attn="ffpa", **cfg).to(device, torch.bfloat16)
        ffpa_only.load_state_dict(plain.state_dict())
        _, _, ffpa_only_grads = step(ffpa_only, ids)
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
    loss, n_grads, grads = step(both, ids) if on_gpu else nothing
    applied = sorted(p["name"] for p in ffpa_patch.status().patches if p["state"] == "applied")
    routing_mapping = live_in_chain(modeling_gemma4.ALL_ATTENTION_FUNCTIONS["sdpa"], "gemma4_dropin") == 1
    norms = {type(m).__name__ for m in both.modules() if "RMSNorm" in type(m).__name__}
    mlps = {type(m).__name__ for m in both.modules() if "MLP" in type(m).__name__}
    routed = stats.total("full", "ffpa")
    ffpa_patch.revert()
    # Liger alone (ffpa_patch reverted, liger has no revert): the baseline that isolates ffpa_patch's effect
    liger_loss, liger_grads = None, []
    if on_gpu:
        liger_only = tiny.causal_lm("dense31b", attn="sdpa", **cfg).to(device, torch.bfloat16)
        liger_only.load_state_dict(plain.state_dict())
        liger_loss, _, liger_grads = step(liger_only, ids)
    print(json.dumps({
        "order": order, "loss": loss, "stock_loss": stock_loss, "liger_only_loss": liger_loss,
        "q_proj_grad_error_vs_fp32": {"stock": errors(stock_grads, want), "ffpa_only": errors(ffpa_only_grads, want),
                                      "liger_only": errors(liger_grads, want), "both": errors(grads, want)},
        "applied_with_liger": applied, "dropin_mapping_with_liger": routing_mapping,
        "n_grads": [n_grads, stock_n], "norms": sorted(norms), "mlps": sorted(mlps),
        "full_ffpa_calls": routed, "ffpa_registered_after_revert": "ffpa" in AttentionInterface._global_mapping,
        "mapping_restored": AttentionInterface._global_mapping["sdpa"] is stock_entry
                            and modeling_gemma4.ALL_ATTENTION_FUNCTIONS is ALL_ATTENTION_FUNCTIONS,
        "liger_kept_after_revert": modeling_gemma4.Gemma4RMSNorm.__name__.startswith("Liger"),
    }))


if __name__ == "__main__":
    main(*sys.argv[1:])
