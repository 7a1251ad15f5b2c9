"""One bf16 training step of a tiny Gemma4, twice, under torch.use_deterministic_algorithms(True);
prints whether the gradients are equal bit for bit and the routes taken (a JSON line)."""
import json

import torch

torch.use_deterministic_algorithms(True)

import ffpa_patch  # noqa: E402
import tiny  # noqa: E402
from ffpa_patch.routing import stats  # noqa: E402


def step(model, ids, mask):
    model.zero_grad()
    model(ids, attention_mask=mask, labels=ids).loss.backward()
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def main():
    ffpa_patch.apply()
    model = tiny.causal_lm("dense31b", attn="ffpa", head_dim=256, hidden_size=256).to("cuda", torch.bfloat16).train()
    ids = torch.randint(0, 128, (2, 1024), device="cuda")
    mask = torch.ones_like(ids)
    mask[0, :100] = 0
    stats.reset()
    first = step(model, ids, mask)
    routes = stats.snapshot()
    second = step(model, ids, mask)
    print(json.dumps({"equal": all(torch.equal(a, b) for a, b in zip(first, second)), "routes": routes}))


if __name__ == "__main__":
    main()
