"""Exact at the edges: inputs where a shortcut would give a wrong number silently.

Each test is one of the wrong results or broken promises found by probing as a user would
(the routing-core issue, items 1-11); each compares against stock Transformers, computed
in the same test, and failed before the routing core was rebuilt.
"""
import os
import subprocess
import sys

import pytest
import torch

import ffpa_patch
import tiny
from ffpa_patch.routing import stats
from test_model_routes import batch, check_against_eager, n_layers

S = 24


def rows(layer=None):
    return [r for r in stats.snapshot() if layer in (None, r["layer"])]


# -- 1. other models on "ffpa" ------------------------------------------------------------------
def other_model(name):
    from transformers import (Gemma3ForCausalLM, Gemma3TextConfig, MistralConfig, MistralForCausalLM, Qwen2Config,
                              Qwen2ForCausalLM)

    torch.manual_seed(0)
    common = dict(vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=8)
    if name == "mistral":
        return MistralForCausalLM(MistralConfig(sliding_window=4, **common)).eval()
    if name == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(use_sliding_window=True, sliding_window=4, max_window_layers=0,
                                            layer_types=["sliding_attention"] * 2, **common)).eval()
    return Gemma3ForCausalLM(Gemma3TextConfig(sliding_window=4, layer_types=["sliding_attention", "full_attention"],
                                              **common)).eval()


@pytest.mark.parametrize("name", ["mistral", "qwen2", "gemma3"])
@pytest.mark.parametrize("padded", [False, True])
def test_another_model_on_ffpa_gets_exactly_stock_sdpa(name, padded, patched, reference_kernels, capsys):
    model = other_model(name)
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    kw = {"attention_mask": torch.tensor([[0] * 5 + [1] * 11, [1] * 16])} if padded else {}
    model.set_attn_implementation("sdpa")
    stock = model(ids, **kw).logits
    model.set_attn_implementation("ffpa")
    stats.reset()
    ours = model(ids, **kw).logits
    torch.testing.assert_close(ours, stock, atol=0, rtol=0)  # the same computation, not a close one
    assert {(r["layer"], r["kernel"]) for r in rows()} == {("other", "sdpa")}
    assert all("is not Gemma4 text attention" in r["reason"] for r in rows())
    assert "Gemma4 model" not in capsys.readouterr().err


# -- 2. the sliding window changed after the model was built ----------------------------------------
@pytest.mark.parametrize("backend", ["ffpa", "sdpa"])
@pytest.mark.parametrize("kind", ["text", "left_pad"])
def test_a_window_changed_after_build_is_the_window_used(backend, kind, patched, reference_kernels):
    model = tiny.causal_lm("dense31b", attn="eager")
    model.config.sliding_window = 4  # was 8; Transformers builds the mask from the config at forward time
    assert S > 8
    check_against_eager(None, kind, backend, model=model, inputs=batch(kind))
    assert stats.total("sliding", "fa4") == n_layers(model, "sliding")


# -- 3. apply() landing inside a forward ------------------------------------------------------------
def test_a_mask_the_ffpa_mask_function_did_not_make_is_never_taken_as_causal(patched, reference_kernels):
    model = tiny.causal_lm("dense31b", attn="ffpa")
    ids, kw, _ = batch("left_pad")
    ffpa_patch.revert()  # "ffpa" leaves the mask registry: Transformers builds no mask for this forward
    hook = model.model.layers[0].register_forward_pre_hook(lambda *args: ffpa_patch.apply() and None)
    try:
        with pytest.raises(ffpa_patch.FFPAFallbackError, match='the "ffpa" mask function did not run'):
            model(ids, **kw)
    finally:
        hook.remove()
    ffpa_patch.apply()
    check_against_eager("dense31b", "left_pad", "ffpa")  # and with the patch in place throughout: exact


# -- 4. a mask buffer rewritten behind torch's version counter ---------------------------------------
def padding_mask4d(pads, seq=S):
    allowed = torch.ones(len(pads), 1, seq, seq, dtype=torch.bool).tril()
    for row, pad in enumerate(pads):
        allowed[row, :, :, :pad] = False
        allowed[row, :, range(pad), range(pad)] = True  # padding rows see themselves
    return torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)


@pytest.mark.parametrize("write", ["numpy", "data"])
def test_a_reused_4d_mask_buffer_is_read_again_at_the_next_forward(write, patched, reference_kernels):
    model = tiny.causal_lm("dense31b", attn="ffpa")
    ids = torch.randint(0, 128, (2, S), generator=torch.Generator().manual_seed(0))
    buffer = padding_mask4d([3, 0])
    model(ids, attention_mask=buffer)
    version = buffer._version
    if write == "numpy":
        buffer.numpy()[:] = padding_mask4d([9, 5]).numpy()  # a data loader filling its pinned buffer
    else:
        buffer.data.copy_(padding_mask4d([9, 5]))
    assert buffer._version == version  # torch did not see the write
    ours = model(ids, attention_mask=buffer).logits
    model.set_attn_implementation("sdpa")
    ffpa_patch.revert()
    stock = model(ids, attention_mask=padding_mask4d([9, 5])).logits
    real = torch.tensor([[False] * 9 + [True] * (S - 9), [False] * 5 + [True] * (S - 5)])
    torch.testing.assert_close(ours[real], stock[real], atol=5e-5, rtol=1e-4)


# -- 5. a learnable mask -------------------------------------------------------------------------------
def test_a_mask_that_requires_grad_enters_every_layer_and_gets_its_gradient(patched, reference_kernels):
    model = tiny.causal_lm("dense31b", attn="sdpa")
    ids = torch.randint(0, 128, (1, S), generator=torch.Generator().manual_seed(0))
    hard = padding_mask4d([0])  # plain causal: a shortcut would read it as "dense causal" and drop it
    grads = {}
    for backend in ("sdpa-stock", "ffpa"):
        if backend == "sdpa-stock":
            ffpa_patch.revert()
        else:
            ffpa_patch.apply()
        model.set_attn_implementation(backend.removesuffix("-stock"))
        bias = torch.zeros(1, 1, S, S, requires_grad=True)  # a learnable attention bias
        logits = model(ids, attention_mask=hard + bias).logits
        logits.float().logsumexp(-1).sum().backward()
        grads[backend] = bias.grad
    torch.testing.assert_close(grads["ffpa"], grads["sdpa-stock"], atol=1e-6, rtol=1e-4)
    assert all("requires grad" in r["reason"] for r in rows() if r["layer"] == "full")


# -- 6. padded query rows ------------------------------------------------------------------------------
def test_a_loss_that_ignores_padding_equals_stock_with_right_padding(patched, reference_kernels):
    """Padded query rows are zeros on the fused routes (as in Transformers' flash-attention
    path; README, Guarantees): a loss with -100 at the padding sees none of them."""
    ids, kw, valid = batch("right_pad")
    labels = ids.masked_fill(~valid, -100)
    model = tiny.causal_lm("dense31b", attn="sdpa")
    losses, grads = {}, {}
    for backend in ("sdpa", "ffpa"):
        if backend == "sdpa":
            ffpa_patch.revert()  # stock
        else:
            ffpa_patch.apply()
        model.set_attn_implementation(backend)
        model.zero_grad()
        loss = model(ids, labels=labels, **kw).loss
        loss.backward()
        losses[backend] = loss.detach()
        grads[backend] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert stats.total("full", "ffpa") == 1
    torch.testing.assert_close(losses["ffpa"], losses["sdpa"], atol=1e-6, rtol=1e-5)
    for name, g in grads["sdpa"].items():
        torch.testing.assert_close(grads["ffpa"][name], g, atol=5e-6, rtol=1e-4, msg=name)


# -- 7. strict mode and route accounting under torch.compile -----------------------------------------
def test_strict_raises_while_tracing_and_traced_routes_are_counted(patched):
    from ffpa_patch.routing.attention import route_attention
    from ffpa_patch.routing.masks import CausalMask
    from ffpa_patch.routing.policy import TRACED

    model = tiny.causal_lm("dense31b", attn="ffpa")  # the real kernels: on CPU the full layer falls back
    attn = next(l.self_attn for l in model.model.layers if not l.self_attn.is_sliding)
    q, k = torch.randn(1, 4, 16, 512), torch.randn(1, 1, 16, 512)

    def layer(q, k):
        return route_attention(attn, q, k, k, CausalMask(), backend="ffpa", scaling=1.0)[0]

    torch._dynamo.reset()
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    compiled(q, k)
    compiled(q, k)  # the same graph: the route is counted once per layer, not per call or trace
    traced = [r for r in rows("full") if r["reason"].startswith(TRACED)]
    assert len(traced) == 1 and traced[0]["count"] == 1
    assert traced[0]["kernel"] == "sdpa" and "needs CUDA" in traced[0]["reason"]
    ffpa_patch.apply(strict=True)
    torch._dynamo.reset()
    with pytest.raises(ffpa_patch.FFPAFallbackError, match="head_dim=512 full-attention layer fell back"):
        torch.compile(layer, backend="aot_eager")(q, k)  # (with fullgraph=True Dynamo wraps it in Unsupported)


def test_strict_raises_from_the_op_when_the_mask_turns_out_inexpressible(patched, reference_kernels):
    from ffpa_patch.routing.attention import route_attention

    model = tiny.causal_lm("dense31b", attn="ffpa")
    attn = next(l.self_attn for l in model.model.layers if not l.self_attn.is_sliding)
    q, k = torch.randn(1, 4, 16, 512), torch.randn(1, 1, 16, 512)
    image = torch.ones(16, 16, dtype=torch.bool).tril()
    image[4, 9] = True  # a later key outside any block: known only once the op reads the mask
    ffpa_patch.apply(strict=True)
    torch._dynamo.reset()
    call = torch.compile(lambda q, k, m: route_attention(attn, q, k, k, m, backend="ffpa", scaling=1.0)[0],
                         backend="aot_eager", fullgraph=True)
    with pytest.raises(ffpa_patch.FFPAFallbackError, match="mask is not causal"):
        call(q, k, image[None, None])


# -- 8. torch.use_deterministic_algorithms(True) -------------------------------------------------------
@pytest.fixture
def deterministic():
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(False)


def test_deterministic_algorithms_reach_the_kernels_and_the_stats(patched, deterministic):
    from ffpa_patch.kernels import reference, use

    kernels = reference.kernel_set(fp32=True)
    with use(kernels):
        check_against_eager("dense31b", "left_pad", "ffpa")
    assert {c for c in kernels.calls if c[0] == "fa4"} == {("fa4", "varlen", True)}  # flash-attn-4 gets the flag
    assert {r["reason"] for r in rows("sliding")} == {"varlen (padding/packing); deterministic=True"}
    # FFPA's backward is repeatable as it is (tests/gpu checks it bit for bit): it stays, and says so
    assert {r["reason"] for r in rows("full")} == {"varlen (padding/packing); deterministic (its backward is repeatable as it is)"}


def test_deterministic_algorithms_keep_unverified_kernels_out(patched, deterministic):
    from ffpa_patch.kernels import reference, use

    with use(reference.kernel_set(fa4=False, fp32=True)):  # sliding layers would take FlexAttention
        check_against_eager("dense31b", "text", "ffpa")
    assert {r["kernel"] for r in rows("sliding")} == {"sdpa"}
    assert all("not verified repeatable" in r["reason"] for r in rows("sliding"))


def test_without_deterministic_algorithms_no_flag_is_passed(patched):
    from ffpa_patch.kernels import reference, use

    kernels = reference.kernel_set(fp32=True)
    with use(kernels):
        check_against_eager("dense31b", "text", "ffpa")
    assert kernels.calls and not any(flag for *_, flag in kernels.calls)


# -- 9. sdpa_kernel() around a model left on "sdpa" ---------------------------------------------------
@pytest.mark.parametrize("backends", [["MATH"], ["EFFICIENT_ATTENTION", "MATH"]])
def test_sdpa_kernel_keeps_the_drop_in_on_sdpa(backends, patched, reference_kernels):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([getattr(SDPBackend, b) for b in backends]):
        check_against_eager("dense31b", "left_pad", "sdpa")
    assert {r["kernel"] for r in rows()} == {"sdpa"}
    assert all("sdpa_kernel() pins SDPA" in r["reason"] for r in rows())
    stats.reset()
    check_against_eager("dense31b", "left_pad", "sdpa")  # outside it: fused again
    assert stats.total("full", "ffpa") == 1


# -- 9b. second-order gradients -------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["ffpa", "sdpa"])
def test_a_double_backward_through_a_fused_kernel_raises(backend, patched, reference_kernels):
    model = tiny.causal_lm("dense31b", attn=backend)
    ids, kw, _ = batch("text")
    loss = model(ids, **kw).logits.float().logsumexp(-1).mean()
    params = [p for p in model.parameters() if p.requires_grad]
    with pytest.raises(RuntimeError, match="second-order gradients"):
        grads = torch.autograd.grad(loss, params, create_graph=True)
        sum(g.square().sum() for g in grads).backward()


def test_a_double_backward_on_stock_attention_still_works(patched, reference_kernels):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model = tiny.causal_lm("dense31b", attn="sdpa")
    ids, kw, _ = batch("text")
    with sdpa_kernel(SDPBackend.MATH):  # the README's way out: the drop-in stays out of the way
        loss = model(ids, **kw).logits.float().logsumexp(-1).mean()
        grads = torch.autograd.grad(loss, list(model.parameters()), create_graph=True, allow_unused=True)
        sum(g.square().sum() for g in grads if g is not None).backward()
    assert stats.total(kernel="ffpa") == 0


# -- 10. integer masks ---------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["ffpa", "sdpa"])
def test_an_integer_4d_mask_gets_stocks_own_answer(backend, patched, reference_kernels):
    model = tiny.causal_lm("dense31b", attn="sdpa")
    ids = torch.randint(0, 128, (1, S))
    mask = torch.ones(1, 1, S, S, dtype=torch.long).tril()

    def run():
        try:
            return model(ids, attention_mask=mask).logits
        except Exception as exc:  # stock SDPA refuses it: then the same error
            return type(exc), str(exc)

    ffpa_patch.revert()
    stock = run()
    ffpa_patch.apply()
    model.set_attn_implementation(backend)
    ours = run()
    if isinstance(stock, tuple):
        assert ours == stock
    else:
        torch.testing.assert_close(ours, stock)


# -- 11. misconfiguration --------------------------------------------------------------------------------
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def status_with(**env_extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FFPA_PATCH_")}
    env.update(env_extra, PYTHONPATH=ROOT)
    code = "import ffpa_patch; s = ffpa_patch.status(); print(s.message); print(sorted(p['name'] for p in s.patches if p['state'] == 'waiting for import' or p['state'] == 'applied'))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize("env_extra, said", [
    ({"FFPA_PATCH_TARGETS": " , "}, "name no patch"),
    ({"FFPA_PATCH_TARGETS": "ffpa_backend", "FFPA_PATCH_EXCLUDE": "ffpa_backend"}, "both chosen and excluded"),
])
def test_a_selection_that_selects_nothing_is_said_not_called_active(env_extra, said):
    done = status_with(**env_extra)
    message, applied = done.stdout.strip().splitlines()
    assert done.returncode == 0 and said in done.stderr
    assert message.startswith("not applied") and said in message
    assert applied == "[]"
