"""No silent bypass: a wrapper someone else puts on the "sdpa" or "ffpa" attention entry is what
Gemma 4 calls, around ffpa_patch's route; revert() and a second apply() neither drop nor double it.

Two ways to install a wrapper exist in Transformers, and both are tested: the class-level
``AttentionInterface.register(name, fn)`` and the shared instance's ``ALL_ATTENTION_FUNCTIONS[name] = fn``
(an instance-local entry, read first: what DeepSpeed's Ulysses SP does; its own wrapper is tested in
tests/test_ulysses.py).
"""
import pytest
import torch

import ffpa_patch
import tiny
from ffpa_patch.routing import stats
from ffpa_patch.wrapping import live_in_chain

IDS = torch.randint(0, 128, (1, 20), generator=torch.Generator().manual_seed(0))


class Counting:
    """A user's wrapper: counts the Gemma 4 text-attention calls it sees, then calls what it wrapped."""

    def __init__(self, inner):
        self.inner, self.calls = inner, 0

    def __call__(self, module, query, key, value, attention_mask, **kwargs):
        if type(module).__name__.endswith("TextAttention"):
            self.calls += 1
        return self.inner(module, query, key, value, attention_mask, **kwargs)


@pytest.fixture
def tables():
    """The two tables as they were; whatever a test installed is taken out again."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

    ffpa_patch.revert()
    saved_global, saved_local = dict(AttentionInterface._global_mapping), dict(ALL_ATTENTION_FUNCTIONS._local_mapping)
    yield AttentionInterface, ALL_ATTENTION_FUNCTIONS
    ffpa_patch.revert()
    AttentionInterface._global_mapping.clear()
    AttentionInterface._global_mapping.update(saved_global)
    ALL_ATTENTION_FUNCTIONS._local_mapping.clear()
    ALL_ATTENTION_FUNCTIONS._local_mapping.update(saved_local)
    stats.reset()


def install(tables, how, name):
    interface, shared = tables
    wrapper = Counting(shared[name])
    if how == "register":
        interface.register(name, wrapper)
    else:
        shared[name] = wrapper
    return wrapper


def forward(model):
    with torch.no_grad():
        return model(IDS).logits


@pytest.mark.parametrize("how", ["register", "instance"])
@pytest.mark.parametrize("backend", ["sdpa", "ffpa"])
def test_a_wrapper_installed_after_apply_runs_around_the_route(backend, how, tables, reference_kernels):
    ffpa_patch.apply()
    stock = forward(tiny.causal_lm("dense31b", attn="eager"))
    model = tiny.causal_lm("dense31b", attn=backend)  # built before the wrapper: the order accelerate uses
    wrapper = install(tables, how, backend)
    stats.reset()
    out = forward(model)
    n_layers = model.config.num_hidden_layers
    assert wrapper.calls == n_layers  # every text-attention call went through it
    assert stats.total("full", "ffpa") == 1 and stats.total("sliding", "fa4") == n_layers - 1  # and then through ours
    torch.testing.assert_close(out, stock, atol=5e-5, rtol=1e-4)


@pytest.mark.parametrize("how", ["register", "instance"])
def test_revert_keeps_a_wrapper_on_top_and_apply_again_switches_ours_back_on_once(how, tables, reference_kernels):
    ffpa_patch.apply()
    model = tiny.causal_lm("dense31b", attn="sdpa")
    wrapper = install(tables, how, "sdpa")
    ffpa_patch.revert()
    stats.reset()
    forward(model)
    assert wrapper.calls == model.config.num_hidden_layers and stats.total() == 0  # theirs runs, ours is off inside it
    assert live_in_chain(tables[1]["sdpa"].inner, "gemma4_dropin") == 0
    for _ in range(2):
        status = ffpa_patch.apply()
        assert {p["name"]: p["state"] for p in status.patches}["gemma4_dropin"] == "applied"
    assert tables[1]["sdpa"] is wrapper  # not dropped, not wrapped again
    assert live_in_chain(wrapper.inner, "gemma4_dropin") == 1
    wrapper.calls = 0
    stats.reset()
    forward(model)
    assert wrapper.calls == model.config.num_hidden_layers and stats.total("full", "ffpa") == 1


def test_a_wrapper_installed_before_apply_is_not_bypassed_the_drop_in_stands_down(tables, reference_kernels):
    """Ours would sit outside a wrapper already there, and routed calls would skip it: the drop-in
    says so and stays off; the wrapper runs for every layer (stock SDPA inside)."""
    ffpa_patch.revert()
    wrapper = install(tables, "register", "sdpa")
    with pytest.warns(ffpa_patch.FFPAPatchWarning, match="gemma4_dropin stood down"):
        status = ffpa_patch.apply()
    row = {p["name"]: p for p in status.patches}["gemma4_dropin"]
    assert row["state"] == "stood down" and "Counting" in row["reason"]
    model = tiny.causal_lm("dense31b", attn="sdpa")
    stats.reset()
    forward(model)
    assert wrapper.calls == model.config.num_hidden_layers and stats.total() == 0
    with pytest.raises(RuntimeError, match="stood down"):
        ffpa_patch.apply(strict=True)


def test_an_instance_local_entry_installed_before_apply_makes_the_drop_in_stand_down(tables, reference_kernels):
    ffpa_patch.revert()
    wrapper = install(tables, "instance", "sdpa")
    with pytest.warns(ffpa_patch.FFPAPatchWarning, match="instance-local 'sdpa' entry"):
        status = ffpa_patch.apply()
    assert {p["name"]: p["state"] for p in status.patches}["gemma4_dropin"] == "stood down"
    model = tiny.causal_lm("dense31b", attn="sdpa")
    forward(model)
    assert wrapper.calls == model.config.num_hidden_layers


def test_status_says_when_a_later_entry_does_not_reach_the_drop_in(tables, reference_kernels):
    """A replacement installed after apply() that calls Transformers' function directly is what
    Gemma 4 calls (not bypassed), and status() says the drop-in is no longer reached."""
    from ffpa_patch import hf

    ffpa_patch.apply()
    replacement = Counting(hf.stock_sdpa())
    tables[0].register("sdpa", replacement)
    row = {p["name"]: p for p in ffpa_patch.status().patches}["gemma4_dropin"]
    assert any("was not found inside it" in w for w in row["warnings"])
    model = tiny.causal_lm("dense31b", attn="sdpa")
    forward(model)
    assert replacement.calls == model.config.num_hidden_layers
