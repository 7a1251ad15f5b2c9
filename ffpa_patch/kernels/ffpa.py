"""ffpa-attn for head_dim > 256: low-copy autograd Functions (dense, varlen) and the backward ops.

Gemma4 builds q/k/v as ``[B, S, H, D]`` and hands the attention function
``[B, H, S, D]`` transposed views; the CuTeDSL ops read ``[B, S, H, D]``
directly. ``FFPADense`` passes those storages straight to
``torch.ops.ffpa_attn._fwd_cute``, saves views (no ``.contiguous()``
copies) and returns ``[B, S, H, D]``, which is what the attention interface
must return; ``FFPAVarlen`` does the same for packed ``[T, H, D]``. Their
backwards are ffpa_patch's custom ops, which run kernels/d512_bwd.py or
ffpa-attn's ``_bwd_cute`` / ``_varlen_bwd_cute``. The ops exist only after
``import ffpa_attn.cute``; everything here is resolved lazily.
"""
from __future__ import annotations

import functools
from collections import Counter

import torch

from .. import env
from . import disk_cache, dtype_problem, import_problem, machine_fact, refusal
from .catalog import FFPA

#: which backward ran, and why not the Triton one: ``{"triton": n, "ffpa-attn (why)": m}``
BACKWARDS: Counter = Counter()


@functools.lru_cache(maxsize=1)
def import_error() -> str | None:
    """None when ffpa-attn's CuTeDSL ops are importable (the import registers torch.ops.ffpa_attn.*), else why not."""
    problem = import_problem("ffpa_attn.cute", "ffpa-attn")
    if problem is None:
        disk_cache.after_ffpa_attn_import()
    return problem


unsupported = refusal(FFPA, import_error)  # what its catalog row declares (sm90: 320 <= D <= 512; sm100: D = 512)


@machine_fact
def _ops_loaded() -> bool:
    """ffpa-attn's ops are registered (``import ffpa_attn.cute`` ran): asked by the entry points, so
    a call that did not go through ``unsupported`` first (a script, a benchmark) loads them too."""
    return import_error() is None


def _need_ops() -> None:
    if not _ops_loaded():
        raise RuntimeError(f"ffpa_patch: the FFPA kernels cannot run: {import_error()}")


def _unaliased(k, v):
    """``v``, or a copy of it when it shares ``k``'s storage: ffpa-attn reads a shared start address as
    its "kv_same" variant, which its sm90 head_dim-512 forward asserts against (found on an H100 with
    ``dense(q, k, k, ...)``). Gemma 4 hands over distinct tensors; the copy is for other callers. Under
    torch.compile only ``k is v`` can be asked (no addresses while tracing)."""
    if k is v or (not torch.compiler.is_compiling() and k.data_ptr() == v.data_ptr()):
        return v.clone()
    return v


class FFPADense(torch.autograd.Function):
    """Causal (bottom-right) FFPA over ``[B, S, H, D]`` tensors, saving views only."""

    @staticmethod
    def forward(ctx, q, k, v, scale: float):
        out, lse = torch.ops.ffpa_attn._fwd_cute(q, k, v, scale, 1, 1)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = torch.ops.ffpa_patch.d512_backward(dout.contiguous(), q, k, v, out, lse, ctx.scale)
        return dq, dk, dv, None


@functools.lru_cache(maxsize=1)
def _triton_import_error() -> str | None:
    return import_problem("triton", "triton")


def triton_backward_problem(q, k, packed: bool = False) -> str | None:
    """Why the causal backward of these tensors (``[B, S, H, D]``, or ``packed`` ``[T, H, D]``
    documents) does not run kernels/d512_bwd.py, or None."""
    if env.d512_backward() != "triton":
        return "FFPA_PATCH_D512_BACKWARD=ffpa-attn"
    if q.shape[-1] != 512:
        return f"head_dim {q.shape[-1]} (it serves 512)"
    if packed:
        # the kernel's varlen mode passes in Triton's interpreter, the GPU's tile config included
        # (tests/test_d512_backward.py); not yet run on a GPU
        return "packed documents (not yet verified on a GPU)"
    if q.shape[1] != k.shape[1]:
        return "fewer queries than keys"
    if q.shape[1] % 128:
        # the kernel masks partial tiles (checked on a CPU in Triton's interpreter, the GPU's tile config
        # included); not yet run so on a GPU
        return f"length {q.shape[1]} not a multiple of 128 (not yet verified on a GPU)"
    if problem := dtype_problem(FFPA, q.dtype):
        return problem
    return triton_backward_unavailable(q.device)


def triton_backward_unavailable(device: torch.device) -> str | None:
    """Why kernels/d512_bwd.py runs no backward on ``device`` whatever the shapes (the switch, the
    GPU's generation, triton), or None: what `ffpa-patch status --check` reports."""
    if env.d512_backward() != "triton":
        return "FFPA_PATCH_D512_BACKWARD=ffpa-attn"
    if device.type != "cuda":
        return f"{device.type} (it runs on CUDA GPUs)"
    major, minor = torch.cuda.get_device_capability(device)
    if major != 9:
        return f"sm{major}{minor} (measured on sm90 only)"
    return _triton_import_error()


def _run_backward(problem: str | None, triton_call, ffpa_attn_call, packed: bool = False):
    """kernels/d512_bwd.py's backward when ``problem`` is None and its scratch fits, else ffpa-attn's;
    counted in BACKWARDS with the reason. Contiguous grads: the layout both fakes promise."""
    grads = None
    if problem is None:
        try:
            grads = triton_call()
            BACKWARDS["triton (packed)" if packed else "triton"] += 1
        except torch.cuda.OutOfMemoryError:  # its buffers (~1.3 GB at 31B 16k) come first; ffpa-attn's needs no scratch
            problem = "out of GPU memory for its scratch"
        except Exception as exc:  # a GPU whose shared memory or registers cannot hold its tiles: nothing ran
            if type(exc).__name__ != "OutOfResources" or not type(exc).__module__.startswith("triton"):
                raise
            problem = f"its tiles do not fit this GPU ({exc})"
    if grads is None:
        BACKWARDS[f"ffpa-attn ({problem})"] += 1
        grads = ffpa_attn_call()
    return tuple(g.contiguous() for g in grads)


@torch.library.custom_op("ffpa_patch::d512_backward", mutates_args=())
def _d512_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                   lse: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The causal dense backward: kernels/d512_bwd.py where it serves the call, else ffpa-attn's. One
    opaque op, so the choice (environment, device) is made when it runs, also under torch.compile."""
    def triton_call():
        from . import d512_bwd

        return d512_bwd.backward(dout, q, k, v, out, lse, scale)

    return _run_backward(triton_backward_problem(q, k), triton_call,
                         lambda: torch.ops.ffpa_attn._bwd_cute(dout, q, k, v, out, lse, scale, 1, 0))


@_d512_backward.register_fake
def _(dout, q, k, v, out, lse, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


@torch.library.custom_op("ffpa_patch::d512_varlen_backward", mutates_args=())
def _d512_varlen_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                          lse: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                          scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The causal backward of packed ``[T, H, D]`` documents (lse ``[H, T]``), chosen as the dense one."""
    def triton_call():
        from . import d512_bwd

        return d512_bwd.backward(dout, q, k, v, out, lse, scale, cu_seqlens=cu_seqlens)

    def ffpa_attn_call():
        return torch.ops.ffpa_attn._varlen_bwd_cute(q, k, v, out, dout, lse, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                                    scale, True, _no_window(), _no_window(), 0.0, None)

    return _run_backward(triton_backward_problem(q, k, packed=True), triton_call, ffpa_attn_call, packed=True)


@_d512_varlen_backward.register_fake
def _(dout, q, k, v, out, lse, cu_seqlens, max_seqlen, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


class FFPAVarlen(torch.autograd.Function):
    """Causal FFPA over packed ``[T, H, D]`` documents: ffpa-attn's varlen forward op, and the backward
    ``ffpa_patch::d512_varlen_backward`` chooses (in place of ffpa_attn_varlen_func, whose backward is
    always ffpa-attn's)."""

    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens, max_seqlen: int, scale: float):
        out, lse = _varlen_forward(q, k, v, cu_seqlens, max_seqlen, scale)
        ctx.save_for_backward(q, k, v, out, lse, cu_seqlens)
        ctx.max_seqlen, ctx.scale = max_seqlen, scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, cu_seqlens = ctx.saved_tensors
        dq, dk, dv = torch.ops.ffpa_patch.d512_varlen_backward(dout.contiguous(), q, k, v, out, lse, cu_seqlens,
                                                                ctx.max_seqlen, ctx.scale)
        return dq, dk, dv, None, None, None


def _varlen_forward(q, k, v, cu_seqlens, max_seqlen: int, scale: float):
    """ffpa-attn's causal varlen forward op: out ``[T, H, D]``, lse ``[H, T]`` (fp32, nats)."""
    return torch.ops.ffpa_attn._varlen_fwd_cute(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, scale, True,
                                                _no_window(), _no_window(), 0.0, q.shape[-2] != k.shape[-2])


def dense(q, k, v, scale: float, window: int | None = None, deterministic: bool = False):
    """Full layers only (no window). Both backwards (ffpa-attn's split-D one, kernels/d512_bwd.py's)
    are atomic-free with a fixed order, so repeatable with or without ``deterministic`` (tests/gpu
    checks it bit for bit)."""
    assert window is None, "FFPA serves full-attention layers only"
    _need_ops()
    return FFPADense.apply(q, k, _unaliased(k, v), scale)


def varlen(q, k, v, cu_seqlens, max_seqlen: int, scale: float, window: int | None = None, deterministic: bool = False):
    assert window is None, "FFPA serves full-attention layers only"
    _need_ops()
    return FFPAVarlen.apply(q, k, _unaliased(k, v), cu_seqlens, max_seqlen, scale)


# -- with the log-sum-exp (kernels/blocks.py merges image blocks by it): forward without autograd,
#    and the backward from a given out/lse. The same ops the paths above use.
def dense_lse(q, k, v, scale: float, window: int | None = None):
    assert window is None, "FFPA serves full-attention layers only"
    _need_ops()
    with torch.no_grad():
        return torch.ops.ffpa_attn._fwd_cute(q, k, _unaliased(k, v), scale, 1, 1)  # out [B, S, H, D], lse [B, H, S]


def dense_bwd(dout, q, k, v, out, lse, scale: float, window: int | None = None, deterministic: bool = False):
    return torch.ops.ffpa_patch.d512_backward(dout, q, k, v, out, lse, scale)


def _no_window() -> int:
    from ffpa_attn.cute._utils import _encode_optional_int_for_custom_op

    return _encode_optional_int_for_custom_op(None)


def varlen_lse(q, k, v, cu_seqlens, max_seqlen: int, scale: float, window: int | None = None):
    assert window is None, "FFPA serves full-attention layers only"
    _need_ops()
    with torch.no_grad():
        return _varlen_forward(q, k, _unaliased(k, v), cu_seqlens, max_seqlen, scale)


def varlen_bwd(dout, q, k, v, out, lse, cu_seqlens, max_seqlen: int, scale: float, window: int | None = None,
               deterministic: bool = False):
    return torch.ops.ffpa_patch.d512_varlen_backward(dout, q, k, v, out, lse, cu_seqlens, max_seqlen, scale)
