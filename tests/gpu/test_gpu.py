"""Real FFPA / flash-attn-4 kernels on a Hopper/Blackwell GPU (marker: gpu)."""
import pytest
import torch

import ffpa_patch
import tiny
from ffpa_patch.kernels import ffpa as ffpa_kernels
from ffpa_patch.kernels import reference
from ffpa_patch.routing import stats

pytestmark = pytest.mark.gpu


def rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.fixture(autouse=True)
def _needs_kernels():
    if ffpa_kernels.unsupported(torch.device("cuda"), torch.bfloat16, 512):
        pytest.skip(ffpa_kernels.unsupported(torch.device("cuda"), torch.bfloat16, 512))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_copy_ffpa_matches_fp32_reference_fwd_and_grads(dtype):
    torch.manual_seed(0)
    b, s, hq, hk, d = 2, 1024, 8, 2, 512
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=dtype, requires_grad=True) for h in (hq, hk, hk))
    out = ffpa_kernels.dense(q, k, v, 1.0 / 16)
    assert out.shape == (b, s, hq, d)
    g = torch.randn_like(out)
    out.backward(g)
    grads = [t.grad.clone() for t in (q, k, v)]
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref = reference.attention(qf, kf, vf, 1.0 / 16)
    ref.backward(g.float())
    assert rel_err(out, ref) < 1e-2
    for got, want in zip(grads, (qf.grad, kf.grad, vf.grad)):
        assert rel_err(got, want) < 2e-2


def _model_pair(family, dtype):
    cfg = dict(head_dim=256, hidden_size=256)
    fp32 = tiny.causal_lm(family, attn="eager", **cfg).cuda()
    low = tiny.causal_lm(family, attn="ffpa", **cfg).to("cuda", dtype)
    return fp32, low


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind", ["text", "padded", "packed"])
def test_tiny_gemma4_on_real_kernels_matches_fp32(kind, dtype):
    ffpa_patch.apply()
    stats.reset()
    fp32, low = _model_pair("dense31b", dtype)
    s = 512
    ids = torch.randint(0, 128, (2, s), device="cuda")
    kw, valid = {}, torch.ones(2, s, dtype=torch.bool, device="cuda")
    if kind == "padded":
        valid[0, :100] = False
        valid[1, 400:] = False
        kw["attention_mask"] = valid.long()
    if kind == "packed":
        kw["position_ids"] = torch.cat([torch.arange(200), torch.arange(312)]).repeat(2, 1).cuda()
    ref = fp32(ids, **kw).logits
    out = low(ids, **kw).logits
    assert rel_err(out[valid], ref[valid]) < 3e-2
    loss = (out.float().logsumexp(-1) * valid).sum() / valid.sum()
    loss.backward()
    ref_loss = (ref.logsumexp(-1) * valid).sum() / valid.sum()
    ref_loss.backward()
    full = next(l for l in low.model.layers if not l.self_attn.is_sliding)
    full_ref = next(l for l in fp32.model.layers if not l.self_attn.is_sliding)
    assert rel_err(full.self_attn.q_proj.weight.grad, full_ref.self_attn.q_proj.weight.grad) < 5e-2
    assert stats.total("full", "ffpa") == 1 and stats.total("sliding", "fa4") == 5, stats.snapshot()


def test_padded_batch_trains_varlen_without_hang():
    ffpa_patch.apply()
    stats.reset()
    _, low = _model_pair("dense31b", torch.bfloat16)
    mask = torch.ones(2, 2048, dtype=torch.long, device="cuda")
    mask[1, 1500:] = 0
    ids = torch.randint(0, 128, (2, 2048), device="cuda")
    for _ in range(2):
        low(ids, attention_mask=mask, labels=ids).loss.backward()
    torch.cuda.synchronize()
    assert stats.total("full", "ffpa") == 2


def test_compiled_model_matches_eager_model():
    ffpa_patch.apply()
    _, low = _model_pair("dense31b", torch.bfloat16)
    ids = torch.randint(0, 128, (1, 1024), device="cuda")
    want = low(ids).logits
    compiled = torch.compile(low)
    got = compiled(ids).logits
    assert rel_err(got, want) < 1e-2


def test_low_copy_function_compiles_fullgraph():
    q, k, v = (torch.randn(1, 1024, h, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True) for h in (8, 2, 2))
    fn = torch.compile(lambda a, b, c: ffpa_kernels.dense(a, b, c, 0.05), fullgraph=True)
    out = fn(q, k, v)
    out.sum().backward()
    torch.testing.assert_close(out, ffpa_kernels.dense(q, k, v, 0.05))


def _ffpa_fwd_calls(model, ids):
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        model(ids, labels=ids).loss.backward()
    return sum(e.count for e in prof.key_averages() if e.key.endswith("_fwd_cute"))


def test_selective_checkpointing_halves_ffpa_forward_calls():
    from ffpa_patch import checkpointing

    ffpa_patch.apply()
    _, low = _model_pair("dense31b", torch.bfloat16)
    low.train()
    ids = torch.randint(0, 128, (1, 1024), device="cuda")
    low.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    plain = _ffpa_fwd_calls(low, ids)
    low.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False, "context_fn": checkpointing.context_fn})
    selective = _ffpa_fwd_calls(low, ids)
    assert plain == 2 and selective == 1, (plain, selective)
