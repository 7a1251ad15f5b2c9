"""hf.py is the one adapter to Transformers internals: its check() finds them all in the
installed version, and names the one that is gone when one is."""
import pytest

from ffpa_patch import hf


def test_every_internal_ffpa_patch_relies_on_is_found():
    assert hf.check() == []


@pytest.mark.parametrize("breakage, named", [
    ("sdpa entry", "AttentionInterface._global_mapping with 'sdpa'"),
    ("mask keyword", "masking_utils.sdpa_mask keywords"),
    ("eager attention", "eager_attention_forward"),
])
def test_a_missing_internal_is_named(monkeypatch, breakage, named):
    if breakage == "sdpa entry":
        registry = dict(hf.attention_registry())
        registry.pop("sdpa")
        monkeypatch.setattr(hf.attention_interface(), "_global_mapping", registry)
    elif breakage == "mask keyword":
        def sdpa_mask(batch_size, q_length, kv_length, **kwargs):  # a layout without local_size & co.
            return None
        monkeypatch.setattr(hf, "sdpa_mask", lambda: sdpa_mask)
    else:
        monkeypatch.delattr(hf.family_module(hf.GEMMA4), "eager_attention_forward")
    problems = hf.check()
    assert len(problems) == 1 and named in problems[0], problems


def test_text_attention_and_config_are_recognised_and_nothing_else():
    import tiny

    model = tiny.causal_lm("dense31b")
    assert all(hf.is_text_attention(layer.self_attn) for layer in model.model.layers)
    assert not hf.is_text_attention(model.model.layers[0].mlp)
    assert hf.is_text_config(model.config) and not hf.is_text_config(None)
    assert hf.configured_window(model.model.layers[0].self_attn) == model.config.sliding_window
    model.config.sliding_window = 3  # read at call time, as Transformers builds the mask
    assert hf.configured_window(model.model.layers[0].self_attn) == 3
    assert hf.configured_window(model.model.layers[5].self_attn) is None
    assert [hf.is_last_layer(layer.self_attn) for layer in model.model.layers] == [False] * 5 + [True]
