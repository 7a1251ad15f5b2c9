"""Mask analysis: exact structure or 'other', never a guess."""
import torch

from ffpa_patch.routing.masks import analyse, read


def causal(s, window=None):
    i, j = torch.arange(s)[:, None], torch.arange(s)[None]
    m = j <= i
    if window:
        m &= (i - j) < window
    return m


def test_plain_causal_is_dense():
    assert read(causal(10)[None, None], 1, None).kind == "dense"
    assert read(causal(10, 4)[None, None], 3, 4).kind == "dense"  # broadcast over batch


def test_wrong_window_is_other():
    assert read(causal(10, 4)[None, None], 1, 5).kind == "other"
    assert read(causal(10)[None, None], 1, 4).kind == "other"


def test_padding_and_packing_give_cu_seqlens():
    left = causal(8).clone()
    left[:, :3] = False  # keys 0..2 are padding
    packed = causal(8) & (torch.arange(8)[:, None] // 5 == torch.arange(8)[None] // 5)  # 5 + 3
    mask = torch.stack([left, packed])[:, None]
    lay = read(mask, 2, None)
    assert lay.kind == "varlen"
    assert lay.cu_seqlens.tolist() == [0, 5, 10, 13]
    assert lay.max_seqlen == 5
    assert lay.indices.tolist() == [3, 4, 5, 6, 7] + list(range(8, 16))


def test_additive_float_mask_is_read_like_bool():
    m = torch.zeros(6, 6).masked_fill(~causal(6), torch.finfo(torch.float32).min)
    assert read(m[None, None], 1, None).kind == "dense"


def test_a_bidirectional_block_is_read_exactly():
    m = causal(8).clone()
    m[2:5, 2:5] = True
    lay = read(m[None, None], 2, None)  # one mask broadcast over two rows
    assert lay.kind == "blocks" and lay.cu_seqlens is None
    assert lay.blocks.tolist() == [[2, 3], [10, 3]] and lay.max_block == 3


def test_what_is_not_causal_plus_blocks_stays_other():
    shifted = causal(8).clone()
    shifted[2:5, 6] = True  # rows 2-4 see key 6 but not 5: not a block
    partial = causal(8).clone()
    partial[2, 4] = True  # a later key, but not the one between: not a run
    cross = causal(8) & (torch.arange(8)[:, None] // 4 == torch.arange(8)[None] // 4)  # two documents of 4
    cross[2:6, 2:6] = True  # a "block" across the document boundary
    for m in (shifted, partial, cross):
        assert read(m[None, None], 1, None).kind == "other"


def random_image_batch(rng, window=None, whole=False):
    """Rows of documents (after optional left padding) holding bidirectional blocks, as Transformers
    builds them within each document: Gemma 4's own vision masks AND(window on the past, OR(causal,
    same block)); its generic ones (``whole``: the 12B's training forward) OR(causal AND window,
    same block)."""
    seq, batch = rng.randint(4, 24), rng.randint(1, 3)
    mask = torch.zeros(batch, 1, seq, seq, dtype=torch.bool)
    blocks, docs = [], 0
    for b in range(batch):
        p = rng.randint(0, seq // 3)
        while p < seq and (docs == 0 or rng.random() < 0.6):
            n = rng.randint(2, seq - p) if seq - p >= 2 else seq - p
            allowed = causal(n, window)
            q = 0
            while q < n - 1:
                q += rng.randint(0, 3)
                length = rng.randint(2, 9)  # longer than the windows below, at times
                if q + length > n:
                    break
                i, j = torch.arange(n)[:, None], torch.arange(n)[None]
                block = (i >= q) & (i < q + length) & (j >= q) & (j < q + length)
                allowed |= block if whole else block & (j > i)
                blocks.append([b * seq + p + q, length])
                q += length
            mask[b, 0, p : p + n, p : p + n] = allowed
            docs += 1
            p += n
    return mask, batch, blocks


def test_random_image_batches_give_exactly_their_blocks():
    import random

    rng = random.Random(1)
    seen = set()
    for n in range(400):
        window, whole = rng.choice([None, 3, 5]), n % 2 == 1
        mask, batch, blocks = random_image_batch(rng, window, whole)
        lay = read(mask, batch, window)
        if not blocks:
            assert lay.kind in ("dense", "varlen")
            continue
        assert lay.kind == "blocks", (mask, blocks)
        assert lay.blocks.tolist() == blocks and lay.max_block == max(n for _, n in blocks)
        seen.add(lay.cu_seqlens is None)
    assert seen == {True, False}  # both bases: one unpadded sequence per row, and varlen


def test_block_union_on_the_reference_seam_is_the_masked_attention():
    """kernels/blocks.py over the reference kernels, forward and gradients, against attention
    under the very mask: a block edge off by one, or a lost window, changes the answer."""
    import random

    from ffpa_patch.kernels import blocks, reference

    rng = random.Random(2)
    kernel = reference.kernel_set(fp32=True).by_name("fa4")
    checked = 0
    while checked < 60:
        window, whole = rng.choice([None, 4]), checked % 2 == 1
        mask, batch, found = random_image_batch(rng, window, whole)
        lay = read(mask, batch, window)
        if lay.kind != "blocks":
            continue
        seq = mask.shape[-1]
        torch.manual_seed(checked)
        q = torch.randn(batch, seq, 4, 8, requires_grad=True)
        k = torch.randn(batch, seq, 2, 8, requires_grad=True)
        v = torch.randn(batch, seq, 2, 8, requires_grad=True)
        out = blocks.attention(kernel, q, k, v, lay, 0.5, window)
        want = reference.masked(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask, 0.5)
        real = mask[:, 0].diagonal(dim1=-2, dim2=-1)
        torch.testing.assert_close(out[real], want[real], atol=1e-5, rtol=1e-4)
        g = torch.randn_like(out) * real[..., None, None]
        got = torch.autograd.grad(out, (q, k, v), g)
        ref = torch.autograd.grad(want, (q, k, v), g)
        for a, b in zip(got, ref):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
        checked += 1


def test_one_analysis_per_forward_shared_by_views_and_read_again_in_the_next_forward():
    """The layers of one forward share one analysis (a compiled graph hands each layer's op a
    fresh view of the one mask buffer); the next forward (a layer index that does not increase)
    reads the mask again, even when it was rewritten behind torch's version counter."""
    mask = causal(8)[None, None].clone()
    first = analyse(mask, 1, None, layer_idx=5)
    view = mask.as_strided(mask.shape, mask.stride())
    assert view is not mask and analyse(view, 1, None, layer_idx=11) is first
    assert analyse(mask.clone(), 1, None, layer_idx=17) is not first  # equal values, another buffer
    mask.numpy()[0, 0, :, 0] = False  # token 0 is now padding; a numpy write keeps torch's version
    again = analyse(view, 1, None, layer_idx=5)  # layer 5 again: the next forward
    assert again is not first and (first.kind, again.kind) == ("dense", "varlen")


def test_a_backward_recomputes_with_its_forwards_analysis():
    """Checkpointing recomputes each layer inside backward (in reverse order, on autograd's
    thread): it must see the mask as the forward did, and selective checkpointing also needs
    the same ops, so no analysis of its own."""
    import torch

    mask = causal(8)[None, None].clone()
    forward = analyse(mask, 1, None, layer_idx=5)
    found = []

    class Recompute(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):  # checkpointing recomputes layers in reverse order inside backward
            found.extend(analyse(mask, 1, None, layer_idx=i) for i in (11, 5))
            return g

    x = torch.ones(1, requires_grad=True)
    Recompute.apply(x).sum().backward()
    assert found[0] is forward and found[1] is forward


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
        lay = read(given, batch, window)
        if lay.kind == "dense":
            assert lengths == [seq] * batch
            continue
        assert lay.kind == "varlen"
        assert lay.cu_seqlens.tolist() == [sum(lengths[:i]) for i in range(len(lengths) + 1)]
        assert lay.cu_seqlens.dtype == torch.int32 and lay.max_seqlen == max(lengths)
        assert lay.indices.tolist() == real
