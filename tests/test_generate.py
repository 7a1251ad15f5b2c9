"""``generate()`` as users call it: a left-padded batch, greedy, dynamic and static cache.

The prompt's prefill runs the fused kernels (varlen: the batch is left-padded) on the fp32
seam, decoding (q_len == 1) and a static cache's prefill (q_len < kv_len) take SDPA; the
tokens must be stock SDPA's, on the "ffpa" backend and on the drop-in route alike."""
import pytest
import torch

import ffpa_patch
import tiny


def prompt():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 128, (2, 20), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :6] = 0  # row 0 left-padded, as a tokenizer pads for generation
    return ids.masked_fill(mask == 0, 0), mask


def greedy(model, cache):
    ids, mask = prompt()
    kw = {"cache_implementation": cache} if cache != "dynamic" else {}
    return model.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0, **kw)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("family", ["dense31b", "e2b"])
def test_greedy_generate_of_a_left_padded_batch_gives_stock_tokens(family, cache, reference_kernels):
    ffpa_patch.revert()
    try:
        want = greedy(tiny.causal_lm(family, attn="sdpa", use_cache=True), cache)
    except IndexError as exc:  # Transformers 5.5's StaticCache starts with no layers for Gemma4
        ffpa_patch.apply()
        pytest.skip(f"stock generate() with this cache fails on this Transformers: {exc}")
    ffpa_patch.apply()
    try:
        for attn in ("ffpa", "sdpa"):  # the backend, then the drop-in route on a model left on "sdpa"
            ffpa_patch.reset_stats()
            got = greedy(tiny.causal_lm(family, attn=attn, use_cache=True), cache)
            assert torch.equal(got, want), attn
            routes = {(r["layer"], r["kernel"], r["reason"]): r["count"] for r in ffpa_patch.status().routes}
            n_full = tiny.text_config(family).layer_types.count("full_attention")
            prefill = {"dynamic": ("full", "ffpa", "varlen (padding/packing)"),
                       "static": ("full", "sdpa", "q_len != kv_len (cache or chunked prefill)")}[cache]
            # 12 forwards (the prompt, then 11 steps of one token) through every full layer. From
            # Transformers 5.23 E2B's KV-shared layers see only the last prompt token (one query).
            assert sum(n for (layer, _, _), n in routes.items() if layer == "full") == 12 * n_full, routes
            assert routes.get(prefill, 0) >= 1, routes  # the left-padded prompt
            assert routes.get(("sliding", "fa4", "varlen (padding/packing)"), 0) >= 1, routes
            assert routes.get(("full", "sdpa", "decode (q_len == 1)")) >= 11 * n_full, routes
    finally:
        ffpa_patch.revert()
        ffpa_patch.reset_stats()
