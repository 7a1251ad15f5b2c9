"""Whole tiny Gemma4 models through the routing, against an eager fp32 reference.

The FFPA / flash-attn-4 kernels are replaced through the one seam
(``reference_kernels``) by fp32 reference kernels; everything else is the real
code path: Transformers' masks, our mask analysis, packing, fallbacks.
"""
import pytest
import torch

import ffpa_patch
import tiny
from ffpa_patch.routing import stats

B, S = 2, 24


def batch(kind, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 128, (B, S), generator=g)
    kw, valid = {}, torch.ones(B, S, dtype=torch.bool)
    if kind == "left_pad":
        valid[0, :7] = False
        kw["attention_mask"] = valid.long()
    elif kind == "right_pad":
        valid[1, 15:] = False
        kw["attention_mask"] = valid.long()
    elif kind == "packed":
        kw["position_ids"] = torch.tensor([list(range(10)) + list(range(14)), list(range(5)) + list(range(19))])
    return ids, kw, valid


def loss_and_grads(model, ids, kw, valid):
    model.zero_grad()
    logits = model(ids, **kw).logits
    loss = (logits.float().logsumexp(-1) * valid).sum() / valid.sum()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None and "self_attn" in n}
    return logits.detach(), grads


def check_against_eager(family, kind, backend):
    model = tiny.causal_lm(family, attn="eager")
    ids, kw, valid = batch(kind)
    ref_logits, ref_grads = loss_and_grads(model, ids, kw, valid)
    model.set_attn_implementation(backend)
    logits, grads = loss_and_grads(model, ids, kw, valid)
    torch.testing.assert_close(logits[valid], ref_logits[valid], atol=5e-5, rtol=1e-4)
    assert grads.keys() == ref_grads.keys() and grads
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], atol=5e-5, rtol=1e-3, msg=name)
    return model


def n_layers(model, kind):
    return sum(l.self_attn.is_sliding == (kind == "sliding") for l in model.model.layers)


@pytest.mark.parametrize("family", ["dense31b", "e2b", "moe"])
@pytest.mark.parametrize("kind", ["text", "left_pad", "right_pad", "packed"])
def test_ffpa_backend_matches_eager_and_routes_every_layer(family, kind, patched, reference_kernels):
    model = check_against_eager(family, kind, "ffpa")
    expected = "dense causal" if kind == "text" else "varlen (padding/packing)"
    rows = {(r["layer"], r["kernel"], r["reason"]): r["count"] for r in stats.snapshot()}
    # one forward (the backward reuses saved tensors): each full layer once on FFPA, each sliding once on fa4
    assert rows.get(("full", "ffpa", expected), 0) == n_layers(model, "full")
    sliding_rows = {k: v for k, v in rows.items() if k[0] == "sliding"}
    assert sum(sliding_rows.values()) == n_layers(model, "sliding")
    assert all(k[1] == "fa4" for k in sliding_rows)


@pytest.mark.parametrize("family", ["dense31b", "e2b"])
@pytest.mark.parametrize("kind", ["text", "left_pad", "packed"])
def test_dropin_sdpa_routes_full_layers_to_ffpa(family, kind, patched, reference_kernels):
    model = check_against_eager(family, kind, "sdpa")
    assert stats.total("full", "ffpa") == n_layers(model, "full")
    assert stats.total("sliding", "sdpa") == n_layers(model, "sliding")
    assert stats.total("sliding", "fa4") == 0


def test_without_the_patch_nothing_is_routed(reference_kernels):
    ffpa_patch.revert()
    ffpa_patch.reset_stats()
    model = tiny.causal_lm("dense31b", attn="sdpa")
    ids, kw, _ = batch("text")
    model(ids, **kw)
    assert stats.snapshot() == []


def test_padded_batch_under_inference_mode(patched, reference_kernels):
    # inference tensors have no version counter: the mask cache must not depend on one
    model = tiny.causal_lm("dense31b", attn="eager")
    ids, kw, valid = batch("left_pad")
    with torch.inference_mode():
        ref = model(ids, **kw).logits
        model.set_attn_implementation("ffpa")
        out = model(ids, **kw).logits
        again = model(ids, **kw).logits
    torch.testing.assert_close(out[valid], ref[valid], atol=5e-5, rtol=1e-4)
    torch.testing.assert_close(again, out)
    assert stats.total("full", "ffpa") == 2
