"""NeMo-Automodel Gemma4-MoE ring attach, against the real installed NeMo (tox env nemo06/nemo07).

Skipped where nemo-automodel is not installed.
"""
import pytest

import ffpa_patch

model_mod = pytest.importorskip("nemo_automodel.components.models.gemma4_moe.model")


def build_layers(backend):
    import torch
    from nemo_automodel.components.models.common import BackendConfig
    from nemo_automodel.components.moe.layers import MoEConfig

    import tiny

    cfg = tiny.text_config("moe", attn="sdpa", num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"])
    if backend is not None:
        cfg.cp_full_attn_backend = backend
    moe = MoEConfig(n_routed_experts=4, n_shared_experts=0, n_activated_experts=2, n_expert_groups=1, n_limited_groups=1,
                    train_gate=True, gate_bias_update_factor=0.0, aux_loss_coeff=0.0, score_func="softmax", route_scale=1.0,
                    dim=cfg.hidden_size, inter_dim=cfg.intermediate_size, moe_inter_dim=32, norm_topk_prob=True, dtype=torch.float32)
    return [model_mod.Gemma4MoEDecoderLayer(cfg, i, moe, BackendConfig()) for i in range(2)]


def flags(layers):
    return [layer.self_attn._gemma4_cp_use_ffpa for layer in layers]


def needed():
    return not hasattr(model_mod.Gemma4ForConditionalGeneration, "_apply_cp_attention_backend_policy")


@pytest.fixture
def nemo_patched():
    ffpa_patch.revert()
    st = ffpa_patch.apply(targets=["nemo_moe_ring"])
    yield st
    ffpa_patch.revert()


def test_status_reports_applied_or_not_needed(nemo_patched):
    row = next(p for p in nemo_patched.patches if p["name"] == "nemo_moe_ring")
    assert row["state"] == ("applied" if needed() else "not needed")


def test_ffpa_backend_sets_use_ffpa_on_every_moe_layer(nemo_patched):
    if not needed():
        pytest.skip("0.7+ attaches the ring at model level with its own policy; nothing of ours runs")
    assert flags(build_layers("ffpa")) == [True, True]
    assert flags(build_layers("flex")) == [False, False]
    assert flags(build_layers(None)) == [False, False]


def test_bad_backend_is_a_clear_error(nemo_patched):
    if not needed():
        pytest.skip("0.7+ validates in its own policy at model level")
    with pytest.raises(ValueError, match="cp_full_attn_backend"):
        build_layers("sdpa")


def test_unpatched_06_ignores_the_setting_and_revert_restores_it():
    ffpa_patch.revert()
    if needed():
        assert flags(build_layers("ffpa")) == [False, False]  # the 0.6.x bug, observable on CPU
    original = model_mod.attach_gemma4_cp_ring_attention
    ffpa_patch.apply(targets=["nemo_moe_ring"])
    ffpa_patch.revert()
    assert model_mod.attach_gemma4_cp_ring_attention is original


@pytest.mark.parametrize("order", ["apply-then-import", "import-then-apply"])
def test_patch_lands_whichever_is_imported_first(order):
    from conftest import run_python

    imp = "import nemo_automodel.components.models.gemma4_moe.model as m\n"
    app = "import ffpa_patch\nffpa_patch.apply(targets=['nemo_moe_ring'])\n"
    code = (app + imp if order == "apply-then-import" else imp + app) + (
        "from ffpa_patch.wrapping import is_ours\n"
        "print(is_ours(m.attach_gemma4_cp_ring_attention))\n"
    )
    out = run_python(code).strip().splitlines()[-1]
    assert out == str(needed())


def test_status_warns_when_ffpa_cannot_run_or_fp32_sdpa_override_is_on(nemo_patched):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

    from ffpa_patch.kernels import ffpa

    warned = lambda: next(p for p in ffpa_patch.status().patches if p["name"] == "nemo_moe_ring")["warnings"]
    assert any("ffpa-attn not importable" in w for w in warned()) is (ffpa.import_error() is not None)
    fp32 = pytest.importorskip("nemo_automodel.components.models.gemma4_moe.sdpa_fp32")
    saved, saved_local = dict(AttentionInterface._global_mapping), dict(ALL_ATTENTION_FUNCTIONS._local_mapping)
    try:
        fp32.enable_gemma4_sdpa_fp32()
        assert any("fp32 SDPA override" in w for w in warned())
        assert "fp32 SDPA override" in str(ffpa_patch.status())
    finally:
        AttentionInterface._global_mapping.clear()
        AttentionInterface._global_mapping.update(saved)
        ALL_ATTENTION_FUNCTIONS._local_mapping.clear()
        ALL_ATTENTION_FUNCTIONS._local_mapping.update(saved_local)
    assert not any("fp32 SDPA override" in w for w in warned())
