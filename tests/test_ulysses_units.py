"""The Ulysses SP pieces one at a time, in one process: the layout read from gathered positions,
the flags the local mask puts on them, the degree and core refusals, the patch's gate and revert."""
import time

import pytest
import torch
from packaging.version import Version

import ffpa_patch
import tiny
from ffpa_patch import hf, versions
from ffpa_patch.names import Shape
from ffpa_patch.routing import masks

deepspeed_sp = pytest.importorskip("deepspeed.runtime.sequence_parallel.ulysses_sp")


def expected_mask(positions, real, window=None):
    """Brute force: a query sees a real key of its own document, at or before it, within the window."""
    batch, seq = positions.shape
    out = torch.zeros(batch, seq, seq, dtype=torch.bool)
    for b in range(batch):
        doc, docs = 0, []
        for t in range(seq):
            if real[b].all() and t and positions[b, t] != positions[b, t - 1] + 1:
                doc += 1
            docs.append(doc)
        for i in range(seq):
            for j in range(i + 1):
                out[b, i, j] = bool(real[b, i] and real[b, j] and docs[i] == docs[j]
                                    and (window is None or i - j < window))
    return out


@pytest.mark.parametrize("window", [None, 4])
@pytest.mark.parametrize("layout", ["plain", "packed", "left_padded", "right_padded_batch"])
def test_the_layout_read_from_positions_is_the_mask_transformers_means(layout, window):
    seq = 16
    positions = torch.arange(seq)[None]
    real = torch.ones(1, seq, dtype=torch.bool)
    if layout == "packed":
        positions = torch.cat([torch.arange(5), torch.arange(7), torch.arange(4)])[None]
    elif layout == "left_padded":
        real[0, :3] = False
    elif layout == "right_padded_batch":
        positions, real = positions.repeat(2, 1), real.repeat(2, 1)
        real[1, 12:] = False
    flagged = torch.where(real, positions, masks.PAD)
    got = masks.over_positions(flagged, positions.shape[0], seq, window)
    assert got.problem is None
    assert got.layout.kind == (Shape.DENSE if layout == "plain" else Shape.VARLEN)
    spelled = masks.spelled(got.layout, seq, "cpu", window)
    spelled = masks.causal(seq, seq, "cpu", window).expand(positions.shape[0], 1, seq, seq) if spelled is None else spelled
    want = expected_mask(positions, real, window)
    assert torch.equal(spelled[:, 0] & real[:, :, None], want)  # real query rows: exactly the mask meant
    assert spelled[:, 0].any(-1).all()  # and no empty row (padding rows see something, as in stock masks)


def test_a_128k_sequence_is_read_in_o_of_s():
    seq = 131072
    positions = torch.cat([torch.arange(70000), torch.arange(seq - 70000)])[None]
    start = time.perf_counter()
    got = masks.over_positions(positions, 1, seq, 1024)
    elapsed = time.perf_counter() - start
    layout = got.layout
    assert layout.kind == Shape.VARLEN and layout.cu_seqlens.tolist() == [0, 70000, seq]
    assert layout.indices.numel() == seq and layout.segments.numel() == seq  # nothing S x S
    assert elapsed < 5.0, elapsed


def test_local_flags_say_padding_and_blocks_and_nothing_else():
    seq = 8
    pos = torch.arange(8, 16)[None]  # rank 1's half
    assert torch.equal(masks.flag_positions(None, pos, 2), pos.expand(2, -1))
    assert torch.equal(masks.flag_positions(masks.CausalMask(4), pos, 1), pos)
    causal = masks.causal(seq, seq, "cpu")
    padded = causal.clone().expand(2, 1, seq, seq).clone()
    padded[1, :, :, 6:] = False  # row 1: the last two keys are padding
    flags = masks.flag_positions(padded, pos, 2)
    assert torch.equal(flags[0], pos[0]) and flags[1, 6:].eq(masks.PAD).all() and torch.equal(flags[1, :6], pos[0, :6])
    blocks = causal.clone()
    blocks[..., 2:5, 2:5] = True  # an image block: queries see later keys
    assert masks.flag_positions(blocks, pos, 1).eq(masks.NOT_CAUSAL).all()
    soft = torch.zeros(1, 1, seq, seq).masked_fill(~causal, float("-inf"))
    assert torch.equal(masks.flag_positions(soft, pos, 1), pos)  # a hard float mask reads as the bool one
    assert masks.flag_positions(soft + 0.5, pos, 1).eq(masks.NOT_CAUSAL).all()  # a soft bias: not ours to read
    assert masks.over_positions(masks.flag_positions(blocks, pos, 1), 1, seq, None).problem == masks.IMAGES_UNDER_SP


def test_missing_positions_refuse_with_the_way_out():
    assert masks.over_positions(None, 1, 8, None).problem == masks.NO_POSITIONS


@pytest.mark.parametrize("family, degree, fits", [("dense31b", 3, [2, 4]), ("e2b", 4, [2])])
def test_a_degree_that_splits_no_layer_shape_is_refused_naming_the_layers_and_the_degrees_that_fit(
        family, degree, fits, patched):
    model = tiny.causal_lm(family, attn="sdpa")
    with pytest.raises(ValueError, match=r"sequence_parallel_size=%d does not split" % degree) as err:
        deepspeed_sp.UlyssesSPAttentionHF.register_with_transformers(
            model_name_or_path=model, core_attn_implementation="sdpa", sequence_parallel_size=degree, micro_batch_size=1)
    assert f"Degrees that fit every layer: {fits}" in str(err.value)


def test_layer_shapes_come_from_the_layers_not_config_head_dim():
    shapes = hf.head_shapes(tiny.text_config("dense31b"))
    assert shapes == {hf.HeadShape(32, 4, 2): ["sliding"], hf.HeadShape(512, 4, 1): ["full"]}


def test_a_core_that_does_not_reach_the_route_is_refused(patched):
    model = tiny.causal_lm("dense31b", attn="eager")
    with pytest.raises(ValueError, match=r"'sdpa' \(ffpa_patch's drop-in"):
        deepspeed_sp.UlyssesSPAttentionHF.register_with_transformers(
            model_name_or_path=model, core_attn_implementation="eager", sequence_parallel_size=2, micro_batch_size=1)


def test_revert_gives_deepspeed_its_registration_back():
    ffpa_patch.revert()
    original = vars(deepspeed_sp.UlyssesSPAttentionHF)["register_with_transformers"]
    status = ffpa_patch.apply()
    assert {p["name"]: p["state"] for p in status.patches}["deepspeed_ulysses"] == "applied"
    assert vars(deepspeed_sp.UlyssesSPAttentionHF)["register_with_transformers"] is not original
    ffpa_patch.revert()
    assert vars(deepspeed_sp.UlyssesSPAttentionHF)["register_with_transformers"] is original


def test_a_deepspeed_outside_the_tested_range_turns_off_only_this_patch(monkeypatch):
    real = versions.installed
    monkeypatch.setattr(versions, "installed", lambda d: Version("0.21.0") if d == "deepspeed" else real(d))
    ffpa_patch.revert()
    try:
        with pytest.warns(UserWarning, match=r"deepspeed_ulysses off: deepspeed 0\.21\.0 is UNSUPPORTED"):
            st = ffpa_patch.apply()
        rows = {p["name"]: p["state"] for p in st.patches}
        assert rows["deepspeed_ulysses"] == "unsupported versions" and rows["gemma4_dropin"] == "applied"
    finally:
        ffpa_patch.revert()
