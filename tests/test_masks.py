"""Mask analysis: exact structure or 'other', never a guess."""
import torch

from ffpa_patch.routing.masks import analyse


def causal(s, window=None):
    i, j = torch.arange(s)[:, None], torch.arange(s)[None]
    m = j <= i
    if window:
        m &= (i - j) < window
    return m


def test_plain_causal_is_dense():
    assert analyse(causal(10)[None, None], 1, None).kind == "dense"
    assert analyse(causal(10, 4)[None, None], 3, 4).kind == "dense"  # broadcast over batch


def test_wrong_window_is_other():
    assert analyse(causal(10, 4)[None, None], 1, 5).kind == "other"
    assert analyse(causal(10)[None, None], 1, 4).kind == "other"


def test_padding_and_packing_give_cu_seqlens():
    left = causal(8).clone()
    left[:, :3] = False  # keys 0..2 are padding
    packed = causal(8) & (torch.arange(8)[:, None] // 5 == torch.arange(8)[None] // 5)  # 5 + 3
    mask = torch.stack([left, packed])[:, None]
    lay = analyse(mask, 2, None)
    assert lay.kind == "varlen"
    assert lay.cu_seqlens.tolist() == [0, 5, 10, 13]
    assert lay.max_seqlen == 5
    assert lay.indices.tolist() == [3, 4, 5, 6, 7] + list(range(8, 16))


def test_additive_float_mask_is_read_like_bool():
    m = torch.zeros(6, 6).masked_fill(~causal(6), torch.finfo(torch.float32).min)
    assert analyse(m[None, None], 1, None).kind == "dense"


def test_bidirectional_block_is_other():
    m = causal(8).clone()
    m[2:5, 2:5] = True
    assert analyse(m[None, None], 1, None).kind == "other"


def test_analysis_is_shared_by_views_of_one_mask_and_redone_after_a_write():
    """A compiled graph hands each layer's op a fresh view of one mask buffer: the layers
    share one analysis. Writing into the mask (version bump) makes it analysed again."""
    mask = causal(8)[None, None].clone()
    first = analyse(mask, 1, None)
    view = mask.as_strided(mask.shape, mask.stride())
    assert view is not mask and analyse(view, 1, None) is first
    assert analyse(mask.clone(), 1, None) is not first  # equal values, another buffer
    mask[0, 0, :, 0] = False  # token 0 is now padding (it sees nothing, not even itself)
    again = analyse(view, 1, None)
    assert again is not first and (first.kind, again.kind) == ("dense", "varlen")
