"""fp32 reference attention with the kernels' semantics and refusals (the CPU test seam).

Bottom-right causal alignment (query r sees keys <= r + Nkv - Nq), native GQA,
optional sliding window; outputs are cast back to the input dtype.
"""
from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field, replace

import torch

from . import CATALOG, MERGING, Kernel, KernelInfo, KernelSet, capability_problem, dtype_problem, switched_off


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, window: int | None = None) -> torch.Tensor:
    """Dense ``[B, S, H, D]`` causal attention in fp32."""
    n_q, n_k = q.shape[1], k.shape[1]
    i = torch.arange(n_q, device=q.device)[:, None] + (n_k - n_q)
    j = torch.arange(n_k, device=q.device)[None, :]
    allowed = j <= i
    if window is not None:
        allowed &= (i - j) < window
    return masked(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), allowed, scale)


def masked(q, k, v, allowed: torch.Tensor, scale: float) -> torch.Tensor:
    """``[B, H, S, D]`` q/k/v, a bool mask broadcastable to ``[B, H, Sq, Skv]`` -> ``[B, S, H, D]``.
    Rows that see no key give zeros (FlexAttention's convention)."""
    with torch.autocast(q.device.type, enabled=False):  # a kernel's arithmetic ignores autocast
        qf, kf, vf = (t.float() for t in (q, k, v))
        rep = qf.shape[1] // kf.shape[1]
        kf, vf = kf.repeat_interleave(rep, dim=1), vf.repeat_interleave(rep, dim=1)
        scores = ((qf @ kf.transpose(-1, -2)) * scale).masked_fill(~allowed, float("-inf"))
        probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
        return (probs @ vf).transpose(1, 2).to(q.dtype)


def _allowed(n_q: int, n_k: int, window: int | None, device) -> torch.Tensor:
    i = torch.arange(n_q, device=device)[:, None] + (n_k - n_q)
    j = torch.arange(n_k, device=device)[None, :]
    allowed = j <= i
    if window is not None:
        allowed &= (i - j) < window
    return allowed


def attention_lse(q, k, v, scale: float, window: int | None = None):
    """``[B, S, H, D]`` causal attention and its natural-log LSE ``[B, H, S]`` (fp32), as the
    kernels' forward returns them."""
    with torch.autocast(q.device.type, enabled=False):
        qf, kf, vf = (t.transpose(1, 2).float() for t in (q, k, v))
        rep = qf.shape[1] // kf.shape[1]
        kf, vf = kf.repeat_interleave(rep, dim=1), vf.repeat_interleave(rep, dim=1)
        scores = ((qf @ kf.transpose(-1, -2)) * scale).masked_fill(~_allowed(q.shape[1], k.shape[1], window, q.device), float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)
        out = (torch.softmax(scores, dim=-1).nan_to_num(0.0) @ vf).transpose(1, 2).to(q.dtype)
        return out, lse


def attention_bwd(dout, q, k, v, out, lse, scale: float, window: int | None = None):
    """The flash-attention backward from a given ``out`` and ``lse`` (which need not be this call's
    own: BlockUnion hands it the merged ones): P = exp(S - lse), D = rowsum(dout * out)."""
    with torch.autocast(q.device.type, enabled=False):
        qf, kf, vf, df, of = (t.transpose(1, 2).float() for t in (q, k, v, dout, out))
        hk, rep = kf.shape[1], qf.shape[1] // kf.shape[1]
        ke, ve = kf.repeat_interleave(rep, dim=1), vf.repeat_interleave(rep, dim=1)
        allowed = _allowed(q.shape[1], k.shape[1], window, q.device)
        probs = torch.exp((qf @ ke.transpose(-1, -2)) * scale - lse.float()[..., None]).masked_fill(~allowed, 0.0)
        ds = probs * (df @ ve.transpose(-1, -2) - (df * of).sum(-1, keepdim=True)) * scale
        dq = ds @ ke
        dk = (ds.transpose(-1, -2) @ qf).unflatten(1, (hk, rep)).sum(2)
        dv = (probs.transpose(-1, -2) @ df).unflatten(1, (hk, rep)).sum(2)
        return tuple(g.transpose(1, 2).to(t.dtype) for g, t in zip((dq, dk, dv), (q, k, v)))


def _segments(cu_seqlens):
    bounds = cu_seqlens.tolist()
    return list(zip(bounds, bounds[1:]))


def varlen_lse(q, k, v, cu_seqlens, scale: float, window: int | None = None):
    """Packed ``[T, H, D]``: out and the LSE ``[H, T]``."""
    parts = [attention_lse(q[None, a:b], k[None, a:b], v[None, a:b], scale, window) for a, b in _segments(cu_seqlens)]
    return torch.cat([o[0] for o, _ in parts]), torch.cat([l[0] for _, l in parts], dim=-1)


def varlen_bwd(dout, q, k, v, out, lse, cu_seqlens, scale: float, window: int | None = None):
    parts = [attention_bwd(dout[None, a:b], q[None, a:b], k[None, a:b], v[None, a:b], out[None, a:b], lse[None, :, a:b],
                           scale, window) for a, b in _segments(cu_seqlens)]
    return tuple(torch.cat([p[i][0] for p in parts]) for i in range(3))


def flex(query, key, value, layout, scale: float, window: int | None) -> torch.Tensor:
    """What FlexAttention computes for ``layout``: the BlockMask the real kernel would build
    (kernels/flex.py), its mask_mod evaluated at every position."""
    from torch.nn.attention.flex_attention import create_mask

    from . import flex as flex_kernel

    b, h, n_q, _ = query.shape
    block_mask = flex_kernel.block_mask(layout, b, n_q, key.shape[2], window, query.device)
    allowed = create_mask(block_mask.mask_mod, b, h, n_q, key.shape[2], device=query.device)
    return masked(query, key, value, allowed, scale)


def varlen(q, k, v, cu_seqlens: torch.Tensor, scale: float, window: int | None = None) -> torch.Tensor:
    """Packed ``[T, H, D]`` causal attention, one sequence per cu_seqlens interval."""
    bounds = cu_seqlens.tolist()
    outs = [attention(q[None, a:b], k[None, a:b], v[None, a:b], scale, window)[0] for a, b in zip(bounds, bounds[1:])]
    return torch.cat(outs, dim=0)


HALF = (torch.float16, torch.bfloat16)  # what FFPA and flash-attn-4 take


def _refuse(q, k, v, cu_seqlens=None, dtypes=HALF) -> None:
    """Raise where the CuTeDSL kernels would: q/k/v of one half dtype, the head dim contiguous,
    int32 cu_seqlens. A CPU test must never pass a call the GPU would reject."""
    allowed, dtypes = dtypes, {t.dtype for t in (q, k, v)}
    if len(dtypes) != 1 or not dtypes <= set(allowed):
        raise TypeError(f"reference kernels (as FFPA / flash-attn-4): q/k/v must share fp16/bf16, got {dtypes}")
    if any(t.stride(-1) != 1 for t in (q, k, v)):
        raise ValueError("reference kernels (as FFPA / flash-attn-4): the head dim must be contiguous")
    if cu_seqlens is not None and cu_seqlens.dtype != torch.int32:
        raise TypeError(f"reference kernels (as FFPA / flash-attn-4): cu_seqlens must be int32, got {cu_seqlens.dtype}")


@dataclass(frozen=True)
class ReferenceSet(KernelSet):
    """A KernelSet whose kernels also record each call: (kernel, entry point, deterministic)."""

    calls: list = field(default_factory=list, compare=False)


def kernel_set(fa4: bool = True, fp32: bool = False, rename: dict | None = None, catalog=CATALOG) -> ReferenceSet:
    """Drop-in for ``cute.kernel_set()`` on any device: one twin per catalog row (``twin``), in the
    catalog's order, refusing what the row declares.

    ``fa4=False`` plays a machine without flash-attn-4, so sliding layers take FlexAttention.
    ``fp32=True`` also takes fp32 q/k/v (and only that): whole-model tests compare an fp32
    model against fp32 eager to 1e-4, which half precision cannot (bf16 logits of the tiny
    test models are ~1% off fp32). Everything that tests which dtype routes where uses
    the default, which refuses fp32 as the GPU does. ``rename`` (e.g. ``{"ffpa": "full512"}``)
    gives kernels other names: routing must take whatever the table names. ``catalog``: other rows
    (tests add a candidate this way).
    """
    calls: list = []
    kernels = []
    for info in catalog:
        kernel = twin(replace(info, name=rename[info.name]) if rename and info.name in rename else info, fp32, calls)
        if not fa4 and info.package == "flash-attn-4":
            kernel = switched_off(kernel, "flash-attn-4 not installed (reference kernels, fa4=False)")
        kernels.append(kernel)
    return ReferenceSet("reference", tuple(kernels), calls=calls)


def twin(info: KernelInfo, fp32: bool, calls: list) -> Kernel:
    """The fp32 reference of one catalog row: its layer kind's computation (causal, with the window
    on sliding layers; any mask for a kernel that takes one), the entry points its module has, and
    the row's refusals on an sm90 (the one thing not checked is the device: CPU is the point)."""
    dtypes = tuple(dict.fromkeys((*info.dtypes, "float32") if fp32 else info.dtypes))
    allowed = tuple(getattr(torch, d) for d in dtypes)
    name = info.name

    def unsupported(device, dtype, head_dim):
        return dtype_problem(info, dtype, dtypes) or capability_problem(info, 9, 0, head_dim)

    def recorded(entry, fn, checked=True):
        signature = inspect.signature(fn)

        def run(*args, **kwargs):
            call = signature.bind(*args, **kwargs).arguments  # the contract's parameter names
            if checked:
                _refuse(call["q"], call["k"], call["v"], call.get("cu"), dtypes=allowed)
            calls.append((name, entry, bool(call.get("deterministic", False))))
            return fn(*args, **kwargs)
        return run

    if info.any_mask:
        def block(query, key, value, layout, scale, window=None):
            if len({query.dtype, key.dtype, value.dtype}) != 1:
                raise TypeError("reference FlexAttention: q/k/v must share one dtype")
            return flex(query, key, value, layout, scale, window)

        return Kernel(info, unsupported, block=recorded("block", block, checked=False))
    entries = dict(
        dense=recorded("dense", lambda q, k, v, scale, window=None, deterministic=False: attention(q, k, v, scale, window)),
        varlen=recorded("varlen", lambda q, k, v, cu, max_len, scale, window=None, deterministic=False:
                        varlen(q, k, v, cu, scale, window)))
    module = importlib.import_module(info.module)
    if all(callable(getattr(module, e, None)) for e in MERGING):  # the production kernel merges image blocks: so does its twin
        entries.update(
            dense_lse=recorded("dense_lse", lambda q, k, v, scale, window=None: attention_lse(q, k, v, scale, window)),
            varlen_lse=recorded("varlen_lse", lambda q, k, v, cu, max_len, scale, window=None: varlen_lse(q, k, v, cu, scale, window)),
            dense_bwd=recorded("dense_bwd", lambda dout, q, k, v, out, lse, scale, window=None, deterministic=False:
                               attention_bwd(dout, q, k, v, out, lse, scale, window)),
            varlen_bwd=recorded("varlen_bwd", lambda dout, q, k, v, out, lse, cu, max_len, scale, window=None, deterministic=False:
                                varlen_bwd(dout, q, k, v, out, lse, cu, scale, window)))
    return Kernel(info, unsupported, **entries)
