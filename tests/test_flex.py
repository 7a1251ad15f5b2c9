"""FlexAttention BlockMasks built from the analysed mask, checked with torch's real flex_attention.

torch runs flex_attention eagerly on CPU (forward only), so here the real kernel
call checks the BlockMasks; gradients through the compiled kernel are a gpu test.
"""
import pytest
import torch

from ffpa_patch.kernels import flex, reference
from ffpa_patch.routing.masks import read as analyse
from test_masks import causal

S, WINDOW = 40, 7


def masks_by_kind():
    left = causal(S, WINDOW).clone()
    left[:, :9] = False  # row 0: 9 left-padding keys
    seg = torch.arange(S) // 13  # row 1: packed 13 + 13 + 13 + 1
    packed = causal(S, WINDOW) & (seg[:, None] == seg[None])
    image = causal(S, WINDOW).clone()
    image[5:12, 5:12] = True  # a bidirectional image block (both rows)
    other = causal(S, WINDOW).clone()
    other[5, 11] = True  # a later key outside any block
    return {
        "varlen": (torch.stack([left, packed])[:, None], 2),
        "blocks": (image[None, None], 2),
        "other": (other[None, None], 2),
        "dense": (causal(S, WINDOW)[None, None], 2),
    }


def real_rows(mask, batch):
    return mask[:, 0].diagonal(dim1=-2, dim2=-1).expand(batch, S)


@pytest.mark.parametrize("kind", ["dense", "varlen", "blocks", "other"])
def test_block_mask_allows_exactly_the_transformers_mask(kind):
    from torch.nn.attention.flex_attention import create_mask

    mask, batch = masks_by_kind()[kind]
    layout = analyse(mask, batch, WINDOW)
    assert layout.kind == kind
    bm = flex.block_mask(layout, batch, S, S, WINDOW, "cpu")
    got = create_mask(bm.mask_mod, batch, 1, S, S, device="cpu")[:, 0]
    want = mask[:, 0].expand(batch, S, S)
    real = real_rows(mask, batch)
    assert torch.equal(got[real], want[real])
    assert flex.block_mask(layout, batch, S, S, WINDOW, "cpu") is bm  # built once per mask


@pytest.mark.parametrize("kind", ["dense", "varlen", "blocks", "other"])
def test_real_flex_attention_with_our_block_mask_matches_the_reference(kind):
    from torch.nn.attention.flex_attention import flex_attention

    mask, batch = masks_by_kind()[kind]
    layout = analyse(mask, batch, WINDOW)
    bm = flex.block_mask(layout, batch, S, S, WINDOW, "cpu")
    torch.manual_seed(0)
    q = torch.randn(batch, 4, S, 16)
    k, v = torch.randn(batch, 2, S, 16), torch.randn(batch, 2, S, 16)
    got = flex_attention(q, k, v, block_mask=bm, scale=0.3, enable_gqa=True).transpose(1, 2)
    want = reference.masked(q, k, v, mask, 0.3)
    real = real_rows(mask, batch)
    torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(reference.flex(q, k, v, layout, 0.3, WINDOW)[real], want[real], atol=1e-5, rtol=1e-4)


def test_no_mask_means_bottom_right_causal_with_window():
    # KV-shared layers sliced to logits_to_keep: 5 queries against 12 keys, no mask given
    from torch.nn.attention.flex_attention import create_mask

    bm = flex.block_mask(None, 1, 5, 12, 4, "cpu")
    got = create_mask(bm.mask_mod, 1, 1, 5, 12, device="cpu")[0, 0]
    i, j = torch.arange(5)[:, None] + 7, torch.arange(12)[None]
    assert torch.equal(got, (j <= i) & (i - j < 4))


def test_production_flex_needs_cuda_and_small_tiles_above_256():
    assert "needs CUDA" in flex.unsupported(torch.device("cpu"), torch.bfloat16, 256)
    assert flex.kernel_options(256) is None
    assert flex.kernel_options(512)["BLOCK_M"] == 32


def test_compiled_flex_does_not_recompile_for_every_packed_length():
    # packing changes the length every step; dynamic=False compiled once per length (~7.8 s a step on an H200)
    before = flex.compiles()
    for n in (96, 160, 224, 352, 416):
        q = torch.randn(1, 2, n, 16)
        layout = analyse(causal(n, WINDOW)[None, None], 1, WINDOW)
        with torch.no_grad():
            out = flex.block(q, q, q, layout, 0.25, WINDOW)
        torch.testing.assert_close(out, reference.attention(*(q.transpose(1, 2),) * 3, 0.25, WINDOW), atol=1e-4, rtol=1e-4)
    assert flex.compiles() - before <= 2
