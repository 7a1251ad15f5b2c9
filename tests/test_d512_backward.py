"""The Triton head_dim-512 backward (kernels/d512_bwd.py), its index math run on a CPU by Triton's
interpreter against fp32 autograd: GQA groups whole and split, strips of query rows, lengths that are
not a multiple of the tile, batches, packed documents; in small tiles, then in the GPU's own. The interpreter mishandles bf16, so these run in fp32; the GPU
tests check bf16/fp16 numerics and speed is measured in benchmarks/. The kernel tests skip where triton
is absent; which calls it leaves to ffpa-attn's backward, and why, is checked everywhere."""
import json
import os
import subprocess
import sys

import pytest

WORKER = r"""
import json, torch
from ffpa_patch.kernels import d512_bwd
from ffpa_patch.kernels import reference

TINY = {"delta": {"BLOCK_M": 16}, "pds": {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_D": 32, "GROUP_M": 2},
        "kv": {"BLOCK_N": 16, "BLOCK_D": 64, "BLOCK_K": 16}, "q": {"BLOCK_M": 16, "BLOCK_D": 64, "BLOCK_K": 16}}
rows = []
for bsz, n, hq, hkv, budget in json.loads(CASES):
    torch.manual_seed(n)
    q, k, v = (torch.randn(bsz, n, h, 512, requires_grad=True) for h in (hq, hkv, hkv))
    dout = torch.randn(bsz, n, hq, 512)
    scale = 512 ** -0.5
    want = reference.attention(q, k, v, scale)
    grads = torch.autograd.grad(want, (q, k, v), dout)
    out, lse = reference.attention_lse(q.detach(), k.detach(), v.detach(), scale)
    got = d512_bwd.backward(dout, q.detach(), k.detach(), v.detach(), out, lse, scale, TINY, budget)
    err = [((a - b).norm() / b.norm()).item() for a, b in zip(got, grads)]
    rows.append({"case": [bsz, n, hq, hkv, budget], "plan": d512_bwd.chunk_plan(hq, hkv, n, budget, 16, 4), "err": err})
for n, hq, hkv, bounds, budget in json.loads(VARLEN_CASES):
    torch.manual_seed(n)
    q, k, v = (torch.randn(n, h, 512, requires_grad=True) for h in (hq, hkv, hkv))
    dout = torch.randn(n, hq, 512)
    cu = torch.tensor(bounds, dtype=torch.int32)
    scale = 512 ** -0.5
    want = reference.varlen(q, k, v, cu, scale)
    grads = torch.autograd.grad(want, (q, k, v), dout)
    out, lse = reference.varlen_lse(q.detach(), k.detach(), v.detach(), cu, scale)  # lse [H, T]
    got = d512_bwd.backward(dout, q.detach(), k.detach(), v.detach(), out, lse, scale, TINY, budget, cu)
    err = [((a - b).norm() / b.norm()).item() for a, b in zip(got, grads)]
    rows.append({"case": [n, hq, hkv, bounds, budget], "err": err})
for n, hq, hkv, bounds, budget in json.loads(PRODUCTION_CASES):  # the GPU's tile config (config=None)
    torch.manual_seed(n)
    shape = (n,) if bounds else (1, n)
    q, k, v = (torch.randn(*shape, h, 512, requires_grad=True) for h in (hq, hkv, hkv))
    dout = torch.randn(*shape, hq, 512)
    scale = 512 ** -0.5
    cu = torch.tensor(bounds, dtype=torch.int32) if bounds else None
    want = reference.varlen(q, k, v, cu, scale) if bounds else reference.attention(q, k, v, scale)
    grads = torch.autograd.grad(want, (q, k, v), dout)
    fwd = reference.varlen_lse(q.detach(), k.detach(), v.detach(), cu, scale) if bounds else \
        reference.attention_lse(q.detach(), k.detach(), v.detach(), scale)
    got = d512_bwd.backward(dout, q.detach(), k.detach(), v.detach(), *fwd, scale, None, budget, cu)
    err = [((a - b).norm() / b.norm()).item() for a, b in zip(got, grads)]
    rows.append({"case": [n, hq, hkv, bounds, budget], "plan": d512_bwd.chunk_plan(hq, hkv, n, budget, 128, 4), "err": err})
for n, hq, hkv, bounds, segment, tiles in json.loads(SEGMENT_CASES):  # packed, in segments of whole documents
    torch.manual_seed(n)
    q, k, v = (torch.randn(n, h, 512, requires_grad=True) for h in (hq, hkv, hkv))
    dout = torch.randn(n, hq, 512)
    cu = torch.tensor(bounds, dtype=torch.int32)
    scale = 512 ** -0.5
    grads = torch.autograd.grad(reference.varlen(q, k, v, cu, scale), (q, k, v), dout)
    out, lse = reference.varlen_lse(q.detach(), k.detach(), v.detach(), cu, scale)
    got = d512_bwd.backward(dout, q.detach(), k.detach(), v.detach(), out, lse, scale, TINY if tiles == "tiny" else None,
                            cu_seqlens=cu, segment_tokens=segment)
    err = [((a - b).norm() / b.norm()).item() for a, b in zip(got, grads)]
    rows.append({"case": [n, hq, hkv, bounds, segment, tiles], "segments": d512_bwd.segments(bounds, segment), "err": err})
print(json.dumps(rows))
"""

#: (batch, tokens, query heads, KV heads, scratch bytes) -> the chunk plan each exercises
CASES = [
    (1, 40, 4, 2, 1e9),  # both GQA groups in one chunk
    (2, 48, 4, 1, 2 * 4 * 48 * 48 * 2),  # two of a group's four heads per chunk: dK/dV accumulate; batch 2
    (1, 33, 2, 2, 2 * 4 * 33 * 33),  # one head per chunk, a ragged length
    (1, 70, 2, 1, 2 * 4 * 70 * 20),  # strips of 16 query rows: dK/dV accumulate across strips
]
PLANS = [[2, 2, 40], [1, 2, 48], [1, 1, 33], [1, 1, 16]]
#: packed: (tokens, query heads, KV heads, cu_seqlens, scratch bytes)
VARLEN_CASES = [
    (70, 4, 2, [0, 5, 37, 40, 70], 1e9),  # documents inside, across and at tile edges (tiles of 16)
    (64, 2, 1, [0, 64], 1e9),  # one document: the dense path's result
    (90, 2, 1, [0, 17, 18, 50, 90], 2 * 4 * 90 * 32),  # a one-token document; strips of 32 rows
]
#: the H100 tile config itself (128x128 tiles, 256-wide GEMM columns, grouped tile order): (tokens, query
#: heads, KV heads, cu_seqlens or None for one dense sequence, scratch bytes) -> the (KV heads, heads, rows) plan
PRODUCTION_CASES = [
    (300, 2, 1, None, 1e9),  # a partial last tile (300 = 2 x 128 + 44): the guard in kernels/ffpa.py
    (300, 4, 2, None, 2 * 4 * 300 * 128),  # strips of 128 rows, the last one partial
    (400, 2, 1, [0, 5, 130, 131, 300, 400], 1e9),  # packed: documents inside and across 128-token tiles
]
PRODUCTION_PLANS = [[1, 2, 300], [1, 1, 128], [1, 2, 400]]
#: packed in segments (``segment_tokens``): (tokens, query heads, KV heads, cu_seqlens, segment tokens, tiles)
SEGMENT_CASES = [
    (90, 4, 2, [0, 17, 18, 50, 90], 32, "tiny"),  # three segments, one of two documents (one a single token)
    (70, 2, 1, [0, 5, 69, 70], 16, "tiny"),  # a document longer than the segment is a segment of its own
    (520, 2, 1, [0, 100, 230, 231, 400, 520], 256, "gpu"),  # the GPU's tiles, partial ones in each segment
]
SEGMENTS = [[[0, 18, [0, 17, 18]], [18, 50, [0, 32]], [50, 90, [0, 40]]],
            [[0, 5, [0, 5]], [5, 69, [0, 64]], [69, 70, [0, 1]]],
            [[0, 231, [0, 100, 230, 231]], [231, 400, [0, 169]], [400, 520, [0, 120]]]]


@pytest.fixture(scope="module")
def interpreted():
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "CASES": json.dumps(CASES), "VARLEN_CASES": json.dumps(VARLEN_CASES)}
    code = WORKER.replace("json.loads(CASES)", "json.loads(__import__('os').environ['CASES'])")
    code = code.replace("json.loads(VARLEN_CASES)", "json.loads(__import__('os').environ['VARLEN_CASES'])")
    code = code.replace("json.loads(PRODUCTION_CASES)", "json.loads(__import__('os').environ['PRODUCTION_CASES'])")
    code = code.replace("json.loads(SEGMENT_CASES)", "json.loads(__import__('os').environ['SEGMENT_CASES'])")
    env["PRODUCTION_CASES"], env["SEGMENT_CASES"] = json.dumps(PRODUCTION_CASES), json.dumps(SEGMENT_CASES)
    run = subprocess.run([sys.executable, "-c", code], check=False, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("index", range(len(CASES)))
def test_triton_d512_backward_matches_fp32_autograd(interpreted, index):
    row = interpreted[index]
    assert row["plan"] == PLANS[index]  # the case exercises the chunking it names
    assert max(row["err"]) < 1e-4, row


@pytest.mark.parametrize("index", range(len(VARLEN_CASES)))
def test_triton_d512_backward_of_packed_documents_matches_fp32_autograd(interpreted, index):
    row = interpreted[len(CASES) + index]
    assert row["case"][3] == VARLEN_CASES[index][3]
    assert max(row["err"]) < 1e-4, row


@pytest.mark.parametrize("index", range(len(PRODUCTION_CASES)))
def test_triton_d512_backward_with_the_gpu_tile_config_matches_fp32_autograd(interpreted, index):
    """The tiles the GPU runs, not the small ones above: what the guards in kernels/ffpa.py (lengths not a
    multiple of 128, packed documents) wait on, short of the GPU run itself."""
    row = interpreted[len(CASES) + len(VARLEN_CASES) + index]
    assert row["case"][3] == PRODUCTION_CASES[index][3] and row["plan"] == PRODUCTION_PLANS[index]
    assert max(row["err"]) < 1e-4, row


@pytest.mark.parametrize("index", range(len(SEGMENT_CASES)))
def test_triton_d512_backward_of_packed_documents_in_segments_matches_fp32_autograd(interpreted, index):
    """``segment_tokens``: whole documents per segment, each segment its own packed batch (tiles and scratch
    sized to it); the gradients are the same function of the inputs."""
    row = interpreted[len(CASES) + len(VARLEN_CASES) + len(PRODUCTION_CASES) + index]
    assert row["case"][3] == SEGMENT_CASES[index][3] and row["segments"] == SEGMENTS[index]
    assert max(row["err"]) < 1e-4, row


def test_chunk_plan_keeps_the_scratch_within_budget():
    pytest.importorskip("triton")
    from ffpa_patch.kernels.d512_bwd import chunk_plan

    for hq, hkv in ((32, 4), (16, 2), (16, 1), (8, 1)):
        for n in (2048, 8192, 16384, 32768, 65536, 131072):
            for budget in (1 << 28, 1 << 30, 8e9):
                kv, rep, rows = chunk_plan(hq, hkv, n, budget)
                assert (hq // hkv) % rep == 0 and hkv % kv == 0 and rows % 128 in (0, n % 128)
                assert kv * rep * rows * n * 4 <= max(budget, 128 * n * 4), (hq, hkv, n, budget)


@pytest.mark.parametrize("env,shape_q,shape_k,dtype,why", [
    ("ffpa-attn", (1, 256, 8, 512), (1, 256, 1, 512), "bfloat16", "FFPA_PATCH_D512_BACKWARD=ffpa-attn"),
    ("", (1, 256, 8, 384), (1, 256, 1, 384), "bfloat16", "head_dim 384 (it serves 512)"),
    ("", (1, 128, 8, 512), (1, 256, 1, 512), "bfloat16", "fewer queries than keys"),
    ("", (1, 1000, 8, 512), (1, 1000, 1, 512), "bfloat16", "length 1000 not a multiple of 128 (not yet verified on a GPU)"),
    ("triton", (1, 256, 8, 512), (1, 256, 1, 512), "float32", "dtype torch.float32 (FFPA needs fp16/bf16)"),
    ("", (4096, 32, 512), (4096, 4, 512), "bfloat16", "packed documents (not yet verified on a GPU)"),
    ("ffpa-attn", (4096, 32, 512), (4096, 4, 512), "bfloat16", "FFPA_PATCH_D512_BACKWARD=ffpa-attn"),
])
def test_the_calls_the_triton_backward_leaves_to_ffpa_attn_say_why(monkeypatch, env, shape_q, shape_k, dtype, why):
    """What kernels/ffpa.py decides before it asks the GPU: each refusal with its reason (the reason is
    what ffpa.BACKWARDS counts, status() reports and `ffpa-patch doctor` prints). Rank 3: packed."""
    import torch

    from ffpa_patch.kernels import ffpa

    monkeypatch.setenv("FFPA_PATCH_D512_BACKWARD", env)
    q, k = torch.empty(shape_q, dtype=getattr(torch, dtype)), torch.empty(shape_k, dtype=getattr(torch, dtype))
    assert ffpa.triton_backward_problem(q, k, packed=q.dim() == 3) == why


def test_what_status_check_says_of_the_triton_backward_on_a_device(monkeypatch):
    """The device-wide reasons (the switch first, then the device) that `ffpa-patch status --check`
    prints; the per-call ones are above."""
    import torch

    from ffpa_patch.kernels import ffpa

    monkeypatch.delenv("FFPA_PATCH_D512_BACKWARD", raising=False)
    assert ffpa.triton_backward_unavailable(torch.device("cpu")) == "cpu (it runs on CUDA GPUs)"
    monkeypatch.setenv("FFPA_PATCH_D512_BACKWARD", "ffpa-attn")
    assert ffpa.triton_backward_unavailable(torch.device("cpu")) == "FFPA_PATCH_D512_BACKWARD=ffpa-attn"


def test_status_counts_each_backward_the_full_layers_ran(monkeypatch):
    """ffpa_patch.status() reports kernels/ffpa.py's count of which backward ran and why (the op that
    counts needs a GPU: tests/gpu checks the count after a real backward); none listed before any ran."""
    from collections import Counter

    import ffpa_patch
    from ffpa_patch.kernels import ffpa

    monkeypatch.setattr(ffpa, "BACKWARDS", Counter())
    assert ffpa_patch.status().backwards == {} and "full layers' backward" not in str(ffpa_patch.status())
    ffpa.BACKWARDS.update({"triton": 96, "ffpa-attn (length 1000 not a multiple of 128)": 4})
    status = ffpa_patch.status()
    assert status.backwards == {"triton": 96, "ffpa-attn (length 1000 not a multiple of 128)": 4}
    assert status.as_dict()["backwards"] == status.backwards
    assert ("  full layers' backward (head_dim 512; count): triton 96, "
            "ffpa-attn (length 1000 not a multiple of 128) 4") in str(status).splitlines()
