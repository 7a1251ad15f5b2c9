"""The dtype a fused kernel runs one attention call in: what SDPA would run it in.

Under autocast (Trainer's ``bf16=True``/``fp16=True``, accelerate's
``mixed_precision``) Gemma4 hands the attention function fp32 q/k (its rotary
multiplies by fp32 cos/sin) and a bf16 v. Stock SDPA is on autocast's
lower-precision list, so it casts all three to the autocast dtype and returns
that dtype. The fused kernels (fp16/bf16 only) must do the same cast, or every
call falls back; the cast is differentiable, so gradients reach fp32 weights
in fp32, as they do through SDPA's cast.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

LOW_PRECISION = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class Precision:
    dtype: torch.dtype | None  # what the kernels see; None: q/k/v disagree and nothing unifies them
    cast: bool  # q/k/v must be cast to ``dtype`` before a fused kernel
    problem: str | None  # why no fused kernel can take q/k/v as they are, or None

    def note(self) -> str | None:
        """The cast spelled out, for the route's reason in stats()."""
        return f"autocast: q/k/v cast to {_name(self.dtype)}" if self.cast else None


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The autocast dtype in force for ``device_type``, or None when autocast is off there."""
    if not torch.is_autocast_enabled(device_type):
        return None
    return torch.get_autocast_dtype(device_type)


def of_call(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> Precision:
    dtypes = (query.dtype, key.dtype, value.dtype)
    target = autocast_dtype(query.device.type)
    if target in LOW_PRECISION and all(d.is_floating_point for d in dtypes):
        return Precision(target, any(d != target for d in dtypes), None)
    if len(set(dtypes)) == 1:
        return Precision(query.dtype, False, None)
    names = "/".join(_name(d) for d in dtypes)
    return Precision(None, False, f"mixed q/k/v dtypes {names} outside autocast")


def cast(precision: Precision, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    if not precision.cast:
        return tensors
    return tuple(t.to(precision.dtype) for t in tensors)
