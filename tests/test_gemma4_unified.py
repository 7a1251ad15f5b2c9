"""Gemma 4 12B (Transformers' ``gemma4_unified``, its own classes) is routed as the other Gemma 4s.

The whole-model cases it shares with them (the "ffpa" backend and the drop-in, dense, padded
and packed, text and image batches) run in tests/test_model_routes.py through ``tiny.families``;
here are the clients and the adapter: torch.compile, generate(), Trainer + PEFT in strict mode,
``status --config``, ``hf.check()``, the first-forward line, and a config whose ``head_dim``
nothing may read.
"""
import json

import pytest
import torch

import ffpa_patch
import tiny
from conftest import run_python
from ffpa_patch import hf
from ffpa_patch.routing import stats

pytestmark = pytest.mark.skipif(not tiny.has_unified(), reason="this Transformers has no gemma4_unified (5.10+)")
FAMILY = "unified12b"

#: the released text config of google/gemma-4-12B(-it) (benchmarks/models.py has its sources)
RELEASED_12B = dict(hidden_size=3840, intermediate_size=15360, num_hidden_layers=48, num_attention_heads=16,
                    num_key_value_heads=8, num_global_key_value_heads=1, attention_k_eq_v=True, sliding_window=1024,
                    head_dim=256, global_head_dim=512, final_logit_softcapping=30.0, vocab_size=262144)


def test_the_12b_is_a_family_of_the_adapter():
    model = tiny.causal_lm(FAMILY)
    layers = [layer.self_attn for layer in model.model.layers]
    assert all(hf.family_of(a) is hf.GEMMA4_UNIFIED for a in layers)
    assert hf.is_text_config(model.config)
    assert hf.check() == []  # every internal of both families found
    assert "gemma4_unified_dropin" in ffpa_patch.PATCH_NAMES
    assert "12B" in hf.MODELS and "31B" in hf.MODELS


def test_compiled_12b_has_no_graph_breaks_and_matches_eager(patched):
    from torch._dynamo.utils import counters

    from ffpa_patch.kernels import reference, use
    from test_compile import _assert_same, _inputs, _loss_and_grads, ran

    torch._dynamo.reset()
    counters.clear()
    model = tiny.causal_lm(FAMILY, attn="ffpa")
    ids, kw = _inputs("left_pad")
    with use(reference.kernel_set(fa4=False, fp32=True)):
        ref = _loss_and_grads(model, model, ids, kw)
        stats.reset()
        got = _loss_and_grads(model, torch.compile(model, backend="aot_eager"), ids, kw)
    assert dict(counters["graph_break"]) == {}
    _assert_same(*got, *ref)
    assert ran("full", "ffpa") == 1  # the op, at run time: FFPA varlen on the padded batch


@pytest.mark.parametrize("attn", ["ffpa", "sdpa"])
def test_greedy_generate_gives_stock_tokens(attn, reference_kernels):
    from test_generate import greedy

    ffpa_patch.revert()
    want = greedy(tiny.causal_lm(FAMILY, attn="sdpa", use_cache=True), "dynamic")
    ffpa_patch.apply()
    try:
        ffpa_patch.reset_stats()
        got = greedy(tiny.causal_lm(FAMILY, attn=attn, use_cache=True), "dynamic")
        assert torch.equal(got, want)
        assert stats.total("full", "ffpa") >= 1 and stats.total("sliding", "fa4") >= 1, stats.snapshot()
    finally:
        ffpa_patch.revert()
        ffpa_patch.reset_stats()


def test_peft_lora_under_trainer_in_strict_mode_runs_every_layer_fused(tmp_path, patched, strict_kernels):
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model
    from transformers import DataCollatorWithFlattening

    from test_trainer import train

    ffpa_patch.apply(strict=True)  # a full layer that missed FFPA would raise
    model = get_peft_model(tiny.causal_lm(FAMILY, attn="ffpa").train(),
                           LoraConfig(r=4, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], lora_dropout=0.0))
    _, losses = train(tmp_path, model, DataCollatorWithFlattening(), bf16=True)
    assert len(losses) == 3
    rows = stats.snapshot()
    assert {r["kernel"] for r in rows} == {"ffpa", "fa4"}, rows
    assert all("varlen (padding/packing)" in r["reason"] and "autocast" in r["reason"] for r in rows), rows


def test_strict_mode_raises_when_a_12b_full_layer_misses_ffpa(patched):
    ffpa_patch.apply(strict=True)
    model = tiny.causal_lm(FAMILY, attn="ffpa")  # the real kernels: on CPU the full layer falls back
    with pytest.raises(ffpa_patch.FFPAFallbackError, match="head_dim=512 full-attention layer fell back"):
        model(torch.randint(0, 128, (1, 12)))


def test_the_first_forward_line_names_the_12b():
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = ("import sys, torch; sys.path.insert(0, 'tests')\n"
            "import ffpa_patch, tiny\n"
            "from ffpa_patch.kernels import use, reference\n"
            "with use(reference.kernel_set(fp32=True)):\n"
            f"    tiny.causal_lm({FAMILY!r}, attn='ffpa')(torch.randint(0, 128, (1, 12)))\n")
    env = dict(os.environ, PYTHONPATH=root)
    env.pop("FFPA_PATCH_DISABLE", None)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root, timeout=300)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("ffpa_patch: ")]
    assert lines == ['ffpa_patch: Gemma4 12B (gemma4_unified) model on "ffpa": 1 full -> ffpa: dense causal | '
                     "5 sliding -> fa4: dense causal"], proc.stderr


def test_status_config_of_the_released_12b_plans_each_layer(tmp_path):
    from transformers.models.gemma4_unified.configuration_gemma4_unified import Gemma4UnifiedTextConfig

    Gemma4UnifiedTextConfig(**RELEASED_12B).save_pretrained(tmp_path)
    out = run_python(f"from ffpa_patch.cli import main; main(['status', '--json', '--config', {str(tmp_path)!r}])")
    plan = json.loads(out)["plan"]
    for backend in ("ffpa", "sdpa"):
        rows = plan[backend]
        assert sum(r["layers"] for r in rows if r["layer"] == "full" and r["head_dim"] == 512) == 8, rows
        assert sum(r["layers"] for r in rows if r["layer"] == "sliding" and r["head_dim"] == 256) == 40, rows
    assert all("FFPA needs CUDA" in r["reason"] for r in plan["ffpa"] if r["layer"] == "full")


def test_nothing_reads_the_config_head_dim(patched, reference_kernels):
    """From Transformers 5.15 a per-layer config raises on ``config.head_dim``; before, it holds the
    sliding layers' 256. Either way routing must take head_dim from the module or the tensors:
    here every config attribute naming a head dim raises, on both families."""
    for family in ("dense31b", FAMILY):
        model = tiny.causal_lm(family, attn="ffpa")
        config = model.config
        original = type(config)
        blocked = {name: property(lambda self, name=name: (_ for _ in ()).throw(RuntimeError(f"read config.{name}")))
                   for name in ("head_dim", "global_head_dim")}
        config.__class__ = type("NoHeadDim", (original,), blocked)
        try:
            stats.reset()
            ids = torch.randint(0, 128, (2, 16))
            mask = torch.ones_like(ids)
            mask[0, :4] = 0
            model(ids, attention_mask=mask).logits.sum().backward()
            rows = stats.snapshot()
            assert stats.total("full", "ffpa") == 1 and stats.total(kernel="sdpa") == 0, rows
        finally:
            config.__class__ = original


def test_a_gemma4_layout_missing_from_this_transformers_is_said_not_waited_for():
    """A family whose modeling module this Transformers lacks (the 12B before 5.10): its drop-in
    patch says so in status() and nothing else changes."""
    from ffpa_patch.lifecycle import Lifecycle
    from ffpa_patch.patches.attention_backend import FFPABackend
    from ffpa_patch.patches.gemma4_dropin import dropin_for

    absent = hf.GEMMA4_UNIFIED._replace(name="gemma4_absent", module="transformers.models.gemma4_absent.modeling_gemma4_absent")
    life = Lifecycle((FFPABackend, dropin_for(absent)))
    try:
        life.apply(explicit=True, strict=False, targets=None, exclude=(), force=False)
        rows = {p["name"]: p for p in life.status().patches}
        assert rows["gemma4_absent_dropin"]["state"] == "not installed"
        assert "not in this transformers version" in rows["gemma4_absent_dropin"]["reason"]
        assert rows["ffpa_backend"]["state"] == "applied"
    finally:
        life.revert()
