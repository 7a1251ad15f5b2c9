"""Whole tiny Gemma4 models through the routing, against an eager fp32 reference.

The FFPA / flash-attn-4 / FlexAttention kernels are replaced through the one
seam (``reference_kernels``) by fp32 reference kernels; everything else is the
real code path: Transformers' masks, our mask analysis, packing, BlockMasks,
fallbacks.
"""
import pytest
import torch

import ffpa_patch
import tiny
from ffpa_patch.routing import stats
from ffpa_patch.routing.decide import BLOCKS_REASON

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


def check_against_eager(family, kind, backend, model=None, inputs=None):
    model = model or tiny.causal_lm(family, attn="eager")
    ids, kw, valid = inputs or batch(kind)
    ref_logits, ref_grads = loss_and_grads(model, ids, kw, valid)
    model.set_attn_implementation(backend)
    logits, grads = loss_and_grads(model, ids, kw, valid)
    torch.testing.assert_close(logits[valid], ref_logits[valid], atol=5e-5, rtol=1e-4)
    assert grads.keys() == ref_grads.keys() and grads
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], atol=5e-5, rtol=1e-3, msg=name)
    return model


def n_layers(model, kind):
    from ffpa_patch import hf

    return sum(m.is_sliding == (kind == "sliding") for m in model.modules() if hf.is_text_attention(m))


@pytest.mark.parametrize("sliding", ["fa4", "flex"])  # flex: a machine without flash-attn-4
@pytest.mark.parametrize("family", tiny.families("dense31b", "e2b", "moe", "unified12b"))
@pytest.mark.parametrize("kind", ["text", "left_pad", "right_pad", "packed"])
def test_ffpa_backend_matches_eager_and_routes_every_layer(family, kind, sliding, patched):
    from ffpa_patch.kernels import use
    from ffpa_patch.kernels import reference

    with use(reference.kernel_set(fa4=sliding == "fa4", fp32=True)):
        model = check_against_eager(family, kind, "ffpa")
    expected = "dense causal" if kind == "text" else "varlen (padding/packing)"
    rows = {(r["layer"], r["kernel"], r["reason"]): r["count"] for r in stats.snapshot()}
    # one forward (the backward reuses saved tensors): each full layer once on FFPA, each sliding layer once
    assert rows.get(("full", "ffpa", expected), 0) == n_layers(model, "full")
    sliding_rows = {k: v for k, v in rows.items() if k[0] == "sliding"}
    assert sum(sliding_rows.values()) == n_layers(model, "sliding")
    assert all(k[1] == sliding for k in sliding_rows), sliding_rows


@pytest.mark.parametrize("kind", ["text", "packed"])
def test_a_kernel_table_under_other_names_routes_the_whole_model(kind, patched):
    """Routing takes whatever the table names: renamed kernels serve every layer, and the stats
    carry their names."""
    from ffpa_patch.kernels import reference, use

    names = {"ffpa": "full512", "fa4": "window256", "flex": "anymask"}
    with use(reference.kernel_set(fp32=True, rename=names)) as kernels:
        model = check_against_eager("dense31b", kind, "ffpa")
    assert stats.total("full", "full512") == n_layers(model, "full")
    assert stats.total("sliding", "window256") == n_layers(model, "sliding")
    assert {c[0] for c in kernels.calls} == {"full512", "window256"}


@pytest.mark.parametrize("family", tiny.families("dense31b", "e2b", "unified12b"))
@pytest.mark.parametrize("kind", ["text", "left_pad", "packed"])
def test_dropin_sdpa_routes_full_layers_to_ffpa_and_sliding_to_fa4(family, kind, patched, reference_kernels):
    model = check_against_eager(family, kind, "sdpa")
    assert stats.total("full", "ffpa") == n_layers(model, "full")
    assert stats.total("sliding", "fa4") == n_layers(model, "sliding")


@pytest.fixture
def reference_kernels_without_fa4():
    """The same seam, playing a machine without flash-attn-4."""
    from ffpa_patch.kernels import use
    from ffpa_patch.kernels import reference

    with use(reference.kernel_set(fa4=False, fp32=True)) as k:
        yield k


@pytest.mark.parametrize("kind", ["text", "left_pad"])
def test_without_fa4_the_dropin_keeps_sliding_layers_on_sdpa(kind, patched, reference_kernels_without_fa4):
    model = check_against_eager("dense31b", kind, "sdpa")
    assert stats.total("full", "ffpa") == n_layers(model, "full")
    assert stats.total("sliding", "sdpa") == n_layers(model, "sliding")
    assert all("flex: not on the drop-in path" in r["reason"] for r in stats.snapshot() if r["layer"] == "sliding")


def vision_batch(image: bool):
    """Token ids with (or without) a 6-token image block in each row; mm_token_type_ids as the
    processor makes them. No pixels: the text layers' masks are what is under test."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 100, (B, S), generator=g)
    if image:
        ids[0, 3:9] = tiny.IMAGE_TOKEN
        ids[1, 10:16] = tiny.IMAGE_TOKEN
    kw = {"mm_token_type_ids": (ids == tiny.IMAGE_TOKEN).long()}
    return ids, kw, torch.ones(B, S, dtype=torch.bool)


def _overlay_on_full_layers(model, inputs) -> bool:
    """Whether this Transformers makes the full layers bidirectional inside image blocks: read
    from the mask it hands a full layer (a key after the query allowed). Gemma4 does on 5.9-5.12
    only; gemma4_unified's training forward does on every version that has it (its generate()
    path keeps full layers causal)."""
    seen = []
    full = next(m for m in model.modules() if getattr(m, "is_sliding", True) is False)
    hook = full.register_forward_pre_hook(lambda m, a, k: seen.append(k.get("attention_mask")), with_kwargs=True)
    try:
        with torch.no_grad():
            model.set_attn_implementation("eager")
            ids, kw, _ = inputs
            model(ids, **kw)
    finally:
        hook.remove()
    mask = seen[0]
    allowed = mask == 0 if mask.dtype != torch.bool else mask
    return bool(allowed[..., :, :].triu(1).any())


@pytest.mark.parametrize("family", tiny.families("dense31b", "unified12b"))
def test_vision_model_text_batch_full_layers_reach_ffpa(family, patched, reference_kernels):
    # On 5.9-5.12 the full layers get a 4-D mask with a no-op overlay: it must be read as plain causal.
    model = tiny.vision_lm(family)
    check_against_eager(None, None, "ffpa", model=model, inputs=vision_batch(image=False))
    assert stats.total("full", "ffpa") == n_layers(model, "full")
    assert stats.total("sliding", "fa4") == n_layers(model, "sliding")


@pytest.mark.parametrize("family", tiny.families("dense31b", "unified12b"))
@pytest.mark.parametrize("fa4", [True, False])
def test_vision_model_image_blocks(fa4, family, patched):
    from ffpa_patch.kernels import use
    from ffpa_patch.kernels import reference

    model = tiny.vision_lm(family)
    bidirectional_full = _overlay_on_full_layers(model, vision_batch(image=True))
    if family == "dense31b":
        from packaging.version import Version
        from transformers import __version__

        assert bidirectional_full == ((5, 9) <= Version(__version__).release < (5, 13))
    stats.reset()
    with use(reference.kernel_set(fa4=fa4, fp32=True)):
        check_against_eager(None, None, "ffpa", model=model, inputs=vision_batch(image=True))
    rows = {(r["layer"], r["kernel"], r["reason"]): r["count"] for r in stats.snapshot()}
    # sliding layers: flash-attn-4 with the in-block keys merged by LSE; without it FlexAttention's BlockMask
    sliding = ("sliding", "fa4", BLOCKS_REASON) if fa4 else \
        ("sliding", "flex", "mask is not causal+padding/packing (e.g. bidirectional image blocks): BlockMask")
    assert rows.get(sliding) == n_layers(model, "sliding"), rows
    # full layers: causal on FFPA, or (where this version makes them bidirectional) FFPA with the blocks merged
    full = (BLOCKS_REASON,) if bidirectional_full else ("dense causal", "dense causal (mask is plain causal)")
    assert sum(n for (layer, kernel, reason), n in rows.items() if layer == "full" and kernel == "ffpa"
               and reason in full) == n_layers(model, "full"), rows


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


def sliding_reasons():
    return {r["reason"] for r in stats.snapshot() if r["layer"] == "sliding"}


@pytest.mark.parametrize("kind, reason", [
    ("no_mask", "dense causal"),  # the S x S sliding mask is never built
    ("all_ones", "dense causal"),  # a tokenizer's attention_mask without padding: the same
    ("left_pad", "varlen (padding/packing)"),
    ("packed", "varlen (padding/packing)"),
])
def test_ffpa_mask_leaves_only_a_plain_sliding_window_to_the_kernels(kind, reason, patched, reference_kernels):
    ids, kw, valid = batch("text" if kind in ("no_mask", "all_ones") else kind)
    if kind == "all_ones":
        kw["attention_mask"] = torch.ones_like(ids)
    model = check_against_eager("dense31b", None, "ffpa", inputs=(ids, kw, valid))
    assert S > model.config.sliding_window  # the window matters in this batch
    assert sliding_reasons() == {reason}


def mask_kwargs(config, **overrides):
    from transformers.masking_utils import sliding_window_causal_mask_function

    kw = dict(batch_size=1, q_length=S, kv_length=S, q_offset=0, kv_offset=0, attention_mask=None,
              mask_function=sliding_window_causal_mask_function(config.sliding_window), allow_is_causal_skip=True,
              local_size=config.sliding_window, config=config, use_vmap=False, device="cpu")
    kw.update(overrides)
    return kw


def test_ffpa_mask_builds_every_other_local_mask():
    from transformers.masking_utils import sdpa_mask

    from ffpa_patch.patches.attention_backend import ffpa_mask

    from ffpa_patch.routing.masks import CausalMask

    config = tiny.text_config("dense31b")
    assert ffpa_mask(**mask_kwargs(config)) == CausalMask(window=config.sliding_window)
    padded = torch.ones(1, S, dtype=torch.bool)
    padded[0, :3] = False
    others = {
        "padding": mask_kwargs(config, attention_mask=padded),
        "short padding mask": mask_kwargs(config, attention_mask=torch.ones(1, S - 1, dtype=torch.bool)),
        "image blocks or packing": mask_kwargs(config, allow_is_causal_skip=False),
        "another local size (chunked attention)": mask_kwargs(config, local_size=4),
        "offset": mask_kwargs(config, kv_offset=2),
    }
    for what, kw in others.items():
        built = ffpa_mask(**kw)
        assert built is not None, what
        torch.testing.assert_close(built, sdpa_mask(**kw), msg=what)


@pytest.mark.parametrize("family", tiny.families("dense31b", "unified12b"))
def test_vision_model_left_on_sdpa_routes_image_batches_through_the_drop_in(family, patched, reference_kernels):
    """The drop-in takes image blocks too: sliding layers on flash-attn-4 with the blocks merged,
    full layers on FFPA; tokens and gradients as stock SDPA's (here: eager fp32)."""
    model = tiny.vision_lm(family)
    check_against_eager(None, None, "sdpa", model=model, inputs=vision_batch(image=True))
    assert stats.total("sliding", "fa4") == n_layers(model, "sliding"), stats.snapshot()
    assert stats.total("full", "ffpa") == n_layers(model, "full"), stats.snapshot()
    assert stats.total(kernel="sdpa") == 0, stats.snapshot()


def moving_image_batch(step: int, batch: int = 2, seq: int = 48):
    """Two images of 6 tokens per row at positions that move with ``step``, and left padding."""
    g = torch.Generator().manual_seed(step)
    ids = torch.randint(1, 100, (batch, seq), generator=g)
    for row in range(batch):
        for start in (4 + (step * 3 + row) % 10, 26 + (step * 5 + row) % 12):
            ids[row, start:start + 6] = tiny.IMAGE_TOKEN
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[1, :3] = 0
    return ids, {"attention_mask": mask, "mm_token_type_ids": (ids == tiny.IMAGE_TOKEN).long()}


@pytest.mark.parametrize("family", tiny.families("dense31b", "unified12b"))
def test_compiled_vision_model_does_not_recompile_as_images_move(family, patched, reference_kernels):
    """torch.compile over an image batch: one graph, no breaks, and 10 steps whose images move
    (and whose padding differs) reuse it; every sliding layer ran flash-attn-4 with the blocks
    merged, inside the op."""
    from torch._dynamo.utils import counters

    from ffpa_patch.routing.policy import IN_OP

    torch._dynamo.reset()
    counters.clear()
    model = tiny.vision_lm(family, attn="ffpa")
    compiled = torch.compile(model, backend="aot_eager")
    for step in range(10):
        ids, kw = moving_image_batch(step)
        compiled(ids, **kw).logits.sum().backward()
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    rows = {(r["layer"], r["kernel"], r["reason"]) for r in stats.snapshot()}
    assert ("sliding", "fa4", IN_OP + BLOCKS_REASON) in rows, rows


@pytest.mark.parametrize("family", tiny.families("dense31b", "unified12b"))
def test_image_blocks_longer_than_the_window_stay_on_flash_attn_4(family, patched, reference_kernels):
    """Gemma4's own vision masks bound a block's past by the window; Transformers' generic ones (the
    12B's training forward) let a block see all of itself. Both are read exactly and run fused."""
    model = tiny.vision_lm(family)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, 100, (B, S), generator=g)
    ids[0, 2:16] = tiny.IMAGE_TOKEN  # 14 tokens, window 8
    ids[1, 9:22] = tiny.IMAGE_TOKEN
    inputs = ids, {"mm_token_type_ids": (ids == tiny.IMAGE_TOKEN).long()}, torch.ones(B, S, dtype=torch.bool)
    check_against_eager(None, None, "ffpa", model=model, inputs=inputs)
    rows = {(r["layer"], r["kernel"], r["reason"]): r["count"] for r in stats.snapshot()}
    assert rows.get(("sliding", "fa4", BLOCKS_REASON)) == n_layers(model, "sliding"), rows
