"""kernels/ffpa.py's own code (FFPADense, FFPAVarlen, the backward ops ``ffpa_patch::d512_backward`` and
``d512_varlen_backward``, the LSE entry points) against a stand-in ffpa-attn whose four ops compute in fp32
(kernels/reference.py) with the real ones' signatures, layouts and dtype refusal: argument order, saved
tensors, LSE shapes, which backward ran and why. The real kernels' numbers are tests/gpu's; this is the part
of a GPU path a CPU can check. In a fresh interpreter, so the stand-in's op namespace stays there; skipped
where the real ffpa-attn is installed."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

STAND_IN = '''
import torch
from torch import Tensor
from typing import Optional

from ffpa_patch.kernels import reference

CALLS = []


def _needs_half(*tensors):
    for t in tensors:
        if t.dtype not in (torch.float16, torch.bfloat16):
            raise TypeError(f"ffpa-attn stand-in: q/k/v must be fp16/bf16, got {t.dtype}")


@torch.library.custom_op("ffpa_attn::_fwd_cute", mutates_args=())
def _fwd(q: Tensor, k: Tensor, v: Tensor, scale: float, causal: int, pack_gqa: int) -> tuple[Tensor, Tensor]:
    _needs_half(q, k, v)
    CALLS.append("_fwd_cute")
    out, lse = reference.attention_lse(q.float(), k.float(), v.float(), scale)
    return out.to(q.dtype), lse


@torch.library.custom_op("ffpa_attn::_bwd_cute", mutates_args=())
def _bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, scale: float, causal: int,
         deterministic: int) -> tuple[Tensor, Tensor, Tensor]:
    CALLS.append("_bwd_cute")
    grads = reference.attention_bwd(dout.float(), q.float(), k.float(), v.float(), out.float(), lse, scale)
    return tuple(g.to(q.dtype) for g in grads)


@torch.library.custom_op("ffpa_attn::_varlen_fwd_cute", mutates_args=())
def _varlen_fwd(q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_k: Tensor, max_q: int, max_k: int, scale: float,
                causal: bool, window_left: int, window_right: int, softcap: float, pack_gqa: bool) -> tuple[Tensor, Tensor]:
    _needs_half(q, k, v)
    assert causal and torch.equal(cu_q, cu_k) and max_q == max_k and pack_gqa == (q.shape[-2] != k.shape[-2])
    assert max_q >= int((cu_q[1:] - cu_q[:-1]).max())
    CALLS.append("_varlen_fwd_cute")
    out, lse = reference.varlen_lse(q.float(), k.float(), v.float(), cu_q, scale)
    return out.to(q.dtype), lse


@torch.library.custom_op("ffpa_attn::_varlen_bwd_cute", mutates_args=())
def _varlen_bwd(q: Tensor, k: Tensor, v: Tensor, out: Tensor, dout: Tensor, lse: Tensor, cu_q: Tensor, cu_k: Tensor,
                max_q: int, max_k: int, scale: float, causal: bool, window_left: int, window_right: int, softcap: float,
                dlse: Optional[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    assert causal and dlse is None and lse.shape == (q.shape[1], q.shape[0]) and lse.dtype == torch.float32
    assert out.shape == dout.shape == q.shape
    CALLS.append("_varlen_bwd_cute")
    grads = reference.varlen_bwd(dout.float(), q.float(), k.float(), v.float(), out.float(), lse, cu_q, scale)
    return tuple(g.to(q.dtype) for g in grads)
'''

WORKER = r'''
import json, torch
import ffpa_patch
from ffpa_patch.kernels import ffpa, reference
import ffpa_attn.cute as stand_in

assert ffpa.import_error() is None, ffpa.import_error()
rows, scale = {}, 512 ** -0.5
torch.manual_seed(0)


def against_fp32(name, run, ref, tensors):
    before, calls = ffpa.BACKWARDS.copy(), len(stand_in.CALLS)
    out = run(*tensors)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, tensors, g)
    fp32 = tuple(t.detach().float().requires_grad_() for t in tensors)
    want_out = ref(*fp32)
    want = torch.autograd.grad(want_out, fp32, g.float())
    err = [((a.float() - b).norm() / b.norm()).item() for a, b in zip((out, *got), (want_out, *want))]
    rows[name] = {"err": err, "shape": list(out.shape), "dtype": str(out.dtype),
                  "ran": [k for k in ffpa.BACKWARDS if ffpa.BACKWARDS[k] > before[k]], "ops": stand_in.CALLS[calls:]}


q, k, v = (torch.randn(2, 128, h, 512, dtype=torch.bfloat16, requires_grad=True) for h in (4, 1, 1))
against_fp32("dense", lambda *t: ffpa.dense(*t, scale), lambda *t: reference.attention(*t, scale), (q, k, v))
cu = torch.tensor([0, 5, 6, 70, 130], dtype=torch.int32)
q, k, v = (torch.randn(130, h, 512, dtype=torch.bfloat16, requires_grad=True) for h in (4, 2, 2))
against_fp32("packed", lambda *t: ffpa.varlen(*t, cu, 64, scale), lambda *t: reference.varlen(*t, cu, scale), (q, k, v))
against_fp32("packed, k is v", lambda q, k: ffpa.varlen(q, k, k, cu, 64, scale),
             lambda q, k: reference.varlen(q, k, k, cu, scale), (q, k))
out, lse = ffpa.varlen_lse(q.detach(), k.detach(), v.detach(), cu, 64, scale)
grads = ffpa.varlen_bwd(torch.ones_like(out), q.detach(), k.detach(), v.detach(), out, lse, cu, 64, scale)
rows["lse entry"] = {"out": list(out.shape), "lse": list(lse.shape), "grads": [list(t.shape) for t in grads]}
try:
    ffpa.varlen(q.float(), k.float(), v.float(), cu, 64, scale)
except TypeError as exc:
    rows["fp32 refused"] = str(exc)
rows["status"] = ffpa_patch.status().backwards
print(json.dumps(rows))
'''


@pytest.fixture(scope="module")
def plumbed(tmp_path_factory):
    if importlib.util.find_spec("ffpa_attn") is not None:
        pytest.skip("the real ffpa-attn is installed: tests/gpu checks these paths on its kernels")
    site = tmp_path_factory.mktemp("stand_in")
    (site / "ffpa_attn" / "cute").mkdir(parents=True)
    (site / "ffpa_attn" / "__init__.py").write_text("")
    (site / "ffpa_attn" / "cute" / "_utils.py").write_text(
        "def _encode_optional_int_for_custom_op(value):\n    return -(2 ** 31) if value is None else int(value)\n")
    (site / "ffpa_attn" / "cute" / "__init__.py").write_text(STAND_IN)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FFPA_PATCH_")}
    env.update(PYTHONPATH=os.pathsep.join([str(site), ROOT]), FFPA_PATCH_KERNEL_CACHE="0")
    done = subprocess.run([sys.executable, "-c", WORKER], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", ["dense", "packed", "packed, k is v"])
def test_the_ffpa_functions_pass_the_ops_what_they_take_and_return_the_gradients_in_order(plumbed, case):
    """bf16 through the stand-in's fp32 math: only the input/output rounding separates it from fp32, so
    a swapped argument, a wrong LSE layout or gradients out of order show as large errors."""
    row = plumbed[case]
    assert max(row["err"]) < 2e-2, row
    assert row["dtype"] == "torch.bfloat16"


def test_each_backward_names_the_one_that_ran_and_why(plumbed):
    """On a CPU the Triton backward never runs; the reasons are the ones status() reports."""
    assert plumbed["dense"]["ran"] == ["ffpa-attn (cpu (it runs on CUDA GPUs))"]
    assert plumbed["dense"]["ops"] == ["_fwd_cute", "_bwd_cute"]
    assert plumbed["packed"]["ran"] == ["ffpa-attn (packed documents (not yet verified on a GPU))"]
    assert plumbed["packed"]["ops"] == ["_varlen_fwd_cute", "_varlen_bwd_cute"]
    assert plumbed["status"] == {"ffpa-attn (cpu (it runs on CUDA GPUs))": 1,
                                 "ffpa-attn (packed documents (not yet verified on a GPU))": 3}


def test_the_packed_lse_entry_points_use_ffpa_attns_layouts(plumbed):
    assert plumbed["lse entry"] == {"out": [130, 4, 512], "lse": [4, 130], "grads": [[130, 4, 512], [130, 2, 512], [130, 2, 512]]}


def test_a_dtype_the_kernel_refuses_is_refused_not_computed(plumbed):
    assert "fp16/bf16" in plumbed["fp32 refused"]
