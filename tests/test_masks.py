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


def test_random_padding_and_packing_layouts_match_their_construction():
    """Rows of documents after optional left padding (and right padding), with and without a
    window, as bool and as additive masks: the layout's bounds, indices and longest segment
    are exactly the documents'."""
    import random

    rng = random.Random(0)
    for _ in range(150):
        seq, batch, window = rng.randint(2, 20), rng.randint(1, 3), rng.choice([None, 3])
        mask = torch.zeros(batch, 1, seq, seq, dtype=torch.bool)
        lengths, real = [], []
        for b in range(batch):
            p = rng.randint(0, seq // 2)
            while p < seq and (not lengths or rng.random() < 0.7):
                n = rng.randint(1, seq - p)
                mask[b, 0, p : p + n, p : p + n] = causal(n, window)
                lengths.append(n)
                real += range(b * seq + p, b * seq + p + n)
                p += n
        as_float = rng.random() < 0.3
        given = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min) if as_float else mask
        lay = analyse(given, batch, window)
        if lay.kind == "dense":
            assert lengths == [seq] * batch
            continue
        assert lay.kind == "varlen"
        assert lay.cu_seqlens.tolist() == [sum(lengths[:i]) for i in range(len(lengths) + 1)]
        assert lay.cu_seqlens.dtype == torch.int32 and lay.max_seqlen == max(lengths)
        assert lay.indices.tolist() == real
