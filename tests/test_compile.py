"""torch.compile over a patched model (Dynamo + AOTAutograd on CPU; inductor is a gpu test).

Reading a mask's structure is data-dependent, so inside a graph masked full layers and
flash-attn-4 sliding layers run an opaque custom op (ffpa_patch/routing/compiled.py)
that reads the mask at run time, and sliding layers without flash-attn-4 take
FlexAttention with the mask as given: no graph breaks.
"""
import shutil

import pytest
import torch

import tiny
from ffpa_patch.routing import stats
from ffpa_patch.routing.decide import BLOCKS_REASON
from ffpa_patch.routing.policy import IN_OP as REASON_PREFIX
from ffpa_patch.routing.policy import TRACED


def ran(layer, kernel, where=REASON_PREFIX):
    """Calls counted at run time by the op (``where=REASON_PREFIX``) or routes counted once per
    trace (``where=TRACED``)."""
    return sum(r["count"] for r in stats.snapshot() if (r["layer"], r["kernel"]) == (layer, kernel) and r["reason"].startswith(where))


def _inputs(kind):
    ids = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(0))
    kw = {}
    if kind == "left_pad":
        mask = torch.ones(2, 24, dtype=torch.long)
        mask[0, :6] = 0
        kw["attention_mask"] = mask
    elif kind == "packed":
        kw["position_ids"] = torch.tensor([list(range(10)) + list(range(14))] * 2)
    return ids, kw


def _loss_and_grads(model, fn, ids, kw):
    model.zero_grad()
    logits = fn(ids, **kw).logits
    valid = kw.get("attention_mask", torch.ones_like(ids)).bool()
    (logits.logsumexp(-1) * valid).sum().backward()
    return logits.detach()[valid], {n: p.grad.clone() for n, p in model.named_parameters() if "self_attn" in n and p.grad is not None}


def _assert_same(logits, grads, ref_logits, ref_grads):
    """Compiled against eager: logits and attention gradients to fp32 rounding."""
    torch.testing.assert_close(logits, ref_logits, atol=5e-5, rtol=1e-4)
    assert grads.keys() == ref_grads.keys() and grads
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], atol=5e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", ["left_pad", "packed"])
def test_compiled_model_has_no_graph_breaks_and_matches_eager(kind, patched):
    # Sliding layers take flex inside a graph; with fa4=False they take flex eagerly too, so
    # both sides sum in the same order and must agree to fp32 rounding.
    from torch._dynamo.utils import counters

    from ffpa_patch.kernels import use
    from ffpa_patch.kernels import reference

    torch._dynamo.reset()
    counters.clear()
    model = tiny.causal_lm("dense31b", attn="ffpa")
    ids, kw = _inputs(kind)
    with use(reference.kernel_set(fa4=False, fp32=True)):
        ref_logits, ref_grads = _loss_and_grads(model, model, ids, kw)
        stats.reset()
        logits, grads = _loss_and_grads(model, torch.compile(model, backend="aot_eager"), ids, kw)
    assert dict(counters["graph_break"]) == {}  # stock Gemma4 compiles to one graph too
    _assert_same(logits, grads, ref_logits, ref_grads)
    # the op counts itself at run time: the full layer ran FFPA varlen (padding/packing); the
    # trace counted every layer's route once
    assert ran("full", "ffpa") == 1
    assert any(r["reason"] == REASON_PREFIX + "varlen (padding/packing)" for r in stats.snapshot())
    assert ran("full", "ffpa", TRACED) == 1 and ran("sliding", "flex", TRACED) == len(model.model.layers) - 1


def test_sliding_layer_without_a_mask_keeps_its_window_in_a_graph(patched):
    # The "ffpa" mask function hands an unpadded batch's sliding layers no mask (while
    # compiling, Transformers on torch < 2.14 still builds one; newer torch may skip it).
    # Inside a graph the window must then come from the module: checked against eager
    # attention with the window as a mask.
    from transformers.models.gemma4.modeling_gemma4 import eager_attention_forward

    from ffpa_patch.kernels import use
    from ffpa_patch.kernels import reference
    from ffpa_patch.routing.attention import route_attention

    model = tiny.causal_lm("dense31b", attn="eager")
    attn = next(l.self_attn for l in model.model.layers if l.self_attn.is_sliding)
    window, n = attn.sliding_window, 3 * attn.sliding_window
    torch.manual_seed(0)
    q, k = torch.randn(1, 4, n, 32), torch.randn(1, 2, n, 32)
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    additive = torch.zeros(n, n).masked_fill(~((j <= i) & (i - j < window)), torch.finfo(torch.float32).min)
    ref, _ = eager_attention_forward(attn, q, k, k, additive[None, None], scaling=1.0)

    from ffpa_patch.routing.masks import CausalMask

    def call(q, k):
        return route_attention(attn, q, k, k, CausalMask(window), backend="ffpa", scaling=1.0, sliding_window=window)[0]

    torch._dynamo.reset()
    with use(reference.kernel_set(fa4=False, fp32=True)):
        out = torch.compile(call, backend="aot_eager", fullgraph=True)(q, k)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)


def test_fused_attention_op_falls_back_to_sdpa_for_other_masks(reference_kernels):
    from ffpa_patch.kernels import reference

    torch.manual_seed(0)
    q = torch.randn(1, 4, 16, 64, requires_grad=True)
    k = torch.randn(1, 1, 16, 64, requires_grad=True)
    mask = torch.ones(16, 16, dtype=torch.bool).tril()
    mask[4, 9] = True  # a later key outside any block: no structure a kernel takes
    mask = mask[None, None]
    stats.reset()
    out = torch.ops.ffpa_patch.fused_attention(q, k, k, mask, 0.125, None, "ffpa", None, 5, False, "")
    torch.testing.assert_close(out, reference.masked(q, k, k, mask, 0.125), atol=1e-5, rtol=1e-4)
    out.sum().backward()
    assert q.grad is not None and k.grad is not None
    assert stats.total("full", "sdpa") == 1
    torch.library.opcheck(torch.ops.ffpa_patch.fused_attention.default,
                          (q.detach(), k.detach(), k.detach(), mask, 0.125, None, "ffpa", None, 5, False, ""))


def _window_mask(n, window, pad=0):
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    allowed = (j <= i) & (i - j < window) & (j >= pad)
    allowed[:pad, :pad] = torch.eye(pad, dtype=torch.bool)  # padding rows see themselves only
    return allowed


@pytest.mark.parametrize("case", ["no mask", "window mask", "left padding", "image block", "image block, flex",
                                  "other mask", "other mask, flex"])
def test_fused_attention_op_routes_a_sliding_layer_like_eager(case, reference_kernels):
    """The op's sliding layer: flash-attn-4 (dense, varlen, or with image blocks merged) with the
    module's window, or for a mask it cannot express FlexAttention (when allowed) or SDPA; values
    and gradients against attention under the full mask (window included), and the route it counted."""
    from ffpa_patch.kernels import reference

    n, window, pad = 24, 8, 5 if case == "left padding" else 0
    torch.manual_seed(0)
    q = torch.randn(1, 4, n, 32, requires_grad=True)
    k = torch.randn(1, 2, n, 32, requires_grad=True)
    allowed = _window_mask(n, window, pad)
    if case.startswith("image block"):
        allowed[10:14, 10:14] = True
    if case.startswith("other mask"):
        allowed[10, 13] = True  # a later key outside any block
    mask = None if case == "no mask" else allowed[None, None]
    flex_ok = case.endswith("flex")
    stats.reset()
    settings = (0.125, window, "fa4", "flex" if flex_ok else None, 0, False, "")
    out = torch.ops.ffpa_patch.fused_attention(q, k, k, mask, *settings)
    expected = reference.masked(q, k, k, allowed[None, None], 0.125)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k), grad)
    want = torch.autograd.grad(expected, (q, k), grad)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)
    kernel, reason = {"no mask": ("fa4", "dense causal"), "window mask": ("fa4", "dense causal (mask is plain causal)"),
                      "left padding": ("fa4", "varlen (padding/packing)"), "image block": ("fa4", BLOCKS_REASON),
                      "image block, flex": ("fa4", BLOCKS_REASON)}.get(case, ("flex" if flex_ok else "sdpa", None))
    [row] = [r for r in stats.snapshot() if r["layer"] == "sliding"]
    assert row["kernel"] == kernel and row["count"] == 1
    assert reason is None or row["reason"] == REASON_PREFIX + reason
    if not flex_ok:  # (opcheck's schema check cannot run the vmap inside create_block_mask)
        torch.library.opcheck(torch.ops.ffpa_patch.fused_attention.default,
                              (q.detach(), k.detach(), k.detach(), mask, *settings))


@pytest.mark.parametrize("kind", ["left_pad", "packed"])
def test_compiled_sliding_layers_run_flash_attn_4_in_the_op(kind, patched):
    """With flash-attn-4 available the sliding layers leave FlexAttention for the op: no
    graph breaks, the eager route's kernels (so results equal to fp32 rounding), and the
    op's run-time counts show every layer on its fused kernel."""
    from torch._dynamo.utils import counters

    from ffpa_patch.kernels import use
    from ffpa_patch.kernels import reference

    torch._dynamo.reset()
    counters.clear()
    model = tiny.causal_lm("dense31b", attn="ffpa")
    ids, kw = _inputs(kind)
    with use(reference.kernel_set(fp32=True)):
        ref_logits, ref_grads = _loss_and_grads(model, model, ids, kw)
        stats.reset()
        logits, grads = _loss_and_grads(model, torch.compile(model, backend="aot_eager"), ids, kw)
    assert dict(counters["graph_break"]) == {}
    _assert_same(logits, grads, ref_logits, ref_grads)
    sliding = sum(l.self_attn.is_sliding for l in model.model.layers)
    assert ran("sliding", "fa4") == sliding and stats.total("sliding", "flex") == 0
    assert ran("full", "ffpa") == len(model.model.layers) - sliding
    ran_rows = {r["reason"] for r in stats.snapshot() if not r["reason"].startswith(TRACED)}
    assert ran_rows == {REASON_PREFIX + "varlen (padding/packing)"}


@pytest.mark.parametrize("module", ["ffpa", "fa4", "flex"])
def test_kernel_availability_is_a_constant_to_dynamo(module, recwarn):
    """The CuTeDSL kernels' availability checks (imports, device queries) run once while
    tracing and enter the graph as a constant: no break, no traced import, no warning."""
    import importlib

    from torch._dynamo.testing import CompileCounter

    unsupported = importlib.import_module(f"ffpa_patch.kernels.{module}").unsupported
    expected = unsupported(torch.device("cpu"), torch.bfloat16, 512)
    counter = CompileCounter()
    torch._dynamo.reset()
    fn = torch.compile(lambda x: x + len(unsupported(x.device, x.dtype, 512)), backend=counter, fullgraph=True)
    out = fn(torch.zeros(2, dtype=torch.bfloat16))
    assert out.tolist() == [len(expected)] * 2
    assert counter.frame_count == 1 and counter.op_count == 1  # the reason is folded in: one add
    assert not [w for w in recwarn if "lru_cache" in str(w.message)]


def _real_flex_on_cpu():
    """The reference kernels, except that sliding layers run torch's real flex_attention
    (which Inductor can compile for CPU, forward only)."""
    from dataclasses import replace

    from ffpa_patch.kernels import flex, reference

    kernels = reference.kernel_set(fa4=False, fp32=True)
    real = replace(kernels.by_name("flex"), unsupported=lambda *args: None, block=flex.block)
    return replace(kernels, kernels=tuple(real if k.name == "flex" else k for k in kernels.kernels))


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="Inductor on CPU needs a C++ compiler")
def test_inductor_lowers_flex_over_the_mask_transformers_built(patched):
    """Inductor's flex lowering needs the mask it reads to be a real buffer; the mask
    Transformers computes in the graph is not one until ffpa_patch::materialize copies it.
    (Left padding only: in a graph every mask takes this path, and a cold Inductor
    compile costs CI about a minute.)"""
    from torch._dynamo.utils import counters

    from ffpa_patch.kernels import use

    torch._dynamo.reset()
    counters.clear()
    model = tiny.causal_lm("dense31b", attn="ffpa")
    ids, kw = _inputs("left_pad")
    valid = kw["attention_mask"].bool()
    with use(_real_flex_on_cpu()), torch.no_grad():
        eager = model(ids, **kw).logits
        stats.reset()
        compiled = torch.compile(model)(ids, **kw).logits
    assert dict(counters["graph_break"]) == {}
    torch.testing.assert_close(compiled[valid], eager[valid], atol=1e-4, rtol=1e-4)
    assert ran("full", "ffpa") == 1


def test_additive_float_mask_in_a_graph_is_read_by_the_op(patched, reference_kernels):
    """A float mask is data too: the op reads it at run time, as the eager route does (padding
    read from the mask -> FFPA varlen), with no graph break."""
    from torch._dynamo.testing import CompileCounter

    from ffpa_patch.routing.attention import route_attention

    model = tiny.causal_lm("dense31b", attn="eager")
    attn = next(l.self_attn for l in model.model.layers if not l.self_attn.is_sliding)
    torch.manual_seed(0)
    q, k = torch.randn(2, 4, 16, 512) * 512**-0.25, torch.randn(2, 1, 16, 512) * 512**-0.25
    allowed = torch.ones(16, 16, dtype=torch.bool).tril().expand(2, 1, 16, 16).clone()
    allowed[0, :, :, :5] = False  # left padding in row 0
    allowed[0, :, :5, :5] = torch.eye(5, dtype=torch.bool)  # padding rows see themselves only
    additive = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)

    def call(q, k, mask):
        return route_attention(attn, q, k, k, mask, backend="ffpa", scaling=1.0)[0]

    eager = call(q, k, additive)
    stats.reset()
    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(call, backend=counter, fullgraph=True)(q, k, additive)
    torch.testing.assert_close(compiled, eager)
    assert counter.frame_count == 1
    assert ran("full", "ffpa") == 1
    assert any(r["reason"] == REASON_PREFIX + "varlen (padding/packing)" for r in stats.snapshot())


@pytest.mark.parametrize("family,context_fn,kind", [("dense31b", "plain", "packed"), ("dense31b", "selective", "packed"),
                                                    ("dense31b", "selective", "left_pad"), ("e2b", "selective", "packed")])
def test_compiled_checkpointed_model_has_no_graph_breaks_with_the_readme_setting(family, context_fn, kind, patched):
    # README, long context: torch.compile over gradient checkpointing. Transformers' Gemma4 layers
    # store K/V in a shared dict, a side effect that Dynamo refuses inside a checkpoint (one graph
    # break per layer, stock too) unless told not to replay it in the backward. With that setting,
    # the patched model's routes must add no break of their own, and match eager checkpointing;
    # e2b's KV-shared layers read that dict, so skipping the replay must not change them either.
    import ffpa_patch
    from torch._dynamo.utils import counters

    from ffpa_patch.kernels import use
    from ffpa_patch.kernels import reference

    torch._dynamo.reset()
    counters.clear()
    model = tiny.causal_lm(family, attn="ffpa")
    kwargs = {"use_reentrant": False}
    if context_fn == "selective":
        kwargs["context_fn"] = ffpa_patch.checkpointing.context_fn
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.train()
    ids, kw = _inputs(kind)
    with use(reference.kernel_set(fa4=False, fp32=True)), torch._dynamo.config.patch(skip_fwd_side_effects_in_bwd_under_checkpoint=True):
        ref_logits, ref_grads = _loss_and_grads(model, model, ids, kw)
        stats.reset()
        logits, grads = _loss_and_grads(model, torch.compile(model, backend="aot_eager"), ids, kw)
    assert dict(counters["graph_break"]) == {}
    assert ran("full", "ffpa") >= 1
    _assert_same(logits, grads, ref_logits, ref_grads)
